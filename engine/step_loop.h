// The loop around the training step, defined once. `microtrain run` (experiment/runner.cpp),
// `microtrain train` (cli/training_run.cpp, and its one-batch smoke test in cli/cmd_train.cpp),
// `microtrain step` (cli/cmd_step.cpp) and bench/cpu_step all run their steps through a StepLoop;
// each only configures it (what to do with each step, the test hooks) and turns its outcome into
// its own reaction (a failed variant, an exit code, a message).
//
// What the loop owns:
// - the order: steps [first, last) of a TrainingSession, step i a warm-up step when
//   i < warmup_steps;
// - run.host_sync none's windows: the steps are enqueued without a host wait and read back
//   together (TrainingSession::drain) at the end of the warm-up, at the end of the steps, when a
//   window is full (TrainingSession::kHostSyncWindow) and as soon as a stop signal arrives. With
//   every other setting a window is one step, read back as it ends;
// - the policy for a non-finite loss or gradient norm: the loop stops at that step (under none,
//   the later steps of its window ran on the device but are dropped) and says which step,
//   whether it was a warm-up step, the phase that produced the value and what to try;
// - the policy for stop signals (engine/signals.h): the loop ends after the step that saw one —
//   on one process the signal this process received (stop_signal()), under data parallel the
//   one every rank agreed on in the step (StepRecord::stop_signal), so all ranks stop together.
//
// For each step read back, in order: on_step (every step, the non-finite one included: the
// runner records it, `train` writes its CSV row), then the loop's checks, then after_step (a
// step that passed them, with the stop signal when the loop ends after it: `train`
// checkpoints there). Installing the signal handlers (StopSignals) stays with the command, whose
// scope also covers what it writes after the loop.
#pragma once

#include <functional>
#include <string>

#include "engine/step_record.h"
#include "engine/training_session.h"
#include "model/gpt.h"

namespace mt {

// How a command configures the loop. Every callback is optional.
struct StepLoopOptions {
    // Steps with an index below this are warm-up steps (StepRecord::warmup; their per-op times
    // stay out of the profiler's table). Under run.host_sync none the warm-up ends a window.
    int warmup_steps = 0;
    // Before step `step` is run.
    std::function<void(int step)> before_step;
    // After the last micro-step's backward of step `step` and before its optimizer update
    // (TrainingSession::GradientsReady): the step's gradients are complete.
    std::function<void(int step, GPT& model)> gradients_ready;
    // Every step read back, in order, before the loop judges it.
    std::function<void(const TrainingSession::CompletedStep& done)> on_step;
    // A step whose loss and gradient norm are finite, after on_step. `stop_signal` is the signal
    // the loop stops for after this step (0: it goes on).
    std::function<void(const StepRecord& rec, int stop_signal)> after_step;
    // Test hooks (-1: off). The loss read back at this step is replaced by NaN.
    int inject_nan_at_step = -1;
    // Behave as if SIGINT arrived during this step.
    int interrupt_at_step = -1;
};

// A loss or gradient norm that is not finite, and what the loop says about it.
struct NonFiniteValue {
    bool in_loss = true;  // the loss; false: the gradient norm (the loss was finite)
    double value = 0;
    bool warmup = false;
    // The phase that produced it: "forward" (the loss) or "backward" (the gradients).
    std::string phase;
    // "variant 'V': non-finite loss (nan) at step 2 (warm-up; steps[2] in results.json),
    // produced in the forward phase and detected at the sync read-back; this variant stopped
    // there (lower optim.lr or check the data)" — V is the session's RunConfig::variant, the
    // step numbered from 0 as the progress line, steps.csv and results.json number it, the hint
    // from the config (non_finite_hint: weight decay or LR).
    std::string message;
};

// How a StepLoop::run ended.
struct LoopOutcome {
    enum class End { completed, non_finite, interrupted };
    End end = End::completed;
    // non_finite: the step whose loss or gradient norm is not finite. interrupted: the last step
    // run (the loop stopped after it). completed: the last step run (last - 1).
    int step = -1;
    int signal = 0;             // interrupted: the stop signal's number
    NonFiniteValue non_finite;  // when end == non_finite
};

// The non-finite message of NonFiniteValue::message for step `rec` of config's variant.
std::string non_finite_message(const RunConfig& config, const StepRecord& rec);
// Its hint, what to change: "lower optim.weight_decay: ..." when lr x weight_decay >= 1, else
// "lower optim.lr or check the data" (a loss) / "enable optim.grad_clip or lower optim.lr".
std::string non_finite_hint(const AdamWConfig& optim, bool loss_bad);

class StepLoop {
  public:
    StepLoop(TrainingSession& session, StepLoopOptions options);

    // Runs steps first .. last-1 (nothing when first >= last) until the last one, a non-finite
    // loss or gradient norm, or a stop signal. Exceptions (a step's, a callback's) propagate;
    // step() then says which step was running.
    LoopOutcome run(int first, int last);

    // The step begun last (while run() runs: the one running now, or whose window is being read
    // back); after a run() that ran every step, `last`.
    int step() const { return step_; }

  private:
    // run.host_sync none: whether the window ends with step `step` (it is read back now).
    bool window_ends(int step, int last) const;

    TrainingSession& session_;
    StepLoopOptions options_;
    int step_ = -1;
};

}  // namespace mt
