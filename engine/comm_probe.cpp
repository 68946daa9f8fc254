// The cached all-reduce probe (see comm_probe.h).
#include "engine/comm_probe.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/profile.h"
#include "io/atomic_file.h"
#include "io/regular_file.h"

namespace mt {
namespace {

constexpr size_t kProbeMaxBytes = size_t{64} << 20;

std::string cache_path() {
    return (std::filesystem::path(peaks_cache_dir()) / "allreduce_probe.json").string();
}

nlohmann::json read_cache() {
    std::error_code ec;
    if (!std::filesystem::exists(cache_path(), ec)) return nlohmann::json::object();
    try {
        // A FIFO or a device there is refused (FileKindError), not opened: it would block.
        nlohmann::json j =
            nlohmann::json::parse(read_regular_file(cache_path(), kMaxCacheFileBytes));
        return j.is_object() ? j : nlohmann::json::object();
    } catch (const std::exception&) {
        return nlohmann::json::object();  // a damaged cache is measured over, never trusted
    }
}

}  // namespace

CommProbe all_reduce_probe(TrainingSession& session, World& world, double timeout_s, bool force) {
    CommProbe p;
    if (session.world_size() < 2) return p;
    // The gradient buffer: the trainable tensors only (LoRA / optim.freeze).
    const size_t bytes =
        std::min(session.model().trainable_count() * sizeof(float), kProbeMaxBytes);
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    const std::string key = std::string(host) + " | " + session.collectives()->describe() + " | " +
                            std::to_string(world.size()) + " ranks | " + std::to_string(bytes) +
                            " bytes";
    char mib[32];
    std::snprintf(mib, sizeof mib, "%.3g", static_cast<double>(bytes) / (1 << 20));
    const std::string what = std::string("all-reduce of the gradient buffer (") + mib +
                             " MiB) over " + std::to_string(world.size()) + " ranks, best of 3";
    // Rank 0 decides (cached or not) for everyone: the measurement is a collective.
    double cached = 0;
    std::string cached_when;
    if (world.rank() == 0 && !force) {
        const nlohmann::json c = read_cache();
        if (c.contains(key) && c[key].is_object() && c[key].value("busbw_gbps", 0.0) > 0) {
            cached = c[key]["busbw_gbps"].get<double>();
            cached_when = c[key].value("measured_utc", "");
        }
    }
    world.broadcast(&cached, sizeof cached, timeout_s, "the all-reduce probe's cache lookup");
    if (cached > 0) {
        p.busbw_gbps = cached;
        p.source = "cache (" + cache_path() + ", measured " + cached_when + "): " + what;
        return p;
    }
    p.busbw_gbps = session.probe_all_reduce_gbps(kProbeMaxBytes);
    p.source = "measured now: " + what;
    if (world.rank() == 0 && p.busbw_gbps > 0) {
        try {
            std::filesystem::create_directories(peaks_cache_dir());
            nlohmann::json c = read_cache();
            if (!c.contains(key) || c[key].value("busbw_gbps", 0.0) < p.busbw_gbps)
                c[key] = {{"busbw_gbps", p.busbw_gbps}, {"measured_utc", utc_now_iso()}};
            write_file_atomic(cache_path(), c.dump(2) + "\n");
        } catch (const std::exception& e) {
            std::fprintf(stderr, "microtrain: note: could not update the probe cache %s: %s\n",
                         cache_path().c_str(), e.what());
        }
    }
    return p;
}

}  // namespace mt
