// The AdamW policy on top of Backend::adamw_update: schedule, clipping, state.
#include "optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace mt {

float learning_rate_at(const LRSchedule& s, float base_lr, int step) {
    if (s.kind == LRSchedule::Kind::constant) return base_lr;
    // Linear warm-up from base_lr/warmup to base_lr over warmup_steps (step 0 is not 0, so the
    // first step moves the weights), then cosine decay to min_lr_ratio * base_lr over
    // decay_steps, then the floor.
    const float floor_lr = s.min_lr_ratio * base_lr;
    if (step < s.warmup_steps)
        return base_lr * static_cast<float>(step + 1) / static_cast<float>(s.warmup_steps);
    const int t = step - s.warmup_steps;
    if (s.decay_steps <= 0 || t >= s.decay_steps) return s.decay_steps <= 0 ? base_lr : floor_lr;
    const double progress = static_cast<double>(t) / static_cast<double>(s.decay_steps);
    const double coeff = 0.5 * (1.0 + std::cos(M_PI * progress));  // 1 -> 0
    return floor_lr + static_cast<float>(coeff) * (base_lr - floor_lr);
}

AdamW::AdamW(GPT& model, const AdamWConfig& config, AdamWPartition partition, Backend* host_backend)
    : model_(model), backend_(model.backend()), config_(config), partition_(std::move(partition)) {
    auto bad = [](const std::string& what) { throw std::invalid_argument("optim: " + what); };
    if (!(config_.lr > 0)) bad("lr must be > 0");
    if (!(config_.beta1 >= 0 && config_.beta1 < 1)) bad("beta1 must be in [0, 1)");
    if (!(config_.beta2 >= 0 && config_.beta2 < 1)) bad("beta2 must be in [0, 1)");
    if (!(config_.eps > 0)) bad("eps must be > 0");
    if (!(config_.weight_decay >= 0)) bad("weight_decay must be >= 0");
    if (!(config_.grad_clip >= 0)) bad("grad_clip must be >= 0 (0 disables clipping)");
    // Only the trainable tensors: the prefix [0, trainable_count) of the device buffers, where
    // gradients, m and v live (frozen tensors have neither).
    for (const auto& t : model.parameter_table().tensors())
        if (t.trainable) slices_.push_back({t.device_offset, t.count, t.decay});
    std::sort(slices_.begin(), slices_.end(),
              [](const TensorSlice& a, const TensorSlice& b) { return a.offset < b.offset; });
    const size_t n = model.trainable_count();
    state_count_ = n;
    if (sharded()) {
        state_count_ = 0;
        size_t prev_end = 0;
        for (const auto& r : partition_.owned) {
            if (r.offset < prev_end || r.offset + r.count > n || r.count == 0)
                bad("partition: owned ranges must be non-empty, ascending, disjoint and inside "
                    "the parameters");
            prev_end = r.offset + r.count;
            state_count_ += r.count;
            // The tensors that overlap [r.offset, r.offset + r.count), cut to it.
            std::vector<TensorSlice> cut;
            for (const TensorSlice& t : slices_) {
                const size_t lo = std::max(t.offset, r.offset);
                const size_t hi = std::min(t.offset + t.count, r.offset + r.count);
                if (lo < hi) cut.push_back({lo - r.offset, hi - lo, t.decay});
            }
            owned_slices_.push_back(std::move(cut));
        }
    }
    if (config_.offload) {
        if (sharded())
            bad("offload keeps every parameter's state on this rank's host; it does not combine "
                "with ZeRO-1 (dist.zero: 1), which shards it: use one or the other");
        if (!host_backend) bad("offload needs a CPU backend to run the update on the host");
        offload_ =
            std::make_unique<OptimizerOffload>(backend_, *host_backend, state_count_, slices_);
    } else {
        m_ = DeviceBuffer(backend_, state_count_ * sizeof(float), MemoryCategory::optimizer);
        v_ = DeviceBuffer(backend_, state_count_ * sizeof(float), MemoryCategory::optimizer);
        backend_.memset_zero(m_.get(), m_.bytes());
        backend_.memset_zero(v_.get(), v_.bytes());
    }
    scratch_ = DeviceBuffer(backend_, (2 + 2 * partition_.norm_pieces) * sizeof(float),
                            MemoryCategory::workspace);
    backend_.memset_zero(scratch_.get(), scratch_.bytes());
}

float AdamW::current_lr() const {
    return learning_rate_at(config_.schedule, config_.lr, t_);
}

void AdamW::step() {
    if (scalars_on_device()) stage_device_scalars();
    launch_step();
    finish_step();
}

void AdamW::keep_scalars_on_device() {
    if (offload_)
        throw std::invalid_argument(
            "optim: the update's scalars on the device (run.cuda_graph) do not combine with "
            "offload, whose update runs on the host");
    if (!scalars_.get())
        scalars_ = DeviceBuffer(backend_, sizeof(math::AdamWScalars), MemoryCategory::workspace);
}

void AdamW::stage_device_scalars() {
    if (!scalars_on_device())
        throw std::logic_error("AdamW::stage_device_scalars: keep_scalars_on_device first");
    staged_scalars_ = adamw_scalars(next_hyperparameters());
    backend_.copy_to_device(scalars_.get(), &staged_scalars_, sizeof staged_scalars_);
}

AdamWParams AdamW::next_hyperparameters() const {
    return {current_lr(), config_.beta1, config_.beta2, config_.eps, config_.weight_decay, t_ + 1};
}

void AdamW::finish_step() {
    norm_valid_ = config_.grad_clip > 0;
    host_norm_ = -1;
    ++t_;
    model_.mark_params_updated();
}

void AdamW::launch_step() {
    if (sharded())
        throw std::logic_error("AdamW::step: a sharded optimizer steps with step_with_clip_scale");
    const size_t n = model_.trainable_count();
    float* norm_sq = scratch_.as<float>();
    float* clip = scratch_.as<float>() + 1;
    const float* grad_scale = nullptr;
    if (config_.grad_clip > 0) {
        // Clip without a host round trip: the norm and the scale stay on the device and the
        // update kernel reads the scale (no sync inside a phase).
        backend_.run(op::GlobalNormClip{.norm_sq = norm_sq,
                                        .clip_scale = clip,
                                        .grads = model_.grads(),
                                        .n = n,
                                        .max_norm = config_.grad_clip});
        grad_scale = clip;
    }
    update(grad_scale);
}

// The AdamW update of this rank's part: the whole flat buffer, or each owned range with its
// packed slice of m and v. The update is elementwise, so a range's elements get exactly the
// values the whole-buffer update gives them.
void AdamW::update(const float* grad_scale) {
    const AdamWParams hp = next_hyperparameters();
    const math::AdamWScalars* scalars = scalars_.as<math::AdamWScalars>();  // null: by value
    if (offload_) {
        offload_->update(model_.params(), model_.grads(), grad_scale, hp, model_.params_version());
    } else if (!sharded()) {
        backend_.run(op::AdamWUpdate{.impl = config_.impl,
                                     .params = model_.params(),
                                     .grads = model_.grads(),
                                     .m = m_.as<float>(),
                                     .v = v_.as<float>(),
                                     .tensors = slices_,
                                     .total = model_.trainable_count(),
                                     .hp = hp,
                                     .grad_scale = grad_scale,
                                     .scalars = scalars});
    } else {
        size_t state = 0;
        for (size_t i = 0; i < partition_.owned.size(); ++i) {
            const auto& r = partition_.owned[i];
            backend_.run(op::AdamWUpdate{.impl = config_.impl,
                                         .params = model_.params() + r.offset,
                                         .grads = model_.grads() + r.offset,
                                         .m = m_.as<float>() + state,
                                         .v = v_.as<float>() + state,
                                         .tensors = owned_slices_[i],
                                         .total = r.count,
                                         .hp = hp,
                                         .grad_scale = grad_scale,
                                         .scalars = scalars});
            state += r.count;
        }
    }
}

std::vector<float> AdamW::grad_norm_squares(const std::vector<GPT::GradientRange>& ranges) {
    if (ranges.size() > partition_.norm_pieces)
        throw std::logic_error("AdamW::grad_norm_squares: more ranges than the partition's " +
                               std::to_string(partition_.norm_pieces));
    float* slots = scratch_.as<float>() + 2;
    std::vector<float> host(2 * ranges.size(), 0.0f);
    for (size_t i = 0; i < ranges.size(); ++i) {
        if (ranges[i].count == 0) continue;
        backend_.run(op::GlobalNormClip{.norm_sq = slots + 2 * i,
                                        .clip_scale = slots + 2 * i + 1,
                                        .grads = model_.grads() + ranges[i].offset,
                                        .n = ranges[i].count,
                                        .max_norm = 1.0f});
    }
    if (!ranges.empty()) backend_.copy_to_host(host.data(), slots, host.size() * sizeof(float));
    std::vector<float> out(ranges.size());
    for (size_t i = 0; i < ranges.size(); ++i) out[i] = ranges[i].count ? host[2 * i] : 0.0f;
    return out;
}

void AdamW::step_with_clip_scale(float clip_scale, float grad_norm) {
    const float* grad_scale = nullptr;
    if (config_.grad_clip > 0) {
        backend_.copy_to_device(scratch_.as<float>() + 1, &clip_scale, sizeof(float));
        grad_scale = scratch_.as<float>() + 1;
    }
    update(grad_scale);
    ++t_;
    model_.mark_params_updated();
    norm_valid_ = false;
    host_norm_ = grad_norm;
}

float AdamW::last_grad_norm() {
    if (host_norm_ >= 0) return host_norm_;
    if (!norm_valid_) return 0.0f;
    float sq = 0;
    backend_.copy_to_host(&sq, scratch_.as<float>(), sizeof(float));
    return std::sqrt(sq);
}

std::vector<float> AdamW::get_m() {
    if (offload_) return offload_->get_m();
    std::vector<float> h(state_count_);
    backend_.copy_to_host(h.data(), m_.get(), m_.bytes());
    return h;
}

std::vector<float> AdamW::get_v() {
    if (offload_) return offload_->get_v();
    std::vector<float> h(state_count_);
    backend_.copy_to_host(h.data(), v_.get(), v_.bytes());
    return h;
}

void AdamW::set_state(const std::vector<float>& m, const std::vector<float>& v, int steps_taken) {
    const size_t n = state_count_;
    if (m.size() != n || v.size() != n)
        throw std::invalid_argument("AdamW::set_state: expected " + std::to_string(n) +
                                    " floats for m and v");
    if (steps_taken < 0) throw std::invalid_argument("AdamW::set_state: negative step count");
    if (offload_) {
        offload_->set_moments(m, v);
    } else {
        backend_.copy_to_device(m_.get(), m.data(), m_.bytes());
        backend_.copy_to_device(v_.get(), v.data(), v_.bytes());
    }
    t_ = steps_taken;
}

}  // namespace mt
