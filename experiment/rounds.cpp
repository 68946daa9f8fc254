// The schedule of interleaved rounds (see rounds.h).
#include "experiment/rounds.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace mt {
namespace {

// SplitMix64 (Steele, Lea, Flood 2014): a 64-bit counter through a fixed bijective mix; every
// output bit depends on every input bit, which is all a shuffle of a few variants needs.
uint64_t splitmix64(uint64_t& state) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

}  // namespace

int effective_rounds(int rounds, int measure_steps) {
    return std::max(1, std::min(rounds, measure_steps));
}

std::vector<RoundSlice> round_slices(int warmup_steps, int measure_steps, int rounds) {
    if (warmup_steps < 0 || measure_steps < 0 || rounds < 1)
        throw std::invalid_argument("round_slices: warm-up " + std::to_string(warmup_steps) +
                                    ", measured " + std::to_string(measure_steps) + ", rounds " +
                                    std::to_string(rounds) + " (expected >= 0, >= 0, >= 1)");
    std::vector<RoundSlice> slices;
    if (measure_steps == 0) return slices;
    const int r = effective_rounds(rounds, measure_steps);
    const int base = measure_steps / r, longer = measure_steps % r;
    int first = warmup_steps;
    for (int i = 0; i < r; ++i) {
        const int n = base + (i < longer ? 1 : 0);
        slices.push_back({first, first + n});
        first += n;
    }
    return slices;
}

std::vector<int> round_order(int count, uint64_t seed, int round) {
    std::vector<int> order(static_cast<size_t>(std::max(count, 0)));
    for (int i = 0; i < count; ++i) order[static_cast<size_t>(i)] = i;
    // One stream per (seed, round): the round number is mixed in once, then drawn from.
    uint64_t state = seed ^ (0xD1B54A32D192ED03ull * (static_cast<uint64_t>(round) + 1));
    for (int i = count - 1; i > 0; --i) {
        // j uniform in [0, i]: the modulo bias of a 64-bit draw over i+1 <= a few hundred
        // variants is below 2^-50.
        const auto j = static_cast<int>(splitmix64(state) % static_cast<uint64_t>(i + 1));
        std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
    }
    return order;
}

}  // namespace mt
