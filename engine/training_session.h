// The training step, defined once. A TrainingSession owns everything one training run needs —
// the backend, the GPT, its AdamW, the batch source, the device input buffers, the PhaseTimer,
// the memory tracker and (profile.kernels) the per-op profiler — built from a RunConfig, and
// runs one step at a time. The loop around the step is engine/step_loop.h's StepLoop:
// `microtrain run` (experiment/runner.cpp), `microtrain train` (cli/training_run.cpp and the
// one-batch smoke test), `microtrain step` and bench/cpu_step all step through one, so they
// cannot drift apart, neither in the step nor in how a non-finite loss or a stop signal ends it.
//
// One step (DESIGN.md); for each micro-step m = 0 .. grad_accum-1 the first four phases repeat:
//   data      batches.next()                              host clock: the host waits for a batch
//   h2d       copy_to_device(inputs), (targets)           device events
//   forward   model.forward(.., grad_scale 1/accum)       device events; with accum > 1 the
//             micro-step's mean loss is reduced into its own device slot
//   backward  (m == 0: zero_grad) model.backward()        device events
//   comm      (data parallel) wait for the gradient buckets device events around the host wait
//   optimizer AdamW::step (global norm, clip, update)     device events
//             (ZeRO-1: then comm again for the all-gather of the parameters)
//   sync      loss (+ grad norm) read-back, synchronize   device events around the host wait
// Each phase boundary also resets/reads the allocator peaks and samples device memory (when
// memory tracking is on).
//
// run.cuda_graph (CUDA): the session's first step runs as above; at its second step the device
// work of forward, backward (every micro-step) and optimizer is captured into a CUDA graph
// (Backend::begin_capture / end_capture, a StepGraph), and from then on each step is
//   data, h2d  per micro-step, as above, each micro-batch into its own device slot
//   forward    AdamW's scalars staged, ONE graph replay: forward + backward + optimizer of
//              every micro-step (the host marks no boundary inside a graph, so backward and
//              optimizer are not phases of a replayed step; the report says so)
//   sync       as above
// Per step the host supplies the batch (copied into the slots the graph reads) and AdamW's lr
// and bias corrections (copied into the buffer its kernels read, AdamW::stage_device_scalars);
// everything else in the graph is fixed. The losses, grad norm and weights are bitwise those of
// the eager step (the same kernels in the same order). What needs the host inside the step is
// refused (spec.cpp, checked_cuda_graph): run.host_sync every_op / loss_every_step, shape
// jitter, offload, profile.kernels, data parallel. A capture that fails anyway is a BackendError
// naming the call, never a silent eager fallback. gradients_ready runs after the replay.
//
// Host synchronisation points (run.host_sync; each wait is counted and timed by the backend,
// Backend::host_sync_stats, into StepRecord::host_syncs / host_wait_ms):
//   step             (default) one wait at the end of the step, in `sync`: the loss (one
//                    read-back for all micro-steps: each reduced into its own device slot), the
//                    grad norm when clipping, a synchronize. Phase events are read after it.
//   loss_every_step  as naive code does with `loss.item()` after each forward: after every
//                    micro-step's forward the host reads that micro-step's loss, in its own
//                    `sync` interval, and stalls there until the device has finished the forward;
//                    the device then idles until the host has launched the backward's first
//                    kernels (that cost lands in `backward` and `other`). The step's end is as
//                    in `step` but the loss is not read again.
//   every_op         Backend::run synchronises after every op (naive debug code, or
//                    CUDA_LAUNCH_BLOCKING=1), then the step ends as in `step`: the device idles
//                    while the host launches each kernel, so the cost lands inside forward,
//                    backward and optimizer, not in `sync`.
//   none             no wait in the step: each micro-step's mean loss and the step's squared
//                    grad norm are reduced/copied into per-step device slots (the `sync` phase is
//                    that copy), the step's events are kept (PhaseTimer::end_step_deferred), and
//                    the host goes straight on to the next step. drain() reads a window of up to
//                    kHostSyncWindow steps back with one synchronisation: the StepLoop drains at
//                    the end of the warm-up, of the measured steps, of a full window and on a
//                    stop signal. A step's wall time is then on the device clock (PhaseTimer).
//                    Not with data parallel (its per-step loss all-reduce and stop agreement are
//                    host collectives), profile.kernels or data.pin_memory (spec.cpp refuses
//                    those), nor `microtrain train` (a CSV row with the loss every step).
// Waits per step (one rank): step 2, loss_every_step grad_accum + 1, every_op the step's ops + 2,
// none 0 (2 per window, counted in its last step); each +1 with clipping (the grad norm's
// read-back) except none. The loss and grad norm are bitwise the same in every mode (the same
// kernels on the same data; none adds one LossMean per micro-step with grad_accum 1, the model's
// own mean having no device address here, which computes the same float).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "distributed/grad_sync.h"
#include "distributed/world.h"
#include "engine/data.h"
#include "engine/memory.h"
#include "engine/profile.h"
#include "engine/run_config.h"
#include "engine/step_record.h"
#include "engine/timing.h"
#include "kernels/backend.h"
#include "kernels/cpu_cores.h"
#include "model/gpt.h"
#include "optim/adamw.h"

namespace mt {

// A run this machine cannot hold: a memory estimate beyond the memory the device has. Thrown
// before anything is allocated; the message gives the estimate by category, what the device
// has and what to shrink. `run` skips such a variant (like one that needs a GPU).
struct ResourceError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// The backend a RunConfig asks for on `kind`: its precision, kernel choices and thread count.
// Throws std::invalid_argument for run.threads outside 0..kMaxThreads.
std::unique_ptr<Backend> create_training_backend(const RunConfig& cfg, BackendKind kind);

// A CPU backend running more threads than this process may use (kernels/cpu_cores.h: the
// affinity mask capped by the cgroup quota): the extra threads take turns on the cores and every
// OpenMP barrier waits for the one the scheduler put aside, which can cost far more than the
// cores' share. The commands print it when a run starts and the report repeats it at the top;
// nullopt when the threads fit.
struct ThreadsBeyondCores {
    std::string what;  // "runs 8 threads on 2 usable cores (affinity mask: 2 CPUs)"
    std::string fix;   // why it is slow, and the run.threads that fits
};
std::optional<ThreadsBeyondCores> threads_beyond_cores(int threads, const UsableCores& cores);
// The same for a built backend: a CPU backend's threads (OpenMP's, as its constructor set them)
// against this process's usable cores; nullopt on any other backend.
std::optional<ThreadsBeyondCores> threads_beyond_cores(const Backend& backend);

// Throws ResourceError when the estimate of what `cfg` allocates on `backend` (params, grads,
// optimizer, activations, workspace, data) exceeds the memory the device has free (CPU:
// MemAvailable; CUDA: cudaMemGetInfo's free bytes), naming each category and what to shrink.
// `*estimate` (optional) receives the estimate. TrainingSession calls it before it allocates.
void check_memory_fits(const RunConfig& cfg, Backend& backend, MemoryEstimate* estimate = nullptr);

// What a session takes beyond the RunConfig; every field has the runner's default.
struct TrainingInputs {
    // Initial weights: empty = cfg.init_from's (load_pretrained), or without one
    // GPT::init_weights(cfg.run.seed); otherwise called once on the new model (e.g.
    // load_checkpoint from a safetensors file, a resumed run's own checkpoint) instead.
    std::function<void(GPT& model)> load_weights;
    // Batches: null = a DataLoader over cfg.data seeded with cfg.run.seed; otherwise this source,
    // whose batches must be (cfg.data.batch_size, cfg.data.seq_len) (T at most seq_len under
    // data.seq_len_jitter).
    std::unique_ptr<BatchSource> batches;
    // Sample memory at every phase boundary (MemoryTracker). Off where nobody reads the summary
    // (train, step, the bench), because each sample reads /proc on the CPU.
    bool track_memory = true;
    // Data parallel: the job's world (distributed/world.h). Null, or a world of one rank: one
    // process, exactly as without it. With several ranks each takes its slice of the global batch,
    // the gradients are all-reduced (dist.*) and the step's loss is the global batch's mean.
    World* world = nullptr;
};

class TrainingSession {
  public:
    // Takes the backend (create_training_backend), so a caller can probe the machine's peaks on
    // it before the model's buffers exist. Builds the model, its weights, the activations for
    // (B, T), AdamW, the batches, the device buffers and, when cfg.profile.kernels, the
    // KernelProfiler attached to the model; then synchronises. Throws what the parts throw, and
    // first, before any of its allocations, std::invalid_argument for data.workers outside
    // 0..kMaxDataWorkers and ResourceError when the memory estimate exceeds what the device has
    // (check_memory_fits).
    TrainingSession(std::unique_ptr<Backend> backend, const RunConfig& cfg,
                    TrainingInputs inputs = {});
    ~TrainingSession();
    TrainingSession(const TrainingSession&) = delete;
    TrainingSession& operator=(const TrainingSession&) = delete;

    // Called after the last micro-step's backward and before the optimizer, outside every phase:
    // the gradients of this step are complete (the `step` command copies the first ones). Under
    // run.cuda_graph, from the session's second step on, it is called after the replay instead
    // (no host code runs inside a graph): the gradients are still this step's, the parameters
    // already updated.
    using GradientsReady = std::function<void(GPT& model)>;

    // Runs step number `index` (0-based over warm-up + measured steps) and returns its record:
    // phase times, mean loss over the micro-steps, grad norm (0 without clipping), the LR used.
    // A warm-up step's per-op times are not accumulated into the profiler's table.
    // run.host_sync none: the step is enqueued and drained at once (one wait at its end).
    // One step on its own, with no policy around it (the tests' form); the commands step
    // through a StepLoop (engine/step_loop.h).
    StepRecord step(int index, bool warmup, const GradientsReady& gradients_ready = {});

    // The windowed form the StepLoop uses: enqueue_step runs a step's phases; drain() returns
    // the enqueued steps' records, complete, in order. Only run.host_sync none holds steps back
    // (drain then synchronises once for all of them); otherwise each step is complete when
    // enqueued and drain() waits for nothing. Call drain() at latest when drain_due().
    struct CompletedStep {
        StepRecord record;
        std::vector<PhaseInterval> intervals;  // the step's phases, for the trace
        // When the host began it (none: its place on the device's timeline, PhaseTimer).
        std::chrono::steady_clock::time_point host_start{};
    };
    void enqueue_step(int index, bool warmup, const GradientsReady& gradients_ready = {});
    std::vector<CompletedStep> drain();
    bool defers_read_back() const { return cfg_.run.host_sync == HostSync::none; }
    bool drain_due() const { return pending_.size() >= kHostSyncWindow; }
    // run.host_sync none: the most steps read back at once (their device slots and events).
    static constexpr size_t kHostSyncWindow = 64;

    // The phase running now, or the last one entered ("setup" before the first step): where a
    // failure happened, for the error message.
    const char* current_phase() const { return phase_name_; }

    // A forward pass over the last batch, outside every phase and unprofiled: after another
    // process ran (the interleaved rounds of experiment/rounds.h), this brings the weights back
    // into the caches and wakes the threads, so the next step's time is not a cold start. Changes
    // nothing the next step reads (its forward overwrites every activation and loss; weights,
    // moments and the data position are untouched). Nothing before the first step (no batch
    // yet), and nothing under run.offload (whose host arenas expect each forward's backward).
    void rewarm();

    // Ends memory tracking (process peak RSS) and returns the summary; detaches the profiler.
    MemorySummary finish();

    const RunConfig& config() const { return cfg_; }
    Backend& backend() { return *backend_; }
    GPT& model() { return model_; }
    const AdamW& optimizer() const { return optim_; }
    // Mutable: `train` saves and restores the moments and step count in its checkpoints.
    AdamW& optimizer() { return optim_; }
    const PhaseTimer& timer() const { return timer_; }
    // The per-op profiler (null unless cfg.profile.kernels).
    const KernelProfiler* profiler() const { return profiler_.get(); }
    KernelProfiler* profiler() { return profiler_.get(); }
    size_t n_params() const { return model_.parameter_table().total_count(); }
    // Data parallel: the world size (1 without), and the synchroniser (null on one rank).
    int world_size() const { return world_size_; }
    const GradientSync* gradient_sync() const { return grad_sync_.get(); }
    // Data parallel: the simulated link's bandwidth from the next step on (see GradientSync).
    void set_simulated_link_gbps(double gbps) {
        if (grad_sync_) grad_sync_->set_simulated_link_gbps(gbps);
    }
    const Collectives* collectives() const { return collectives_.get(); }
    // Data parallel, on every rank at once, before the first step: the bus bandwidth (GB/s) of
    // an all-reduce of the first min(grads, max_bytes) bytes of the gradient buffer over the real
    // transport (no simulated link), best of 3 after a warm-up. 0 on one rank.
    double probe_all_reduce_gbps(size_t max_bytes);
    // Analytic model FLOPs of one step: forward + backward over all grad_accum micro-steps, at
    // data.seq_len (under data.seq_len_jitter each step's StepRecord::model_flops has its own).
    double flops_per_step() const;

  private:
    // The phases of one step; the record is complete except under run.host_sync none.
    StepRecord run_step(int index, bool warmup, const GradientsReady& gradients_ready);
    void run_eager_step(StepRecord& rec, const GradientsReady& gradients_ready);
    int micro_step(int m);        // returns the micro-batch's length T
    int load_micro_batch(int m);  // data + h2d; returns T
    void forward_micro_step(int m, int T);
    void backward_micro_step(int m);
    int* inputs_slot(int m) const;
    int* targets_slot(int m) const;
    // Device slots of micro-batches: one each under run.cuda_graph, else one shared.
    int batch_slots() const { return cfg_.run.cuda_graph ? accum_ : 1; }
    // run.cuda_graph: the step replayed (captured at the session's second step).
    void run_graph_step(StepRecord& rec, const GradientsReady& gradients_ready);
    void capture_step_graph();
    // run.host_sync (see the top of this file): where each micro-step's loss goes and when it
    // is read; the end of the step (sync phase, timer).
    float* loss_slot(int m) const;  // the device float micro-step m's mean loss goes to
    void read_micro_step_loss(int m);
    double read_back_loss();
    double mean_loss(const float* losses) const;  // of the accum micro-step losses, in double
    void end_step(StepRecord& rec, bool warmup);
    void end_step_deferred(StepRecord& rec);
    // Adds the backend's host waits since syncs_at_step_start_ to the record.
    void count_host_syncs(StepRecord& rec) const;
    void optimizer_step_data_parallel(StepRecord& rec);
    void enter(Phase p);
    void leave(Phase p);

    RunConfig cfg_;
    int B_, T_, accum_;
    std::unique_ptr<Backend> backend_;
    std::unique_ptr<MemoryTracker> memory_;  // null when not tracking
    GPT model_;
    // Data parallel (world_size_ > 1): the transport and the gradient synchroniser, built before
    // the optimizer, whose ZeRO-1 shard is the synchroniser's pieces of this rank.
    World* world_ = nullptr;
    int world_size_ = 1;
    std::unique_ptr<Collectives> collectives_;
    std::unique_ptr<GradientSync> grad_sync_;
    // optim.offload: the CPU backend that runs AdamW on the host (null otherwise).
    std::unique_ptr<Backend> host_backend_;
    AdamW optim_;
    std::unique_ptr<BatchSource> batches_;
    DeviceBuffer d_inputs_, d_targets_;
    // With accumulation, each micro-step's mean loss is reduced on the device into its own slot,
    // so the step's loss needs one read-back, not one sync per micro-step.
    DeviceBuffer d_losses_;
    std::vector<float> h_losses_;
    // run.host_sync none: per pending step (accum losses, then the squared grad norm), read back
    // by drain(); the steps enqueued but not drained; the host-sync count when the step began.
    DeviceBuffer d_step_scalars_;
    std::vector<CompletedStep> pending_;
    Backend::HostSyncStats syncs_at_step_start_;
    std::unique_ptr<KernelProfiler> profiler_;
    PhaseTimer timer_;
    int last_T_ = 0;     // the length of the last micro-batch copied to d_inputs_ (0: none yet)
    int steps_run_ = 0;  // steps this session ran (run.cuda_graph captures at 1)
    std::unique_ptr<StepGraph> graph_;  // run.cuda_graph: the captured step (null before)
    const char* phase_name_ = "setup";
};

}  // namespace mt
