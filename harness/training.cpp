// The training step, defined once (see training.h).
#include "harness/training.h"

#include <cstdio>
#include <stdexcept>
#include <string>

namespace mt {
namespace {

ModelOptions model_options(const RunConfig& cfg) {
    ModelOptions mo;
    mo.kernels = cfg.kernels;
    mo.recompute = cfg.run.recompute;
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

}  // namespace

void check_memory_fits(const RunConfig& cfg, Backend& backend, MemoryEstimate* estimate) {
    const MemoryEstimate e = GPT::estimate_memory(cfg.model, model_options(cfg),
                                                  cfg.data.batch_size, cfg.data.seq_len, backend);
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
      optim_(prepare_model(model_, cfg, inputs), cfg.optim),
      batches_(inputs.batches ? std::move(inputs.batches)
                              : std::make_unique<DataLoader>(cfg.data, cfg.model.vocab_size,
                                                             cfg.run.seed, backend_.get())),
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
    // grad_scale 1/accum: the accumulated gradient is the gradient of the mean over micro-steps.
    model_.forward(d_inputs_.as<int>(), d_targets_.as<int>(), B_, T_, 1.0f / accum_);
    if (accum_ > 1)
        backend_->run(op::LossMean{
            .loss = d_losses_.as<float>() + m, .losses = model_.losses_device(), .N = int(n)});
    leave(Phase::forward);

    enter(Phase::backward);
    if (m == 0) model_.zero_grad();
    model_.backward();
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

    enter(Phase::optimizer);
    rec.lr = optim_.current_lr();
    optim_.step();
    leave(Phase::optimizer);

    enter(Phase::sync);
    rec.loss = read_back_loss();
    rec.grad_norm = cfg_.optim.grad_clip > 0 ? optim_.last_grad_norm() : 0.0;
    backend_->synchronize();
    leave(Phase::sync);
    rec.times = timer_.finish_step();
    if (profiler_) profiler_->finish_step(!warmup, timer_.step_start_event());
    return rec;
}

MemorySummary TrainingSession::finish() {
    backend_->set_op_observer(nullptr);
    if (!memory_) return {};
    memory_->finish();
    return memory_->summary();
}

}  // namespace mt
