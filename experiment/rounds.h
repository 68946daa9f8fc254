// The schedule of interleaved rounds (run.rounds): which measured steps of a variant each round
// holds, and the order the variants run in within a round.
//
// Variants that run one after another are measured on a machine whose load changes between
// them: a neighbour's build that starts while the second variant runs is credited to that
// variant's knob. Interleaving spreads every variant over the whole run instead: the measured
// steps [W, W+M) of each variant (W warm-up steps, M measured) are cut into R consecutive slices
// of as equal a size as possible (the first M mod R slices one step longer), and round r runs
// slice r of every variant, in an order shuffled per round from the run's seed. A change of load
// then lands in one round of every variant rather than on all the steps of one, and the
// comparison pairs each variant's round-r steps with the baseline's round-r steps
// (report/paired_stats.h). A variant still trains one continuous sequence of steps 0, 1, 2, ...
// from the same seed, so its losses and weights are bitwise those of a run with one round.
#pragma once

#include <cstdint>
#include <vector>

namespace mt {

// Steps [first, last) of a variant, in the numbering of all its steps (warm-up first).
struct RoundSlice {
    int first = 0, last = 0;
    int size() const { return last - first; }
};

// The rounds a variant with `measure_steps` measured steps is measured in: min(rounds,
// measure_steps), so that every round holds at least one of its steps.
int effective_rounds(int rounds, int measure_steps);

// Slice r (0-based, r < effective_rounds) of the measured steps [warmup, warmup + measure) of a
// variant in `rounds` rounds; the slices are consecutive and cover every measured step once.
std::vector<RoundSlice> round_slices(int warmup_steps, int measure_steps, int rounds);

// The order the variants 0 .. count-1 run in during round `round`: a Fisher–Yates shuffle driven
// by a SplitMix64 stream of (seed, round), so every run (and every rank, every platform: no
// std::shuffle, whose algorithm the standard leaves open) with the same seed has the same
// schedule.
std::vector<int> round_order(int count, uint64_t seed, int round);

}  // namespace mt
