// Stop signals: every signal a user or a scheduler sends to end a run (SIGINT from Ctrl-C,
// SIGTERM from kill / a scheduler, SIGHUP when the terminal goes away, SIGQUIT from Ctrl-\,
// SIGXCPU at a CPU-time limit, SIGUSR1/SIGUSR2 from a scheduler's warning) ends it the same way:
// the handler only records the signal (async-signal-safe), the step loop stops after the current
// step, what was measured is written, and the process exits 128 + the signal's number.
//
// Two stages:
// - while steps run, a second Ctrl-C or Ctrl-\ (SIGINT, SIGQUIT) kills the process the ordinary
//   way (a step can be long and the user means it); nothing is being written then. Any other
//   second signal is only recorded;
// - after protect_writes(), signals are only recorded until the scope ends, so a report is
//   never cut off mid-write (its temporaries are removed on the way out in every case).
// SIGPIPE is ignored for the scope: a closed stdout (`microtrain run | head`) must not kill the
// run before its results are written.
//
// Installed by `microtrain run` (cli/cmd_run.cpp, experiment/runner.cpp) and `microtrain train`
// (cli/training_run.cpp); read by the step loop (engine/step_loop.h), which owns what a signal
// does to the steps. Reusable by any long command.
#pragma once

#include <csignal>
#include <string>

namespace mt {

class StopSignals {
  public:
    // Installs the handlers (when `enable`) and clears any earlier stop request.
    explicit StopSignals(bool enable = true);
    // Restores the previous handlers, unless protect_writes() was called: then they stay until
    // the process exits, so a late signal cannot kill it between the report and exit().
    ~StopSignals();
    StopSignals(const StopSignals&) = delete;
    StopSignals& operator=(const StopSignals&) = delete;

    // From now on, until the process exits, signals are only recorded: nothing interrupts what
    // is being written. Call it once the steps are over, on the way out.
    void protect_writes();

  private:
    bool enabled_;
};

// The first stop signal received since the last StopSignals was made (0: none).
int stop_signal();
bool stop_requested();
// "SIGINT (Ctrl-C)", "SIGTERM", ... for messages.
std::string signal_description(int sig);

}  // namespace mt
