// run.cuda_graph in an experiment file: the step's device work captured into a CUDA graph once
// and replayed. A graph is a fixed list of kernels with fixed shapes that the device runs
// without the host, so the spec refuses, at validation and naming the key that set it, every
// knob that makes the step uncapturable: the CPU backend, host waits inside the step
// (run.host_sync every_op / loss_every_step), shape jitter, offload (activations, optimizer),
// the per-op profile, and fewer than two warm-up steps (the eager step and the capture).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "experiment/spec.h"
#include "tests/test_util.h"

using namespace mt;

namespace {

// The SpecError message of `yaml` loaded as exp.yaml ("" when it loaded).
std::string error_of(const std::string& yaml) {
    return load_error_of<SpecError>(yaml, [](const std::string& p) { load_experiment(p, {}); });
}

const char* kBase = "name: graph\nmodel: { preset: tiny }\ndata: { batch_size: 2, seq_len: 16 }\n";

bool has(const std::string& msg, const std::string& part) {
    return msg.find(part) != std::string::npos;
}

}  // namespace

TEST(SpecCudaGraph, DefaultsOffAndParses) {
    const TempDir dir("mt_spec_cuda_graph");
    const std::string p = dir.file("exp.yaml");
    std::ofstream(p) << kBase
                     << "variants:\n  - name: eager\n  - name: graph\n"
                        "    set: { run.cuda_graph: true }\n";
    const ExperimentSpec spec = load_experiment(p, {});
    ASSERT_EQ(spec.variants.size(), 2u);
    EXPECT_FALSE(spec.variants[0].run.cuda_graph);
    EXPECT_TRUE(spec.variants[1].run.cuda_graph);
    // The one knob the variant changed, as the report's configuration names it.
    EXPECT_EQ(spec.variants[1].changed.size(), 1u);
    EXPECT_EQ(spec.variants[1].changed.count("run.cuda_graph"), 1u);
    // Printed with every key, and a CUDA-only feature (a CPU machine skips the variant).
    bool printed = false;
    for (const auto& [k, v] : flatten(spec.variants[1]))
        if (k == "run.cuda_graph") printed = v == "true";
    EXPECT_TRUE(printed);
    const std::vector<std::string> cuda = cuda_only_features(spec.variants[1]);
    EXPECT_NE(std::find(cuda.begin(), cuda.end(), "run.cuda_graph true"), cuda.end());
    EXPECT_TRUE(cuda_only_features(spec.variants[0]).empty());
}

TEST(SpecCudaGraph, ValidatesOnAutoAndCuda) {
    EXPECT_EQ(error_of(std::string(kBase) + "run: { cuda_graph: true }\n"), "");
    EXPECT_EQ(error_of(std::string(kBase) +
                       "backend: cuda\nrun: { cuda_graph: true, host_sync: none, grad_accum: 2 }\n"
                       "optim: { schedule: cosine, warmup_steps: 2, decay_steps: 10 }\n"),
              "");
}

TEST(SpecCudaGraph, TheCpuBackendIsRefused) {
    const std::string msg =
        error_of(std::string(kBase) + "backend: cpu\nrun: { cuda_graph: true }\n");
    EXPECT_TRUE(has(msg, "exp.yaml:")) << msg;
    EXPECT_TRUE(has(msg,
                    "key 'run.cuda_graph': run.cuda_graph: true captures the step's device "
                    "work into a CUDA graph"))
        << msg;
    EXPECT_TRUE(has(msg, "expected backend: cuda (or auto), got backend: cpu")) << msg;
    EXPECT_TRUE(has(msg, "use backend: cuda, or remove run.cuda_graph")) << msg;
}

TEST(SpecCudaGraph, AVariantThatMovesToTheCpuIsBlamed) {
    const std::string msg = error_of(std::string(kBase) +
                                     "run: { cuda_graph: true }\nvariants:\n  - name: gpu\n"
                                     "  - name: cpu\n    set: { backend: cpu }\n");
    EXPECT_TRUE(has(msg, "key 'backend' (variant 'cpu'): run.cuda_graph: true")) << msg;
}

TEST(SpecCudaGraph, HostSyncEveryOpAndLossEveryStepAreRefused) {
    std::string msg =
        error_of(std::string(kBase) + "run: { cuda_graph: true, host_sync: every_op }\n");
    EXPECT_TRUE(has(msg, "expected run.host_sync: step or none, got every_op")) << msg;
    EXPECT_TRUE(has(msg, "after every op inside the step")) << msg;
    msg = error_of(std::string(kBase) +
                   "run: { cuda_graph: true }\nvariants:\n  - name: a\n  - name: naive\n"
                   "    set: { run.host_sync: loss_every_step }\n");
    EXPECT_TRUE(has(msg, "key 'run.host_sync' (variant 'naive')")) << msg;
    EXPECT_TRUE(has(msg, "got loss_every_step")) << msg;
}

TEST(SpecCudaGraph, ShapeJitterIsRefused) {
    const std::string msg = error_of(
        "name: graph\nmodel: { preset: tiny }\n"
        "data: { batch_size: 2, seq_len: 16, seq_len_jitter: 0.5 }\n"
        "variants:\n  - name: graph\n"
        "    set: { run.cuda_graph: true }\n");
    EXPECT_TRUE(has(msg, "key 'run.cuda_graph' (variant 'graph')")) << msg;
    EXPECT_TRUE(has(msg, "expected data.seq_len_jitter: 0, got 0.5")) << msg;
    EXPECT_TRUE(has(msg, "keep the shapes they were captured with")) << msg;
}

TEST(SpecCudaGraph, OffloadIsRefused) {
    std::string msg =
        error_of(std::string(kBase) + "run: { cuda_graph: true, offload: activations }\n");
    EXPECT_TRUE(has(msg, "expected run.offload: none, got activations")) << msg;
    msg = error_of(std::string(kBase) + "run: { cuda_graph: true }\noptim: { offload: true }\n");
    EXPECT_TRUE(has(msg, "expected optim.offload: false, got true")) << msg;
    EXPECT_TRUE(has(msg, "runs on the host's CPU")) << msg;
}

TEST(SpecCudaGraph, TheKernelProfileIsRefused) {
    const std::string msg =
        error_of(std::string(kBase) + "run: { cuda_graph: true }\nprofile: { kernels: true }\n");
    EXPECT_TRUE(has(msg, "expected profile.kernels: false, got true")) << msg;
    EXPECT_TRUE(has(msg, "a replay launches no op from the host")) << msg;
}

TEST(SpecCudaGraph, FewerThanTwoWarmupStepsAreRefused) {
    const std::string msg =
        error_of(std::string(kBase) + "run: { cuda_graph: true, warmup_steps: 1 }\n");
    EXPECT_TRUE(has(msg, "expected run.warmup_steps >= 2, got 1")) << msg;
    EXPECT_TRUE(has(msg, "the second captures the graph")) << msg;
    EXPECT_TRUE(has(msg, "set run.warmup_steps: 2 or more")) << msg;
}
