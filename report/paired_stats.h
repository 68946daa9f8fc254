// The time call of a variant against the baseline: a 95 % confidence interval of its speedup
// built from interleaved rounds, and the call (faster / slower / no difference / inconclusive)
// made from that interval and a minimal effect (compare.min_effect).
//
// What is paired. The runner takes every variant's measured steps in R rounds (run.rounds); in
// each round every variant runs its slice of steps, in an order shuffled per round. Whatever the
// machine did during a round (another job, a thermal or frequency drift) hit the baseline's slice
// and the variant's slice of that round alike, so the comparison is made WITHIN each round and
// only the per-round comparisons are pooled:
//
//   d_r = log(median of the baseline's round-r steps) - log(median of the variant's round-r steps)
//
// The median of a slice ignores a burst that hits fewer than half of its steps. d_r is on a log
// scale because step times combine multiplicatively (a 10 % faster kernel is a ratio whatever the
// machine's speed that round), so a ratio becomes a difference, and exp(mean d) is the geometric
// mean of the per-round speedups.
//
// The interval (the method): a Student t-interval on the per-round log ratios,
//   mean(d) ± t(0.975, R-1) · sd(d) / sqrt(R),   exponentiated: [low, high] of the speedup.
// It assumes the R values d_r are independent and roughly normal around the true log speedup:
// independent because each round's pair is measured in its own stretch of time (the shared drift
// cancels inside the pair; what is left is each slice's own noise and the small drift between
// the two slices of a round, whose sign the shuffled order makes random). It is exact for normal
// d_r with any R >= 2, and the per-round medians are close to normal. A round hit by a burst is
// an outlier d_r: an outlier D among R values moves the mean by D/R but raises the standard
// deviation to about D/sqrt(R), so the half-width grows by about t·D/R (t = 2.78 at R = 5): the
// interval widens more than it moves, and a burst gives an honest `inconclusive` rather than a
// wrong call — and a gross one is left out (the outlying-pair rule below). Why not a bootstrap over
// rounds: with R = 5 it under-covers (it cannot see the tails of 5 values); why not a rank interval
// (Walsh averages / Hodges–Lehmann): with R = 5 the highest confidence it can reach is 1 - 2/32
// = 93.75 %, never 95 %. tests/test_paired_stats.cpp shows, on a simulator of step times with
// drift, noise and bursts, the coverage, the A/A false-call rate and the power of these calls.
//
// The call, from the interval [low, high] and the minimal effect m (default 2 %):
//   faster         low  >= 1 + m            (the whole interval is a gain of at least m)
//   slower         high <= 1 / (1 + m)      (the whole interval is a loss of at least m)
//   no difference  1/(1+m) <= low and high <= 1 + m   (any effect is smaller than m)
//   inconclusive   otherwise: the interval straddles a boundary. The half-width shrinks as
//                  t(0.975, R'-1) / sqrt(R'); the rounds it would take to clear the nearest
//                  boundary, if the centre and the spread stayed as measured, are estimated.
// With fewer than 2 rounds there is no spread to build an interval from: `inconclusive`.
//
// Pairs that met different machines are left out. The pairing assumes the baseline's and the
// variant's slices of a round met the same load; each step records the CPU time other processes
// took (engine/cpu_load.h), so that is checked rather than assumed: a round whose two slices'
// loads (other processes' cores busy) differ by more than kUnevenLoadCores — or by more than
// the figure's own resolution on a short slice, 3 clock ticks over the slice's wall time — is
// not a pair, and the call says how many rounds it left out. A neighbour that burns a core in
// bursts of a second or two lands on some slices of a round and not on others: those rounds are
// exactly the ones this drops, and without it a few of them can tilt a 5-round interval into a
// wrong call. A machine can also change speed with no other process in sight (a cloud VM's host
// gives its cores to another guest, the clock steps down): measured on a 2-core VM, every step
// of a run went from 231 ms to 315 ms in the middle of one slice. A median cannot hide a change
// that splits its slice, so a round is also left out when one of its slices is unsteady: the
// middle half of its steps spreads (inner_spread_log: log of the upper over the lower inner
// value) by more than kUnsteadySliceFactor times that side's typical (median) slice spread and
// by more than kUnsteadySliceFloor. Relative to its own slices, so a variant whose steps always
// vary (data.seq_len_jitter) keeps its rounds; decided from each slice alone, never from the
// ratio, so it cannot favour a call. And when the speed changes between the two slices of a
// round (on that VM it flipped between the two levels every few seconds), neither slice shows
// it: that round's ratio is off by the change, 37 % where the effects are a few. So, last, a
// pair whose log ratio lies farther from the median of the round pairs than kOutlierPairFloor
// (15 %) and than kOutlierPairMads robust standard deviations (1.4826 · MAD) is left out (with
// 3 pairs or more). On a machine whose rounds scatter by a few percent this never fires, and
// the interval is the plain t-interval; it removes only changes far beyond any round's noise,
// on either side of the centre. When too few pairs are left, the call is `inconclusive` and
// says why.
//
// Unpaired (`microtrain compare A.json B.json`: two runs, measured at different times, so their
// rounds are not pairs): a Welch t-interval on the difference of the mean log per-round medians
// of the two runs. It needs 2 rounds in each run, and covers the noise inside each run only: a
// change of the machine between the two runs is not in it, which is why its output says
// "unpaired".
#pragma once

#include <array>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/enum_names.h"

namespace mt {

inline constexpr double kDefaultMinEffect = 0.02;  // compare.min_effect
inline constexpr int kMinRoundsForInterval = 2;    // an interval needs a spread: 2 rounds

enum class TimeCall { faster, slower, no_difference, inconclusive };
template <>
struct EnumSpelling<TimeCall> {
    static constexpr std::array<std::string_view, 4> names{"faster", "slower", "no difference",
                                                           "inconclusive"};
};

// One variant's measured steps by round: round -> the median step time (ms) of its slice.
using RoundMedians = std::map<int, double>;
// From (round, step ms) of the measured steps. A negative round (a step recorded without one)
// counts as round 0.
RoundMedians round_medians(const std::vector<std::pair<int, double>>& round_and_ms);

// The load each slice met: round -> cores busy with other processes (their CPU time / the
// slice's wall time), and the slice's wall time (ms), from (round, wall ms, other processes' CPU
// ms) of the measured steps.
struct SliceLoad {
    double cores_busy = 0, wall_ms = 0;
    // log(x[n-1-k] / x[k]) of the slice's n sorted step times, k = n/4: the spread of the
    // middle half, where its median lies (a lone spike does not move it; a change of speed
    // inside the slice does). 0 for a slice of one step.
    double inner_spread_log = 0;
};
using RoundLoads = std::map<int, SliceLoad>;
RoundLoads round_loads(const std::vector<std::array<double, 3>>& round_wall_other);
// Two slices of a round met different loads beyond this many cores busy (the noise section's
// kBusySliceCores: a quarter core of someone else's work already moves a step).
inline constexpr double kUnevenLoadCores = 0.25;
// A slice is unsteady beyond this many times its side's median inner spread, and beyond 5 %.
inline constexpr double kUnsteadySliceFactor = 3.0;
inline constexpr double kUnsteadySliceFloor = 0.05;
// A round pair is an outlier beyond 15 % and 5 robust standard deviations from the median pair.
inline constexpr double kOutlierPairFloor = 0.15;
inline constexpr double kOutlierPairMads = 5.0;
// The CPU-time figure's resolution: Linux's USER_HZ clock tick (100 Hz), in ms.
inline constexpr double kCpuTickMs = 10.0;
// Whether slices a and b of one round met different loads (see the top of this file).
bool uneven_load(const SliceLoad& a, const SliceLoad& b);

// The speedup (baseline time / variant time) and its 95 % interval, on the log scale.
struct SpeedupInterval {
    bool paired = true;
    int rounds = 0;  // paired: rounds both sides have; unpaired: the fewer of the two runs'
    int rounds_baseline = 0, rounds_variant = 0;
    int rounds_left_out = 0;    // paired: common rounds whose slices met different loads
    int rounds_unsteady = 0;    // paired: common rounds left out because a slice was unsteady
    int rounds_outlying = 0;    // paired: common rounds whose ratio was far from the others'
    bool has_interval = false;  // false: too few rounds (fewer than 2; unpaired: in either run)
    double centre_log = 0;      // the point estimate: mean log ratio (0 when no round at all)
    double se_log = 0;          // its standard error
    double df = 0;              // the t distribution's degrees of freedom
    double half_width_log = 0;  // t(0.975, df) * se_log
    std::vector<double> log_ratios;  // paired: d_r per common round, in round order

    double centre() const;  // exp(centre_log): the geometric mean of the per-round speedups
    double low() const;     // exp(centre_log - half_width_log)
    double high() const;
};

// `baseline_load` / `variant_load` (optional): the rounds whose slices met different loads, or
// one of whose slices was unsteady, are left out of the pairs.
SpeedupInterval paired_speedup_interval(const RoundMedians& baseline, const RoundMedians& variant,
                                        const RoundLoads* baseline_load = nullptr,
                                        const RoundLoads* variant_load = nullptr);
SpeedupInterval unpaired_speedup_interval(const RoundMedians& baseline,
                                          const RoundMedians& variant);

// The call from an interval [low, high] of the speedup and the minimal effect m (boundaries
// inclusive; checked in the order faster, slower, no difference).
TimeCall call_from_interval(double low, double high, double min_effect);

// For an interval that straddles a boundary: about how many more rounds (in each run, unpaired)
// would make the half-width smaller than the distance from the centre to the nearest boundary
// (log(1+m) or -log(1+m)), if the centre and the per-round spread stayed as measured. nullopt
// when no number of rounds up to kMaxRoundsEstimate would (the centre sits on a boundary) or
// there is no interval.
inline constexpr int kMaxRoundsEstimate = 1000;
std::optional<int> more_rounds_to_decide(const SpeedupInterval& s, double min_effect);

// The call with its text: "1.23x faster [1.18–1.27]", "0.91x slower [0.89–0.93]",
// "1.00x no difference [0.99–1.01]", "inconclusive [0.97–1.09]: about 6 more rounds would
// decide it"; unpaired ones end with " (unpaired)". The point estimate is the interval's centre.
struct TimeCallResult {
    TimeCall call = TimeCall::inconclusive;
    std::optional<std::pair<double, double>> ci95;  // [low, high]; nullopt: no interval
    std::optional<int> more_rounds;                 // inconclusive: the estimate above
    std::string text;
};
TimeCallResult make_time_call(const SpeedupInterval& s, double min_effect);

// Student's t distribution with `df` > 0 degrees of freedom (df need not be an integer: Welch).
double student_t_cdf(double t, double df);
double student_t_quantile(double p, double df);  // 0 < p < 1

}  // namespace mt
