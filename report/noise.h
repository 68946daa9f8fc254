// What else the machine did while the variants were measured, derived from the step rows
// (StepRow::other_cpu_ms, steal_ms, sm_clock_mhz, throttle_reasons, round): per slice (one
// variant's measured steps in one round, run.rounds) how busy the machine was, which slices a
// busy spell hit, and a round hit much harder than the others. report.md's "Machine noise"
// section prints it; `microtrain train` prints the same figures for its one continuous run
// (noise_of_steps).
//
// "Cores busy" = CPU time other processes took / wall time: 1.0 is one core's worth of someone
// else's work for the whole slice. It is tick-resolution (/proc: 10 ms summed over every CPU), so
// a slice of a few short steps reads in steps of 10 ms / its wall time.
#pragma once

#include <algorithm>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "report/results.h"

namespace mt {

// A slice is "hit" by other work when other processes took more than this many cores during it
// on average: a quarter core of someone else's work already slows a step that uses every core
// (cache, memory bandwidth, a stolen time slice), and below it the tick resolution of a short
// slice blurs the figure.
inline constexpr double kBusySliceCores = kUnevenLoadCores;  // one threshold (paired_stats.h)
// A round is "hit much harder than the others" when its cores busy exceed this many times the
// median of the other rounds (and kBusySliceCores): a burst that lands in one round, the case
// interleaving is for — that round's slices, of every variant, carry the load.
inline constexpr double kHarderRoundFactor = 3.0;
// Steal worth naming: the hypervisor took more than this many cores during a slice (a VM's
// neighbours; on a quiet host it reads 0).
inline constexpr double kStealCores = 0.05;

// The machine changed speed when even the steadiest variant's slowest slice took this much
// longer a step than its fastest (each slice's mean step): a cloud VM whose host lends its cores
// to another guest, or a clock that steps down, slows every variant with no process in sight
// (measured on a 2-core VM: 231 and 315 ms a step, flipping every few seconds). The steadiest
// variant, so that one whose steps vary by design (data.seq_len_jitter) does not read as it.
inline constexpr double kSpeedChange = 0.15;

// The noise of a run of steps (a slice, a round, a whole `train` run): sums over measured steps.
struct NoiseFigures {
    int steps = 0;
    int first_step = 0, last_step = 0;  // the steps it spans (StepRow::step)
    double wall_ms = 0, other_cpu_ms = 0, steal_ms = 0;
    std::optional<double> min_sm_clock_mhz, max_sm_clock_mhz;  // nullopt: no device clock
    std::vector<std::string> slowdowns;  // throttle reasons seen that slow the clock (not idle)

    void add(const StepRow& s);
    double cores_busy() const { return wall_ms > 0 ? other_cpu_ms / wall_ms : 0; }
    double steal_cores() const { return wall_ms > 0 ? steal_ms / wall_ms : 0; }
};

struct NoiseSlice {
    std::string variant;
    int round = 0;
    NoiseFigures figures;
    bool hit = false;  // cores_busy > kBusySliceCores
};

struct NoiseRound {
    int round = 0;
    NoiseFigures figures;            // every variant's slice of this round together
    bool much_harder = false;        // kHarderRoundFactor x the other rounds' median, and busy
    double others_median_cores = 0;  // that median (0 with one round)
};

// The steadiest variant's slowest and fastest slices (mean step time), see kSpeedChange.
struct SpeedChange {
    std::string variant;
    int fast_round = 0, slow_round = 0;
    double fast_ms = 0, slow_ms = 0;
    double ratio() const { return fast_ms > 0 ? slow_ms / fast_ms : 1; }
};

struct NoiseSummary {
    int rounds = 0;
    std::optional<SpeedChange> speed_change;  // set when ratio() > 1 + kSpeedChange
    std::vector<std::string> variants;        // the measured ones, in file order
    std::vector<NoiseSlice> slices;  // variant-major, rounds in order; empty slices left out
    std::vector<NoiseRound> rounds_figures;
    NoiseFigures all;               // every measured step of every variant
    std::optional<size_t> busiest;  // index in slices of the one with the most cores busy
    bool has_device_clock() const { return all.min_sm_clock_mhz.has_value(); }
    // Nothing worth naming: no slice hit, no steal worth naming, no clock slowdown, no change
    // of speed.
    bool quiet() const;
    const NoiseSlice* slice(const std::string& variant, int round) const;
};

// The noise of every measured step of the run's variants (warm-up excluded).
NoiseSummary summarize_noise(const Results& results);
// The sentences that say it: when and how much the machine was busy, which variants' slices it
// hit, a round hit much harder; one line on a quiet run. hardware_threads: the machine's (0:
// unknown), to put the cores in proportion.
std::vector<std::string> noise_sentences(const NoiseSummary& n, unsigned hardware_threads);
// report.md's "Machine noise" section: the sentences, and a variant x round table of cores busy
// (hit slices in bold; steal and the lowest SM clock where there are any). "" without measured
// steps.
std::string render_noise_md(const Results& results);

// `microtrain train`'s one continuous run: the figures of its steps, and its busiest stretch:
// the consecutive steps (at least min_steps, and at least min_wall_ms of step time, so the 10 ms
// ticks of a run of millisecond steps average out) with the most cores busy.
struct TrainNoise {
    NoiseFigures all;
    int busiest_first = 0, busiest_last = 0;
    double busiest_cores = 0;
};
// Step by step (a long run keeps only the current stretch), warm-up steps ignored. Until the
// first full stretch, the run so far is the busiest.
class TrainNoiseTracker {
  public:
    TrainNoiseTracker(int min_steps, double min_wall_ms)
        : min_steps_(static_cast<size_t>(std::max(min_steps, 1))), min_wall_ms_(min_wall_ms) {}
    void add(const StepRow& s);
    const TrainNoise& noise() const { return noise_; }

  private:
    size_t min_steps_;
    double min_wall_ms_;
    std::deque<StepRow> last_;  // the current stretch
    double other_ms_ = 0, wall_ms_ = 0;
    bool full_ = false;  // a full stretch has been seen
    TrainNoise noise_;
};
TrainNoise noise_of_steps(const std::vector<StepRow>& steps, int min_steps, double min_wall_ms);
// One line: "machine: other processes took 0.42 cores on average, 1.70 at most (steps
// 120–135); steal 0; GPU SM clock 1410–1980 MHz, sw_power_cap seen".
std::string train_noise_line(const TrainNoise& t);

}  // namespace mt
