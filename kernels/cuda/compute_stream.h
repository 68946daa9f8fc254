// The CUDA backend's compute stream, for code outside the backend that orders its own stream
// against the backend's kernels (the NCCL collectives, the GPU tests). Plain C++: only the CUDA
// runtime's C API header, so .cpp files compiled by the host compiler can include it.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/backend.h"

namespace mt::cuda {

// The stream every op of the CUDA backend runs on. Throws BackendError when `backend` is not the
// CUDA backend. Defined in cuda_backend.cu, which owns the class.
cudaStream_t compute_stream_of(Backend& backend);

}  // namespace mt::cuda
