// RunConfig: the fully-resolved configuration of one variant of an experiment (the base config
// with the variant's `set:` overrides applied). ExperimentSpec (experiment/spec.h) produces one per
// variant; the runner consumes it. Field names match the YAML keys (section.key).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/synthetic.h"
#include "kernels/backend.h"
#include "model/gpt.h"
#include "optim/adamw.h"

namespace mt {

enum class BackendChoice { cpu, cuda, auto_ };
enum class DataSource { synthetic, tokens, text };
template <>
struct EnumSpelling<BackendChoice> {
    static constexpr std::array<std::string_view, 3> names{"cpu", "cuda", "auto"};
};
template <>
struct EnumSpelling<DataSource> {
    static constexpr std::array<std::string_view, 3> names{"synthetic", "tokens", "text"};
};

// run.host_sync: where a training step makes the host wait for the device
// (engine/training_session.h says exactly what each does). `step` is the default: one wait at the
// end of the step.
enum class HostSync { step, every_op, loss_every_step, none };
template <>
struct EnumSpelling<HostSync> {
    static constexpr std::array<std::string_view, 4> names{"step", "every_op", "loss_every_step",
                                                           "none"};
};

// Bounds of what a run creates, checked by the spec's key table (experiment/spec.cpp) and, for a
// config that did not come through it, by the TrainingSession (engine/training_session.cpp):
// data.workers loader threads here, the CPU threads of run.threads / --threads in
// kernels/types.h (kMaxThreads).
inline constexpr int kMaxDataWorkers = 256;
// run.rounds: more rounds than this adds nothing a report can use (each holds at least one
// measured step of every variant) and only multiplies the slices' start-up cost.
inline constexpr int kMaxRounds = 1000;

struct DataConfig {
    DataSource source = DataSource::synthetic;
    std::string path;  // tokens / text file (relative paths resolve against the YAML's dir)
    SyntheticKind synthetic = SyntheticKind::markov;  // source synthetic: learnable or uniform
    int batch_size = 4;                               // B
    int seq_len = 64;                                 // T
    int workers = 0;          // background loader threads; 0 = load synchronously in the step
    int prefetch = 2;         // ring size of ready batches when workers > 0
    bool pin_memory = false;  // pinned host batches (CUDA only; ignored on CPU with a note)
    int preprocess_us = 0;    // SIMULATED per-sample CPU work, to reproduce a data-bound step
    // Validation split (microtrain train): the last val_fraction of the windows are held out
    // (the loader then trains on the rest), or a separate file of the same source kind.
    float val_fraction = 0.0f;
    std::string val_path;
    // Shape jitter: batch i is seq_len_i tokens long, drawn (a pure function of run.seed and i)
    // uniformly from [ceil((1 - j) * seq_len), seq_len]; 0 = every batch is seq_len long.
    float seq_len_jitter = 0.0f;
    // Sample cache: each window's prepared tokens (after preprocess_us) are kept in host memory
    // after their first use, so a window visited again (the next epoch) is not prepared again.
    bool cache = false;
};

struct RunSettings {
    uint64_t seed = 1337;
    int warmup_steps = 3;
    int measure_steps = 20;
    // The measured steps of every variant are taken in this many interleaved rounds: in each
    // round every variant runs its slice of them, in an order shuffled per round from the seed
    // (experiment/rounds.h). The same for every variant (the experiment's schedule). 1: the
    // variants run one after another, as before rounds existed.
    int rounds = 5;
    Precision precision = Precision::fp32;
    Recompute recompute = Recompute::none;
    int grad_accum = 1;
    int threads = 0;                      // CPU threads (0 = all cores)
    HostSync host_sync = HostSync::step;  // where the step waits for the device
    // Saved activations in pinned host memory between forward and backward (CUDA only;
    // model/activation_offload.h).
    OffloadMode offload = OffloadMode::none;
    // run.cuda_graph (CUDA only): the device work of a step (forward, backward, optimizer of
    // every micro-step) is captured into a CUDA graph once, at the second step, and replayed
    // every step after it: one launch instead of one per kernel (engine/training_session.h).
    bool cuda_graph = false;
};

// Data parallel (distributed/, `mpirun -np N microtrain run FILE`): how the gradients travel. Every
// key is a one-knob variant; on one rank they change nothing.
// dist.simulate_link_gbps's bounds when nonzero: 10 Mbit/s stretches a 25 MiB bucket to 21 s
// (slower only hangs a run, and 1e-30 would overflow the clock into no delay at all); above
// 1e6 Gbit/s the delay is below any clock's resolution, so it simulates nothing.
inline constexpr double kMinSimulatedLinkGbps = 0.01;
inline constexpr double kMaxSimulatedLinkGbps = 1e6;

struct DistConfig {
    float bucket_mb = 25;  // gradients reduced in buckets of about this size (MiB), in the
                           // order backward produces them (PyTorch DDP's default is 25)
    bool overlap = true;   // start a bucket's reduction as soon as backward has produced it
    int zero = 0;          // ZeRO stage: 0, or 1 (AdamW state sharded across the ranks)
    // A SIMULATED slow interconnect: each collective is stretched to latency + bytes / link
    // (0 = off), so a communication-bound step can be studied on one machine.
    float simulate_link_gbps = 0;   // link bandwidth in Gbit/s: 0, or in the bounds below
    float simulate_latency_us = 0;  // per-collective latency in microseconds
    // Or a link scaled to the machine: after the warm-up, the bandwidth at which one step's
    // gradient traffic takes this many times the last warm-up step's forward + backward (the
    // slowest rank's), so a lab's comm-bound lesson holds on any machine (0 = off).
    float simulate_link_ratio = 0;
    float timeout_s = 120;  // every wait for another rank gives up after this
};

struct ProfileConfig {
    bool kernels = false;  // per-op timing with FLOPs/bytes
    bool trace = true;     // write trace.json (a few steps)
    int trace_steps = 3;
};

struct RunConfig {
    std::string variant;  // variant name
    BackendChoice backend = BackendChoice::auto_;
    std::string model_preset;  // empty when explicit dims were given
    GPTConfig model;
    // model.init_from: the weights the run starts from (checkpoint/pretrained.h: a train
    // checkpoint, nanoGPT weights, a Hugging Face GPT-2); `model` is then the file's. Empty:
    // random weights from run.seed. A resumed `train` run takes its own checkpoint instead.
    std::string init_from;
    DataConfig data;
    AdamWConfig optim;
    RunSettings run;
    KernelChoice kernels;
    ProfileConfig profile;
    DistConfig dist;
    // model.lora, model.quantize_frozen, optim.freeze: which parameters train, how the frozen
    // ones are stored.
    TrainableOptions trainable;
    // The dotted keys this variant changes against the baseline variant (compare.baseline), with
    // their values as text (e.g. {"run.precision", "bf16"}). Empty for the baseline, and for an
    // A/A control (the baseline's config under another name).
    std::map<std::string, std::string> changed;
};

}  // namespace mt
