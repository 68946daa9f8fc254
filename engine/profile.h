// Per-op profiling and the machine's peaks (the roofline).
//
// Peaks. MFU and the roofline verdict need the device's peak FLOP/s and memory bandwidth.
// - CPU: measured, since no table can know the build flags, the thread count and the turbo
//   state: a GEMM probe through the backend's own matmul_forward (the sgemm the model runs,
//   kernels/cpu/gemm.h, 1024^3; the best of at least 5 runs and up to ~1 s of them: a peak is
//   the best the machine does, slower runs are interference) and a copy probe (64 MiB memcpy
//   split over all threads, best of the same; bandwidth counts read + write). Measured once per
//   device name (which includes the CPU model, the thread count and the GEMM implementation)
//   and cached in $MICROTRAIN_CACHE_DIR, else $XDG_CACHE_HOME/microtrain, else
//   ~/.cache/microtrain, file cpu_peaks.json. The report names the figure and its source. MFU
//   on CPU is therefore relative to the achievable sgemm rate, not a data-sheet number.
// - CUDA: MFU uses the vendor's dense data-sheet peak for the device and precision
//   (engine/peak_flops.h; a device missing from the table gives MFU n/a, never a made-up
//   number). The roofline on CUDA uses the same
//   probes as the CPU, run through the CUDA backend (cuBLAS GEMM, device-to-device copy).
//
// Per-op timing (profile.kernels: true): KernelProfiler is the model's OpObserver. It records a
// backend TimingEvent at each op begin/end (cudaEvents on CUDA, steady_clock on CPU), reads them
// after the step's final sync, and aggregates by op name: calls, total ms, GFLOP/s, GB/s,
// arithmetic intensity (flops / bytes) and the verdict against the ridge point
// (peak FLOP/s / bandwidth): intensity below the ridge = memory-bound. Two optional refinements,
// used by bench/cpu_step: ops aggregated under a label instead of their name (MatmulLayerLabels
// tells the LM head's matmul from the MLP's), and a second, in-cache bandwidth roof for ops
// whose bytes per call fit in the last-level cache (CacheBandwidth).
//
// The single probes (one GEMM shape, one copy size) are public, so a benchmark can add shapes
// (the LM head's GEMM, an in-cache copy) measured exactly like the peaks.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/timing.h"
#include "kernels/backend.h"
#include "model/gpt.h"

namespace mt {

struct MachinePeaks {
    double flops_per_s = 0;    // GEMM probe (fp32 / compute precision)
    double bytes_per_s = 0;    // copy probe, bytes read + written per second
    std::string flops_source;  // e.g. "measured: 1024^3 sgemm ..., best of 5 (cached ...)"
    std::string bytes_source;
    bool from_cache = false;
    double ridge() const { return bytes_per_s > 0 ? flops_per_s / bytes_per_s : 0.0; }
};

// Data-sheet / cached peak FLOP/s of a device for a precision, used for MFU. CPU device names
// ("CPU: ...") answer from the probe cache (nullopt until measure_peaks ran once for that
// device); GPUs answer from the data-sheet table in engine/peak_flops.h (nullopt if unknown).
std::optional<double> peak_flops(const std::string& device_name, Precision precision);
// Where that figure comes from, in words, for the report.
std::string peak_flops_source(const std::string& device_name, Precision precision);

// Directory of the probe cache (see above); created on demand by measure_peaks.
std::string peaks_cache_dir();
// The largest cache file read (each holds a few hundred bytes per device or link); a larger one,
// or one that is not a regular file, is ignored and measured over.
inline constexpr size_t kMaxCacheFileBytes = size_t{16} << 20;

// Returns the peaks of `backend`'s device: from the cache when present (CPU), else measured
// now (a fraction of a second on CPU) and, on CPU, written to the cache. `force` re-measures
// (and still returns the cache's figure when that is better).
MachinePeaks measure_peaks(Backend& backend, bool force = false);
// Measures the peaks now and returns this measurement, whatever the cache holds; on CPU it also
// goes into the cache when it beats the cached figure. For a benchmark that reports the probes
// of its own process (bench/cpu_step).
MachinePeaks probe_peaks_now(Backend& backend);

// The probes themselves, each timed with backend events: one untimed warm-up run, then the best
// of at least 5 and up to 40 runs or ~1 s of them. *reps = the runs timed.
// GEMM: out (M,N) = a (M,K) @ w (N,K)^T through matmul_forward on zeros; 2 M K N flops per run.
double probe_gemm_flops_per_s(Backend& backend, int M, int K, int N, int* reps);
// Copy: `bytes` copied (CPU: split over all OpenMP threads; CUDA: copy_device); counts
// bytes read + written (2 x bytes per copy), the convention of the op table (kernels/ops.h).
double probe_copy_bytes_per_s(Backend& backend, size_t bytes, int* reps);
// The sizes measure_peaks probes on a backend kind: the GEMM's n (n^3) and the copy's bytes.
int peak_probe_gemm_n(BackendKind kind);
size_t peak_probe_copy_bytes(BackendKind kind);
// Size of the last-level (L3) cache in bytes from sysfs; 0 when the kernel does not say.
size_t last_level_cache_bytes();
// The CPU model in a CPU backend's device name ("CPU: AMD EPYC (2 threads, eigen GEMM)" ->
// "AMD EPYC"); "unknown" for any other name.
std::string cpu_model_of(const std::string& device_name);

// Roofline verdict for an op of arithmetic intensity `flops_per_byte`.
enum class Bound { compute, memory, unknown };
template <>
struct EnumSpelling<Bound> {
    static constexpr std::array<std::string_view, 3> names{"compute", "memory", "unknown"};
};
Bound roofline_bound(double flops_per_byte, const MachinePeaks& peaks);
// Attainable FLOP/s at that intensity: min(peak, intensity * bandwidth).
double roofline_attainable(double flops_per_byte, const MachinePeaks& peaks);

// Aggregated per-op statistics over the measured steps.
struct KernelStat {
    std::string name;
    std::string impl;  // what the op ran, OpRecord::impl ("packed", "flash"...; "" if one)
    long long calls = 0;
    double total_ms = 0;
    double flops = 0;  // total analytic flops over all calls
    double bytes = 0;  // total analytic bytes
    double ms_per_step = 0;
    double pct_of_step = 0;  // of the mean measured step wall time
    double gflops_per_s() const { return total_ms > 0 ? flops / (total_ms * 1e-3) / 1e9 : 0; }
    double gb_per_s() const { return total_ms > 0 ? bytes / (total_ms * 1e-3) / 1e9 : 0; }
    double intensity() const { return bytes > 0 ? flops / bytes : 0; }
    Bound bound = Bound::unknown;
    // Judged against the in-cache bandwidth: its bytes per call fit in the cache (only when a
    // CacheBandwidth was given to KernelProfiler::table).
    bool in_cache = false;
    double pct_of_roofline = 0;  // achieved / attainable at this intensity, percent
};

// A second, in-cache bandwidth roof: an op whose analytic bytes per call fit in `cache_bytes`
// streams (mostly) from cache (its inputs were just written by the op before), so its memory
// roof is `bytes_per_s` (a copy probe of a fraction of the cache) instead of DRAM's.
struct CacheBandwidth {
    size_t cache_bytes = 0;
    double bytes_per_s = 0;  // 0: no in-cache roof
};

// Labels each matmul op by the GPT layer whose shape produced its analytic cost, so a profile
// can tell the LM head from the MLP: "matmul_forward fc (N1024 256->1024)". Layers of identical
// shape share a label ("fc+lm_head"). Other ops keep their name.
class MatmulLayerLabels {
  public:
    MatmulLayerLabels(const GPTConfig& cfg, int B, int T);
    std::string operator()(const OpRecord& op) const;

  private:
    struct Entry {
        std::string op;
        double flops;
        std::string label;
    };
    std::vector<Entry> entries_;
};

// One timed op of a step, for the trace (offset from the step-start event, ms).
struct OpInterval {
    std::string name;
    double start_ms = 0;
    double duration_ms = 0;
};

class KernelProfiler final : public OpObserver {
  public:
    explicit KernelProfiler(Backend& backend);
    void op_begin(const OpRecord& op) override;
    void op_end(const OpRecord& op) override;

    // After the step's final synchronisation: reads this step's events. When `accumulate`
    // (a measured step) they are added to the aggregate; offsets for the trace are taken against
    // `step_start` (the PhaseTimer's step-start event, same clock as the op events).
    void finish_step(bool accumulate, const TimingEvent& step_start);
    const std::vector<OpInterval>& last_step_ops() const { return last_ops_; }
    // Aggregate ops under `label(op)` instead of their name (e.g. MatmulLayerLabels).
    void set_op_labels(std::function<std::string(const OpRecord&)> label) {
        label_ = std::move(label);
    }
    // Aggregated table sorted by total time, with % of step (of `mean_step_ms` over
    // `measured_steps` steps) and the roofline verdict filled in (with `cache`: ops whose bytes
    // per call fit in the cache are judged against its bandwidth).
    std::vector<KernelStat> table(double mean_step_ms, int measured_steps,
                                  const MachinePeaks& peaks,
                                  const CacheBandwidth& cache = {}) const;

  private:
    struct Pending {
        std::string name;
        std::string_view impl;  // what the op ran (OpRecord::impl: a string literal)
        double flops, bytes;
        size_t begin_event, end_event;
        bool closed = false;
    };
    TimingEvent& next_event(size_t* index);
    Backend& backend_;
    std::vector<std::unique_ptr<TimingEvent>> pool_;
    size_t used_ = 0;
    std::vector<Pending> pending_;
    std::vector<size_t> open_;  // stack of indices into pending_ (ops may nest)
    std::function<std::string(const OpRecord&)> label_;
    std::map<std::string, KernelStat> agg_;
    std::vector<OpInterval> last_ops_;
};

}  // namespace mt
