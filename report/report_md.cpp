// report.md: the full human report (see render.h). The comparison table is comparison.cpp's,
// the suggestions suggestions.cpp's; the HTML page is report_html.cpp.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

#include "engine/training_session.h"
#include "report/comparison.h"
#include "report/format.h"
#include "report/noise.h"
#include "report/render.h"
#include "report/suggestions.h"

namespace mt {

using nlohmann::json;
using namespace report_text;

// ---- the full markdown report -------------------------------------------------------------------

namespace {

const RankRecord* rank_zero(const DataParallelRecord& d) {
    for (const RankRecord& r : d.ranks)
        if (r.rank == 0) return &r;
    return nullptr;
}

std::string simulated_link_text(const DataParallelRecord& d) {
    std::string s = "simulated: " + f("%.4g", d.simulated_link_gbps) + " Gbit/s";
    if (d.simulated_link_ratio && d.calibration_compute_ms)
        s += " (scaled so a step's gradients take " + f("%g", *d.simulated_link_ratio) +
             "x the measured forward + backward, " + f("%.1f", *d.calibration_compute_ms) + " ms)";
    return s + ", " + f("%g", d.simulated_latency_us) + " µs — not a real interconnect";
}

std::string memory_peak_text(const VariantResult& v) {
    const MemoryRecord& m = v.memory;
    std::string s = mib(m.tracked_peak_total) + " MiB tracked";
    if (m.peak_phase) {
        s += " during " + std::string(enum_name(*m.peak_phase));
        if (const auto& pm = m.phases[column(*m.peak_phase)])
            s += " (+" + mib(pm->transient_peak) + " MiB allocated in it)";
    } else {
        s += ", held through every phase (allocated at setup; no phase allocates on top)";
    }
    s += "; largest category " + std::string(enum_name(m.largest_category)) + " (" +
         mib(category_bytes(m.tracked_peak, m.largest_category)) + " MiB)";
    const DeviceMemoryRecord& d = m.device;
    if (d.available)
        s += "; " + d.kind + " peak " + mib(d.peak_used_bytes) + " MiB" +
             (d.total_bytes > 0 ? " of " + mib(d.total_bytes) + " MiB" : std::string());
    return s;
}

std::string top_kernels_text(const VariantResult& v, size_t n) {
    std::string s;
    for (size_t i = 0; i < v.kernels.size() && i < n; ++i) {
        const KernelRecord& k = v.kernels[i];
        if (!s.empty()) s += ", ";
        s += k.name + " " + f("%.1f%%", k.pct_of_step) + " (" + limit_of(k) + ", " +
             f("%.1f%%", k.pct_of_roofline) + " of its roofline)";
    }
    return s;
}

// Which phases moved against the baseline (mean ms, variant - baseline), largest first, and a
// hint when background loader threads took cores from the compute.
std::string phase_moves_text(const VariantResult& v, const VariantResult& base) {
    if (!v.measured() || !base.measured()) return "";
    const Shares a = shares_of(base), b = shares_of(v);
    std::vector<std::pair<double, int>> moves;
    for (int i = 0; i < kPhaseColumnCount; ++i) moves.emplace_back(b.ms[i] - a.ms[i], i);
    std::sort(moves.begin(), moves.end(),
              [](const auto& x, const auto& y) { return std::fabs(x.first) > std::fabs(y.first); });
    std::string s = "- vs the baseline (mean ms, variant − baseline): step " +
                    signed_f("%.2f", b.step_ms - a.step_ms);
    int shown = 0;
    for (const auto& [d, i] : moves) {
        if (shown == 3 || std::fabs(d) < 0.02 * a.step_ms) break;
        s += std::string(shown++ ? ", " : "; ") + phase_column_name(i) + " " + signed_f("%.2f", d);
    }
    s += "\n";
    const int data = column(Phase::data), fwd = column(Phase::forward),
              bwd = column(Phase::backward);
    const double data_d = b.ms[data] - a.ms[data];
    const double compute_d = (b.ms[fwd] + b.ms[bwd]) - (a.ms[fwd] + a.ms[bwd]);
    if (v.backend == "cpu" && data_d < -0.05 * a.step_ms && compute_d > 0.5 * -data_d &&
        v.config_value("data.workers") != base.config_value("data.workers"))
        s += "- note: the data phase shrank but forward/backward grew by " + f("%.2f", compute_d) +
             " ms: on the CPU the loader's worker threads compete with the compute threads for "
             "the same cores, so the saved wait is spent again; the gain needs spare cores "
             "(run.threads + data.workers <= the machine's hardware threads)\n";
    return s;
}

// run.host_sync: how often the variant's step made the host wait for the device, and how long.
std::string host_syncs_text(const VariantResult& v) {
    const std::string mode = v.config_value("run.host_sync");
    return "- host syncs: " + f("%.0f", v.stats.host_syncs.median) +
           " per step (median), the host waited " + f("%.2f", v.stats.host_wait_ms.median) +
           " ms in them" + (mode.empty() ? std::string() : " (`run.host_sync: " + mode + "`)") +
           (v.backend == "cpu" ? "; CPU ops are synchronous, so a sync waits for nothing here"
                               : std::string()) +
           "\n";
}

// What one setting of run.host_sync does to the step, for the line below.
std::string host_sync_cause(const std::string& mode) {
    if (mode == "every_op")
        return "`run.host_sync: every_op` synchronises after every kernel, as naive debug code "
               "does: the device idles while the host wakes up and launches the next kernel, so "
               "the cost lands inside forward, backward and optimizer rather than in sync";
    if (mode == "loss_every_step")
        return "`run.host_sync: loss_every_step` reads the loss after every micro-step's forward "
               "(`loss.item()`): the host stalls in sync until the forward is done, and the "
               "backward then starts from an idle device";
    return "the step waits for the device more often than the baseline's";
}

// The sync line of "Bottleneck and next steps": when the variant synchronises more often than
// the baseline, or its sync phase grew beyond the noise (the larger IQR, and 1% of the
// baseline's step), it names the sync phase, the setting and where the cost landed.
std::string host_sync_growth_text(const VariantResult& v, const VariantResult& base) {
    if (!v.measured() || !base.measured()) return "";
    const SeriesSummary& vs = v.stats.phases_ms[column(Phase::sync)];
    const SeriesSummary& bs = base.stats.phases_ms[column(Phase::sync)];
    const double grew = vs.mean - bs.mean;
    const bool more_syncs = v.stats.host_syncs.median > base.stats.host_syncs.median;
    const bool sync_grew =
        grew > std::max({vs.iqr, bs.iqr, 0.01 * base.stats.step_ms.mean}) && grew > 0;
    if (!more_syncs && !sync_grew) return "";
    const Shares a = shares_of(base), b = shares_of(v);
    auto moved = [&](Phase p) { return b.ms[column(p)] - a.ms[column(p)]; };
    const double compute = moved(Phase::forward) + moved(Phase::backward) + moved(Phase::optimizer);
    const std::string syncs = f("%.0f", base.stats.host_syncs.median) + " → " +
                              f("%.0f", v.stats.host_syncs.median) + " per step";
    const std::string phase = f("%.2f", bs.mean) + " to " + f("%.2f", vs.mean) + " ms per step";
    const std::string waits = "host waits " + f("%.2f", base.stats.host_wait_ms.median) + " → " +
                              f("%.2f", v.stats.host_wait_ms.median) + " ms";
    std::string t = "- next: ";
    t += sync_grew
             ? "sync grew from " + phase + " (host syncs " + syncs + ", " + waits + ")"
             : "host syncs grew " + syncs + " (the sync phase from " + phase + ", " + waits + ")";
    t += ": " + host_sync_cause(v.config_value("run.host_sync")) +
         "; forward+backward+optimizer moved " + signed_f("%.2f", compute) + " ms, other " +
         signed_f("%.2f", b.ms[kPhaseCount] - a.ms[kPhaseCount]) + " ms, the step " +
         signed_f("%.2f", b.step_ms - a.step_ms) + " ms";
    if (v.backend == "cpu")
        t += " (CPU backend: ops are synchronous, so a sync waits for nothing; a move within the "
             "spread of the comparison is noise)";
    return t +
           ". Read the step's scalars back once at its end (`run.host_sync: step`) or keep them "
           "on the device (`run.host_sync: none`).\n";
}

// The variant the three questions are answered for: the baseline, else the first measured one.
const VariantResult* reference_variant(const Results& res, const std::string& baseline) {
    const VariantResult* ref = nullptr;
    for (const VariantResult& v : res.variants)
        if (v.name == baseline && v.measured()) ref = &v;
    if (!ref)
        for (const VariantResult& v : res.variants)
            if (v.measured()) return &v;
    return ref;
}

void write_header(std::ostringstream& o, const Results& res, const Comparison& cmp) {
    const Environment& env = res.environment;
    o << "# " << res.experiment.name << " — microtrain report\n\n";
    o << "Experiment `" << res.experiment.source << "`, started " << res.started_utc
      << ", baseline `" << cmp.baseline << "`";
    if (env.git_commit)
        o << ", commit `" << env.git_commit->substr(0, 12) << "`"
          << (env.git_dirty.value_or(false) ? " (with uncommitted changes)" : "");
    o << ".\n";
    if (res.interrupted)
        o << "\n**Interrupted (Ctrl-C): the numbers below cover only the steps measured before "
             "the interruption.**\n";
    for (const VariantResult& v : res.variants)
        if (v.status == RunStatus::failed)
            o << "\n**Failed: " << v.message << "** (its measured steps are kept below)\n";
    for (const VariantResult& v : res.variants)
        if (v.diverged)
            o << "\n**Warning: '" << v.name << "' " << divergence_warning(*v.diverged)
              << "** (its verdict is never keep)\n";
    if (!env.usable_cores) return;
    const UsableCores cores{*env.usable_cores, env.usable_cores_source.value_or("")};
    for (const VariantResult& v : res.variants)
        if (v.backend == "cpu")
            if (const auto w = threads_beyond_cores(v.threads, cores))
                o << "\n**Warning: '" << v.name << "' " << w->what << "**: " << w->fix << ".\n";
}

void write_answers(std::ostringstream& o, const VariantResult* ref, const Comparison& cmp) {
    o << "\n## Answers\n\n";
    if (ref) {
        const Shares s = shares_of(*ref);
        const int d = dominant(s);
        o << "- **Where is the step slow?** In `" << ref->name << "`, " << phase_column_name(d)
          << " takes " << pct(s.share(d)) << " of the mean step (" << f("%.2f", s.ms[d]) << " of "
          << f("%.2f", s.step_ms) << " ms)";
        if (!ref->kernels.empty()) o << "; top ops: " << top_kernels_text(*ref, 3);
        o << ".\n";
        o << "- **Where does memory peak?** " << memory_peak_text(*ref) << ".\n";
    } else {
        o << "- No variant has measured steps, so there is nothing to answer with.\n";
    }
    o << "- **Is the change worth keeping?**";
    bool any_variant = false;
    for (const ComparisonRow& r : cmp.rows) {
        if (r.is_baseline) continue;
        any_variant = true;
        o << "\n  - `" << r.variant << "` (" << r.changed << "): " << r.verdict;
    }
    if (!any_variant) o << " There is only the baseline: add variants to compare.";
    o << "\n";
}

// run.cuda_graph: a replayed step's device work is one phase (engine/training_session.h).
bool replays_a_graph(const VariantResult& v) {
    return v.config_value("run.cuda_graph") == "true";
}
const char* kGraphPhasesText =
    "its `forward` is the whole graph replay — forward, backward and optimizer of every "
    "micro-step, launched as one CUDA graph —, so its `backward` and `optimizer` read 0: inside "
    "a graph the host marks no boundary between them. Compare its step time, and its `forward` "
    "with the others' forward + backward + optimizer";

void write_phase_table(std::ostringstream& o, const Results& res) {
    o << "\n## Phase breakdown\n\nMean ms per measured step (share of the mean step). `other` = "
         "step wall time − the sum of the phases (launch overhead, idle time; negative when host "
         "and device work overlapped).\n\n| Variant | steps |";
    for (int i = 0; i < kPhaseColumnCount; ++i) o << " " << phase_column_name(i) << " |";
    o << " step (mean) | step p10–p90 | jitter |\n|---|---:|";
    for (int i = 0; i < kPhaseColumnCount; ++i) o << "---:|";
    o << "---:|---:|---:|\n";
    for (const VariantResult& v : res.variants) {
        if (!v.measured()) {
            o << "| " << v.name << " | 0 | – | " << to_string(v.status) << ": no measured steps |";
            for (int i = 0; i < kPhaseCount + 2; ++i) o << " |";
            o << "\n";
            continue;
        }
        const Shares s = shares_of(v);
        const SeriesSummary& st = v.stats.step_ms;
        o << "| " << v.name << " | " << v.measured_steps << " |";
        for (int i = 0; i < kPhaseColumnCount; ++i)
            o << " " << f("%.2f", s.ms[i]) << " (" << f("%.0f%%", 100 * s.share(i)) << ") |";
        const double jit = v.stats.jitter;
        o << " " << f("%.2f", s.step_ms) << " | " << f("%.2f", st.p10) << "–" << f("%.2f", st.p90)
          << " | " << pct(jit) << (jit > kJitterWarnThreshold ? " ⚠" : "") << " |\n";
    }
    for (const VariantResult& v : res.variants)
        if (v.measured() && replays_a_graph(v))
            o << "\n`" << v.name << "` (`run.cuda_graph: true`): " << kGraphPhasesText << ".\n";
}

// The peaks each device's MFU and roofline use, in words (the first variant per device).
std::string peaks_text(const VariantResult& v) {
    const RooflineRecord& rf = v.roofline;
    return "`" + v.device_name + "`: peak " + f("%.1f", rf.peak_flops_per_s / 1e9) + " GFLOP/s (" +
           rf.flops_source + "), bandwidth " + f("%.1f", rf.bandwidth_bytes_per_s / 1e9) +
           " GB/s (" + rf.bytes_source + "), ridge " + f("%.2f", rf.ridge_flops_per_byte) +
           " FLOP/byte. " + "MFU: " + v.flops.peak_source;
}

void write_throughput(std::ostringstream& o, const Results& res) {
    o << "\n## Throughput and FLOPs\n\n| Variant | device | samples/step | tokens/step | model "
         "GFLOP/step | achieved GFLOP/s | peak GFLOP/s used for MFU | MFU |\n"
         "|---|---|---:|---:|---:|---:|---:|---:|\n";
    std::map<std::string, std::string> sources;  // by device: the first variant's figures
    bool mfu_over = false;
    for (const VariantResult& v : res.variants) {
        if (!v.measured()) continue;
        const FlopsRecord& fl = v.flops;
        o << "| " << v.name << " | " << v.device_name << " | " << v.batch.samples_per_step << " | "
          << v.batch.tokens_per_step << " | " << f("%.3f", fl.per_step / 1e9) << " | "
          << f("%.2f", fl.achieved_per_s / 1e9) << " | "
          << (fl.peak_per_s ? f("%.1f", *fl.peak_per_s / 1e9) : std::string("n/a")) << " | "
          << (fl.mfu ? pct(*fl.mfu) : "n/a") << " |\n";
        if (fl.mfu && *fl.mfu > 1.0) mfu_over = true;
        if (!sources.count(v.device_name)) sources[v.device_name] = peaks_text(v);
    }
    o << "\nModel FLOPs per token: 6 N + 6 L C T, as llm.c counts them (N every parameter; what "
         "backward does not run left out; docs/report.md, \"MFU and the peak it uses\").\n";
    if (!sources.empty()) {
        o << "\nPeaks used:\n";
        for (const auto& [dev, s] : sources) o << "\n- " << s;
        o << "\n";
    }
    if (mfu_over)
        o << "\n**MFU above 100%: the training step ran faster than the measured peak, so the "
             "peak probe was disturbed (a busy machine when it ran). Delete `"
          << res.environment.peaks_cache
          << "/cpu_peaks.json` to re-measure on a quiet machine.**\n";
}

// Whether two variants' memory tables would print the same rows: the same estimate and the same
// tracked peak in every category.
bool same_memory_rows(const MemoryRecord& a, const MemoryRecord& b) {
    return a.estimate == b.estimate && a.tracked_peak == b.tracked_peak &&
           a.estimate_total == b.estimate_total && a.tracked_peak_total == b.tracked_peak_total;
}

// One block of rows per distinct memory record: variants whose rows would repeat an earlier
// block's (a kernel ladder's variants all hold the same buffers) are named in that block's first
// column instead of printing the same numbers again.
void write_memory_estimate_table(std::ostringstream& o, const Results& res) {
    o << "\n## Memory\n\nAnalytic estimate (printed before the run) beside the allocator's "
         "tracked peak per category, in MiB.\n\n| Variant | category | estimate | tracked peak | "
         "Δ (tracked − estimate) |\n|---|---|---:|---:|---:|\n";
    std::vector<const VariantResult*> printed;
    for (const VariantResult& v : res.variants) {
        if (v.status == RunStatus::skipped) continue;
        const bool repeats = std::any_of(printed.begin(), printed.end(), [&](const auto* p) {
            return same_memory_rows(p->memory, v.memory);
        });
        if (repeats) continue;
        printed.push_back(&v);
        std::string names = v.name;
        for (const VariantResult& w : res.variants)
            if (&w != &v && w.status != RunStatus::skipped && same_memory_rows(w.memory, v.memory))
                names += ", " + w.name;
        const MemoryRecord& m = v.memory;
        for (int c = 0; c < kMemoryCategoryCount; ++c) {
            const double e = static_cast<double>(m.estimate[c]);
            const double t = static_cast<double>(m.tracked_peak[c]);
            o << "| " << (c == 0 ? names : "") << " | " << to_string(static_cast<MemoryCategory>(c))
              << " | " << mib_or_bytes(e) << " | " << mib_or_bytes(t) << " | "
              << mib_or_bytes(t - e, /*sign=*/true) << " |\n";
        }
        const double e = static_cast<double>(m.estimate_total);
        const double t = static_cast<double>(m.tracked_peak_total);
        o << "| | **total (peak of the sum)** | " << mib(e) << " | " << mib(t) << " | "
          << signed_f("%.1f", to_mib(t - e)) << " |\n";
    }
}

void write_memory_peaks(std::ostringstream& o, const Results& res) {
    o << "\nWhere memory peaks:\n";
    for (const VariantResult& v : res.variants) {
        if (v.status == RunStatus::skipped) continue;
        o << "\n- `" << v.name << "`: " << memory_peak_text(v);
        if (const size_t rss = v.memory.process_peak_rss_bytes; rss > 0) {
            o << "; process peak RSS (since its setup) " << mib(rss) << " MiB";
            // Why this bounds the peak's swing between runs: engine/memory.h.
            if (const auto huge = v.memory.process_huge_page_bytes; huge && *huge > 0)
                o << ", " << mib(*huge)
                  << " MiB of it on 2 MiB pages at the end (the kernel grants them as its free "
                     "memory allows and counts each whole, touched or not: where it grants fewer, "
                     "the same config peaks lower, by at most that)";
        }
    }
    o << "\n\nPer-phase peaks (tracked MiB / device-or-RSS MiB):\n\n| Variant |";
    for (Phase p : kAllPhases) o << " " << enum_name(p) << " |";
    o << "\n|---|";
    for (int i = 0; i < kPhaseCount; ++i) o << "---:|";
    o << "\n";
    // Variants whose cells print the same share one row, named together (as in the table above).
    std::vector<std::pair<std::string, std::string>> rows;  // (variants, cells)
    for (const VariantResult& v : res.variants) {
        if (v.status == RunStatus::skipped) continue;
        std::ostringstream cells;
        for (Phase p : kAllPhases) {
            if (const auto& pm = v.memory.phases[column(p)])
                cells << " " << mib(pm->tracked_peak_total) << " / " << mib(pm->device_used_peak)
                      << " |";
            else
                cells << " – |";
        }
        const auto same = std::find_if(rows.begin(), rows.end(),
                                       [&](const auto& r) { return r.second == cells.str(); });
        if (same != rows.end())
            same->first += ", " + v.name;
        else
            rows.emplace_back(v.name, cells.str());
    }
    for (const auto& [names, cells] : rows) o << "| " << names << " |" << cells << "\n";
}

void write_kernels(std::ostringstream& o, const Results& res) {
    for (const VariantResult& v : res.variants) {
        if (v.kernels.empty()) continue;
        o << "\n## Kernels: " << v.name
          << "\n\nPer op over the measured steps (analytic FLOPs and bytes / measured time); "
             "limited by = what its measured % of roofline says: latency-limited below "
          << f("%.0f", 100 * kFarBelowRoofline)
          << " % (the implementation, not the machine), else compute- or memory-bound by its "
             "arithmetic intensity vs the ridge point ("
          << f("%.2f", v.roofline.ridge_flops_per_byte)
          << " FLOP/byte); implementation = what the op ran (kernels.*); % of peak = achieved "
             "GFLOP/s / the measured peak ("
          << f("%.1f", v.roofline.peak_flops_per_s / 1e9)
          << " GFLOP/s).\n\n| op | implementation | calls | total ms | ms/step | % of step | "
             "GFLOP/s | % of peak | GB/s | FLOP/byte | limited by | % of roofline "
             "|\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|\n";
        for (size_t i = 0; i < v.kernels.size() && i < 12; ++i) {
            const KernelRecord& k = v.kernels[i];
            const double peak = v.roofline.peak_flops_per_s;
            o << "| " << k.name << " | " << (k.impl.empty() ? "–" : k.impl) << " | " << k.calls
              << " | " << f("%.2f", k.total_ms) << " | " << f("%.3f", k.ms_per_step) << " | "
              << f("%.1f", k.pct_of_step) << " | " << f("%.2f", k.gflops_per_s) << " | "
              << (peak > 0 && k.flops > 0 ? f("%.1f", 100.0 * k.gflops_per_s * 1e9 / peak)
                                          : std::string("–"))
              << " | " << f("%.2f", k.gb_per_s) << " | " << f("%.2f", k.intensity) << " | "
              << limit_of(k) << " | " << f("%.0f", k.pct_of_roofline) << " |\n";
        }
    }
}

void write_rank_table(std::ostringstream& o, const DataParallelRecord& d) {
    o << "\n| rank | step ms | comm exposed ms | comm overlapped ms | data ms | forward ms | "
         "backward ms | optimizer ms |\n|---|---:|---:|---:|---:|---:|---:|---:|\n";
    for (const RankRecord& r : d.ranks) {
        const bool slow = d.ranks.size() > 1 && r.rank == d.slowest_rank;
        o << "| "
          << (slow ? "**" + std::to_string(r.rank) + "** (slowest)" : std::to_string(r.rank))
          << " | " << f("%.2f", r.step_ms);
        for (double x :
             {r.phases_ms[column(Phase::comm)], r.comm_overlapped_ms,
              r.phases_ms[column(Phase::data)], r.phases_ms[column(Phase::forward)],
              r.phases_ms[column(Phase::backward)], r.phases_ms[column(Phase::optimizer)]})
            o << " | " << f("%.2f", x);
        o << " |\n";
    }
    o << "\nMedians per rank over its measured steps. Rank spread: " << f("%.2f", d.rank_spread_ms)
      << " ms (" << pct(d.rank_spread_pct) << " of the fastest rank's median step); slowest rank "
      << d.slowest_rank << ".\n";
}

// `next`: the variant's suggestions (run_comm_suggestions), printed when comm is the bottleneck.
void write_comm_verdict(std::ostringstream& o, const VariantResult& v,
                        const std::vector<std::string>& next) {
    const DataParallelRecord& d = *v.data_parallel;
    const bool bottleneck = comm_is_bottleneck(v);
    o << "\n**Is communication the bottleneck?** " << (bottleneck ? "Yes" : "No")
      << ": the exposed communication wait is " << pct(d.comm_share) << " of the median step ("
      << f("%.2f", d.comm_exposed_ms) << " of " << f("%.2f", v.stats.step_ms.median)
      << " ms); the largest phase is " << enum_name(largest_phase(v))
      << " (threshold: communication is the bottleneck when it is the largest phase or more than "
      << pct(kCommBottleneckShare) << " of the step).\n\n";
    if (bottleneck)
        for (const std::string& s : next) o << "- next: " << s << "\n";
    if (d.ranks.size() > 1 && d.rank_spread_pct > kRankSpreadWarn)
        o << "- straggler / load imbalance: rank " << d.slowest_rank << " is the slowest, "
          << f("%.2f", d.rank_spread_ms) << " ms (" << pct(d.rank_spread_pct)
          << ") slower per step than the fastest rank (more than " << pct(kRankSpreadWarn)
          << "); every collective waits for it, so the other ranks' comm wait includes its lag. "
             "Check what differs on that rank (its data phase, other processes on its cores, "
             "`run.threads` × ranks against the machine's cores).\n";
    if (d.simulated_link_gbps > 0)
        o << "- the link is simulated: these communication times are what the simulated link "
             "would take, not what this machine's interconnect does.\n";
}

void write_communication(std::ostringstream& o, const Results& res) {
    bool any = false;
    for (const VariantResult& v : res.variants) any = any || (v.data_parallel && v.measured());
    if (!any) return;
    o << "\n## Communication (data parallel)\n\nThe comm phase is the time a step *waits* for "
         "communication (exposed); communication hidden under backward (overlapped) is measured "
         "beside the phases. Per step, rank 0's medians unless stated.\n";
    const std::vector<std::vector<std::string>> next = run_comm_suggestions(res);
    for (size_t i = 0; i < res.variants.size(); ++i) {
        const VariantResult& v = res.variants[i];
        if (!v.data_parallel || !v.measured()) continue;
        const DataParallelRecord& d = *v.data_parallel;
        o << "\n### " << v.name << "\n\n";
        o << "- world size **" << d.world_size << "**, transport " << d.transport << ", ZeRO stage "
          << d.zero << ", overlap " << (d.overlap ? "on" : "off") << ", " << d.buckets << " bucket"
          << (d.buckets == 1 ? "" : "s") << " of " << f("%g", d.bucket_mb) << " MiB\n";
        if (d.simulated_link_gbps > 0)
            o << "- link: **" << simulated_link_text(d) << "**\n";
        else
            o << "- link: the real transport (no simulated link)\n";
        o << "- sent per step (each rank): " << mib(d.bytes_per_step) << " MiB ("
          << f("%.0f", d.bytes_per_step) << " bytes)\n";
        o << "- achieved bus bandwidth: " << f("%.3f", d.achieved_busbw_gbps) << " GB/s";
        if (d.probe_busbw_gbps)
            o << " vs the probe's " << f("%.3f", *d.probe_busbw_gbps) << " GB/s"
              << (d.busbw_fraction_of_probe ? ", " + pct(*d.busbw_fraction_of_probe) + " of it"
                                            : std::string())
              << " (probe: " << d.probe_source << ")";
        else
            o << " (no probe of this transport)";
        o << "\n";
        const RankRecord* r0 = rank_zero(d);
        o << "- communication per step: exposed " << f("%.2f", d.comm_exposed_ms) << " ms ("
          << pct(d.comm_share) << " of the step), overlapped " << f("%.2f", d.comm_overlapped_ms)
          << " ms" << (r0 ? ", link busy " + f("%.2f", r0->comm_busy_ms) + " ms" : std::string())
          << "\n";
        write_rank_table(o, d);
        write_comm_verdict(o, v, next[i]);
    }
}

void write_bottlenecks(std::ostringstream& o, const Results& res, const VariantResult* ref,
                       const std::string& baseline) {
    o << "\n## Bottleneck and next steps\n";
    const std::vector<std::vector<std::string>> next = run_suggestions(res);
    for (size_t i = 0; i < res.variants.size(); ++i) {
        const VariantResult& v = res.variants[i];
        o << "\n### " << v.name << "\n\n";
        if (!v.measured()) {
            o << to_string(v.status) << ": "
              << (v.message.empty() ? std::string("no measured steps") : v.message) << "\n";
            continue;
        }
        const Shares s = shares_of(v);
        const int d = dominant(s);
        o << "- dominant phase: **" << phase_column_name(d) << "** (" << pct(s.share(d))
          << " of the step)\n";
        if (replays_a_graph(v)) o << "- `run.cuda_graph: true`: " << kGraphPhasesText << "\n";
        if (!v.kernels.empty()) o << "- top ops: " << top_kernels_text(v, 5) << "\n";
        o << "- memory: " << memory_peak_text(v) << "\n";
        o << host_syncs_text(v);
        if (v.name != baseline && ref && ref->name == baseline) o << phase_moves_text(v, *ref);
        if (v.name != baseline && ref && ref->name == baseline) o << host_sync_growth_text(v, *ref);
        for (const std::string& sug : next[i]) o << "- next: " << sug << "\n";
    }
}

void write_configuration(std::ostringstream& o, const Results& res) {
    const std::vector<VariantResult>& vs = res.variants;
    o << "\n## Effective configuration\n\nEvery key of every variant (the base plus the variant's "
         "`set:`); a key a variant changed is in bold.\n\n| key |";
    for (const VariantResult& v : vs) o << " " << v.name << " |";
    o << "\n|---|";
    for (size_t i = 0; i < vs.size(); ++i) o << "---|";
    o << "\n";
    std::set<std::string> keys;
    for (const VariantResult& v : vs)
        for (const auto& kv : v.config) keys.insert(kv.first);
    for (const std::string& k : keys) {
        o << "| " << k << " |";
        for (const VariantResult& v : vs) {
            const auto it = v.config.find(k);
            const std::string val = it != v.config.end() ? it->second : "–";
            o << " " << (v.changed.count(k) ? "**" + val + "**" : val) << " |";
        }
        o << "\n";
    }
    for (const VariantResult& v : vs)
        if (v.knobs_changed > 1)
            o << "\n- `" << v.name << "` changes " << v.knobs_changed
              << " knobs at once: its effect cannot be attributed to one of them.";
}

void write_environment(std::ostringstream& o, const Results& res) {
    o << "\n\n## Environment\n\n";
    const json env = environment_to_json(res.environment);
    for (auto it = env.begin(); it != env.end(); ++it)
        o << "- " << it.key() << ": "
          << (it.value().is_string() ? it.value().get<std::string>() : it.value().dump()) << "\n";
    o << "\nFiles: results.json (everything), steps.csv (per step, per phase), trace.json (open in "
         "https://ui.perfetto.dev or chrome://tracing), report.html (this report with charts).\n";
}

}  // namespace

std::string render_report_md(const Results& results) {
    const Comparison cmp = build_comparison(results);
    const VariantResult* ref = reference_variant(results, cmp.baseline);
    std::ostringstream o;
    write_header(o, results, cmp);
    write_answers(o, ref, cmp);
    o << "\n## Comparison\n\n" << render_comparison_md(cmp);
    o << render_noise_md(results);  // what else the machine did meanwhile (report/noise.h)
    o << "\n<!-- charts -->\n";
    write_phase_table(o, results);
    write_throughput(o, results);
    write_memory_estimate_table(o, results);
    write_memory_peaks(o, results);
    write_kernels(o, results);
    write_communication(o, results);
    write_bottlenecks(o, results, ref, cmp.baseline);
    write_configuration(o, results);
    write_environment(o, results);
    return o.str();
}

}  // namespace mt
