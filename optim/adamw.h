// The AdamW policy: hyper-parameters, LR schedule, global-norm clipping, and which AdamW
// implementation runs. The arithmetic itself is a backend op (Backend::adamw_update), so the
// policy is the same on every backend.
#pragma once

#include <vector>

#include "kernels/backend.h"
#include "model/gpt.h"
#include "optim/optimizer_offload.h"

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
    // optim.offload: m, v and a master copy of the weights in pinned host memory, the update on
    // the CPU (optim/optimizer_offload.h); `impl` then no longer applies (the CPU's fused runs).
    bool offload = false;
};

// Data parallel (distributed/grad_sync.h): which part of the flat buffers this rank updates, and
// how many ranges the gradient norm may be cut into.
struct AdamWPartition {
    // Ranges of the flat buffers this rank updates, ascending and disjoint. Empty: every
    // parameter (one rank, or ZeRO stage 0). Non-empty (ZeRO-1): m and v hold only these
    // elements, packed in this order, so the optimizer memory is this rank's share.
    std::vector<GPT::GradientRange> owned;
    // The most ranges grad_norm_squares() is asked for at once (its device scratch).
    size_t norm_pieces = 0;
};

class AdamW {
  public:
    // `host_backend`: with config.offload, the CPU backend that runs the update (it must
    // outlive this object); ignored otherwise.
    AdamW(GPT& model, const AdamWConfig& config, AdamWPartition partition = {},
          Backend* host_backend = nullptr);

    // One optimizer step over the model's flat buffers: global grad norm (when clipping),
    // clip scale, AdamW update; then marks the model's params updated. Asynchronous.
    // step() = (with device scalars: stage_device_scalars()) + launch_step() + finish_step().
    void step();

    // run.cuda_graph (engine/training_session.h): the step's device work is captured once and
    // replayed, so the kernels' by-value arguments are frozen at capture. Why device memory and
    // not cudaGraphExecKernelNodeSetParams: the update is one kernel (fused) or three per tensor
    // (unfused); patching them means finding those nodes among the step's hundreds and knowing
    // each kernel's parameter layout, while one small copy before every replay into a buffer all
    // of them read works for every impl and leaves the graph untouched (as PyTorch's
    // capturable Adam keeps its step count on the device).
    // keep_scalars_on_device(): from now on the update kernels read lr and the bias corrections
    // from a device buffer (allocated here, before any capture).
    void keep_scalars_on_device();
    bool scalars_on_device() const { return scalars_.get() != nullptr; }
    // Copies the scalars of the next step (steps_taken() + 1) into that buffer: enqueued before
    // the replay, outside the graph (an h2d copy from pageable memory cannot be captured).
    void stage_device_scalars();
    // The device work of one step (norm, clip scale, update), without the host bookkeeping: what
    // a capture records. The scalars are the staged ones (keep_scalars_on_device) or, by value,
    // those of the next step.
    void launch_step();
    // The host side of a step whose device work ran (eagerly or replayed): the step count (the
    // next LR and bias correction), the norm's validity, the model's params marked updated.
    void finish_step();
    // Data parallel. The squared L2 norm of the gradients in each range (one read-back): every
    // rank's partial sums, added in one fixed order by the caller, give the same global norm on
    // every rank and under both ZeRO stages.
    std::vector<float> grad_norm_squares(const std::vector<GPT::GradientRange>& ranges);
    // One step with the clip factor computed by the caller from the global norm (ignored when
    // clipping is off), over this rank's part (AdamWPartition::owned) only. Asynchronous.
    void step_with_clip_scale(float clip_scale, float grad_norm);
    bool sharded() const { return !partition_.owned.empty(); }
    // Which elements m and v hold (ZeRO-1: `train` gathers every rank's to checkpoint them).
    const AdamWPartition& partition() const { return partition_; }
    // Global L2 norm of the gradients before clipping at the last step (synchronises). 0 when
    // clipping is off and the norm was not computed.
    float last_grad_norm();
    // The device float where step() leaves the squared norm of last_grad_norm() (valid after a
    // step() with clipping on; overwritten by the next), so a caller can keep it on the device
    // (run.host_sync: none) instead of reading it back every step.
    const float* grad_norm_squared_device() const { return scratch_.as<float>(); }
    int steps_taken() const { return t_; }
    float current_lr() const;  // the LR the next step uses
    const AdamWConfig& config() const { return config_; }

    // Optimizer state (host copies, flat, parameter-table order) for checkpoints. Sharded
    // (ZeRO-1): only this rank's elements, packed in AdamWPartition::owned order.
    std::vector<float> get_m();
    std::vector<float> get_v();
    void set_state(const std::vector<float>& m, const std::vector<float>& v, int steps_taken);

  private:
    GPT& model_;
    Backend& backend_;
    AdamWConfig config_;
    void update(const float* grad_scale);
    AdamWParams next_hyperparameters() const;
    std::vector<TensorSlice> slices_;
    AdamWPartition partition_;
    // Per owned range (sharded): the tensor slices inside it, relative to its start.
    std::vector<std::vector<TensorSlice>> owned_slices_;
    size_t state_count_ = 0;                     // elements of m and v
    DeviceBuffer m_, v_;                         // optimizer (empty with offload)
    std::unique_ptr<OptimizerOffload> offload_;  // optim.offload: the state lives there
    // workspace: [0] norm^2, [1] clip scale, then (norm^2, clip) per grad_norm_squares range
    DeviceBuffer scratch_;
    // run.cuda_graph: the step's math::AdamWScalars on the device (keep_scalars_on_device), and
    // the host copy it is staged from.
    DeviceBuffer scalars_;
    math::AdamWScalars staged_scalars_{};
    int t_ = 0;
    bool norm_valid_ = false;
    float host_norm_ = -1;  // the norm given to step_with_clip_scale (-1: none)
};

}  // namespace mt
