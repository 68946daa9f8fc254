// Stop signals (see signals.h).
#include "engine/signals.h"

#include <array>
#include <atomic>

namespace mt {
namespace {

constexpr std::array<int, 7> kStopSignals{SIGINT,  SIGTERM, SIGHUP, SIGQUIT,
                                          SIGXCPU, SIGUSR1, SIGUSR2};

std::atomic<int> g_signal{0};
// True until protect_writes(): a second Ctrl-C (or Ctrl-\\) then takes its default action.
std::atomic<bool> g_second_kills{true};
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<bool>::is_always_lock_free,
              "the signal handler needs lock-free atomics");

struct sigaction g_previous[kStopSignals.size()];
struct sigaction g_previous_pipe;

extern "C" void on_stop_signal(int sig) {
    int none = 0;
    if (g_signal.compare_exchange_strong(none, sig)) return;  // the first: recorded
    if (g_second_kills.load() && (sig == SIGINT || sig == SIGQUIT)) {
        // A second one from the keyboard while steps run: the default action, as without a
        // handler (a scheduler's repeated SIGTERM is only recorded: it sends SIGKILL when it
        // means it). The signal is blocked inside its handler, so it is delivered once the
        // handler returns.
        std::signal(sig, SIG_DFL);
        std::raise(sig);
    }
}

}  // namespace

StopSignals::StopSignals(bool enable) : enabled_(enable) {
    g_signal.store(0);
    g_second_kills.store(true);
    if (!enabled_) return;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    for (int s : kStopSignals) sigaddset(&sa.sa_mask, s);  // one handler at a time
    sa.sa_flags = SA_RESTART;                              // a read or write in progress continues
    for (size_t i = 0; i < kStopSignals.size(); ++i)
        sigaction(kStopSignals[i], &sa, &g_previous[i]);
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    sigaction(SIGPIPE, &ignore, &g_previous_pipe);
}

StopSignals::~StopSignals() {
    // After protect_writes() the process is on its way out: a signal between here and exit()
    // must not kill it with its default action (the exit code says the stop instead).
    if (!enabled_ || !g_second_kills.load()) return;
    for (size_t i = 0; i < kStopSignals.size(); ++i)
        sigaction(kStopSignals[i], &g_previous[i], nullptr);
    sigaction(SIGPIPE, &g_previous_pipe, nullptr);
}

void StopSignals::protect_writes() {
    g_second_kills.store(false);
}

int stop_signal() {
    return g_signal.load();
}

bool stop_requested() {
    return g_signal.load() != 0;
}

std::string signal_description(int sig) {
    switch (sig) {
        case SIGINT:
            return "SIGINT (Ctrl-C)";
        case SIGTERM:
            return "SIGTERM";
        case SIGHUP:
            return "SIGHUP";
        case SIGQUIT:
            return "SIGQUIT";
        case SIGXCPU:
            return "SIGXCPU (CPU time limit)";
        case SIGUSR1:
            return "SIGUSR1";
        case SIGUSR2:
            return "SIGUSR2";
        default:
            return "signal " + std::to_string(sig);
    }
}

}  // namespace mt
