// The training step, defined once (see training.h).
#include "harness/training.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "harness/signals.h"
#include "kernels/collectives.h"

namespace mt {
namespace {

ModelOptions model_options(const RunConfig& cfg) {
    ModelOptions mo;
    mo.kernels = cfg.kernels;
    mo.recompute = cfg.run.recompute;
    mo.trainable = cfg.trainable;
    return mo;
}

// Gives the new model its initial weights and its activations for (B, T); returns it so that
// the optimizer, the next member, is built on a model that is ready.
GPT& prepare_model(GPT& model, const RunConfig& cfg, const TrainingInputs& inputs) {
    if (inputs.load_weights)
        inputs.load_weights(model);
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
std::string shrink_advice(const RunConfig& cfg, const MemoryEstimate& e) {
    const size_t state = e.params + e.grads + e.optimizer;
    std::string a;
    if (e.activations + e.workspace + e.data >= state) {
        a = "lower data.batch_size (" + std::to_string(cfg.data.batch_size) +
            ") or data.seq_len (" + std::to_string(cfg.data.seq_len) +
            "): activations grow with both (run.grad_accum keeps the effective batch)";
        if (cfg.run.recompute != Recompute::layernorm_gelu)
            a += ", or set run.recompute: layernorm_gelu";
        a += ", or use a smaller model";
    } else {
        a = "use a smaller model (n_layer, n_embd or a smaller preset): parameters, their "
            "gradients and the AdamW moments take " +
            fmt_bytes(static_cast<double>(state)) + " whatever the batch size";
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

}  // namespace

void check_memory_fits(const RunConfig& cfg, Backend& backend, MemoryEstimate* estimate) {
    MemoryEstimate e = GPT::estimate_memory(cfg.model, model_options(cfg), cfg.data.batch_size,
                                            cfg.data.seq_len, backend);
    // ZeRO-1 over the job's ranks: each holds about 1/N of the AdamW moments.
    if (const World& w = World::current(); cfg.dist.zero == 1 && w.distributed())
        e.optimizer =
            (e.optimizer + static_cast<size_t>(w.size()) - 1) / static_cast<size_t>(w.size());
    if (estimate) *estimate = e;
    const DeviceMemoryInfo info = backend.device_memory_info();
    if (!info.available || info.free_bytes == 0 || e.total() <= info.free_bytes) return;
    const bool cpu = backend.kind() == BackendKind::cpu;
    auto b = [](size_t x) { return fmt_bytes(static_cast<double>(x)); };
    throw ResourceError(
        "does not fit in memory: an estimated " + b(e.total()) + " needed, " + b(info.free_bytes) +
        " available " +
        (cpu ? "on the CPU (MemAvailable within any container limit, of " + b(info.total_bytes) +
                   " RAM)"
             : "on " + backend.device_name() + " (free, of " + b(info.total_bytes) + ")") +
        "; estimate for " + cfg.model.describe() + " at B" + std::to_string(cfg.data.batch_size) +
        " T" + std::to_string(cfg.data.seq_len) + ": params " + b(e.params) + ", grads " +
        b(e.grads) + ", optimizer " + b(e.optimizer) + ", activations " + b(e.activations) +
        ", workspace " + b(e.workspace) + ", data " + b(e.data) +
        "; refused before allocating anything. To fit: " + shrink_advice(cfg, e));
}

std::unique_ptr<Backend> create_training_backend(const RunConfig& cfg, BackendKind kind) {
    if (cfg.run.threads < 0 || cfg.run.threads > kMaxThreads)
        throw std::invalid_argument("threads (run.threads, --threads) must be in 0.." +
                                    std::to_string(kMaxThreads) + " (0 = one per core), got " +
                                    std::to_string(cfg.run.threads));
    BackendOptions bo;
    bo.precision = cfg.run.precision;
    bo.kernels = cfg.kernels;
    bo.num_threads = cfg.run.threads;
    // Data parallel on CUDA: one GPU per rank, the rank's index on its node picks it (a node
    // with fewer GPUs than ranks is refused by the backend, naming the device count).
    if (const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
        local && kind == BackendKind::cuda && World::current().distributed())
        bo.device_index = std::atoi(local);
    return create_backend(kind, bo);
}

TrainingSession::TrainingSession(std::unique_ptr<Backend> backend, const RunConfig& cfg,
                                 TrainingInputs inputs)
    : cfg_(checked_workers(cfg)),
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
      optim_(prepare_model(model_, cfg, inputs), cfg.optim, partition_of(grad_sync_.get(), cfg)),
      batches_(inputs.batches ? std::move(inputs.batches)
                              : std::make_unique<DataLoader>(
                                    cfg.data, cfg.model.vocab_size, cfg.run.seed, backend_.get(),
                                    DataLoaderOptions{.rank = world_ ? world_->rank() : 0,
                                                      .world = world_size_})),
      timer_(*backend_) {
    if (accum_ < 1)
        throw std::invalid_argument("run.grad_accum must be >= 1, got " + std::to_string(accum_));
    const size_t n = static_cast<size_t>(B_) * T_;
    d_inputs_ = DeviceBuffer(*backend_, n * sizeof(int), MemoryCategory::data);
    d_targets_ = DeviceBuffer(*backend_, n * sizeof(int), MemoryCategory::data);
    if (accum_ > 1)
        d_losses_ = DeviceBuffer(*backend_, accum_ * sizeof(float), MemoryCategory::workspace);
    h_losses_.resize(static_cast<size_t>(accum_));
    if (cfg.profile.kernels) {
        profiler_ = std::make_unique<KernelProfiler>(*backend_);
        backend_->set_op_observer(profiler_.get());
    }
    backend_->synchronize();
    if (memory_) memory_->setup_done();
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
void TrainingSession::micro_step(int m) {
    const size_t n = static_cast<size_t>(B_) * T_;
    enter(Phase::data);
    const Batch& batch = batches_->next();
    leave(Phase::data);
    if (batch.B != B_ || batch.T != T_)
        throw std::logic_error("TrainingSession: the batch source gave a (" +
                               std::to_string(batch.B) + ", " + std::to_string(batch.T) +
                               ") batch, the session was built for data.batch_size " +
                               std::to_string(B_) + " and data.seq_len " + std::to_string(T_));

    enter(Phase::h2d);
    backend_->copy_to_device(d_inputs_.get(), batch.inputs, n * sizeof(int));
    backend_->copy_to_device(d_targets_.get(), batch.targets, n * sizeof(int));
    leave(Phase::h2d);

    enter(Phase::forward);
    // grad_scale 1/(accum * world): the accumulated gradient, summed over the ranks, is the
    // gradient of the mean over every micro-step of every rank: the global batch.
    model_.forward(d_inputs_.as<int>(), d_targets_.as<int>(), B_, T_,
                   1.0f / (static_cast<float>(accum_) * static_cast<float>(world_size_)));
    if (accum_ > 1)
        backend_->run(op::LossMean{
            .loss = d_losses_.as<float>() + m, .losses = model_.losses_device(), .N = int(n)});
    leave(Phase::forward);

    enter(Phase::backward);
    if (m == 0) model_.zero_grad();
    // Only the last micro-step's backward completes the gradients: the buckets go from there.
    const bool last = m == accum_ - 1;
    if (grad_sync_ && last) grad_sync_->arm(model_.grads());
    model_.backward();
    if (grad_sync_ && last) grad_sync_->end_backward();
    leave(Phase::backward);
}

// The step's loss: the mean over its micro-steps (one read-back either way).
double TrainingSession::read_back_loss() {
    if (accum_ == 1) return model_.loss();
    backend_->copy_to_host(h_losses_.data(), d_losses_.get(), accum_ * sizeof(float));
    double sum = 0;
    for (float x : h_losses_) sum += x;
    return sum / accum_;
}

StepRecord TrainingSession::step(int index, bool warmup, const GradientsReady& gradients_ready) {
    StepRecord rec;
    rec.step = index;
    rec.warmup = warmup;
    timer_.begin_step();
    for (int m = 0; m < accum_; ++m) micro_step(m);
    if (gradients_ready) gradients_ready(model_);

    rec.lr = optim_.current_lr();
    if (grad_sync_) {
        optimizer_step_data_parallel(rec);
    } else {
        enter(Phase::optimizer);
        optim_.step();
        leave(Phase::optimizer);
    }

    enter(Phase::sync);
    rec.loss = read_back_loss();
    rec.grad_norm = cfg_.optim.grad_clip > 0 ? optim_.last_grad_norm() : 0.0;
    if (world_) {
        // The global batch's mean loss (every rank's batch has B*T tokens), and a stop signal
        // any rank saw, so that every rank stops after the same step.
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
    return rec;
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

}  // namespace mt
