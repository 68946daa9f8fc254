// Machine peak probes, the roofline and the per-op profiler (see profile.h).
#include "engine/profile.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "engine/peak_flops.h"
#include "io/atomic_file.h"
#include "io/regular_file.h"
#include "kernels/ops.h"

namespace mt {
namespace {

constexpr int kProbeVersion = 4;  // bump when the probe changes, to invalidate old caches

// Bounds on a cached CPU peak. A figure above these is no CPU's (the largest do about 1e13 FLOP/s
// and 1e12 B/s): an edited or corrupt cache, ignored and measured again rather than kept forever.
constexpr double kMaxPlausibleFlopsPerS = 1e16;
constexpr double kMaxPlausibleBytesPerS = 1e14;
// A busy machine's probe under-estimates the peak, so a better cached figure is kept over a fresh
// probe; but not one more than this many times the fresh probe: no load slows a probe by an
// order of magnitude, a wrong cache entry can.
constexpr double kMaxCachedOverProbe = 10;

bool is_cpu_device(const std::string& name) {
    return name.rfind("CPU", 0) == 0;
}

std::string cache_file() {
    return (std::filesystem::path(peaks_cache_dir()) / "cpu_peaks.json").string();
}

// A figure for a message: 1.02e+11, not std::to_string's 300 digits of 1e300.
std::string sci(double x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g", x);
    return buf;
}

// A cache that cannot be used is said once per process, naming the file, and then measured
// again and rewritten (never a failed run, never a silent wrong peak).
void warn_bad_cache(const std::string& why) {
    static std::mutex mu;
    static std::set<std::string> warned;
    const std::lock_guard<std::mutex> lock(mu);
    const std::string key = cache_file() + why;
    if (!warned.insert(key).second) return;
    std::fprintf(stderr,
                 "microtrain: warning: ignoring the peak cache %s: %s; measuring the peaks again "
                 "(the cache is rewritten with the new figures)\n",
                 cache_file().c_str(), why.c_str());
}

nlohmann::json read_cache() {
    std::error_code ec;
    if (!std::filesystem::exists(cache_file(), ec)) return nlohmann::json::object();
    try {
        // A FIFO or a device there is refused, not opened (it would block the run, or never end).
        nlohmann::json j =
            nlohmann::json::parse(read_regular_file(cache_file(), kMaxCacheFileBytes));
        const bool this_probe = j.is_object() && j.contains("probe_version") &&
                                j["probe_version"].is_number_integer() &&
                                j["probe_version"].get<int>() == kProbeVersion;
        if (!this_probe || !j.contains("devices") || !j["devices"].is_object())
            return nlohmann::json::object();  // another probe version's cache: re-measured
        return j;
    } catch (const FileKindError& e) {
        warn_bad_cache(e.what());
        return nlohmann::json::object();
    } catch (const std::exception& e) {
        warn_bad_cache(std::string("not valid JSON (") + e.what() + ")");
        return nlohmann::json::object();
    }
}

std::optional<MachinePeaks> cached_peaks(const std::string& device_name) {
    nlohmann::json j = read_cache();
    if (!j.contains("devices") || !j["devices"].contains(device_name)) return std::nullopt;
    const auto& e = j["devices"][device_name];
    const std::string at = "devices[\"" + device_name + "\"]";
    if (!e.is_object()) {
        warn_bad_cache(at + " is " + e.type_name() + ", expected an object");
        return std::nullopt;
    }
    for (const char* k : {"flops_per_s", "bytes_per_s"}) {
        if (!e.contains(k)) return std::nullopt;
        if (!e[k].is_number()) {
            warn_bad_cache(at + "." + k + " is " + e[k].dump() + ", expected a number");
            return std::nullopt;
        }
    }
    MachinePeaks p;
    p.flops_per_s = e["flops_per_s"].get<double>();
    p.bytes_per_s = e["bytes_per_s"].get<double>();
    if (!(p.flops_per_s > 0) || !(p.bytes_per_s > 0)) return std::nullopt;
    if (p.flops_per_s > kMaxPlausibleFlopsPerS || p.bytes_per_s > kMaxPlausibleBytesPerS) {
        warn_bad_cache(at + " holds " + sci(p.flops_per_s) + " FLOP/s and " + sci(p.bytes_per_s) +
                       " B/s, above any CPU's (at most " + sci(kMaxPlausibleFlopsPerS) +
                       " FLOP/s, " + sci(kMaxPlausibleBytesPerS) + " B/s)");
        return std::nullopt;
    }
    auto text = [&](const char* k, const char* dflt) {
        return e.contains(k) && e[k].is_string() ? e[k].get<std::string>() : std::string(dflt);
    };
    const std::string when = text("measured_utc", "?");
    p.flops_source = text("flops_probe", "measured") + " (cached in " + cache_file() +
                     ", measured " + when + ")";
    p.bytes_source = text("bytes_probe", "measured") + " (cached)";
    p.from_cache = true;
    return p;
}

// The fastest of the timed runs: a peak is the best the machine does; slower runs are
// interference (other processes, frequency ramps), which a median would partly keep.
double best_of(const std::vector<double>& v) {
    return compute_stats(v).min;
}

// Times runs of `work` with backend events, after one untimed warm-up run: at least
// kMinReps, then more until kBudgetMs of timed work or kMaxReps (a machine shared with other
// work needs several chances to show its peak). Returns the best ms; *reps_out = runs timed.
constexpr int kMinReps = 5, kMaxReps = 40;
constexpr double kBudgetMs = 1000;
template <class F>
double time_best_ms(Backend& backend, int* reps_out, F&& work) {
    work();
    backend.synchronize();
    auto e0 = backend.create_event();
    auto e1 = backend.create_event();
    std::vector<double> ms;
    double total = 0;
    while (static_cast<int>(ms.size()) < kMinReps ||
           (total < kBudgetMs && static_cast<int>(ms.size()) < kMaxReps)) {
        e0->record();
        work();
        e1->record();
        backend.synchronize();
        ms.push_back(e1->elapsed_ms_since(*e0));
        total += ms.back();
    }
    *reps_out = static_cast<int>(ms.size());
    return best_of(ms);
}

// CPU copy bandwidth: all OpenMP threads copy their own slice (one thread's memcpy cannot
// saturate the memory system, and the CPU kernels run on every thread). dst <- src, n bytes.
void parallel_copy(void* dst, const void* src, size_t n) {
    const int threads = omp_get_max_threads();
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int t = 0; t < threads; ++t) {
        const size_t lo = n * static_cast<size_t>(t) / static_cast<size_t>(threads);
        const size_t hi = n * static_cast<size_t>(t + 1) / static_cast<size_t>(threads);
        std::memcpy(static_cast<char*>(dst) + lo, static_cast<const char*>(src) + lo, hi - lo);
    }
}

MachinePeaks probe(Backend& backend) {
    const bool cpu = backend.kind() == BackendKind::cpu;
    MachinePeaks p;
    const int n = peak_probe_gemm_n(backend.kind());
    int reps = 0;
    p.flops_per_s = probe_gemm_flops_per_s(backend, n, n, n, &reps);
    std::ostringstream fs;
    fs << "measured: " << n << "^3 " << (cpu ? "sgemm" : "GEMM") << " via matmul_forward ("
       << to_string(backend.precision()) << "), best of " << reps;
    p.flops_source = fs.str();

    const size_t bytes = peak_probe_copy_bytes(backend.kind());
    p.bytes_per_s = probe_copy_bytes_per_s(backend, bytes, &reps);
    std::ostringstream bs;
    bs << "measured: " << (cpu ? "parallel memcpy" : "copy_device") << " of " << (bytes >> 20)
       << " MiB (read + write), best of " << reps;
    p.bytes_source = bs.str();
    backend.synchronize();
    return p;
}

// Records a CPU measurement in the cache unless the cache holds a better one (a probe on a busy
// machine only under-estimates the peak, never over-estimates it). Returns what the cache now
// holds; *note says where the figure went, for its source line.
MachinePeaks remember_cpu_peaks(const std::string& name, const MachinePeaks& p, std::string* note) {
    try {
        std::filesystem::create_directories(peaks_cache_dir());
        nlohmann::json j = read_cache();
        j["probe_version"] = kProbeVersion;
        if (!j.contains("devices")) j["devices"] = nlohmann::json::object();
        if (auto old = cached_peaks(name); old && old->flops_per_s >= p.flops_per_s) {
            if (old->flops_per_s <= kMaxCachedOverProbe * p.flops_per_s) {
                *note = " (the cache in " + cache_file() + " keeps a better figure)";
                return *old;
            }
            warn_bad_cache("devices[\"" + name + "\"] holds " + sci(old->flops_per_s) +
                           " FLOP/s, more than " + sci(kMaxCachedOverProbe) +
                           " times this probe's " + sci(p.flops_per_s));
        }
        j["devices"][name] = {{"flops_per_s", p.flops_per_s},
                              {"bytes_per_s", p.bytes_per_s},
                              {"flops_probe", p.flops_source},
                              {"bytes_probe", p.bytes_source},
                              {"measured_utc", utc_now_iso()}};
        write_file_atomic(cache_file(), j.dump(2) + "\n");
        *note = " (now cached in " + cache_file() + ")";
    } catch (const std::exception& e) {
        *note = std::string(" (not cached: ") + e.what() + ")";
    }
    return p;
}

}  // namespace

std::string peak_flops_source(const std::string& device_name, Precision precision) {
    if (is_cpu_device(device_name)) {
        if (auto p = cached_peaks(device_name)) return p->flops_source;
        return "no measured CPU peak for '" + device_name + "': MFU n/a";
    }
    const PeakFlopsEntry* e = find_peak_flops_entry(device_name);
    if (!e)
        return "no peak FLOP/s table entry for '" + device_name + "' (" + to_string(precision) +
               "): MFU n/a";
    const auto v = cuda_peak_flops(device_name, precision);
    std::ostringstream s;
    s << "data sheet: " << e->gpu << " " << to_string(precision) << " dense "
      << (v ? *v / 1e12 : 0.0) << " TFLOP/s (" << e->source << ")";
    return s.str();
}

std::string peaks_cache_dir() {
    if (const char* d = std::getenv("MICROTRAIN_CACHE_DIR"); d && *d) return d;
    if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d)
        return (std::filesystem::path(d) / "microtrain").string();
    if (const char* h = std::getenv("HOME"); h && *h)
        return (std::filesystem::path(h) / ".cache" / "microtrain").string();
    return (std::filesystem::temp_directory_path() / "microtrain-cache").string();
}

std::optional<double> peak_flops(const std::string& device_name, Precision precision) {
    (void)precision;  // the CPU backend is fp32 only; the probe ran in the backend's precision
    if (is_cpu_device(device_name)) {
        if (auto p = cached_peaks(device_name)) return p->flops_per_s;
        return std::nullopt;
    }
    // GPUs: the vendors' dense data-sheet figure (engine/peak_flops.h); nullopt for a device
    // the table does not know, and the report prints MFU as n/a instead of inventing a number.
    return cuda_peak_flops(device_name, precision);
}

int peak_probe_gemm_n(BackendKind kind) {
    return kind == BackendKind::cpu ? 1024 : 4096;
}

size_t peak_probe_copy_bytes(BackendKind kind) {
    return (kind == BackendKind::cpu ? size_t(64) : size_t(256)) << 20;
}

double probe_gemm_flops_per_s(Backend& backend, int M, int K, int N, int* reps) {
    // out (M,N) = a (M,K) @ w(N,K)^T: 2 M K N flops. Zeros: GEMM speed does not depend on
    // values, and zeros are never denormal.
    const size_t esize = backend.compute_elem_bytes();
    const size_t a_bytes = size_t(M) * K * esize, w_bytes = size_t(N) * K * esize;
    DeviceBuffer a(backend, a_bytes, MemoryCategory::workspace);
    DeviceBuffer w(backend, w_bytes, MemoryCategory::workspace);
    DeviceBuffer out(backend, size_t(M) * N * esize, MemoryCategory::workspace);
    backend.memset_zero(a.get(), a_bytes);
    backend.memset_zero(w.get(), w_bytes);
    // The machine's peak, not the kernels.matmul step a run teaches: the fastest GEMM (auto).
    struct Restore {
        Backend& b;
        MatmulImpl m;
        ~Restore() { b.exchange_matmul_impl(m); }
    } restore{backend, backend.exchange_matmul_impl(MatmulImpl::auto_)};
    const double ms = time_best_ms(backend, reps, [&] {
        backend.run(op::MatmulForward{
            .out = out.get(), .inp = a.get(), .weight = w.get(), .N = M, .C = K, .OC = N});
    });
    const double flops = 2.0 * M * static_cast<double>(K) * N;
    return ms > 0 ? flops / (ms * 1e-3) : 0;
}

double probe_copy_bytes_per_s(Backend& backend, size_t bytes, int* reps) {
    // A copy of `bytes` reads and writes each byte once -> 2 * bytes moved. CPU: the buffers are
    // host memory; every thread copies a slice. CUDA: copy_device (d2d).
    const bool cpu = backend.kind() == BackendKind::cpu;
    DeviceBuffer src(backend, bytes, MemoryCategory::workspace);
    DeviceBuffer dst(backend, bytes, MemoryCategory::workspace);
    backend.memset_zero(src.get(), bytes);
    backend.memset_zero(dst.get(), bytes);
    const double ms = time_best_ms(backend, reps, [&] {
        if (cpu)
            parallel_copy(dst.get(), src.get(), bytes);
        else
            backend.copy_device(dst.get(), src.get(), bytes);
    });
    return ms > 0 ? 2.0 * static_cast<double>(bytes) / (ms * 1e-3) : 0;
}

size_t last_level_cache_bytes() {
    std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index3/size");
    std::string s;
    if (!(f >> s) || s.empty()) return 0;
    size_t mult = 1;
    if (s.back() == 'K') mult = size_t(1) << 10;
    if (s.back() == 'M') mult = size_t(1) << 20;
    try {
        return static_cast<size_t>(std::stoull(s)) * mult;
    } catch (const std::exception&) {
        return 0;
    }
}

std::string cpu_model_of(const std::string& device_name) {
    const std::string prefix = "CPU: ";
    if (device_name.rfind(prefix, 0) != 0) return "unknown";
    std::string model = device_name.substr(prefix.size());
    // The backend appends " (<threads>, <GEMM>)"; a model name's own "(R)" has no space before.
    if (const size_t suffix = model.rfind(" ("); suffix != std::string::npos) model.resize(suffix);
    return model.empty() ? "unknown" : model;
}

MachinePeaks measure_peaks(Backend& backend, bool force) {
    static std::mutex mu;
    // CUDA peaks: once per process, device AND precision (the probe's GEMM runs in the backend's
    // precision: a bf16 variant measured after an fp32 one in the same process must not reuse
    // the fp32 figure, which made its bf16 matmuls read 981 % of peak).
    static std::map<std::pair<std::string, Precision>, MachinePeaks> in_process;
    std::lock_guard<std::mutex> lock(mu);
    const std::string name = backend.device_name();
    const std::pair<std::string, Precision> key{name, backend.precision()};
    const bool cpu = backend.kind() == BackendKind::cpu;  // fp32 only: one figure per device
    if (!force) {
        if (cpu) {
            if (auto p = cached_peaks(name)) return *p;
        } else if (auto it = in_process.find(key); it != in_process.end()) {
            return it->second;
        }
    }
    MachinePeaks p = probe(backend);
    // The probe's buffers are freed; do not let them count towards the run's peaks.
    backend.reset_peaks();
    if (!cpu) {
        in_process[key] = p;
        return p;
    }
    std::string note;
    MachinePeaks best = remember_cpu_peaks(name, p, &note);
    if (best.from_cache) return best;  // the cache's better figure, with its own source line
    best.flops_source += note;
    return best;
}

MachinePeaks probe_peaks_now(Backend& backend) {
    MachinePeaks p = probe(backend);
    backend.reset_peaks();
    if (backend.kind() != BackendKind::cpu) return p;
    std::string note;
    remember_cpu_peaks(backend.device_name(), p, &note);
    p.flops_source += note;
    return p;
}

Bound roofline_bound(double flops_per_byte, const MachinePeaks& peaks) {
    if (!(peaks.flops_per_s > 0) || !(peaks.bytes_per_s > 0) || !(flops_per_byte > 0))
        return flops_per_byte == 0 && peaks.bytes_per_s > 0 ? Bound::memory : Bound::unknown;
    return flops_per_byte < peaks.ridge() ? Bound::memory : Bound::compute;
}

double roofline_attainable(double flops_per_byte, const MachinePeaks& peaks) {
    return std::min(peaks.flops_per_s, flops_per_byte * peaks.bytes_per_s);
}

// ---- KernelProfiler -----------------------------------------------------------------------------

KernelProfiler::KernelProfiler(Backend& backend) : backend_(backend) {}

TimingEvent& KernelProfiler::next_event(size_t* index) {
    if (used_ == pool_.size()) pool_.push_back(backend_.create_event());
    *index = used_;
    return *pool_[used_++];
}

void KernelProfiler::op_begin(const OpRecord& op) {
    Pending p{label_ ? label_(op) : std::string(op.name), op.impl, op.flops, op.bytes, 0, 0, false};
    next_event(&p.begin_event).record();
    pending_.push_back(std::move(p));
    open_.push_back(pending_.size() - 1);
}

void KernelProfiler::op_end(const OpRecord& op) {
    (void)op;
    if (open_.empty()) return;  // unbalanced end: ignore rather than corrupt the table
    Pending& p = pending_[open_.back()];
    open_.pop_back();
    next_event(&p.end_event).record();
    p.closed = true;
}

void KernelProfiler::finish_step(bool accumulate, const TimingEvent& step_start) {
    last_ops_.clear();
    for (const Pending& p : pending_) {
        if (!p.closed) continue;
        const double ms = pool_[p.end_event]->elapsed_ms_since(*pool_[p.begin_event]);
        last_ops_.push_back({p.name, pool_[p.begin_event]->elapsed_ms_since(step_start), ms});
        if (!accumulate) continue;
        KernelStat& k = agg_[p.name];
        // What the op ran is fixed for the backend's life: copied once per op, not per call.
        if (k.calls == 0) k.impl = p.impl;
        k.name = p.name;
        k.calls += 1;
        k.total_ms += ms;
        k.flops += p.flops;
        k.bytes += p.bytes;
    }
    pending_.clear();
    open_.clear();
    used_ = 0;
}

std::vector<KernelStat> KernelProfiler::table(double mean_step_ms, int measured_steps,
                                              const MachinePeaks& peaks,
                                              const CacheBandwidth& cache) const {
    std::vector<KernelStat> out;
    for (const auto& [name, k0] : agg_) {
        KernelStat k = k0;
        k.ms_per_step = measured_steps > 0 ? k.total_ms / measured_steps : 0;
        k.pct_of_step = mean_step_ms > 0 ? 100.0 * k.ms_per_step / mean_step_ms : 0;
        MachinePeaks roof = peaks;
        k.in_cache =
            cache.bytes_per_s > 0 && k.calls > 0 &&
            k.bytes / static_cast<double>(k.calls) <= static_cast<double>(cache.cache_bytes);
        if (k.in_cache) roof.bytes_per_s = cache.bytes_per_s;
        k.bound = roofline_bound(k.intensity(), roof);
        const double attainable = roofline_attainable(k.intensity(), roof);
        // Achieved / attainable. Memory-bound ops this equals achieved GB/s / bandwidth; ops with
        // no flops (copies, casts) are measured on bandwidth directly.
        if (k.total_ms > 0 && k.flops > 0 && attainable > 0)
            k.pct_of_roofline = 100.0 * (k.gflops_per_s() * 1e9) / attainable;
        else if (k.total_ms > 0 && roof.bytes_per_s > 0)
            k.pct_of_roofline = 100.0 * (k.gb_per_s() * 1e9) / roof.bytes_per_s;
        out.push_back(k);
    }
    std::sort(out.begin(), out.end(),
              [](const KernelStat& a, const KernelStat& b) { return a.total_ms > b.total_ms; });
    return out;
}

// ---- MatmulLayerLabels ------------------------------------------------------------------------

MatmulLayerLabels::MatmulLayerLabels(const GPTConfig& cfg, int B, int T) {
    const long long N = static_cast<long long>(B) * T, C = cfg.n_embd;
    const long long Vp = cfg.padded_vocab_size();
    const struct {
        const char* layer;
        long long in, out;
    } layers[] = {{"qkv", C, 3 * C},
                  {"attn_proj", C, C},
                  {"fc", C, 4 * C},
                  {"fc_proj", 4 * C, C},
                  {"lm_head", C, Vp}};
    for (const auto& l : layers) {
        // Layers of identical shape (tiny: lm_head C->Vp=256 is fc's C->4C) share one label.
        std::string layer;
        for (const auto& o : layers) {
            if (o.in != l.in || o.out != l.out) continue;
            if (!layer.empty()) layer += '+';
            layer += o.layer;
        }
        const std::string shape = " " + layer + " (N" + std::to_string(N) + " " +
                                  std::to_string(l.in) + "->" + std::to_string(l.out) + ")";
        // fp32 costs (4-byte elements): only the flops identify the layer, and they do not
        // depend on the element size.
        const double fwd =
            op::MatmulForward{.N = int(N), .C = int(l.in), .OC = int(l.out)}.record(4).flops;
        entries_.push_back({"matmul_forward", fwd, "matmul_forward" + shape});
        entries_.push_back({"matmul_gelu_forward", fwd, "matmul_gelu_forward" + shape});
        // The backward's flops depend on which products it runs (no dbias for the LM head; no
        // dweight for a frozen weight): one entry per combination. The pointers only mark which.
        static float mark;
        for (int which = 1; which < 8; ++which) {
            const op::MatmulBackward b{.dinp = which & 1 ? &mark : nullptr,
                                       .dweight = which & 2 ? &mark : nullptr,
                                       .dbias = which & 4 ? &mark : nullptr,
                                       .N = int(N),
                                       .C = int(l.in),
                                       .OC = int(l.out)};
            entries_.push_back({"matmul_backward", b.record(4).flops, "matmul_backward" + shape});
        }
    }
}

std::string MatmulLayerLabels::operator()(const OpRecord& op) const {
    for (const auto& e : entries_)
        if (op.name == e.op && std::abs(op.flops - e.flops) <= 1e-9 * e.flops) return e.label;
    return std::string(op.name);
}

}  // namespace mt
