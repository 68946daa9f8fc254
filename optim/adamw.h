// The AdamW policy: hyper-parameters, LR schedule, global-norm clipping, and which AdamW
// implementation runs. The arithmetic itself is a backend op (Backend::adamw_update), so the
// policy is the same on every backend.
#pragma once

#include <vector>

#include "kernels/backend.h"
#include "model/gpt.h"

namespace mt {

struct LRSchedule {
    enum class Kind { constant, cosine };  // cosine: linear warm-up, cosine decay to a floor
    Kind kind = Kind::constant;
    int warmup_steps = 0;
    int decay_steps = 0;        // steps from the end of warm-up to reaching the floor
    float min_lr_ratio = 0.1f;  // floor = min_lr_ratio * lr
};
// Learning rate for 0-based optimizer step `step`.
float learning_rate_at(const LRSchedule& schedule, float base_lr, int step);

template <>
struct EnumSpelling<LRSchedule::Kind> {
    static constexpr std::array<std::string_view, 2> names{"constant", "cosine"};
};

struct AdamWConfig {
    float lr = 3e-4f;
    float beta1 = 0.9f;
    float beta2 = 0.95f;
    float eps = 1e-8f;
    float weight_decay = 0.1f;
    float grad_clip = 1.0f;  // max global L2 norm; 0 disables clipping
    AdamWImpl impl = AdamWImpl::fused;
    LRSchedule schedule;
};

class AdamW {
  public:
    AdamW(GPT& model, const AdamWConfig& config);

    // One optimizer step over the model's flat buffers: global grad norm (when clipping),
    // clip scale, AdamW update; then marks the model's params updated. Asynchronous.
    void step();
    // Global L2 norm of the gradients before clipping at the last step (synchronises). 0 when
    // clipping is off and the norm was not computed.
    float last_grad_norm();
    int steps_taken() const { return t_; }
    float current_lr() const;  // the LR the next step uses
    const AdamWConfig& config() const { return config_; }

    // Optimizer state (host copies, flat, parameter-table order) for checkpoints.
    std::vector<float> get_m();
    std::vector<float> get_v();
    void set_state(const std::vector<float>& m, const std::vector<float>& v, int steps_taken);

  private:
    GPT& model_;
    Backend& backend_;
    AdamWConfig config_;
    std::vector<TensorSlice> slices_;
    DeviceBuffer m_, v_;    // optimizer
    DeviceBuffer scratch_;  // workspace: [0] norm^2, [1] clip scale
    int t_ = 0;
    bool norm_valid_ = false;
};

}  // namespace mt
