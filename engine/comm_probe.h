// The all-reduce probe of data parallel: the bus bandwidth the job's transport reaches for an
// all-reduce of the gradient buffer (at most 64 MiB), the yardstick of a step's achieved
// communication bandwidth. Cached like the machine peaks (engine/profile.h): in
// peaks_cache_dir()/allreduce_probe.json, one entry per (host, transport, ranks, bytes), keeping
// the best figure ever measured; a cached entry skips the measurement.
#pragma once

#include <string>

#include "distributed/world.h"
#include "engine/training_session.h"

namespace mt {

struct CommProbe {
    double busbw_gbps = 0;  // GB/s (10^9 bytes/s), ring bus bandwidth; 0: none (one rank)
    std::string source;     // "measured now: ..." or "cache (...): ..."
};

// Collective: every rank calls it at the same point. Rank 0 looks the cache up and tells the
// others whether to measure; after a measurement rank 0 updates the cache. `force` measures
// whatever the cache holds.
CommProbe all_reduce_probe(TrainingSession& session, World& world, double timeout_s,
                           bool force = false);

}  // namespace mt
