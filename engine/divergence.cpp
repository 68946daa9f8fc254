// The divergence rule (see divergence.h).
#include "engine/divergence.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace mt {
namespace {

std::string num(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.4g", v);
    return buf;
}

}  // namespace

DivergenceWatch::DivergenceWatch(int vocab_size)
    : ln_vocab_(std::log(static_cast<double>(std::max(vocab_size, 2)))) {}

std::optional<Divergence> DivergenceWatch::observe(int step, double loss, double grad_norm) {
    if (found_ || !std::isfinite(loss) || !std::isfinite(grad_norm)) return std::nullopt;
    if (!first_loss_) first_loss_ = loss;
    if (!first_grad_norm_ && grad_norm > 0) first_grad_norm_ = grad_norm;
    const double reference = std::max(ln_vocab_, *first_loss_);
    const double loss_limit = kDivergedLossFactor * reference;
    const bool rising = previous_loss_ && loss > *previous_loss_;
    std::string reason;
    if (loss > loss_limit && rising) {
        reason = "loss " + num(loss) + " is above " + num(kDivergedLossFactor) + " x " +
                 num(reference) + " (the larger of ln V = " + num(ln_vocab_) +
                 " and the first step's loss " + num(*first_loss_) +
                 ") and rising (previous step " + num(*previous_loss_) + ")";
    } else if (first_grad_norm_ && grad_norm > kExplodedGradNormFactor * *first_grad_norm_) {
        reason = "gradient norm " + num(grad_norm) + " is above " + num(kExplodedGradNormFactor) +
                 " x the first step's " + num(*first_grad_norm_);
    }
    previous_loss_ = loss;
    if (reason.empty()) return std::nullopt;
    found_ = Divergence{step, reason + "; lower optim.lr or enable optim.grad_clip"};
    return found_;
}

std::string divergence_warning(const Divergence& d) {
    return "diverged at step " + std::to_string(d.step) + ": " + d.reason;
}

}  // namespace mt
