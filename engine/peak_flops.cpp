#include "engine/peak_flops.h"

#include <algorithm>
#include <array>
#include <cctype>

namespace mt {

namespace {
// Dense figures. Where a datasheet gives "X | Y*" (* = with structured sparsity) we take X;
// where it only gives the sparse figure we take half of it.
constexpr std::array<PeakFlopsEntry, 20> kTable{{
    // Hopper. H200 has H100's SXM compute with more/faster HBM.
    {"GH200", "GH200", 67.0, 494.7, 989.4, "NVIDIA GH200 Grace Hopper Superchip datasheet"},
    {"H200 NVL", "H200 NVL", 60.0, 417.5, 835.5,
     "NVIDIA H200 Tensor Core GPU datasheet (H200 NVL column)"},
    {"H200", "H200 SXM", 67.0, 494.7, 989.4,
     "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column)"},
    {"H100 NVL", "H100 NVL", 60.0, 417.5, 835.5,
     "NVIDIA H100 Tensor Core GPU datasheet (H100 NVL column)"},
    {"H100 PCIe", "H100 PCIe", 51.0, 378.0, 756.0,
     "NVIDIA H100 Tensor Core GPU datasheet (H100 PCIe column)"},
    {"H100", "H100 SXM5", 67.0, 494.7, 989.4,
     "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column)"},
    // Ampere data centre. The A100 datasheet lists the same peaks for PCIe and SXM.
    {"A100", "A100 (SXM4/PCIe)", 19.5, 156.0, 312.0, "NVIDIA A100 Tensor Core GPU datasheet"},
    {"A40", "A40", 37.4, 74.8, 149.7, "NVIDIA A40 datasheet"},
    {"A30", "A30", 10.3, 82.0, 165.0, "NVIDIA A30 Tensor Core GPU datasheet"},
    {"A10", "A10", 31.2, 62.5, 125.0, "NVIDIA A10 Tensor Core GPU datasheet"},
    // Ada data centre.
    {"L40S", "L40S", 91.6, 183.0, 362.05, "NVIDIA L40S datasheet"},
    {"L40", "L40", 90.5, 90.5, 181.05, "NVIDIA L40 datasheet"},
    {"L4", "L4", 30.3, 60.0, 121.0, "NVIDIA L4 Tensor Core GPU datasheet"},
    // GeForce: BF16 with FP32 accumulate runs at half the FP16-accumulate rate.
    {"RTX 4090", "GeForce RTX 4090", 82.6, 82.6, 165.2,
     "NVIDIA Ada Lovelace GPU Architecture whitepaper (RTX 4090)"},
    {"RTX 4080", "GeForce RTX 4080", 48.7, 48.7, 97.5,
     "NVIDIA Ada Lovelace GPU Architecture whitepaper (RTX 4080)"},
    {"RTX 3090 Ti", "GeForce RTX 3090 Ti", 40.0, 40.0, 80.0,
     "NVIDIA GeForce RTX 3090 Ti specifications (GA102)"},
    {"RTX 3090", "GeForce RTX 3090", 35.6, 35.6, 71.0,
     "NVIDIA Ampere GA102 GPU Architecture whitepaper (RTX 3090)"},
    {"RTX 3080 Ti", "GeForce RTX 3080 Ti", 34.1, 34.1, 68.2,
     "NVIDIA GeForce RTX 3080 Ti specifications (GA102)"},
    {"RTX 3080", "GeForce RTX 3080", 29.8, 29.8, 59.5,
     "NVIDIA Ampere GA102 GPU Architecture whitepaper (RTX 3080)"},
    {"RTX A6000", "RTX A6000", 38.7, 77.4, 154.8, "NVIDIA RTX A6000 datasheet"},
}};

std::string lower(std::string s) {
    std::transform(s.begin(), s.end(), s.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return s;
}
}  // namespace

std::span<const PeakFlopsEntry> peak_flops_table() {
    return kTable;
}

const PeakFlopsEntry* find_peak_flops_entry(const std::string& device_name) {
    const std::string name = lower(device_name);
    for (const auto& e : kTable)
        if (name.find(lower(e.match)) != std::string::npos) return &e;
    return nullptr;
}

std::optional<double> cuda_peak_flops(const std::string& device_name, Precision precision) {
    const PeakFlopsEntry* e = find_peak_flops_entry(device_name);
    if (!e) return std::nullopt;
    double t = precision == Precision::fp32   ? e->fp32_tflops
               : precision == Precision::tf32 ? e->tf32_tflops
                                              : e->bf16_tflops;
    return t * 1e12;
}

}  // namespace mt
