// Next-step suggestions (see suggestions.h).
#include "report/suggestions.h"

#include <algorithm>
#include <cmath>

#include "report/format.h"

namespace mt {

using namespace report_text;

Shares shares_of(const VariantResult& v) {
    Shares s;
    s.step_ms = v.stats.step_ms.mean;
    for (int i = 0; i < kPhaseColumnCount; ++i) s.ms[i] = phase_column_stats(v.stats, i).mean;
    return s;
}

int dominant(const Shares& s) {
    int best = 0;
    for (int i = 1; i < kPhaseColumnCount; ++i)
        if (s.ms[i] > s.ms[best]) best = i;
    return best;
}

// ---- data parallel ------------------------------------------------------------------------------

// More buckets than this per step: the per-collective latency adds up.
constexpr int kManyBuckets = 8;

Phase largest_phase(const VariantResult& v) {
    Phase best = kAllPhases[0];
    for (Phase p : kAllPhases)
        if (v.stats.phases_ms[column(p)].median > v.stats.phases_ms[column(best)].median) best = p;
    return best;
}

bool comm_is_bottleneck(const VariantResult& v) {
    if (!v.data_parallel || !v.measured()) return false;
    const DataParallelRecord& d = *v.data_parallel;
    return d.comm_exposed_ms > 0 &&
           (d.comm_share > kCommBottleneckShare || largest_phase(v) == Phase::comm);
}

std::vector<std::string> comm_suggestions(const VariantResult& v) {
    const DataParallelRecord& d = *v.data_parallel;
    std::vector<std::string> out;
    const std::string buckets = "now " + f("%g", d.bucket_mb) + " MiB, " +
                                std::to_string(d.buckets) + " bucket" +
                                (d.buckets == 1 ? "" : "s") + " per step";
    if (!d.overlap) {
        out.push_back(
            "set `dist.overlap: true`: each bucket's reduction then starts as soon as "
            "backward has produced it and runs under the rest of backward (overlap is "
            "off: the step waits for every byte).");
    } else if (d.comm_overlapped_ms < d.comm_exposed_ms) {
        // Overlap is on but most of the communication is still waited for.
        if (d.simulated_latency_us > 0 || d.buckets > kManyBuckets)
            out.push_back("a larger `dist.bucket_mb` (" + buckets +
                          "): fewer collectives, each paying the per-collective latency once" +
                          (d.simulated_latency_us > 0
                               ? " (" + f("%g", d.simulated_latency_us) + " µs simulated)"
                               : std::string()) +
                          "; little of the communication is hidden (" +
                          f("%.2f", d.comm_overlapped_ms) + " ms overlapped vs " +
                          f("%.2f", d.comm_exposed_ms) + " ms exposed).");
        else
            out.push_back("a smaller `dist.bucket_mb` (" + buckets +
                          "): the first reduction starts earlier in backward, so more of it "
                          "hides; little is hidden now (" +
                          f("%.2f", d.comm_overlapped_ms) + " ms overlapped vs " +
                          f("%.2f", d.comm_exposed_ms) + " ms exposed).");
    }
    out.push_back("more gradient accumulation (`run.grad_accum`, now " +
                  std::to_string(v.batch.grad_accum) +
                  "): one reduction per optimizer step is amortised over more samples.");
    out.push_back(d.zero == 0
                      ? std::string("`dist.zero: 1` (ZeRO-1) only when memory is the issue: it "
                                    "shards the optimizer state across the ranks but does not "
                                    "reduce the traffic.")
                      : std::string("ZeRO-1 is on: it saves optimizer memory, not traffic (it "
                                    "adds a parameter all-gather after the optimizer); "
                                    "`dist.zero: 0` if memory allows."));
    return out;
}

namespace {

// The compute-dominated suggestion: the knobs of this variant that trade for model speed.
std::string compute_suggestion(const VariantResult& v, double fwd, double bwd) {
    const bool cuda = v.backend == "cuda";
    auto cfg = [&](const char* k) { return v.config_value(k); };
    std::string t =
        "compute in the model dominates (forward " + pct(fwd) + ", backward " + pct(bwd) + "). ";
    std::vector<std::string> opts;
    if (cuda && cfg("run.precision") == "fp32")
        opts.push_back("`run.precision: tf32` or `bf16` (tensor cores)");
    if (cuda && cfg("kernels.attention") == "naive") opts.push_back("`kernels.attention: flash`");
    if (cfg("kernels.classifier") == "unfused")
        opts.push_back("`kernels.classifier: fused` (no probability tensor)");
    if (cfg("kernels.layernorm") == "separate")
        opts.push_back("`kernels.layernorm: fused_residual`");
    if (cfg("kernels.matmul_gelu") == "false") opts.push_back("`kernels.matmul_gelu: true`");
    if (cfg("run.recompute") != "none" && !cfg("run.recompute").empty())
        opts.push_back("`run.recompute: none` if memory allows (recompute costs backward FLOPs)");
    if (cfg("run.offload") == "activations")
        opts.push_back(
            "`run.offload: none` if memory allows (the activation copies that do not hide "
            "behind compute wait in forward and backward)");
    if (opts.empty()) opts.push_back("a larger batch per step (fewer, bigger GEMMs)");
    t += "Try: ";
    for (size_t i = 0; i < opts.size(); ++i) t += (i ? "; " : "") + opts[i];
    t += ".";
    if (!cuda) t += " (The CPU backend is fp32-only: precision variants need a GPU.)";
    if (!v.kernels.empty()) {
        const KernelRecord& k = v.kernels[0];
        t += " Top op: " + k.name + " (" + f("%.1f%%", k.pct_of_step) + " of the step, " +
             to_string(k.bound) + "-bound, " + f("%.0f%%", k.pct_of_roofline) + " of its roofline)";
        t += k.bound == Bound::memory
                 ? ": fusing it with its neighbours saves the memory traffic."
                 : ": it is arithmetic-limited; precision or a better GEMM path helps.";
    } else if (!v.profiled) {
        t += " Set `profile.kernels: true` to see which op dominates.";
    }
    return t;
}

// The data-bound suggestion: background loading, or more of it.
std::string data_suggestion(const VariantResult& v, double data) {
    auto ival = [&](const char* k) {
        try {
            return std::stoi(v.config_value(k));
        } catch (...) {
            return 0;
        }
    };
    const int workers = ival("data.workers");
    std::string t = "data-bound: the data phase takes " + pct(data) + " of the step. ";
    if (workers == 0)
        t += "Load batches in the background: `data.workers: 2` with `data.prefetch: 2` or "
             "more (now workers 0: every batch is prepared inside the step)";
    else
        t += "With " + std::to_string(workers) +
             " workers the loader still cannot keep up: raise `data.workers` and "
             "`data.prefetch`, or make per-sample preprocessing cheaper";
    if (v.backend == "cuda" && v.config_value("data.pin_memory") != "true")
        t += "; `data.pin_memory: true` makes the h2d copy asynchronous";
    if (v.config_value("data.cache") == "false")
        t += "; if the run sees its data more than once, `data.cache: true` prepares each sample "
             "once (after the first epoch the data phase is a copy)";
    if (ival("data.preprocess_us") > 0)
        t += " (data.preprocess_us=" + v.config_value("data.preprocess_us") +
             " is simulated per-sample work)";
    return t + ".";
}

// Fewer parameters to update (optimizer slow; memory high): LoRA or frozen layers when the
// variant trains everything, int8 storage when something is frozen but kept in fp32. "" when
// the variant already uses every one of them.
std::string fewer_trainable_hint(const VariantResult& v) {
    const bool lora = v.config_value("model.lora").rfind("{rank: 0,", 0) != 0 &&
                      !v.config_value("model.lora").empty();
    const bool freeze =
        !v.config_value("optim.freeze").empty() && v.config_value("optim.freeze") != "[]";
    if (!lora && !freeze)
        return " If this is a fine-tune, update fewer parameters: `model.lora: {rank: 8, alpha: "
               "16}` trains adapters only, `optim.freeze: [wte, wpe, h.0]` freezes layers (no "
               "gradients, no AdamW state for them).";
    if (v.config_value("model.quantize_frozen") != "int8")
        return " The frozen weights can be stored as int8: `model.quantize_frozen: int8`.";
    return "";
}

// The optimizer, host-overhead, memory-limit and jitter suggestions.
void add_step_overhead_suggestions(std::vector<std::string>& out, const VariantResult& v,
                                   const Shares& s) {
    const double opt = s.share(column(Phase::optimizer)), sync = s.share(column(Phase::sync)),
                 other = s.share(kPhaseCount);
    if (opt >= 0.15) {
        if (v.config_value("optim.offload") == "true")
            out.push_back("the optimizer takes " + pct(opt) +
                          " of the step with `optim.offload: true`: AdamW runs on the host and "
                          "the gradients and weights cross the host link every step; "
                          "`optim.offload: false` if the moments fit on the device, else "
                          "`run.grad_accum` (more samples per update) amortises it.");
        else if (v.config_value("optim.impl") != "fused")
            out.push_back("optimizer-bound: the optimizer takes " + pct(opt) +
                          " of the step with `optim.impl: " + v.config_value("optim.impl") +
                          "`; `optim.impl: fused` updates the flat buffer in one pass." +
                          fewer_trainable_hint(v));
        else
            out.push_back("the fused optimizer still takes " + pct(opt) +
                          " of the step: it costs a fixed time per step, so `run.grad_accum` "
                          "(more samples per update) amortises it." +
                          fewer_trainable_hint(v));
    }
    if (sync + std::max(0.0, other) >= 0.15)
        out.push_back("host waits and overhead take " + pct(sync + std::max(0.0, other)) +
                      " of the step (sync " + pct(sync) + ", other " + pct(other) +
                      "): fewer synchronisations (read the loss less often: `run.host_sync: step` "
                      "reads it once per step, `none` keeps it on the device), fewer and larger "
                      "launches (bigger batch, fused kernels).");
    const DeviceMemoryRecord& d = v.memory.device;
    if (d.available && d.total_bytes > 0) {
        const double frac = static_cast<double>(d.peak_used_bytes) / d.total_bytes;
        if (frac >= 0.80)
            out.push_back("memory is near the limit (" + pct(frac) + " of " + mib(d.total_bytes) +
                          " MiB): `run.recompute: gelu` or `layernorm_gelu` trades FLOPs for "
                          "activations; a smaller `data.batch_size` with `run.grad_accum` keeps "
                          "the samples per update" +
                          (v.backend == "cuda" ? "; `run.offload: activations` and "
                                                 "`optim.offload: true` move activations and "
                                                 "AdamW moments to host memory."
                                               : ".") +
                          fewer_trainable_hint(v));
    }
    const MemoryRecord& m = v.memory;
    const size_t state = category_bytes(m.tracked_peak, MemoryCategory::grads) +
                         category_bytes(m.tracked_peak, MemoryCategory::optimizer);
    const std::string fewer = fewer_trainable_hint(v);
    if (m.tracked_peak_total > 0 && state * 2 >= m.tracked_peak_total && !fewer.empty())
        out.push_back("gradients and AdamW state hold " + mib(state) + " of the " +
                      mib(m.tracked_peak_total) + " MiB tracked (" +
                      pct(static_cast<double>(state) / m.tracked_peak_total) +
                      "): they scale with the parameters that train." + fewer);
    const std::string shape_jitter = v.config_value("data.seq_len_jitter");
    if (v.stats.jitter > kJitterWarnThreshold && !shape_jitter.empty() && shape_jitter != "0")
        out.push_back("high jitter (IQR/median " + pct(v.stats.jitter) +
                      ") caused by variable shapes: `data.seq_len_jitter: " + shape_jitter +
                      "` gives every batch its own length, and the step time follows it; fixed "
                      "shapes (`data.seq_len_jitter: 0`), or lengths bucketed to a few values, "
                      "make it steady.");
    else if (v.stats.jitter > kJitterWarnThreshold)
        out.push_back("high jitter (IQR/median " + pct(v.stats.jitter) +
                      "): more `run.warmup_steps`, fixed shapes, and check the data loader and "
                      "host syncs; other programs on the machine add noise too.");
}

}  // namespace

std::vector<std::string> suggestions_for(const VariantResult& v) {
    std::vector<std::string> out;
    if (!v.measured()) return out;
    const Shares s = shares_of(v);
    const double data = s.share(column(Phase::data)), h2d = s.share(column(Phase::h2d)),
                 fwd = s.share(column(Phase::forward)), bwd = s.share(column(Phase::backward));
    if (comm_is_bottleneck(v))
        out.push_back("communication-bound: the step waits " + pct(v.data_parallel->comm_share) +
                      " of its median time for communication; see *Communication (data "
                      "parallel)* above for what to change (overlap, bucket size, grad "
                      "accumulation).");
    if (data >= 0.20) out.push_back(data_suggestion(v, data));
    if (h2d >= 0.10)
        out.push_back("h2d takes " + pct(h2d) + " of the step: " +
                      (v.backend == "cuda"
                           ? std::string("`data.pin_memory: true` and prefetching overlap the "
                                         "copy; larger batches amortise it.")
                           : std::string("larger batches amortise the copy.")));
    if (fwd + bwd >= 0.50) out.push_back(compute_suggestion(v, fwd, bwd));
    add_step_overhead_suggestions(out, v, s);
    if (out.empty())
        out.push_back("no single phase dominates: the step is balanced; the largest is " +
                      phase_column_name(dominant(s)) + " (" + pct(s.share(dominant(s))) + ").");
    return out;
}

}  // namespace mt
