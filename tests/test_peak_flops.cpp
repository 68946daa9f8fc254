// CPU-side tests of what the GPU path needs but no GPU to check: the peak-FLOP/s table (MFU's
// denominator), the analytic FLOP/byte formulas of the op table (kernels/ops.h) on small known
// cases, and the wording of CUDA error / out-of-memory messages.
#include <gtest/gtest.h>

#include <string>

#include "engine/peak_flops.h"
#include "kernels/cuda_error_format.h"
#include "kernels/ops.h"

namespace mt {
namespace {

TEST(PeakFlops, LooksUpCommonDeviceNamesPerPrecision) {
    // Names as cudaGetDeviceProperties reports them.
    EXPECT_DOUBLE_EQ(*cuda_peak_flops("NVIDIA H100 80GB HBM3", Precision::bf16), 989.4e12);
    EXPECT_DOUBLE_EQ(*cuda_peak_flops("NVIDIA H100 80GB HBM3", Precision::tf32), 494.7e12);
    EXPECT_DOUBLE_EQ(*cuda_peak_flops("NVIDIA H100 80GB HBM3", Precision::fp32), 67e12);
    EXPECT_DOUBLE_EQ(*cuda_peak_flops("NVIDIA H100 PCIe", Precision::bf16), 756e12);
    EXPECT_DOUBLE_EQ(*cuda_peak_flops("NVIDIA H100 NVL", Precision::bf16), 835.5e12);
    EXPECT_DOUBLE_EQ(*cuda_peak_flops("NVIDIA H200", Precision::bf16), 989.4e12);
    EXPECT_DOUBLE_EQ(*cuda_peak_flops("NVIDIA H200 NVL", Precision::bf16), 835.5e12);
    EXPECT_DOUBLE_EQ(*cuda_peak_flops("NVIDIA A100-SXM4-80GB", Precision::bf16), 312e12);
    EXPECT_DOUBLE_EQ(*cuda_peak_flops("NVIDIA A100-PCIE-40GB", Precision::tf32), 156e12);
    EXPECT_DOUBLE_EQ(*cuda_peak_flops("NVIDIA GeForce RTX 4090", Precision::bf16), 165.2e12);
    EXPECT_DOUBLE_EQ(*cuda_peak_flops("NVIDIA GeForce RTX 3090", Precision::fp32), 35.6e12);
}

TEST(PeakFlops, MoreSpecificNamesWinOverTheirPrefixes) {
    EXPECT_STREQ(find_peak_flops_entry("NVIDIA A10")->gpu, "A10");
    EXPECT_STREQ(find_peak_flops_entry("NVIDIA A100 80GB PCIe")->gpu, "A100 (SXM4/PCIe)");
    EXPECT_STREQ(find_peak_flops_entry("NVIDIA L4")->gpu, "L4");
    EXPECT_STREQ(find_peak_flops_entry("NVIDIA L40S")->gpu, "L40S");
    EXPECT_STREQ(find_peak_flops_entry("NVIDIA L40")->gpu, "L40");
    EXPECT_STREQ(find_peak_flops_entry("NVIDIA GeForce RTX 3090 Ti")->gpu, "GeForce RTX 3090 Ti");
    EXPECT_STREQ(find_peak_flops_entry("NVIDIA GH200 480GB")->gpu, "GH200");
}

TEST(PeakFlops, LookupIsCaseInsensitiveAndUnknownDevicesGiveNothing) {
    EXPECT_TRUE(cuda_peak_flops("nvidia h100 pcie", Precision::fp32).has_value());
    EXPECT_FALSE(cuda_peak_flops("Some Future GPU", Precision::bf16).has_value());
    EXPECT_FALSE(cuda_peak_flops("", Precision::fp32).has_value());
    EXPECT_EQ(find_peak_flops_entry("CPU: AMD EPYC"), nullptr);
}

TEST(PeakFlops, EveryEntryNamesItsSourceAndIsConsistent) {
    for (const auto& e : peak_flops_table()) {
        SCOPED_TRACE(e.gpu);
        EXPECT_NE(std::string(e.source).find("NVIDIA"), std::string::npos);
        EXPECT_GT(e.fp32_tflops, 0.0);
        EXPECT_GE(e.tf32_tflops, e.fp32_tflops * 0.99);  // tensor cores never slower here
        EXPECT_GE(e.bf16_tflops, e.tf32_tflops);         // bf16 doubles tf32's rate
        // Each entry's own match string finds the entry itself (ordering is right).
        EXPECT_EQ(find_peak_flops_entry(std::string("NVIDIA ") + e.match), &e);
    }
}

TEST(OpCosts, MatmulForwardCountsMultiplyAddsAndEachTensorOnce) {
    const OpRecord r = (mt::op::MatmulForward{.N = 2, .C = 3, .OC = 4}.record(4.0));
    EXPECT_DOUBLE_EQ(r.flops, 2.0 * 2 * 3 * 4 + 2 * 4);            // 2NC*OC + bias adds
    EXPECT_DOUBLE_EQ(r.bytes, 4.0 * (2 * 3 + 4 * 3 + 2 * 4 + 4));  // inp, W, out, bias
}

TEST(OpCosts, AttentionCountsOnlyTheCausalHalf) {
    // B=1, T=2, C=4, NH=2 (hs=2): T(T+1)/2 = 3 pairs per head, 6 in all.
    const OpRecord r =
        mt::op::AttentionForward{.impl = mt::AttentionImpl::naive, .B = 1, .T = 2, .C = 4, .NH = 2}
            .record(4.0);
    EXPECT_DOUBLE_EQ(r.flops, 6.0 * (4.0 * 2 + 5.0));
    EXPECT_DOUBLE_EQ(r.bytes, 4.0 * (3 * 8 + 8) + 4.0 * 8);  // qkv + out + saved
}

TEST(OpCosts, AdamWMoves28BytesPerParameter) {
    EXPECT_DOUBLE_EQ((mt::op::AdamWUpdate{.total = 10}.record(4.0)).bytes, 280.0);
    EXPECT_DOUBLE_EQ((mt::op::AdamWUpdate{.total = 10}.record(4.0)).flops, 160.0);
}

TEST(OpCosts, FusedClassifierWithoutGradientOnlyReadsTheLogits) {
    EXPECT_DOUBLE_EQ((mt::op::ClassifierFused{.N = 2, .Vp = 3, .dloss = 1.0f}.record(2.0)).bytes,
                     2.0 * 6 * 2 + 16);
    EXPECT_DOUBLE_EQ((mt::op::ClassifierFused{.N = 2, .Vp = 3, .dloss = 0.0f}.record(2.0)).bytes,
                     2.0 * 6 + 16);
    EXPECT_DOUBLE_EQ((mt::op::ClassifierFused{.N = 2, .Vp = 3, .dloss = 1.0f}.record(2.0)).flops,
                     36.0);
}

TEST(OpCosts, LayerNormAndPointwiseSmallCases) {
    const OpRecord ln = (mt::op::LayerNormForward{.N = 2, .C = 3}.record(4.0));
    EXPECT_DOUBLE_EQ(ln.flops, 48.0);
    EXPECT_DOUBLE_EQ(ln.bytes, 4.0 * (12 + 6) + 16);  // in+out, weight+bias, mean+rstd
    EXPECT_DOUBLE_EQ((mt::op::ResidualForward{.n = 100}.record(2.0)).bytes, 600.0);
    EXPECT_DOUBLE_EQ((mt::op::GeluForward{.n = 100}.record(4.0)).bytes, 800.0);
    EXPECT_DOUBLE_EQ((mt::op::CastParams{.n = 100}.record(2.0)).bytes, 600.0);
}

TEST(CudaErrorFormat, NamesLibraryStatusCallAndShortFile) {
    EXPECT_EQ(
        format_gpu_error("CUDA", "cudaErrorInvalidValue", "invalid argument",
                         "cudaMemcpyAsync(dst, src, n)", "/home/x/src/kernels/cuda/foo.cu", 12),
        "CUDA error cudaErrorInvalidValue (invalid argument) in cudaMemcpyAsync(dst, src, n) "
        "at kernels/cuda/foo.cu:12");
    // No description (or the same as the name): no empty parentheses.
    EXPECT_EQ(format_gpu_error("cuBLAS", "CUBLAS_STATUS_INVALID_VALUE", "", "cublasLtMatmul(...)",
                               "matmul.cu", 7),
              "cuBLAS error CUBLAS_STATUS_INVALID_VALUE in cublasLtMatmul(...) at matmul.cu:7");
}

TEST(CudaErrorFormat, OutOfMemoryMessageSaysWhoAskedWhatIsFreeAndWhatToShrink) {
    std::array<size_t, 6> tracked{100u << 20, 100u << 20, 200u << 20, 0, 32u << 20, 1u << 20};
    const std::string msg = format_out_of_memory("activations", size_t(3) << 30, size_t(1) << 30,
                                                 size_t(80) << 30, tracked);
    EXPECT_NE(msg.find("category 'activations' asked for 3072.00 MiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("1024.00 MiB free of 81920.00 MiB total"), std::string::npos) << msg;
    EXPECT_NE(msg.find("optimizer 200.00 MiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tracked total 433.00 MiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("batch_size"), std::string::npos) << msg;
    EXPECT_NE(msg.find("recompute"), std::string::npos) << msg;
    EXPECT_EQ(format_mib(3u << 19), "1.50 MiB");
}

}  // namespace
}  // namespace mt
