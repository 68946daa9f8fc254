// The divergence rule, defined once: whether a run whose loss and gradient norm are still finite
// is nevertheless blowing up. `microtrain run` (each variant, experiment/runner.cpp), `train`
// (cli/training_run.cpp) and `step` (cli/cmd_step.cpp) feed every step they read back to a
// DivergenceWatch; the first step it flags is the run's divergence (a warning on the progress
// line, results.json's `diverged`, and never a "keep" verdict). A non-finite value is the
// StepLoop's business (engine/step_loop.h): it stops the loop, this only warns.
//
// The rule (docs/commands.md "Divergence" states it for users). With
//   reference = max(ln V, the first step's loss)
// (a freshly initialised GPT starts near ln V, the loss of guessing uniformly over the V tokens;
// a resumed run may start lower, and a bad initialisation higher), step s has diverged when
//   - its loss is above kDivergedLossFactor x reference and above the previous step's loss
//     (far worse than guessing, and still rising: not a spike the run already came back from), or
//   - its gradient norm (known only with optim.grad_clip; 0 otherwise) is above
//     kExplodedGradNormFactor x the first step's gradient norm.
#pragma once

#include <optional>
#include <string>

namespace mt {

// A loss twice that of a uniform guess puts, on average, probability 1/V^2 on the right token:
// no run that is learning gets there, and every divergence seen (lr 10: 5.3 -> 320; lr 1000:
// 1.7e15) passes it within a few steps.
inline constexpr double kDivergedLossFactor = 2.0;
// Training shrinks the gradient norm from its value at the start; growing it a thousandfold is
// an explosion that clipping hides from the loss for a while, not noise (step-to-step changes of
// a healthy run stay within ~10x).
inline constexpr double kExplodedGradNormFactor = 1000.0;

// The first step found diverged, and why, in words that name the numbers and the thresholds.
struct Divergence {
    int step = 0;
    std::string reason;
};

class DivergenceWatch {
  public:
    // `vocab_size`: V, the model's real vocabulary (not the padded one).
    explicit DivergenceWatch(int vocab_size);

    // Feeds the next step read back (steps in order; non-finite values are skipped). Returns the
    // divergence when this step is the first one flagged, nullopt otherwise (also for every step
    // after the first flagged one: a run diverges once).
    std::optional<Divergence> observe(int step, double loss, double grad_norm);

    // The first step flagged so far.
    const std::optional<Divergence>& found() const { return found_; }

  private:
    double ln_vocab_;
    std::optional<double> first_loss_, previous_loss_, first_grad_norm_;
    std::optional<Divergence> found_;
};

// The warning printed when a step is flagged: "diverged at step 3: <reason>".
std::string divergence_warning(const Divergence& d);

}  // namespace mt
