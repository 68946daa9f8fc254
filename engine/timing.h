// Step timing: the named phases of one training step, a PhaseTimer that records a backend
// TimingEvent at every phase boundary, and the statistics of a series of measured steps.
//
// A step is, in order (DESIGN.md): data -> h2d -> forward -> backward -> comm -> optimizer ->
// sync (comm only with data parallel).
// With grad_accum > 1 the data/h2d/forward/backward phases repeat once per micro-step and their
// times accumulate into the step's totals. `other` = wall - sum(phases): launch overhead and idle
// time (negative when host work overlapped device work, e.g. loading micro-batch 2 while the
// device still runs micro-batch 1 — reported as measured, never clamped).
//
// Clocks. `data` is the host waiting for the next batch, so it is timed with steady_clock. Every
// other phase is timed with Backend::create_event() events recorded on the stream that does the
// work (steady_clock on the CPU backend, cudaEvents on CUDA). The events are read only after the
// synchronisation that ends the step, never by syncing inside a phase.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/backend.h"

namespace mt {

// comm: the time the step waits for communication (data parallel, distributed/): for the gradient
// buckets after backward, and under ZeRO-1 for the parameters after the optimizer. Zero on one
// rank (the phase never runs). Communication hidden under backward is not a phase: it is
// measured beside the phases (StepRecord::comm_busy_ms).
enum class Phase : int { data, h2d, forward, backward, comm, optimizer, sync };
inline constexpr int kPhaseCount = 7;
inline constexpr std::array<Phase, kPhaseCount> kAllPhases = {
    Phase::data, Phase::h2d,       Phase::forward, Phase::backward,
    Phase::comm, Phase::optimizer, Phase::sync};
template <>
struct EnumSpelling<Phase> {
    static constexpr std::array<std::string_view, kPhaseCount> names{
        "data", "h2d", "forward", "backward", "comm", "optimizer", "sync"};
};
// Parses a phase name ("data", ..., "sync"); nullopt for anything else (including "other").
std::optional<Phase> phase_from_string(const std::string& name);

// The measured times of one step, in ms.
struct PhaseTimes {
    std::array<double, kPhaseCount> ms{};  // per phase, summed over micro-steps
    double wall_ms = 0;                    // host steady_clock, step start -> after the final sync
    double phase_sum_ms() const;
    double other_ms() const { return wall_ms - phase_sum_ms(); }
    double& operator[](Phase p) { return ms[static_cast<int>(p)]; }
    double operator[](Phase p) const { return ms[static_cast<int>(p)]; }
};

// One timed interval of a step, for the trace: offsets relative to the step start, in ms.
struct PhaseInterval {
    Phase phase;
    int micro_step = 0;
    double start_ms = 0;
    double duration_ms = 0;
};

// A TimingEvent on the host clock (steady_clock), used for the host-side data phase and by tests.
class HostEvent final : public TimingEvent {
  public:
    void record() override { t_ = std::chrono::steady_clock::now(); }
    double elapsed_ms_since(const TimingEvent& start) const override;
    std::chrono::steady_clock::time_point time() const { return t_; }

  private:
    std::chrono::steady_clock::time_point t_{};
};

// The times of a step closed with PhaseTimer::end_step_deferred, read later by read_deferred.
struct DeferredStepTimes {
    PhaseTimes times;
    std::vector<PhaseInterval> intervals;  // for the trace
    // Where the step starts on the trace's host timeline: the host start of the window's first
    // step plus this step's device offset from it (the device's timeline, like wall_ms).
    std::chrono::steady_clock::time_point host_start;
};

// Records the phases of one step. Usage per step:
//   timer.begin_step();
//   timer.begin(Phase::data); ...; timer.end(Phase::data);    // repeated per micro-step
//   ...
//   timer.begin(Phase::sync); model.loss(); backend.synchronize(); timer.end(Phase::sync);
//   PhaseTimes t = timer.finish_step();   // only now are the events read
// Events come from a pool that grows on first use and is reused every step, so no event is
// created inside a measured step after the first. begin/end also push/pop a backend range
// (NVTX on CUDA) named after the phase.
//
// Deferred steps (run.host_sync: none, where no step waits for the device): end_step_deferred()
// closes a step without reading anything, keeping its events; the next steps take fresh events
// from the pool (reserve_events() creates them before the measured steps); after one
// synchronisation read_deferred() reads every closed step. A deferred step's wall time is on the
// device clock — from its start event to the next deferred step's (all the device spent on it,
// idle gaps included), the last one to its own end event — because the host, never waiting, does
// not know when a step ended.
class PhaseTimer {
  public:
    // `use_ranges`: call backend.range_push/range_pop around each phase.
    explicit PhaseTimer(Backend& backend, bool use_ranges = true);
    PhaseTimer(const PhaseTimer&) = delete;
    PhaseTimer& operator=(const PhaseTimer&) = delete;

    void begin_step();
    void begin(Phase p);  // throws std::logic_error if a phase is already open
    void end(Phase p);    // throws std::logic_error if `p` is not the open phase
    // Reads all events (the caller has synchronised) and returns the step's times. Throws
    // std::logic_error if a phase is still open, no step was begun or deferred steps are unread.
    PhaseTimes finish_step();
    // Closes the step without reading its events (recording one at its end); see above. Throws
    // std::logic_error if a phase is still open or no step was begun.
    void end_step_deferred();
    // After the caller synchronised: the times of every step closed by end_step_deferred since
    // the last read, in order (empty when none). last_intervals() is then the last one's.
    std::vector<DeferredStepTimes> read_deferred();
    size_t deferred_steps() const { return deferred_.size(); }
    // Creates device events up front so that `steps` deferred steps of `events_per_step`
    // device events each (two per phase entry, plus two) create none while measured.
    void reserve_events(size_t steps, size_t events_per_step);
    // Intervals of the last finished step (for the trace).
    const std::vector<PhaseInterval>& last_intervals() const { return intervals_; }
    // Host time the last finished step began (for laying steps out on a trace timeline).
    std::chrono::steady_clock::time_point last_step_start() const { return step_start_host_; }
    // The device event recorded at the step start: other device-timed records (per-op events)
    // compute their offsets against it.
    const TimingEvent& step_start_event() const { return *device_pool_.at(step_.start_event); }
    bool in_step() const { return in_step_; }

  private:
    struct Mark {
        Phase phase;
        int micro_step;
        size_t begin_event, end_event;  // indices into the pool of the phase's clock
    };
    // One step's events: indices into the pools, and its host start.
    struct StepMarks {
        size_t start_event = 0, end_event = 0;  // device pool (end: deferred steps only)
        size_t host_start_event = 0;            // host pool
        std::vector<Mark> marks;
    };
    TimingEvent& next_device_event(size_t* index);
    HostEvent& next_host_event(size_t* index);
    // The phase times and intervals of `s` (its events complete); wall_ms is left to the caller.
    PhaseTimes read_marks(const StepMarks& s, std::vector<PhaseInterval>& intervals) const;
    // Throws std::logic_error unless a step is begun and no phase is open.
    void check_closable(const char* what) const;

    Backend& backend_;
    bool use_ranges_;
    std::chrono::steady_clock::time_point step_start_host_{};
    std::vector<std::unique_ptr<TimingEvent>> device_pool_;
    std::vector<HostEvent> host_pool_;
    size_t device_used_ = 0, host_used_ = 0;
    StepMarks step_;                   // the step begun last
    std::vector<StepMarks> deferred_;  // closed by end_step_deferred, not read yet
    std::array<int, kPhaseCount> phase_count_{};
    std::optional<Phase> open_;
    bool in_step_ = false;
    std::vector<PhaseInterval> intervals_;
};

// The current UTC time as ISO 8601 ("2026-12-03T18:18:19Z"), for results and caches.
std::string utc_now_iso();

// ---- statistics -------------------------------------------------------------------------------

// Percentile `p` in [0, 100] of sorted values with linear interpolation between closest ranks
// (NumPy's default): rank = p/100 * (n-1). Throws std::invalid_argument on an empty input.
double percentile_sorted(const std::vector<double>& sorted, double p);

struct SeriesStats {
    size_t n = 0;
    double mean = 0, median = 0, p10 = 0, p90 = 0, q1 = 0, q3 = 0, min = 0, max = 0;
    double std = 0;  // sample standard deviation (n-1 denominator; 0 for n < 2)
    double iqr() const { return q3 - q1; }
    // Relative spread (IQR / median): the jitter measure; 0 when median is 0.
    double iqr_over_median() const { return median != 0 ? iqr() / median : 0.0; }
};
// Statistics of `values` (any order). n = 0 gives all zeros.
SeriesStats compute_stats(std::vector<double> values);

// Jitter above which the report warns (IQR / median).
inline constexpr double kJitterWarnThreshold = 0.10;

}  // namespace mt
