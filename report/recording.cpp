// Engine records into the results schema, and the statistics derived from the step rows (see
// recording.h).
#include "report/recording.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>

#include "report/comparison.h"

namespace mt {

namespace {

// A finite number, or nullopt (written as JSON null: JSON has no NaN).
std::optional<double> finite(double x) {
    return std::isfinite(x) ? std::optional<double>(x) : std::nullopt;
}

CategoryBytes estimate_bytes(const MemoryEstimate& e) {
    CategoryBytes b{};
    b[static_cast<int>(MemoryCategory::params)] = e.params;
    b[static_cast<int>(MemoryCategory::grads)] = e.grads;
    b[static_cast<int>(MemoryCategory::optimizer)] = e.optimizer;
    b[static_cast<int>(MemoryCategory::activations)] = e.activations;
    b[static_cast<int>(MemoryCategory::workspace)] = e.workspace;
    b[static_cast<int>(MemoryCategory::data)] = e.data;
    return b;
}

// The statistics of one quantity over the measured steps.
SeriesSummary measured_series(const std::vector<StepRow>& steps,
                              const std::function<double(const StepRow&)>& value) {
    std::vector<double> xs;
    for (const StepRow& s : steps)
        if (!s.warmup) xs.push_back(value(s));
    return SeriesSummary::of(compute_stats(xs));
}

// Whether the variant's batches vary in length (data.seq_len_jitter > 0): its tokens and FLOPs
// per step are then the measured steps' own.
bool has_shape_jitter(const VariantResult& v) {
    const std::string j = v.config_value("data.seq_len_jitter");
    return !j.empty() && std::strtod(j.c_str(), nullptr) > 0;
}

// The mean over the measured steps of what a step trained: tokens and model FLOPs.
struct MeasuredWork {
    double tokens_per_step = 0, model_flops_per_step = 0;
};
MeasuredWork measured_work(const std::vector<StepRow>& steps) {
    MeasuredWork w;
    int n = 0;
    for (const StepRow& s : steps) {
        if (s.warmup) continue;
        w.tokens_per_step += s.tokens;
        w.model_flops_per_step += s.model_flops;
        ++n;
    }
    if (n > 0) w.tokens_per_step /= n, w.model_flops_per_step /= n;
    return w;
}

StepStatistics step_statistics(const std::vector<StepRow>& steps) {
    StepStatistics st;
    st.step_ms = measured_series(steps, [](const StepRow& s) { return s.wall_ms; });
    for (int i = 0; i < kPhaseCount; ++i)
        st.phases_ms[i] = measured_series(steps, [i](const StepRow& s) { return s.phases_ms[i]; });
    st.other_ms = measured_series(steps, [](const StepRow& s) { return s.other_ms; });
    std::vector<double> losses;  // the finite ones
    for (const StepRow& s : steps)
        if (!s.warmup && std::isfinite(s.loss)) losses.push_back(s.loss);
    st.loss = SeriesSummary::of(compute_stats(losses));
    st.host_syncs = measured_series(steps, [](const StepRow& s) { return s.host_syncs; });
    st.host_wait_ms = measured_series(steps, [](const StepRow& s) { return s.host_wait_ms; });
    st.other_cpu_ms = measured_series(steps, [](const StepRow& s) { return s.other_cpu_ms; });
    st.steal_ms = measured_series(steps, [](const StepRow& s) { return s.steal_ms; });
    st.jitter = st.step_ms.iqr_over_median;
    st.jitter_warning = st.step_ms.n > 0 && st.jitter > kJitterWarnThreshold;
    return st;
}

// The data-parallel record's derived numbers, from its ranks and rank 0's statistics (the
// variant's): the exposed comm time and the step it is a share of come from the same medians.
void derive_data_parallel(DataParallelRecord& d, const StepStatistics& st) {
    d.slowest_rank = 0;
    d.rank_spread_ms = d.rank_spread_pct = d.comm_overlapped_ms = 0;
    if (!d.ranks.empty()) {
        const auto [lo, hi] = std::minmax_element(
            d.ranks.begin(), d.ranks.end(),
            [](const RankRecord& a, const RankRecord& b) { return a.step_ms < b.step_ms; });
        d.slowest_rank = hi->rank;
        d.rank_spread_ms = hi->step_ms - lo->step_ms;
        d.rank_spread_pct = lo->step_ms > 0 ? d.rank_spread_ms / lo->step_ms : 0;
        for (const RankRecord& r : d.ranks)
            if (r.rank == 0) d.comm_overlapped_ms = r.comm_overlapped_ms;
    }
    d.comm_exposed_ms = st.phases_ms[static_cast<int>(Phase::comm)].median;
    d.comm_share = st.step_ms.median > 0 ? d.comm_exposed_ms / st.step_ms.median : 0;
    d.busbw_fraction_of_probe.reset();
    if (d.probe_busbw_gbps && *d.probe_busbw_gbps > 0)
        d.busbw_fraction_of_probe = d.achieved_busbw_gbps / *d.probe_busbw_gbps;
}

}  // namespace

StepRow step_row(const StepRecord& s) {
    StepRow o;
    o.step = s.step;
    o.warmup = s.warmup;
    o.wall_ms = s.times.wall_ms;
    o.phases_ms = s.times.ms;
    o.other_ms = s.times.other_ms();
    o.loss = s.loss;
    o.grad_norm = s.grad_norm;
    o.lr = s.lr;
    o.comm_busy_ms = s.comm_busy_ms;
    o.comm_bytes = s.comm_bytes;
    o.host_syncs = s.host_syncs;
    o.host_wait_ms = s.host_wait_ms;
    o.other_cpu_ms = s.other_cpu_ms;
    o.steal_ms = s.steal_ms;
    if (s.device_clock) {
        o.sm_clock_mhz = s.device_clock->sm_clock_mhz;
        o.throttle_reasons = throttle_reason_names(s.device_clock->throttle_reasons);
    }
    o.tokens = s.tokens;
    o.model_flops = s.model_flops;
    return o;
}

MemoryRecord memory_record(const MemoryEstimate& estimate, const MemorySummary& m) {
    MemoryRecord o;
    o.estimate = estimate_bytes(estimate);
    o.estimate_total = estimate.total();
    o.tracked_peak = m.tracked_peak;
    o.tracked_peak_total = m.tracked_peak_total;
    o.at_setup_total = m.at_setup.current_total;
    for (Phase p : kAllPhases) {
        const PhaseMemory& pm = m.phases[static_cast<int>(p)];
        if (!pm.seen) continue;
        o.phases[static_cast<int>(p)] = PhaseMemoryRecord{pm.tracked_peak_total, pm.tracked_peak,
                                                          pm.device_used_peak, pm.transient_peak};
    }
    o.peak_phase = m.peak_phase();
    o.largest_category = m.largest_category();
    o.device = {m.device_available, m.device_kind, m.device_total, m.device_used_peak};
    o.process_peak_rss_bytes = m.process_peak_rss;
    o.process_huge_page_bytes = m.process_huge_page_bytes;
    return o;
}

RooflineRecord roofline_record(const MachinePeaks& p) {
    return {p.flops_per_s, p.bytes_per_s, p.ridge(), p.flops_source, p.bytes_source, p.from_cache};
}

KernelRecord kernel_record(const KernelStat& k) {
    KernelRecord r;
    r.name = k.name;
    r.impl = k.impl;
    r.calls = k.calls;
    r.total_ms = k.total_ms;
    r.ms_per_step = k.ms_per_step;
    r.pct_of_step = k.pct_of_step;
    r.flops = k.flops;
    r.bytes = k.bytes;
    r.gflops_per_s = k.gflops_per_s();
    r.gb_per_s = k.gb_per_s();
    r.intensity = k.intensity();
    r.bound = k.bound;
    r.pct_of_roofline = k.pct_of_roofline;
    return r;
}

void derive_statistics(VariantResult& v) {
    const std::vector<StepRow>& steps = v.steps;
    v.stats = step_statistics(steps);
    const int measured = static_cast<int>(v.stats.step_ms.n);
    v.measured_steps = measured;
    const bool jitter = has_shape_jitter(v);
    const MeasuredWork work = measured_work(steps);

    // The global batch: every rank trains B * grad_accum samples of its own per optimizer step.
    const long long W = v.data_parallel ? v.data_parallel->world_size : 1;
    BatchShape& b = v.batch;
    b.samples_per_step = W * b.batch_size * b.grad_accum;
    b.tokens_per_step = b.samples_per_step * b.seq_len;
    // Shape jitter: the mean tokens the measured steps really trained (seq_len is their maximum).
    if (jitter && !steps.empty()) b.tokens_per_step = std::llround(work.tokens_per_step);
    // ... and the FLOPs they really did, per step (their mean), for the analytic figure.
    if (jitter && measured > 0) v.flops.per_step = work.model_flops_per_step;

    v.flops.achieved_per_s = 0;
    v.flops.mfu.reset();
    // Throughput is the work of the measured steps over their total time (their mean step): a
    // median step over a mean batch would pair a short step with an average batch when the
    // batches vary (data.seq_len_jitter) and overstate it.
    if (measured > 0 && v.stats.step_ms.mean > 0) {
        const double step_s = v.stats.step_ms.mean / 1000.0;
        const double samples = static_cast<double>(b.samples_per_step);
        v.stats.samples_per_s = samples / step_s;
        v.stats.tokens_per_s = samples * b.seq_len / step_s;
        v.flops.achieved_per_s = v.flops.per_step / step_s;
        if (jitter) {
            // Jittered batches are shorter than data.seq_len: count the tokens and FLOPs the
            // measured steps really trained.
            v.stats.tokens_per_s = work.tokens_per_step / step_s;
            v.flops.achieved_per_s = work.model_flops_per_step / step_s;
        }
        if (v.flops.peak_per_s && *v.flops.peak_per_s > 0)
            v.flops.mfu = v.flops.achieved_per_s / *v.flops.peak_per_s;
    }

    v.loss.first = steps.empty() ? std::nullopt : finite(steps.front().loss);
    v.loss.final = steps.empty() ? std::nullopt : finite(steps.back().loss);
    v.loss.mean_measured = v.stats.loss.n ? finite(v.stats.loss.mean) : std::nullopt;
    if (v.data_parallel) derive_data_parallel(*v.data_parallel, v.stats);
}

void complete_results(Results& results) {
    results.environment = capture_environment(results.experiment.source);
    results.comparison = build_comparison(results);
}

}  // namespace mt
