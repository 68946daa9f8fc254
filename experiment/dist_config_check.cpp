// See dist_config_check.h.
#include "experiment/dist_config_check.h"

#include <cstdint>
#include <cstdio>
#include <sstream>

namespace mt {

bool same_text_on_every_rank(const std::string& mine, World& world, double timeout_s,
                             const char* command) {
    uint64_t len = mine.size();
    world.broadcast(&len, sizeof len, timeout_s, "the config check (size)");
    std::string rank0 = world.rank() == 0 ? mine : std::string(len, '\0');
    world.broadcast(rank0.data(), len, timeout_s, "the config check");
    double differs = rank0 != mine ? 1 : 0;
    if (differs) {
        // The first differing lines, so the user sees which key and how.
        std::istringstream a(rank0), b(mine);
        std::string la, lb, diff;
        int shown = 0;
        for (;;) {
            const bool more_a = static_cast<bool>(std::getline(a, la));
            const bool more_b = static_cast<bool>(std::getline(b, lb));
            if ((!more_a && !more_b) || shown >= 5) break;
            if (la != lb) {
                diff += "\n    rank 0: " + la + "\n    rank " + std::to_string(world.rank()) +
                        ": " + lb;
                ++shown;
            }
            la.clear(), lb.clear();
        }
        std::fprintf(stderr,
                     "microtrain %s: rank %d of %d: this rank's resolved config differs from "
                     "rank 0's:%s\n  every rank must read the same FILE with the same flags "
                     "(and the same files next to it)\n",
                     command, world.rank(), world.size(), diff.c_str());
    }
    world.allreduce_max(&differs, 1, timeout_s, "the config check (verdict)");
    if (differs && world.rank() == 0)
        std::fprintf(stderr,
                     "microtrain %s: refused: the ranks hold different configs (see the ranks' "
                     "messages above); nothing was run\n",
                     command);
    return differs == 0;
}

std::string resolved_config_text(const ExperimentSpec& spec) {
    std::string mine;
    for (const RunConfig& v : spec.variants) {
        mine += "variant " + v.variant + "\n";
        for (const auto& [k, val] : flatten(v)) mine += k + "=" + val + "\n";
    }
    return mine;
}

bool same_config_on_every_rank(const ExperimentSpec& spec, World& world, const char* command) {
    const double timeout = spec.variants.empty() ? 120 : spec.variants[0].dist.timeout_s;
    return same_text_on_every_rank(resolved_config_text(spec), world, timeout, command);
}

}  // namespace mt
