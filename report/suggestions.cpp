// Next-step suggestions (see suggestions.h).
#include "report/suggestions.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>

#include "kernels/matmul_ladder.h"
#include "report/format.h"

namespace mt {

using namespace report_text;

Shares shares_of(const VariantResult& v) {
    Shares s;
    s.step_ms = v.stats.step_ms.median;
    for (int i = 0; i < kPhaseColumnCount; ++i) s.ms[i] = phase_column_stats(v.stats, i).median;
    return s;
}

Shares mean_shares_of(const VariantResult& v) {
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

namespace {

double number(const std::string& s) {
    return std::strtod(s.c_str(), nullptr);
}

// A suggestion that proposes `key` at a value `proposes` accepts.
Suggestion proposing(std::string rule, std::string text, std::string key,
                     std::function<bool(const std::string&)> proposes, bool generic = false) {
    return {std::move(rule), std::move(text), std::move(key), std::move(proposes), generic};
}
// A suggestion that proposes `key: value` (a variant-independent knob to try: generic).
Suggestion proposing_value(std::string rule, std::string text, std::string key, std::string value) {
    return proposing(
        std::move(rule), std::move(text), std::move(key),
        [value](const std::string& x) { return x == value; }, true);
}
// A suggestion that proposes no knob.
Suggestion note(std::string rule, std::string text, bool generic = false) {
    return {std::move(rule), std::move(text), "", nullptr, generic};
}

// The bucket suggestion when overlap is on but most of the communication is still waited for.
// A larger bucket pays the per-collective latency fewer times; a smaller one starts the first
// reduction earlier in backward, so more of it hides. Which one helps is decided by what the
// latency costs: buckets x latency against the exposed time. Neither helps past three bounds:
// reductions hide only under backward (hidden comm <= backward time); a bucket never splits a
// range backward completes, so at one bucket per range a smaller size changes nothing; and
// buckets already many (more than kManyBuckets) start early enough. What stays exposed then is
// bytes, not buckets.
// `backward_ms`: the variant's median backward phase.
Suggestion bucket_suggestion(const DataParallelRecord& d, double backward_ms) {
    const std::string buckets = "now " + f("%g", d.bucket_mb) + " MiB, " +
                                std::to_string(d.buckets) + " bucket" +
                                (d.buckets == 1 ? "" : "s") + " per step";
    const std::string hidden = "little of the communication is hidden (" +
                               f("%.2f", d.comm_overlapped_ms) + " ms overlapped vs " +
                               f("%.2f", d.comm_exposed_ms) + " ms exposed)";
    const double latency_ms = d.buckets * d.simulated_latency_us / 1000.0;
    const bool latency_counts =
        d.simulated_latency_us > 0
            ? latency_ms >= kLatencyShareForLargerBuckets * d.comm_exposed_ms
            : d.buckets > kManyBuckets;  // a real link: its latency unknown, many collectives
    const double mb = d.bucket_mb;
    const std::string bytes_not_buckets =
        f("%.2f", d.comm_exposed_ms) +
        " ms still exposed is traffic the backward cannot cover: fewer bytes per optimizer step "
        "(more `run.grad_accum`) or a faster link help, not the bucket size.";
    if (d.comm_overlapped_ms >= kHiddenNearBackward * backward_ms)
        return note("bucket-size",
                    "the bucket size cannot hide more (" + buckets + "): overlap already hides " +
                        f("%.2f", d.comm_overlapped_ms) + " ms under " + f("%.2f", backward_ms) +
                        " ms of backward, and hidden comm ≤ backward time; the " +
                        bytes_not_buckets);
    if (latency_counts)
        return proposing("bucket-size",
                         "a larger `dist.bucket_mb` (" + buckets +
                             "): fewer collectives, each paying the per-collective latency once" +
                             (d.simulated_latency_us > 0
                                  ? " (" + f("%g", d.simulated_latency_us) +
                                        " µs simulated: " + f("%.2f", latency_ms) + " ms per step)"
                                  : std::string()) +
                             "; " + hidden + ".",
                         "dist.bucket_mb", [mb](const std::string& x) { return number(x) > mb; });
    if (d.finest_buckets > 0 && d.buckets >= d.finest_buckets)
        return note("bucket-size", "a smaller bucket gives no more buckets (" + buckets +
                                       ": already one per " + "range backward completes, " +
                                       std::to_string(d.finest_buckets) +
                                       " ranges; a bucket never splits one); " + hidden + "; the " +
                                       bytes_not_buckets);
    if (d.buckets > kManyBuckets)
        return note("bucket-size", "smaller buckets would not start the reductions much earlier (" +
                                       buckets + ": the first already starts early in backward); " +
                                       hidden + "; the " + bytes_not_buckets);
    const std::string latency_text =
        d.simulated_latency_us > 0 ? " (the per-collective latency, " + f("%.2f", latency_ms) +
                                         " ms per step, is not what the step waits for)"
                                   : std::string();
    return proposing("bucket-size",
                     "a smaller `dist.bucket_mb` (" + buckets +
                         "): the first reduction starts earlier in backward, so more of it "
                         "hides" +
                         latency_text + "; " + hidden + ".",
                     "dist.bucket_mb", [mb](const std::string& x) { return number(x) < mb; });
}

}  // namespace

std::vector<Suggestion> comm_suggestion_list(const VariantResult& v) {
    const DataParallelRecord& d = *v.data_parallel;
    std::vector<Suggestion> out;
    if (!d.overlap)
        out.push_back(
            proposing("overlap",
                      "set `dist.overlap: true`: each bucket's reduction then starts as soon as "
                      "backward has produced it and runs under the rest of backward (overlap is "
                      "off: the step waits for every byte).",
                      "dist.overlap", [](const std::string& x) { return x == "true"; }));
    else if (d.comm_overlapped_ms < d.comm_exposed_ms)
        out.push_back(bucket_suggestion(d, v.stats.phases_ms[column(Phase::backward)].median));
    const int accum = v.batch.grad_accum;
    out.push_back(
        proposing("grad-accum",
                  "more gradient accumulation (`run.grad_accum`, now " + std::to_string(accum) +
                      "): one reduction per optimizer step is amortised over more "
                      "samples.",
                  "run.grad_accum", [accum](const std::string& x) { return number(x) > accum; }));
    out.push_back(note("zero",
                       d.zero == 0 ? "`dist.zero: 1` (ZeRO-1) only when memory is the issue: it "
                                     "shards the optimizer state across the ranks but does not "
                                     "reduce the traffic."
                                   : "ZeRO-1 is on: it saves optimizer memory, not traffic (it "
                                     "adds a parameter all-gather after the optimizer); "
                                     "`dist.zero: 0` if memory allows.",
                       /*generic=*/true));
    return out;
}

namespace {

// ---- compute --------------------------------------------------------------------------------

// Whether the variant's kernels have a packed GEMM: not on the CPU's baseline ISA level.
bool has_packed_gemm(const VariantResult& v) {
    return v.cpu_isa.value_or("") != "baseline";
}

// The matmul ladder of `backend` from its first rung, as "naive → blocked → packed → blas"
// (kernels/types.h: next_matmul_rung is its one definition).
std::string matmul_ladder_text(BackendKind backend, bool has_packed) {
    std::string t = "naive";
    for (auto m = next_matmul_rung(backend, MatmulImpl::naive, has_packed); m;
         m = next_matmul_rung(backend, *m, has_packed))
        t += std::string(" → ") + to_string(*m);
    return t;
}

// The next rung for the top op when it is a matmul running a step of its backend's ladder.
std::optional<MatmulImpl> next_rung_for(const VariantResult& v, const KernelRecord& k) {
    const auto backend = parse_enum<BackendKind>(v.backend);
    const auto impl = parse_enum<MatmulImpl>(k.impl);
    if (!backend || !impl || k.name.find("matmul") == std::string::npos) return std::nullopt;
    return next_matmul_rung(*backend, *impl, has_packed_gemm(v));
}

// What limits the top op, from its measured fraction of its roofline (see kFarBelowRoofline),
// and what to try for it.
Suggestion top_op_suggestion(const VariantResult& v, const KernelRecord& k) {
    const double frac = k.pct_of_roofline / 100.0;
    const bool cuda = v.backend == "cuda";
    const std::string op = "top op: " + k.name + (k.impl.empty() ? "" : " (" + k.impl + ")") +
                           ", " + f("%.1f%%", k.pct_of_step) + " of the step, at " +
                           f("%.1f%%", k.pct_of_roofline) + " of its " + to_string(k.bound) +
                           " roofline";
    const auto next = next_rung_for(v, k);
    const std::string rung =
        next ? "try the next rung (`kernels.matmul: " + k.impl + " → " + to_string(*next) +
                   "`; the " + v.backend + " ladder: " +
                   matmul_ladder_text(cuda ? BackendKind::cuda : BackendKind::cpu,
                                      has_packed_gemm(v)) +
                   ")"
             : std::string("a better implementation of it (or fusing it away) is the lever");
    auto with_rung = [&](std::string text) {
        if (!next) return note("top-op", std::move(text));
        const std::string to = to_string(*next);
        return proposing("top-op", std::move(text), "kernels.matmul",
                         [to](const std::string& x) { return x == to; });
    };
    if (frac < kFarBelowRoofline)
        return with_rung(op +
                         ": this implementation is inefficient: latency (loop order, cache "
                         "misses, launches) limits it, not the machine's arithmetic or "
                         "bandwidth; " +
                         rung + ".");
    const std::string precision = cuda ? "lower precision (`run.precision: tf32` or `bf16`)"
                                       : "lower precision (a GPU: the CPU backend is fp32-only)";
    if (frac >= kNearRoofline)
        return note("top-op",
                    op + ": near its roofline, the hardware limits it: only " +
                        (k.bound == Bound::memory
                             ? "fewer bytes help: fusion with its neighbours, " + precision
                             : "fewer FLOPs, " + precision + " or fusion help") +
                        ".");
    return with_rung(op + ": " +
                     (k.bound == Bound::memory
                          ? "memory-limited by its intensity; fusing it with its neighbours "
                            "saves the traffic"
                          : "arithmetic-limited by its intensity, below its roofline") +
                     (next ? "; " + rung : std::string()) + ".");
}

// Compute dominates: what limits the top op (profiled), or how to see it.
void compute_rule(const VariantResult& v, const Shares& s, std::vector<Suggestion>& out) {
    const double fwd = s.share(column(Phase::forward)), bwd = s.share(column(Phase::backward));
    if (fwd + bwd < 0.50) return;
    out.push_back(note(
        "compute",
        "compute in the model dominates (forward " + pct(fwd) + ", backward " + pct(bwd) + ")" +
            (v.kernels.empty() && !v.profiled ? ": set `profile.kernels: true` to see which op "
                                                "dominates and how near its roofline it runs."
                                              : ".")));
    if (!v.kernels.empty()) out.push_back(top_op_suggestion(v, v.kernels[0]));
}

// Compute dominates: the knobs of this variant that trade for model speed, one line each.
void compute_knobs_rule(const VariantResult& v, const Shares& s, std::vector<Suggestion>& out) {
    if (s.share(column(Phase::forward)) + s.share(column(Phase::backward)) < 0.50) return;
    const bool cuda = v.backend == "cuda";
    auto cfg = [&](const char* k) { return v.config_value(k); };
    const size_t before = out.size();
    auto knob = [&](const char* key, const char* value, const std::string& why) {
        out.push_back(proposing_value(
            "compute-knobs", std::string("`") + key + ": " + value + "`" + why + ".", key, value));
    };
    if (cuda && cfg("run.precision") == "fp32")
        knob("run.precision", "tf32", " (tensor cores; `bf16` halves the bytes too)");
    if (cuda && cfg("kernels.attention") == "naive") knob("kernels.attention", "flash", "");
    if (cfg("kernels.classifier") == "unfused")
        knob("kernels.classifier", "fused", " (no probability tensor)");
    if (cfg("kernels.layernorm") == "separate")
        knob("kernels.layernorm", "fused_residual",
             " (the residual add and LayerNorm in one pass)");
    if (cfg("kernels.matmul_gelu") == "false")
        knob("kernels.matmul_gelu", "true", " (GELU in the GEMM's epilogue)");
    if (cfg("run.recompute") != "none" && !cfg("run.recompute").empty())
        knob("run.recompute", "none", " if memory allows (recompute costs backward FLOPs)");
    if (cfg("run.offload") == "activations")
        knob("run.offload", "none",
             " if memory allows (the activation copies that do not hide behind compute wait in "
             "forward and backward)");
    if (out.size() == before) {
        const double batch = number(cfg("data.batch_size"));
        out.push_back(proposing(
            "compute-knobs", "a larger batch per step (fewer, bigger GEMMs).", "data.batch_size",
            [batch](const std::string& x) { return number(x) > batch; }, true));
    }
}

// ---- data -----------------------------------------------------------------------------------

int int_value(const VariantResult& v, const char* key) {
    try {
        return std::stoi(v.config_value(key));
    } catch (...) {
        return 0;
    }
}

// Data dominates the median step: background loading, or more of it.
void data_rule(const VariantResult& v, const Shares& s, std::vector<Suggestion>& out) {
    const double data = s.share(column(Phase::data));
    if (data < 0.20) return;
    const int workers = int_value(v, "data.workers");
    std::string t = "data-bound: the data phase takes " + pct(data) + " of the median step. ";
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
    if (int_value(v, "data.preprocess_us") > 0)
        t += " (data.preprocess_us=" + v.config_value("data.preprocess_us") +
             " is simulated per-sample work)";
    out.push_back(proposing("data", t + ".", "data.workers",
                            [workers](const std::string& x) { return number(x) > workers; }));
}

// The data phase is large over the mean step but not over the median one: a few slow steps (the
// first epoch, when data.cache prepares every sample once) carry it; the warm steps are not
// data-bound.
void data_warm_phase_rule(const VariantResult& v, const Shares& s, std::vector<Suggestion>& out) {
    const double median = s.share(column(Phase::data));
    const double mean = mean_shares_of(v).share(column(Phase::data));
    if (median >= 0.20 || mean < 0.20) return;
    out.push_back(note(
        "data-warm-phase",
        "not data-bound: the data phase is " + pct(mean) + " of the mean step but " + pct(median) +
            " of the median one (" + f("%.3f", v.stats.phases_ms[column(Phase::data)].median) +
            " ms): a few slow steps carry the mean" +
            (v.config_value("data.cache") == "true"
                 ? " (the first epoch, which prepares every sample for `data.cache`; later "
                   "steps copy them)"
                 : std::string()) +
            "."));
}

void h2d_rule(const VariantResult& v, const Shares& s, std::vector<Suggestion>& out) {
    const double h2d = s.share(column(Phase::h2d));
    if (h2d < 0.10) return;
    out.push_back(note(
        "h2d", "h2d takes " + pct(h2d) + " of the step: " +
                   (v.backend == "cuda" ? std::string("`data.pin_memory: true` and prefetching "
                                                      "overlap the copy; larger batches amortise "
                                                      "it.")
                                        : std::string("larger batches amortise the copy."))));
}

// ---- optimizer, host, memory, jitter --------------------------------------------------------

bool trains_everything(const VariantResult& v) {
    const std::string lora = v.config_value("model.lora");
    const bool has_lora = !lora.empty() && lora.rfind("{rank: 0,", 0) != 0;
    const std::string freeze = v.config_value("optim.freeze");
    return !has_lora && (freeze.empty() || freeze == "[]");
}

// Fewer parameters to update: LoRA or frozen layers when the variant trains everything, int8
// storage when something is frozen but kept in fp32. "" when it already uses them all.
std::string fewer_trainable_hint(const VariantResult& v) {
    if (trains_everything(v))
        return "if this is a fine-tune, update fewer parameters: `model.lora: {rank: 8, alpha: "
               "16}` trains adapters only, `optim.freeze: [wte, wpe, h.0]` freezes layers (no "
               "gradients, no AdamW state for them).";
    if (v.config_value("model.quantize_frozen") != "int8")
        return "the frozen weights can be stored as int8: `model.quantize_frozen: int8`.";
    return "";
}

double optimizer_share(const Shares& s) {
    return s.share(column(Phase::optimizer));
}
bool memory_near_limit(const VariantResult& v) {
    const DeviceMemoryRecord& d = v.memory.device;
    return d.available && d.total_bytes > 0 &&
           static_cast<double>(d.peak_used_bytes) / d.total_bytes >= 0.80;
}
size_t trainable_state_bytes(const MemoryRecord& m) {
    return category_bytes(m.tracked_peak, MemoryCategory::grads) +
           category_bytes(m.tracked_peak, MemoryCategory::optimizer);
}
bool state_dominates_memory(const VariantResult& v) {
    const MemoryRecord& m = v.memory;
    return m.tracked_peak_total > 0 && trainable_state_bytes(m) * 2 >= m.tracked_peak_total;
}

void optimizer_rule(const VariantResult& v, const Shares& s, std::vector<Suggestion>& out) {
    const double opt = optimizer_share(s);
    if (opt < 0.15) return;
    if (v.config_value("optim.offload") == "true")
        out.push_back(
            note("optimizer", "the optimizer takes " + pct(opt) +
                                  " of the step with `optim.offload: true`: AdamW runs on the host "
                                  "and the gradients and weights cross the host link every step; "
                                  "`optim.offload: false` if the moments fit on the device, else "
                                  "`run.grad_accum` (more samples per update) amortises it."));
    else if (v.config_value("optim.impl") != "fused")
        out.push_back(
            proposing_value("optimizer",
                            "optimizer-bound: the optimizer takes " + pct(opt) +
                                " of the step with `optim.impl: " + v.config_value("optim.impl") +
                                "`; `optim.impl: fused` updates the flat buffer in one "
                                "pass.",
                            "optim.impl", "fused"));
    else
        out.push_back(note("optimizer", "the fused optimizer still takes " + pct(opt) +
                                            " of the step: it costs a fixed time per step, so "
                                            "`run.grad_accum` (more samples per update) "
                                            "amortises it."));
}

// Training fewer parameters helps where the optimizer, the memory limit or the trainable state
// is the issue: one generic line (it names no measurement).
void fine_tune_rule(const VariantResult& v, const Shares& s, std::vector<Suggestion>& out) {
    if (optimizer_share(s) < 0.15 && !memory_near_limit(v) && !state_dominates_memory(v)) return;
    const std::string hint = fewer_trainable_hint(v);
    if (!hint.empty()) out.push_back(note("fine-tune", hint, /*generic=*/true));
}

void host_overhead_rule(const VariantResult& v, const Shares& s, std::vector<Suggestion>& out) {
    const double sync = s.share(column(Phase::sync)), other = s.share(kPhaseCount);
    if (sync + std::max(0.0, other) < 0.15) return;
    // On CUDA, a step that does not replay a graph yet can launch all its kernels at once.
    const bool graph_helps = v.backend == "cuda" && v.config_value("run.cuda_graph") != "true";
    out.push_back(note("host-overhead",
                       "host waits and overhead take " + pct(sync + std::max(0.0, other)) +
                           " of the step (sync " + pct(sync) + ", other " + pct(other) +
                           "): fewer synchronisations (read the loss less often: `run.host_sync: "
                           "step` reads it once per step, `none` keeps it on the device), fewer "
                           "and larger launches (bigger batch, fused kernels" +
                           (graph_helps ? ", or the whole step as one CUDA graph replay: "
                                          "`run.cuda_graph: true`"
                                        : "") +
                           ")."));
}

void memory_limit_rule(const VariantResult& v, const Shares&, std::vector<Suggestion>& out) {
    if (!memory_near_limit(v)) return;
    const DeviceMemoryRecord& d = v.memory.device;
    const double frac = static_cast<double>(d.peak_used_bytes) / d.total_bytes;
    out.push_back(note("memory-limit",
                       "memory is near the limit (" + pct(frac) + " of " + mib(d.total_bytes) +
                           " MiB): `run.recompute: gelu` or `layernorm_gelu` trades FLOPs for "
                           "activations; a smaller `data.batch_size` with `run.grad_accum` keeps "
                           "the samples per update" +
                           (v.backend == "cuda" ? "; `run.offload: activations` and "
                                                  "`optim.offload: true` move activations and "
                                                  "AdamW moments to host memory."
                                                : ".")));
}

void trainable_state_rule(const VariantResult& v, const Shares&, std::vector<Suggestion>& out) {
    if (!state_dominates_memory(v) || fewer_trainable_hint(v).empty()) return;
    const MemoryRecord& m = v.memory;
    const size_t state = trainable_state_bytes(m);
    out.push_back(
        note("trainable-state", "gradients and AdamW state hold " + mib(state) + " of the " +
                                    mib(m.tracked_peak_total) + " MiB tracked (" +
                                    pct(static_cast<double>(state) / m.tracked_peak_total) +
                                    "): they scale with the parameters that train."));
}

void jitter_rule(const VariantResult& v, const Shares&, std::vector<Suggestion>& out) {
    if (v.stats.jitter <= kJitterWarnThreshold) return;
    const std::string shape_jitter = v.config_value("data.seq_len_jitter");
    if (!shape_jitter.empty() && shape_jitter != "0")
        out.push_back(note(
            "jitter", "high jitter (IQR/median " + pct(v.stats.jitter) +
                          ") caused by variable shapes: `data.seq_len_jitter: " + shape_jitter +
                          "` gives every batch its own length, and the step time follows "
                          "it; fixed shapes (`data.seq_len_jitter: 0`), or lengths bucketed "
                          "to a few values, make it steady."));
    else
        out.push_back(note("jitter", "high jitter (IQR/median " + pct(v.stats.jitter) +
                                         "): more `run.warmup_steps`, fixed shapes, and check "
                                         "the data loader and host syncs; other programs on the "
                                         "machine add noise too."));
}

void communication_rule(const VariantResult& v, const Shares&, std::vector<Suggestion>& out) {
    if (!comm_is_bottleneck(v)) return;
    out.push_back(note("communication",
                       "communication-bound: the step waits " + pct(v.data_parallel->comm_share) +
                           " of its median time for communication; see *Communication (data "
                           "parallel)* above for what to change (overlap, bucket size, grad "
                           "accumulation)."));
}

// The rule set, in the order the report prints its suggestions (docs/report.md lists it).
struct Rule {
    const char* name;
    void (*apply)(const VariantResult& v, const Shares& s, std::vector<Suggestion>& out);
};
constexpr Rule kRules[] = {
    {"communication", communication_rule},
    {"data", data_rule},
    {"data-warm-phase", data_warm_phase_rule},
    {"h2d", h2d_rule},
    {"compute", compute_rule},  // and "top-op"
    {"compute-knobs", compute_knobs_rule},
    {"optimizer", optimizer_rule},
    {"host-overhead", host_overhead_rule},
    {"memory-limit", memory_limit_rule},
    {"trainable-state", trainable_state_rule},
    {"fine-tune", fine_tune_rule},
    {"jitter", jitter_rule},
};

// ---- checked against the run ----------------------------------------------------------------

// A knob the run measured worse: a variant that changed `key` alone, to `value`, and was called
// slower than the baseline.
struct SlowerKnob {
    std::string key, value;
};

std::vector<SlowerKnob> slower_knobs(const Results& run) {
    std::vector<SlowerKnob> out;
    for (const VariantResult& v : run.variants) {
        if (v.knobs_changed != 1 || v.changed.size() != 1) continue;
        for (const ComparisonRow& r : run.comparison.rows)
            if (r.variant == v.name && r.time_call == TimeCall::slower)
                out.push_back({v.changed.begin()->first, v.changed.begin()->second});
    }
    return out;
}

bool refuted(const Suggestion& s, const std::vector<SlowerKnob>& slower) {
    if (s.key.empty() || !s.proposes) return false;
    return std::any_of(slower.begin(), slower.end(),
                       [&](const SlowerKnob& k) { return k.key == s.key && s.proposes(k.value); });
}

}  // namespace

std::string limit_of(const KernelRecord& k) {
    if (k.pct_of_roofline / 100.0 < kFarBelowRoofline) return "latency-limited";
    return std::string(to_string(k.bound)) + "-bound";
}

std::vector<Suggestion> suggestions_of(const VariantResult& v) {
    std::vector<Suggestion> out;
    if (!v.measured()) return out;
    const Shares s = shares_of(v);
    for (const Rule& rule : kRules) rule.apply(v, s, out);
    if (out.empty())
        out.push_back(note("balanced",
                           "no single phase dominates: the step is balanced; the "
                           "largest is " +
                               phase_column_name(dominant(s)) + " (" + pct(s.share(dominant(s))) +
                               ")."));
    return out;
}

std::vector<std::string> suggestions_for(const VariantResult& v) {
    std::vector<std::string> out;
    for (const Suggestion& s : suggestions_of(v)) out.push_back(s.text);
    return out;
}

namespace {

// `make`'s suggestions for every variant of `run`, checked against what the run measured, the
// generic ones only under the first variant they apply to.
std::vector<std::vector<std::string>> checked_once(
    const Results& run, const std::function<std::vector<Suggestion>(const VariantResult&)>& make) {
    const std::vector<SlowerKnob> slower = slower_knobs(run);
    std::map<std::string, std::string> printed_under;  // generic text -> the variant it is under
    std::vector<std::vector<std::string>> out;
    for (const VariantResult& v : run.variants) {
        std::vector<std::string>& lines = out.emplace_back();
        std::set<std::string> earlier;  // the variants whose lines this one shares
        for (const Suggestion& s : make(v)) {
            if (refuted(s, slower)) continue;
            if (s.generic) {
                const auto [it, first] = printed_under.emplace(s.text, v.name);
                if (!first) {
                    earlier.insert(it->second);
                    continue;
                }
            }
            lines.push_back(s.text);
        }
        for (const std::string& name : earlier)
            lines.push_back("the knobs suggested under *" + name + "* above apply here too.");
    }
    return out;
}

}  // namespace

std::vector<std::vector<std::string>> run_suggestions(const Results& run) {
    return checked_once(run, suggestions_of);
}

std::vector<std::vector<std::string>> run_comm_suggestions(const Results& run) {
    return checked_once(run, [](const VariantResult& v) {
        return comm_is_bottleneck(v) ? comm_suggestion_list(v) : std::vector<Suggestion>{};
    });
}

}  // namespace mt
