// Entry points of the CUDA backend. This header includes no CUDA header: the model and the
// harness see only Backend.
#pragma once

#include <memory>
#include <string>

#include "kernels/backend.h"

namespace mt {
// True when the CUDA runtime finds a device; otherwise *why_not says what failed (any error,
// e.g. "driver version is insufficient", means "no device").
bool cuda_device_available(std::string* why_not);
// Throws BackendError when no device can be used.
std::unique_ptr<Backend> create_cuda_backend(const BackendOptions& options);
}  // namespace mt
