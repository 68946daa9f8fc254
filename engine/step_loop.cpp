// The loop around the training step (see step_loop.h).
#include "engine/step_loop.h"

#include <cmath>
#include <csignal>
#include <cstdio>
#include <limits>
#include <sstream>
#include <utility>
#include <vector>

#include "engine/signals.h"

namespace mt {

// What to change, from the config: a decoupled weight decay with lr x weight_decay >= 1 scales
// every weight by (1 - lr x wd) <= 0 each step (the weights flip sign and grow until they
// overflow), whatever the LR alone; else the usual suspects of the loss or the gradients.
std::string non_finite_hint(const AdamWConfig& optim, bool loss_bad) {
    const double decay = static_cast<double>(optim.lr) * optim.weight_decay;
    if (decay >= 1) {
        char buf[160];
        std::snprintf(buf, sizeof buf,
                      "lower optim.weight_decay: lr x weight_decay = %g >= 1 scales the weights "
                      "by (1 - %g) each step",
                      decay, decay);
        return buf;
    }
    return loss_bad ? "lower optim.lr or check the data"
                    : "enable optim.grad_clip or lower optim.lr";
}

std::string non_finite_message(const RunConfig& config, const StepRecord& rec) {
    const bool loss_bad = !std::isfinite(rec.loss);
    // The step's number from 0, as the progress line ("step 3 (4 of 23)"), steps.csv and
    // results.json's steps[] name it.
    std::ostringstream msg;
    msg << "variant '" << config.variant << "': non-finite "
        << (loss_bad ? "loss (" + std::to_string(rec.loss) + ")"
                     : "gradient norm (" + std::to_string(rec.grad_norm) + ")")
        << " at step " << rec.step << " (" << (rec.warmup ? "warm-up; " : "") << "steps["
        << rec.step << "] in results.json), produced in the " << (loss_bad ? "forward" : "backward")
        << " phase and detected at the sync read-back; this variant stopped there ("
        << non_finite_hint(config.optim, loss_bad) << ")";
    return msg.str();
}

namespace {

NonFiniteValue non_finite_value(const RunConfig& config, const StepRecord& rec) {
    NonFiniteValue v;
    v.in_loss = !std::isfinite(rec.loss);
    v.value = v.in_loss ? rec.loss : rec.grad_norm;
    v.warmup = rec.warmup;
    v.phase = v.in_loss ? "forward" : "backward";
    v.message = non_finite_message(config, rec);
    return v;
}

}  // namespace

StepLoop::StepLoop(TrainingSession& session, StepLoopOptions options)
    : session_(session), options_(std::move(options)) {}

bool StepLoop::window_ends(int step, int last) const {
    return !session_.defers_read_back() || session_.drain_due() ||
           step + 1 == options_.warmup_steps || step + 1 == last || stop_signal() != 0 ||
           step == options_.interrupt_at_step;
}

LoopOutcome StepLoop::run(int first, int last) {
    LoopOutcome outcome;
    for (step_ = first; step_ < last; ++step_) {
        if (options_.before_step) options_.before_step(step_);
        TrainingSession::GradientsReady gradients_ready;
        if (options_.gradients_ready)
            gradients_ready = [this](GPT& model) { options_.gradients_ready(step_, model); };
        session_.enqueue_step(step_, step_ < options_.warmup_steps, gradients_ready);
        if (!window_ends(step_, last)) continue;
        std::vector<TrainingSession::CompletedStep> window = session_.drain();
        for (size_t i = 0; i < window.size(); ++i) {
            TrainingSession::CompletedStep& done = window[i];
            StepRecord& rec = done.record;
            if (rec.step == options_.inject_nan_at_step)
                rec.loss = std::numeric_limits<double>::quiet_NaN();
            if (options_.on_step) options_.on_step(done);
            if (!std::isfinite(rec.loss) || !std::isfinite(rec.grad_norm)) {
                // Under none the window's later steps ran on the device; they are dropped.
                outcome.end = LoopOutcome::End::non_finite;
                outcome.step = rec.step;
                outcome.non_finite = non_finite_value(session_.config(), rec);
                return outcome;
            }
            int sig = 0;
            if (i + 1 == window.size()) {
                // Data parallel: the signal every rank agreed on in the step (all stop together).
                sig = session_.world_size() > 1 ? rec.stop_signal : stop_signal();
                if (!sig && step_ == options_.interrupt_at_step) sig = SIGINT;  // the test hook
            }
            if (options_.after_step) options_.after_step(rec, sig);
            if (sig) {
                outcome.end = LoopOutcome::End::interrupted;
                outcome.step = step_;
                outcome.signal = sig;
                return outcome;
            }
        }
    }
    outcome.step = last - 1;
    return outcome;
}

}  // namespace mt
