// Peak dense FLOP/s of common NVIDIA GPUs per precision, for MFU (model FLOPs per second / peak)
// and the roofline ridge point. Plain C++ (no CUDA header) so the CPU tests can pin it.
// Figures are the vendors' dense numbers (datasheet figures marked "with sparsity" halved).
// fp32 = CUDA-core FP32; tf32 = TF32 tensor core; bf16 = BF16 tensor core with FP32 accumulate.
#pragma once

#include <optional>
#include <span>
#include <string>

#include "kernels/backend.h"

namespace mt {

struct PeakFlopsEntry {
    const char* match;   // case-insensitive substring of cudaDeviceProp::name
    const char* gpu;     // human name, e.g. "H100 SXM5"
    double fp32_tflops;  // dense
    double tf32_tflops;  // dense
    double bf16_tflops;  // dense, FP32 accumulate
    const char* source;  // the vendor document the figures come from
};

// The table, most specific match first (so "A100" is tried before "A10", "L40S" before "L4").
std::span<const PeakFlopsEntry> peak_flops_table();
// The first entry whose `match` occurs in device_name (case-insensitive); nullptr if none.
const PeakFlopsEntry* find_peak_flops_entry(const std::string& device_name);
// Peak FLOP/s (not TFLOP/s) for the device and precision; nullopt for an unknown device.
std::optional<double> cuda_peak_flops(const std::string& device_name, Precision precision);

}  // namespace mt
