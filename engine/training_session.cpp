// The training step, defined once (see training_session.h).
#include "engine/training_session.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "checkpoint/pretrained.h"
#include "engine/cpu_load.h"
#include "engine/signals.h"
#include "kernels/collectives.h"
#include "kernels/cpu_cores.h"

namespace mt {
namespace {

// The CPU backend's threads: run.threads when given; unset (0), the cores this process may use
// (kernels/cpu_cores.h: the affinity mask capped by the cgroup quota, which libgomp's own default
// ignores), unless OMP_NUM_THREADS sets them: the user's OpenMP setting is kept.
int cpu_threads_for(const RunConfig& cfg) {
    if (cfg.run.threads > 0 || std::getenv("OMP_NUM_THREADS")) return cfg.run.threads;
    return usable_cpu_cores().count;
}

ModelOptions model_options(const RunConfig& cfg) {
    ModelOptions mo;
    mo.recompute = cfg.run.recompute;
    mo.trainable = cfg.trainable;
    mo.offload = cfg.run.offload;
    return mo;
}

// optim.offload: AdamW's update runs on the host, on a CPU backend with the run's threads.
std::unique_ptr<Backend> host_optimizer_backend(const RunConfig& cfg) {
    if (!cfg.optim.offload) return nullptr;
    BackendOptions bo;
    bo.num_threads = cpu_threads_for(cfg);
    return create_backend(BackendKind::cpu, bo);
}

// Gives the new model its initial weights and its activations for (B, T); returns it so that
// the optimizer, the next member, is built on a model that is ready.
GPT& prepare_model(GPT& model, const RunConfig& cfg, const TrainingInputs& inputs) {
    if (inputs.load_weights)
        inputs.load_weights(model);
    else if (!cfg.init_from.empty())
        load_pretrained(inspect_pretrained(cfg.init_from), model, cfg.run.seed);
    else
        model.init_weights(cfg.run.seed);
    model.allocate_activations(cfg.data.batch_size, cfg.data.seq_len);
    return model;
}

std::string fmt_bytes(double b) {
    char buf[32];
    if (b >= 1024.0 * 1024.0 * kMiB)
        std::snprintf(buf, sizeof buf, "%.2f TiB", b / (1024.0 * 1024.0 * kMiB));
    else if (b >= 1024.0 * kMiB)
        std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * kMiB));
    else
        std::snprintf(buf, sizeof buf, "%.1f MiB", to_mib(b));
    return buf;
}

// What to shrink, for the categories that dominate the estimate.
// `cache`: the sample cache's bytes where they count against this memory (the CPU), else 0.
std::string shrink_advice(const RunConfig& cfg, const MemoryEstimate& e, size_t cache) {
    const size_t state = e.params + e.grads + e.optimizer;
    std::string a;
    if (cache > 0 && cache >= e.activations && cache >= state)
        return "set data.cache: false (the sample cache holds every window of the data's "
               "training part: " +
               fmt_bytes(static_cast<double>(cache)) + "), or use a shorter data file";
    if (e.activations + e.workspace + e.data >= state) {
        a = "lower data.batch_size (" + std::to_string(cfg.data.batch_size) +
            ") or data.seq_len (" + std::to_string(cfg.data.seq_len) +
            "): activations grow with both (run.grad_accum keeps the effective batch)";
        if (cfg.run.recompute != Recompute::layernorm_gelu)
            a += ", or set run.recompute: layernorm_gelu";
        if (cfg.run.offload == OffloadMode::none) a += ", or (CUDA) run.offload: activations";
        a += ", or use a smaller model";
    } else {
        a = "use a smaller model (n_layer, n_embd or a smaller preset): parameters, their "
            "gradients and the AdamW moments take " +
            fmt_bytes(static_cast<double>(state)) + " whatever the batch size" +
            (cfg.optim.offload ? ""
                               : "; or (CUDA) optim.offload: true moves the moments to host "
                                 "memory");
    }
    return a;
}

// Loader workers are threads the session creates: bounded like the spec bounds data.workers.
const RunConfig& checked_workers(const RunConfig& cfg) {
    if (cfg.data.workers < 0 || cfg.data.workers > kMaxDataWorkers)
        throw std::invalid_argument(
            "data.workers must be in 0.." + std::to_string(kMaxDataWorkers) +
            " (loader threads; 0 = load in the step), got " + std::to_string(cfg.data.workers));
    return cfg;
}

// The session's backend, once the run is known to fit in its memory.
std::unique_ptr<Backend> fitting(std::unique_ptr<Backend> backend, const RunConfig& cfg) {
    if (!backend) throw std::invalid_argument("TrainingSession: no backend");
    check_memory_fits(cfg, *backend);
    return backend;
}

// run.host_sync none leaves steps running on the device while the host goes on: refused where
// something reads the device every step (the spec refuses profile.kernels and data.pin_memory
// first, with the file's position; this guards a RunConfig built in code).
const RunConfig& checked_host_sync(const RunConfig& cfg, const TrainingInputs& inputs) {
    if (cfg.run.host_sync != HostSync::none) return cfg;
    const std::string why =
        "run.host_sync: none (no host wait in the step) cannot be combined with ";
    if (inputs.world && inputs.world->distributed())
        throw std::invalid_argument(
            why +
            "data parallel: every step all-reduces the loss and agrees on a stop signal on "
            "the host; use run.host_sync: step under mpirun");
    if (cfg.profile.kernels)
        throw std::invalid_argument(why +
                                    "profile.kernels: true (per-op events are read after "
                                    "every step's synchronisation)");
    if (cfg.data.pin_memory)
        throw std::invalid_argument(why +
                                    "data.pin_memory: true (a pending asynchronous copy "
                                    "would race with the loader refilling the batch)");
    return cfg;
}

// run.cuda_graph: the step is captured into a graph the device replays without the host; what
// makes the host take part inside the step is refused (the spec refuses each knob first, with
// the file's position; this guards a RunConfig built in code, and data parallel, which only a
// run knows).
const RunConfig& checked_cuda_graph(const RunConfig& cfg, const TrainingInputs& inputs) {
    if (!cfg.run.cuda_graph) return cfg;
    const std::string why =
        "run.cuda_graph: true (the step replayed as one CUDA graph) cannot be "
        "combined with ";
    auto refuse = [&](const std::string& what) { throw std::invalid_argument(why + what); };
    if (inputs.world && inputs.world->distributed())
        refuse(
            "data parallel: the gradient buckets are reduced by a host thread that waits on "
            "events mid-backward, and the step's loss is all-reduced on the host; run "
            "without mpirun, or with run.cuda_graph: false");
    if (cfg.run.host_sync == HostSync::every_op || cfg.run.host_sync == HostSync::loss_every_step)
        refuse(std::string("run.host_sync: ") + to_string(cfg.run.host_sync) +
               " (host waits inside the step)");
    if (cfg.data.seq_len_jitter > 0) refuse("data.seq_len_jitter (a shape per batch)");
    if (cfg.run.offload != OffloadMode::none || cfg.optim.offload)
        refuse("offload (host copies and a host update inside the step)");
    if (cfg.profile.kernels) refuse("profile.kernels (per-op events from the host)");
    return cfg;
}

World* data_parallel_world(const TrainingInputs& inputs) {
    return inputs.world && inputs.world->distributed() ? inputs.world : nullptr;
}

// The transport of a data-parallel session: NCCL on a CUDA backend, MPI on host memory for the
// CPU backend (create_device_collectives returns null there).
std::unique_ptr<Collectives> make_collectives(World* world, Backend& backend,
                                              const RunConfig& cfg) {
    if (!world) return nullptr;
    const double timeout = cfg.dist.timeout_s;
    auto broadcast = [world, timeout](void* data, size_t bytes) {
        world->broadcast(data, bytes, timeout, "the NCCL unique id");
    };
    if (auto device =
            create_device_collectives(backend, world->rank(), world->size(), broadcast, timeout))
        return device;
    return world->host_collectives(timeout);
}

std::unique_ptr<GradientSync> make_grad_sync(Collectives* coll, GPT& model, const RunConfig& cfg) {
    if (!coll) return nullptr;
    GradientSyncOptions o;
    o.bucket_mb = cfg.dist.bucket_mb;
    o.overlap = cfg.dist.overlap;
    o.zero = cfg.dist.zero;
    o.simulate_link_gbps = cfg.dist.simulate_link_gbps;
    o.simulate_latency_us = cfg.dist.simulate_latency_us;
    o.timeout_s = cfg.dist.timeout_s;
    std::vector<FlatRange> order;
    for (const auto& r : model.gradient_ready_order()) order.push_back({r.offset, r.count});
    auto sync = std::make_unique<GradientSync>(*coll, o, order);
    model.set_gradient_ready_hook(
        [s = sync.get()](size_t offset, size_t count) { s->gradients_ready(offset, count); });
    return sync;
}

// ZeRO-1: this rank updates its pieces; the norm is always cut into every rank's pieces.
AdamWPartition partition_of(const GradientSync* sync, const RunConfig& cfg) {
    AdamWPartition p;
    if (!sync) return p;
    if (cfg.dist.zero == 1)
        for (const FlatRange& r : sync->owned_ranges()) p.owned.push_back({r.offset, r.count});
    p.norm_pieces = sync->all_pieces().size();
    return p;
}

// The parameters AdamW updates: the trainable ones (all but model.lora's base or optim.freeze's
// names).
size_t n_params_of(const RunConfig& cfg) {
    return ParameterTable(cfg.model, cfg.trainable).trainable_count();
}

}  // namespace

void check_memory_fits(const RunConfig& cfg, Backend& backend, MemoryEstimate* estimate) {
    MemoryEstimate e = GPT::estimate_memory(cfg.model, model_options(cfg), cfg.data.batch_size,
                                            cfg.data.seq_len, backend);
    // ZeRO-1 over the job's ranks: each holds about 1/N of the AdamW moments.
    const World& w = World::current();
    if (cfg.dist.zero == 1 && w.distributed())
        e.optimizer =
            (e.optimizer + static_cast<size_t>(w.size()) - 1) / static_cast<size_t>(w.size());
    // The sample cache (data.cache) is host memory under `data`: on the CPU it competes with
    // everything else, on a GPU with the host's memory only.
    const size_t cache = sample_cache_bytes(cfg.data, w.size());
    e.data += cache;
    // optim.offload: no moments on the device; they, a master copy of the weights and the
    // gradient staging buffer are pinned host memory (tracked under `data`).
    if (cfg.optim.offload) {
        const size_t host = OptimizerOffload::host_bytes(n_params_of(cfg));
        e.optimizer = 0;
        e.data += host;
        e.host_pinned += host;
    }
    if (estimate) *estimate = e;
    const bool cpu = backend.kind() == BackendKind::cpu;
    auto b = [](size_t x) { return fmt_bytes(static_cast<double>(x)); };
    if (const size_t host = host_available_bytes(); !cpu && cache > 0 && host > 0 && cache > host)
        throw ResourceError("does not fit in host memory: the sample cache (data.cache) of " +
                            b(cache) + " exceeds the " + b(host) +
                            " of host memory available (MemAvailable); refused before "
                            "allocating anything. To fit: set data.cache: false, or use a "
                            "shorter data file (the cache holds every window of its training "
                            "part)");
    // The device holds what is not host memory: pinned arenas (offload) and the sample cache.
    const size_t device_need = cpu ? e.total() : e.device_total() - cache;
    const DeviceMemoryInfo info = backend.device_memory_info();
    if (!info.available || info.free_bytes == 0 || device_need <= info.free_bytes) return;
    throw ResourceError(
        "does not fit in memory: an estimated " + b(device_need) + " needed, " +
        b(info.free_bytes) + " available " +
        (cpu ? "on the CPU (MemAvailable within any container limit, of " + b(info.total_bytes) +
                   " RAM)"
             : "on " + backend.device_name() + " (free, of " + b(info.total_bytes) + ")") +
        "; estimate for " + cfg.model.describe() + " at B" + std::to_string(cfg.data.batch_size) +
        " T" + std::to_string(cfg.data.seq_len) + ": params " + b(e.params) + ", grads " +
        b(e.grads) + ", optimizer " + b(e.optimizer) + ", activations " + b(e.activations) +
        ", workspace " + b(e.workspace) + ", data " + b(e.data) +
        (cache == 0 ? std::string()
                    : " (the sample cache " + b(cache) +
                          (cpu ? ")" : ", host memory: not counted against the device)")) +
        "; refused before allocating anything. To fit: " + shrink_advice(cfg, e, cpu ? cache : 0));
}

std::unique_ptr<Backend> create_training_backend(const RunConfig& cfg, BackendKind kind) {
    if (const std::string e = thread_count_error("threads", cfg.run.threads); !e.empty())
        throw std::invalid_argument(e);
    BackendOptions bo;
    bo.precision = cfg.run.precision;
    bo.kernels = cfg.kernels;
    bo.num_threads = kind == BackendKind::cpu ? cpu_threads_for(cfg) : cfg.run.threads;
    // Data parallel on CUDA: one GPU per rank, the rank's index on its node picks it (a node
    // with fewer GPUs than ranks is refused by the backend, naming the device count).
    if (const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
        local && kind == BackendKind::cuda && World::current().distributed())
        bo.device_index = std::atoi(local);
    return create_backend(kind, bo);
}

std::optional<ThreadsBeyondCores> threads_beyond_cores(int threads, const UsableCores& cores) {
    if (threads <= cores.count) return std::nullopt;
    const std::string n = std::to_string(cores.count);
    return ThreadsBeyondCores{
        "runs " + std::to_string(threads) + " threads on " + n + " usable core" +
            (cores.count == 1 ? "" : "s") + " (" + cores.source + ")",
        "the extra threads take turns on the cores, and every barrier waits for the one "
        "descheduled: unset `run.threads` (it defaults to the usable cores) or set it to " +
            n + " or fewer"};
}

std::optional<ThreadsBeyondCores> threads_beyond_cores(const Backend& backend) {
    if (backend.kind() != BackendKind::cpu) return std::nullopt;
    return threads_beyond_cores(omp_get_max_threads(), usable_cpu_cores());
}

TrainingSession::TrainingSession(std::unique_ptr<Backend> backend, const RunConfig& cfg,
                                 TrainingInputs inputs)
    : cfg_(checked_cuda_graph(checked_host_sync(checked_workers(cfg), inputs), inputs)),
      B_(cfg.data.batch_size),
      T_(cfg.data.seq_len),
      accum_(cfg.run.grad_accum),
      backend_(fitting(std::move(backend), cfg)),
      memory_(inputs.track_memory ? std::make_unique<MemoryTracker>(*backend_) : nullptr),
      model_(*backend_, cfg.model, model_options(cfg)),
      world_(data_parallel_world(inputs)),
      world_size_(world_ ? world_->size() : 1),
      collectives_(make_collectives(world_, *backend_, cfg)),
      grad_sync_(make_grad_sync(collectives_.get(), model_, cfg)),
      host_backend_(host_optimizer_backend(cfg)),
      optim_(prepare_model(model_, cfg, inputs), cfg.optim, partition_of(grad_sync_.get(), cfg),
             host_backend_.get()),
      batches_(inputs.batches ? std::move(inputs.batches)
                              : std::make_unique<DataLoader>(
                                    cfg.data, cfg.model.vocab_size, cfg.run.seed, backend_.get(),
                                    DataLoaderOptions{.rank = world_ ? world_->rank() : 0,
                                                      .world = world_size_})),
      timer_(*backend_) {
    if (accum_ < 1)
        throw std::invalid_argument("run.grad_accum must be >= 1, got " + std::to_string(accum_));
    // run.cuda_graph: one replay runs every micro-step, so each micro-batch needs its own slot,
    // filled before the replay; otherwise the micro-batches take turns in one.
    const size_t n = static_cast<size_t>(B_) * T_ * batch_slots();
    d_inputs_ = DeviceBuffer(*backend_, n * sizeof(int), MemoryCategory::data);
    d_targets_ = DeviceBuffer(*backend_, n * sizeof(int), MemoryCategory::data);
    if (accum_ > 1 || cfg.run.cuda_graph)
        d_losses_ = DeviceBuffer(*backend_, accum_ * sizeof(float), MemoryCategory::workspace);
    if (cfg.run.cuda_graph) optim_.keep_scalars_on_device();
    h_losses_.resize(static_cast<size_t>(accum_));
    if (cfg.profile.kernels) {
        profiler_ = std::make_unique<KernelProfiler>(*backend_);
        backend_->set_op_observer(profiler_.get());
    }
    if (defers_read_back()) {
        // A window's scalars: per step, accum micro-step losses then the squared grad norm.
        const size_t row = static_cast<size_t>(accum_) + 1;
        d_step_scalars_ = DeviceBuffer(*backend_, kHostSyncWindow * row * sizeof(float),
                                       MemoryCategory::workspace);
        backend_->memset_zero(d_step_scalars_.get(), d_step_scalars_.bytes());
        // Device events per step: start, end, h2d/forward/backward per micro-step, optimizer,
        // sync (two each): created now, not inside a measured step.
        const int longest = std::max({1, cfg.run.warmup_steps, cfg.run.measure_steps});
        timer_.reserve_events(std::min(kHostSyncWindow, static_cast<size_t>(longest)),
                              2 + 6 * static_cast<size_t>(accum_) + 4);
    }
    backend_->synchronize();
    if (memory_) memory_->setup_done();
    backend_->set_sync_after_every_op(cfg.run.host_sync == HostSync::every_op);
}

TrainingSession::~TrainingSession() {
    // The profiler dies with the session; the model must not call it after that.
    backend_->set_op_observer(nullptr);
    model_.set_gradient_ready_hook({});  // nor the synchroniser
}

double TrainingSession::flops_per_step() const {
    return model_.training_flops_per_step(B_, T_) * accum_;
}

void TrainingSession::enter(Phase p) {
    phase_name_ = to_string(p);
    if (memory_) memory_->phase_begin(p);
    timer_.begin(p);
}

void TrainingSession::leave(Phase p) {
    timer_.end(p);
    if (memory_) memory_->phase_end(p);
}

// data -> h2d -> forward -> backward for micro-batch m of the step.
// Returns the micro-batch's length T (data.seq_len, or shorter under data.seq_len_jitter).
int TrainingSession::micro_step(int m) {
    const int T = load_micro_batch(m);
    enter(Phase::forward);
    forward_micro_step(m, T);
    leave(Phase::forward);
    if (cfg_.run.host_sync == HostSync::loss_every_step) read_micro_step_loss(m);
    enter(Phase::backward);
    backward_micro_step(m);
    leave(Phase::backward);
    return T;
}

// data -> h2d: micro-batch m into its device slot. Returns its length T.
int TrainingSession::load_micro_batch(int m) {
    enter(Phase::data);
    const Batch& batch = batches_->next();
    leave(Phase::data);
    // Under shape jitter a batch may be shorter than data.seq_len: the activations and the
    // device buffers, planned for (B, seq_len), hold it (GPT::forward re-plans for its shape).
    const bool jitter = cfg_.data.seq_len_jitter > 0;
    if (batch.B != B_ || (jitter ? batch.T < 1 || batch.T > T_ : batch.T != T_))
        throw std::logic_error("TrainingSession: the batch source gave a (" +
                               std::to_string(batch.B) + ", " + std::to_string(batch.T) +
                               ") batch, the session was built for data.batch_size " +
                               std::to_string(B_) + " and data.seq_len " + std::to_string(T_) +
                               (jitter ? " (or shorter, with data.seq_len_jitter)" : ""));
    const int T = batch.T;
    last_T_ = T;
    const size_t n = static_cast<size_t>(B_) * T;

    enter(Phase::h2d);
    backend_->copy_to_device(inputs_slot(m), batch.inputs, n * sizeof(int));
    backend_->copy_to_device(targets_slot(m), batch.targets, n * sizeof(int));
    leave(Phase::h2d);
    return T;
}

// The device slot of micro-batch m: its own under run.cuda_graph, else the one shared slot.
int* TrainingSession::inputs_slot(int m) const {
    return d_inputs_.as<int>() + static_cast<size_t>(m % batch_slots()) * B_ * T_;
}
int* TrainingSession::targets_slot(int m) const {
    return d_targets_.as<int>() + static_cast<size_t>(m % batch_slots()) * B_ * T_;
}

// The forward's device work (no phase: run.cuda_graph captures it).
void TrainingSession::forward_micro_step(int m, int T) {
    // grad_scale 1/(accum * world): the accumulated gradient, summed over the ranks, is the
    // gradient of the mean over every micro-step of every rank: the global batch.
    model_.forward(inputs_slot(m), targets_slot(m), B_, T,
                   1.0f / (static_cast<float>(accum_) * static_cast<float>(world_size_)));
    if (float* slot = loss_slot(m))
        backend_->run(op::LossMean{.loss = slot, .losses = model_.losses_device(), .N = B_ * T});
}

// The backward's device work (no phase: run.cuda_graph captures it).
void TrainingSession::backward_micro_step(int m) {
    if (m == 0) model_.zero_grad();
    // Only the last micro-step's backward completes the gradients: the buckets go from there.
    const bool last = m == accum_ - 1;
    if (grad_sync_ && last) grad_sync_->arm(model_.grads());
    model_.backward();
    if (grad_sync_ && last) grad_sync_->end_backward();
}

// ---- run.cuda_graph: the step captured once, replayed after --------------------------------

// From the session's second step: every micro-batch is copied into its own slot first (data
// and h2d phases, as always), then one replay runs forward, backward and the optimizer of every
// micro-step. The replay's device time is the `forward` phase: inside a graph the host marks no
// boundary between forward, backward and optimizer, so backward and optimizer never run as
// phases (see the top of training_session.h and docs/report.md).
void TrainingSession::run_graph_step(StepRecord& rec, const GradientsReady& gradients_ready) {
    for (int m = 0; m < accum_; ++m) {
        const int T = load_micro_batch(m);
        rec.tokens += static_cast<double>(world_size_) * B_ * T;
        rec.model_flops += model_.training_flops_per_step(B_, T);
    }
    rec.lr = optim_.current_lr();
    enter(Phase::forward);
    // The step's lr and bias corrections into the buffer the captured update reads: the one
    // per-step value the host supplies to the device work besides the batch.
    optim_.stage_device_scalars();
    if (!graph_) capture_step_graph();
    graph_->replay();
    optim_.finish_step();
    leave(Phase::forward);
    // The gradients are still this step's (the update reads them, never writes them); the
    // parameters are already updated.
    if (gradients_ready) gradients_ready(model_);
}

// Records forward, backward (every micro-step) and the optimizer into graph_, running nothing.
// Anything in them that waits for the device or allocates fails here, as a BackendError naming
// it (Backend::begin_capture); the capture is then discarded, never replaced by an eager step
// that would misattribute the time.
void TrainingSession::capture_step_graph() {
    // bf16: the captured forward must refresh the weights' compute copy, whatever ran since the
    // last optimizer step (an untimed rewarm forward leaves nothing to cast).
    model_.mark_params_updated();
    try {
        backend_->begin_capture("the training step (run.cuda_graph)");
        for (int m = 0; m < accum_; ++m) {
            forward_micro_step(m, T_);
            backward_micro_step(m);
        }
        optim_.launch_step();
    } catch (const std::exception& e) {
        backend_->abort_capture();
        throw BackendError(std::string("run.cuda_graph: capturing the training step failed: ") +
                           e.what());
    }
    graph_ = backend_->end_capture();
}

// ---- run.host_sync: where the step waits for the device (training.h) ----------------------

// Where micro-step m's mean loss goes: with accumulation its slot of d_losses_; under none its
// slot of the pending step's row; otherwise nowhere (the model's own mean is read).
float* TrainingSession::loss_slot(int m) const {
    // run.cuda_graph: a fixed address (captured once); none copies it to the row after the step.
    if (cfg_.run.cuda_graph) return d_losses_.as<float>() + m;
    if (defers_read_back()) return d_step_scalars_.as<float>() + pending_.size() * (accum_ + 1) + m;
    return accum_ > 1 ? d_losses_.as<float>() + m : nullptr;
}

// loss_every_step: the naive `loss.item()` after the forward: the host waits for it here.
void TrainingSession::read_micro_step_loss(int m) {
    enter(Phase::sync);
    if (accum_ > 1)
        backend_->copy_to_host(&h_losses_[m], d_losses_.as<float>() + m, sizeof(float));
    else
        h_losses_[0] = model_.loss();
    leave(Phase::sync);
}

// The step's loss, the mean over its micro-steps: one read-back (loss_every_step has read them).
double TrainingSession::read_back_loss() {
    if (cfg_.run.host_sync != HostSync::loss_every_step) {
        if (accum_ == 1 && !cfg_.run.cuda_graph)
            h_losses_[0] = model_.loss();
        else
            backend_->copy_to_host(h_losses_.data(), d_losses_.get(), accum_ * sizeof(float));
    }
    return mean_loss(h_losses_.data());
}

double TrainingSession::mean_loss(const float* losses) const {
    double sum = 0;
    for (int m = 0; m < accum_; ++m) sum += losses[m];
    return sum / accum_;
}

void TrainingSession::count_host_syncs(StepRecord& rec) const {
    const Backend::HostSyncStats now = backend_->host_sync_stats();
    rec.host_syncs += static_cast<int>(now.count - syncs_at_step_start_.count);
    rec.host_wait_ms += now.wait_ms - syncs_at_step_start_.wait_ms;
}

// The end of a step that waits for the device: the scalars' read-back and the step's one
// synchronisation (sync), then the phase events are read.
void TrainingSession::end_step(StepRecord& rec, bool warmup) {
    enter(Phase::sync);
    rec.loss = read_back_loss();
    rec.grad_norm = cfg_.optim.grad_clip > 0 ? optim_.last_grad_norm() : 0.0;
    if (world_) {
        // The global batch's mean loss (every rank's batch has the same B*T tokens), and a stop
        // signal any rank saw, so that every rank stops after the same step.
        double loss = rec.loss, sig = stop_signal();
        world_->allreduce_sum(&loss, 1, cfg_.dist.timeout_s, "the sum of the step's losses");
        world_->allreduce_max(&sig, 1, cfg_.dist.timeout_s, "the stop flag of the step");
        rec.loss = loss / world_size_;
        rec.stop_signal = static_cast<int>(sig);
    }
    backend_->synchronize();
    leave(Phase::sync);
    rec.times = timer_.finish_step();
    if (profiler_) profiler_->finish_step(!warmup, timer_.step_start_event());
    count_host_syncs(rec);
}

// none: the squared grad norm joins the losses in the step's device row (sync is that copy);
// the step's events are kept for drain().
void TrainingSession::end_step_deferred(StepRecord& rec) {
    enter(Phase::sync);
    float* row = d_step_scalars_.as<float>() + pending_.size() * (accum_ + 1);
    if (cfg_.run.cuda_graph)  // the losses went to the fixed slots the graph writes
        backend_->copy_device(row, d_losses_.get(), accum_ * sizeof(float));
    if (cfg_.optim.grad_clip > 0)
        backend_->copy_device(row + accum_, optim_.grad_norm_squared_device(), sizeof(float));
    leave(Phase::sync);
    timer_.end_step_deferred();
    count_host_syncs(rec);
}

StepRecord TrainingSession::run_step(int index, bool warmup,
                                     const GradientsReady& gradients_ready) {
    StepRecord rec;
    rec.step = index;
    rec.warmup = warmup;
    const CpuLoadSample cpu_at_start = CpuLoadSample::take();
    const std::optional<DeviceClockSample> clock_at_start = backend_->sample_device_clock();
    syncs_at_step_start_ = backend_->host_sync_stats();
    timer_.begin_step();
    // run.cuda_graph: the session's first step runs eagerly (shapes, plans and lazily loaded
    // kernels settle), the second captures the graph, every step replays it.
    if (cfg_.run.cuda_graph && steps_run_ > 0)
        run_graph_step(rec, gradients_ready);
    else
        run_eager_step(rec, gradients_ready);
    ++steps_run_;
    if (defers_read_back())
        end_step_deferred(rec);
    else
        end_step(rec, warmup);
    const CpuLoadSample cpu_at_end = CpuLoadSample::take();
    rec.other_cpu_ms = other_cpu_ms(cpu_at_start, cpu_at_end);
    rec.steal_ms = steal_ms(cpu_at_start, cpu_at_end);
    const std::optional<DeviceClockSample> clock_at_end = backend_->sample_device_clock();
    if (clock_at_start && clock_at_end)
        rec.device_clock = combine(*clock_at_start, *clock_at_end);
    else
        rec.device_clock = clock_at_end ? clock_at_end : clock_at_start;
    return rec;
}

// The step's phases as the host launches every op: micro-steps, then the optimizer.
void TrainingSession::run_eager_step(StepRecord& rec, const GradientsReady& gradients_ready) {
    for (int m = 0; m < accum_; ++m) {
        const int T = micro_step(m);
        // Every rank's micro-batch m has this length (it is a function of the global batch
        // index), so the global batch holds world x B x T tokens of it.
        rec.tokens += static_cast<double>(world_size_) * B_ * T;
        rec.model_flops += model_.training_flops_per_step(B_, T);
    }
    if (gradients_ready) gradients_ready(model_);

    rec.lr = optim_.current_lr();
    if (grad_sync_) {
        optimizer_step_data_parallel(rec);
    } else {
        enter(Phase::optimizer);
        optim_.step();
        leave(Phase::optimizer);
    }
}

StepRecord TrainingSession::step(int index, bool warmup, const GradientsReady& gradients_ready) {
    if (!defers_read_back()) return run_step(index, warmup, gradients_ready);
    if (!pending_.empty())
        throw std::logic_error("TrainingSession::step: enqueued steps are not drained");
    pending_.push_back({run_step(index, warmup, gradients_ready), {}, {}});
    return drain().front().record;
}

void TrainingSession::enqueue_step(int index, bool warmup, const GradientsReady& gradients_ready) {
    if (drain_due())
        throw std::logic_error("TrainingSession::enqueue_step: a full window is not drained");
    CompletedStep c{run_step(index, warmup, gradients_ready), {}, {}};
    if (!defers_read_back()) {
        c.intervals = timer_.last_intervals();
        c.host_start = timer_.last_step_start();
    }
    pending_.push_back(std::move(c));
}

// none: one synchronisation and one read-back for the window, then every step's scalars and
// events; the waits are counted in the window's last step.
std::vector<TrainingSession::CompletedStep> TrainingSession::drain() {
    std::vector<CompletedStep> done;
    done.swap(pending_);
    if (!defers_read_back() || done.empty()) return done;
    syncs_at_step_start_ = backend_->host_sync_stats();
    const size_t row = static_cast<size_t>(accum_) + 1;
    std::vector<float> scalars(done.size() * row);
    backend_->synchronize();
    backend_->copy_to_host(scalars.data(), d_step_scalars_.get(), scalars.size() * sizeof(float));
    std::vector<DeferredStepTimes> times = timer_.read_deferred();
    for (size_t i = 0; i < done.size(); ++i) {
        StepRecord& rec = done[i].record;
        const float* r = scalars.data() + i * row;
        rec.loss = mean_loss(r);
        // As AdamW::last_grad_norm computes it from norm^2.
        rec.grad_norm = cfg_.optim.grad_clip > 0 ? std::sqrt(r[accum_]) : 0.0;
        rec.times = times[i].times;
        done[i].intervals = std::move(times[i].intervals);
        done[i].host_start = times[i].host_start;
    }
    count_host_syncs(done.back().record);
    return done;
}

// comm (wait for the buckets) -> optimizer (the global norm from every rank's pieces, the
// update of this rank's part) -> ZeRO-1: comm again (all-gather the parameters).
void TrainingSession::optimizer_step_data_parallel(StepRecord& rec) {
    enter(Phase::comm);
    grad_sync_->wait_gradients();
    leave(Phase::comm);

    enter(Phase::optimizer);
    float clip = 1.0f, norm = 0.0f;
    if (cfg_.optim.grad_clip > 0) {
        // The squared norm of every rank's piece of every bucket, added in one fixed order (in
        // double): the same norm on every rank and under both ZeRO stages. Stage 0 holds every
        // reduced piece; stage 1 holds its own and gathers the others' partial sums.
        const std::vector<FlatRange> pieces = grad_sync_->all_pieces();
        std::vector<float> sq(pieces.size(), 0.0f);
        const size_t W = static_cast<size_t>(world_size_), nb = pieces.size() / W;
        if (cfg_.dist.zero == 0) {
            std::vector<GPT::GradientRange> all;
            for (const FlatRange& p : pieces) all.push_back({p.offset, p.count});
            sq = optim_.grad_norm_squares(all);
        } else {
            std::vector<GPT::GradientRange> mine;
            for (size_t b = 0; b < nb; ++b) {
                const FlatRange& p = pieces[b * W + static_cast<size_t>(world_->rank())];
                mine.push_back({p.offset, p.count});
            }
            const std::vector<float> my_sq = optim_.grad_norm_squares(mine);
            std::vector<float> gathered(nb * W);
            world_->all_gather(my_sq.data(), static_cast<int>(nb), gathered.data(),
                               cfg_.dist.timeout_s, "the gradient norm's partial sums");
            for (size_t r = 0; r < W; ++r)
                for (size_t b = 0; b < nb; ++b) sq[b * W + r] = gathered[r * nb + b];
        }
        double total = 0;
        for (float x : sq) total += static_cast<double>(x);
        // As the GlobalNormClip kernels compute it from norm^2 (kernels/cpu/reductions.cpp).
        norm = std::sqrt(static_cast<float>(total));
        clip = std::min(1.0f, cfg_.optim.grad_clip / (norm + 1e-6f));
    }
    optim_.step_with_clip_scale(clip, norm);
    leave(Phase::optimizer);

    if (cfg_.dist.zero == 1) {
        enter(Phase::comm);
        grad_sync_->gather_params(model_.params());
        leave(Phase::comm);
    }
    const GradientSync::StepStats st = grad_sync_->take_step_stats();
    rec.comm_busy_ms = st.busy_ms;
    rec.comm_bytes = st.bytes;
    rec.comm_buckets_in_backward = st.buckets_issued_in_backward;
}

double TrainingSession::probe_all_reduce_gbps(size_t max_bytes) {
    if (!collectives_) return 0.0;
    // The gradient buffer: the trainable prefix (LoRA / optim.freeze: less than n_params()).
    const size_t n = std::min(model_.trainable_count(), max_bytes / sizeof(float));
    const size_t W = static_cast<size_t>(world_size_), q = (n + W - 1) / W;
    std::vector<size_t> counts;
    for (size_t r = 0, left = n; r < W; ++r, left -= std::min(q, left))
        counts.push_back(std::min(q, left));
    double best_s = 0;
    for (int rep = 0; rep < 4; ++rep) {
        collectives_->fence(0);
        const auto t0 = std::chrono::steady_clock::now();
        collectives_->reduce_scatter_sum(model_.grads(), counts, 0);
        collectives_->all_gather(model_.grads(), counts, 0);
        collectives_->wait();
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (rep > 0 && (best_s == 0 || s < best_s)) best_s = s;  // rep 0 is the warm-up
    }
    model_.zero_grad();
    const double bytes = 2.0 * static_cast<double>(W - 1) / W * static_cast<double>(n) * 4;
    return best_s > 0 ? bytes / best_s / 1e9 : 0.0;
}

MemorySummary TrainingSession::finish() {
    backend_->set_op_observer(nullptr);
    if (!memory_) return {};
    memory_->finish();
    return memory_->summary();
}

void TrainingSession::rewarm() {
    if (last_T_ == 0 || cfg_.run.offload != OffloadMode::none) return;
    OpObserver* observer = backend_->op_observer();
    backend_->set_op_observer(nullptr);
    model_.forward(d_inputs_.as<int>(), d_targets_.as<int>(), B_, last_T_);
    backend_->synchronize();
    backend_->set_op_observer(observer);
}

}  // namespace mt
