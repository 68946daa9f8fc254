// The time call: per-round pairs, the t-interval of the speedup, the call (see paired_stats.h).
#include "report/paired_stats.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "kernels/text.h"
#include "report/format.h"

namespace mt {

namespace {

double median_of(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct MeanVar {
    double mean = 0, var = 0;  // var: the sample variance (n - 1); 0 for one value
    size_t n = 0;
};
MeanVar mean_var(const std::vector<double>& x) {
    MeanVar m;
    m.n = x.size();
    if (x.empty()) return m;
    for (double v : x) m.mean += v;
    m.mean /= static_cast<double>(x.size());
    if (x.size() < 2) return m;
    for (double v : x) m.var += (v - m.mean) * (v - m.mean);
    m.var /= static_cast<double>(x.size() - 1);
    return m;
}

// The continued fraction of the regularized incomplete beta function (modified Lentz).
double beta_cf(double a, double b, double x) {
    constexpr double tiny = 1e-300, eps = 1e-15;
    const double qab = a + b, qap = a + 1, qam = a - 1;
    double c = 1, d = 1 - qab * x / qap;
    if (std::fabs(d) < tiny) d = tiny;
    d = 1 / d;
    double h = d;
    for (int m = 1; m <= 300; ++m) {
        const double m2 = 2.0 * m;
        double aa = m * (b - m) * x / ((qam + m2) * (a + m2));
        d = 1 + aa * d;
        if (std::fabs(d) < tiny) d = tiny;
        c = 1 + aa / c;
        if (std::fabs(c) < tiny) c = tiny;
        d = 1 / d;
        h *= d * c;
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
        d = 1 + aa * d;
        if (std::fabs(d) < tiny) d = tiny;
        c = 1 + aa / c;
        if (std::fabs(c) < tiny) c = tiny;
        d = 1 / d;
        const double del = d * c;
        h *= del;
        if (std::fabs(del - 1) < eps) break;
    }
    return h;
}

// I_x(a, b), the regularized incomplete beta function.
double incomplete_beta(double a, double b, double x) {
    if (x <= 0) return 0;
    if (x >= 1) return 1;
    const double front = std::exp(std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) +
                                  a * std::log(x) + b * std::log1p(-x));
    if (x < (a + 1) / (a + b + 2)) return front * beta_cf(a, b, x) / a;
    return 1 - front * beta_cf(b, a, 1 - x) / b;
}

// The half-width the interval would have with `rounds` rounds, the per-round spread as measured.
double half_width_at(const SpeedupInterval& s, int rounds) {
    const double scale = std::sqrt(static_cast<double>(s.rounds) / rounds);
    // Paired: R - 1 degrees of freedom. Unpaired: Welch's df grows in proportion.
    const double df = s.paired ? rounds - 1.0 : s.df * (rounds - 1.0) / (s.rounds - 1.0);
    return student_t_quantile(0.975, df) * s.se_log * scale;
}

// The interval's bounds as text, with a third decimal where two would print a bound equal to a
// boundary of the call (1+m or 1/(1+m)) and so hide which side of it the bound lies.
std::string bounds_text(double low, double high, double min_effect) {
    using report_text::f;
    const char* spec = "%.2f";
    for (double bound : {low, high})
        for (double edge : {1 + min_effect, 1 / (1 + min_effect)})
            if (f("%.2f", bound) == f("%.2f", edge)) spec = "%.3f";
    std::string out(1, '[');
    out += f(spec, low);
    out += "–";
    out += f(spec, high);
    out += ']';
    return out;
}

std::string fmt_g(double x) {
    return report_text::f("%g", x);
}

}  // namespace

RoundMedians round_medians(const std::vector<std::pair<int, double>>& round_and_ms) {
    std::map<int, std::vector<double>> by_round;
    for (const auto& [round, ms] : round_and_ms) by_round[std::max(round, 0)].push_back(ms);
    RoundMedians out;
    for (auto& [round, ms] : by_round) out[round] = median_of(std::move(ms));
    return out;
}

double SpeedupInterval::centre() const {
    return std::exp(centre_log);
}
double SpeedupInterval::low() const {
    return std::exp(centre_log - half_width_log);
}
double SpeedupInterval::high() const {
    return std::exp(centre_log + half_width_log);
}

RoundLoads round_loads(const std::vector<std::array<double, 3>>& round_wall_other) {
    RoundLoads loads;
    std::map<int, double> other;
    std::map<int, std::vector<double>> walls;
    for (const auto& [round, wall, other_ms] : round_wall_other) {
        const int r = round < 0 ? 0 : static_cast<int>(round);
        loads[r].wall_ms += wall;
        other[r] += other_ms;
        walls[r].push_back(wall);
    }
    for (auto& [r, l] : loads) {
        l.cores_busy = l.wall_ms > 0 ? other[r] / l.wall_ms : 0;
        std::vector<double>& x = walls[r];
        std::sort(x.begin(), x.end());
        const size_t k = x.size() / 4;
        if (x.size() > 1 && x[k] > 0) l.inner_spread_log = std::log(x[x.size() - 1 - k] / x[k]);
    }
    return loads;
}

namespace {

// The spread above which one side's slice is unsteady (see the top of paired_stats.h).
double unsteady_threshold(const RoundLoads& loads) {
    std::vector<double> spreads;
    for (const auto& kv : loads) spreads.push_back(kv.second.inner_spread_log);
    const double typical = spreads.empty() ? 0 : median_of(spreads);
    return std::max(kUnsteadySliceFactor * typical, std::log1p(kUnsteadySliceFloor));
}

// The pairs left after dropping those far from the median pair (see paired_stats.h).
std::vector<double> without_outlying_pairs(const std::vector<double>& d) {
    if (d.size() < 3) return d;
    const double centre = median_of(d);
    std::vector<double> dev;
    for (double x : d) dev.push_back(std::fabs(x - centre));
    const double robust_sd = 1.4826 * median_of(dev);
    const double limit = std::max(std::log1p(kOutlierPairFloor), kOutlierPairMads * robust_sd);
    std::vector<double> kept;
    for (double x : d)
        if (std::fabs(x - centre) <= limit) kept.push_back(x);
    return kept;
}

}  // namespace

bool uneven_load(const SliceLoad& a, const SliceLoad& b) {
    const double shorter = std::min(a.wall_ms, b.wall_ms);
    if (!(shorter > 0)) return false;
    const double resolution = 3 * kCpuTickMs / shorter;
    return std::fabs(a.cores_busy - b.cores_busy) > std::max(kUnevenLoadCores, resolution);
}

SpeedupInterval paired_speedup_interval(const RoundMedians& baseline, const RoundMedians& variant,
                                        const RoundLoads* baseline_load,
                                        const RoundLoads* variant_load) {
    SpeedupInterval s;
    s.paired = true;
    s.rounds_baseline = static_cast<int>(baseline.size());
    s.rounds_variant = static_cast<int>(variant.size());
    // Only the rounds both ran are pairs (an interrupted variant may miss the last ones), and
    // only those whose two slices met the same load, each at a steady speed.
    const bool loads = baseline_load && variant_load;
    const double steady_b = loads ? unsteady_threshold(*baseline_load) : 0;
    const double steady_v = loads ? unsteady_threshold(*variant_load) : 0;
    for (const auto& [round, b] : baseline) {
        const auto it = variant.find(round);
        if (it == variant.end() || !(b > 0) || !(it->second > 0)) continue;
        if (loads) {
            const auto lb = baseline_load->find(round), lv = variant_load->find(round);
            if (lb != baseline_load->end() && lv != variant_load->end()) {
                if (uneven_load(lb->second, lv->second)) {
                    ++s.rounds_left_out;
                    continue;
                }
                if (lb->second.inner_spread_log > steady_b ||
                    lv->second.inner_spread_log > steady_v) {
                    ++s.rounds_unsteady;
                    continue;
                }
            }
        }
        s.log_ratios.push_back(std::log(b) - std::log(it->second));
    }
    const size_t pairs = s.log_ratios.size();
    s.log_ratios = without_outlying_pairs(s.log_ratios);
    s.rounds_outlying = static_cast<int>(pairs - s.log_ratios.size());
    s.rounds = static_cast<int>(s.log_ratios.size());
    const MeanVar m = mean_var(s.log_ratios);
    s.centre_log = m.mean;
    if (s.rounds < kMinRoundsForInterval) return s;
    s.has_interval = true;
    s.df = s.rounds - 1.0;
    s.se_log = std::sqrt(m.var / s.rounds);
    s.half_width_log = student_t_quantile(0.975, s.df) * s.se_log;
    return s;
}

SpeedupInterval unpaired_speedup_interval(const RoundMedians& baseline,
                                          const RoundMedians& variant) {
    SpeedupInterval s;
    s.paired = false;
    std::vector<double> a, b;
    for (const auto& kv : baseline)
        if (kv.second > 0) a.push_back(std::log(kv.second));
    for (const auto& kv : variant)
        if (kv.second > 0) b.push_back(std::log(kv.second));
    s.rounds_baseline = static_cast<int>(a.size());
    s.rounds_variant = static_cast<int>(b.size());
    s.rounds = std::min(s.rounds_baseline, s.rounds_variant);
    const MeanVar ma = mean_var(a), mb = mean_var(b);
    s.centre_log = a.empty() || b.empty() ? 0 : ma.mean - mb.mean;
    if (s.rounds < kMinRoundsForInterval) return s;
    s.has_interval = true;
    const double va = ma.var / static_cast<double>(a.size()),
                 vb = mb.var / static_cast<double>(b.size());
    s.se_log = std::sqrt(va + vb);
    // Welch–Satterthwaite degrees of freedom (the pooled ones when both spreads are 0).
    const double denom = va * va / (a.size() - 1.0) + vb * vb / (b.size() - 1.0);
    s.df = denom > 0 ? (va + vb) * (va + vb) / denom : a.size() + b.size() - 2.0;
    s.half_width_log = student_t_quantile(0.975, s.df) * s.se_log;
    return s;
}

TimeCall call_from_interval(double low, double high, double min_effect) {
    const double up = 1 + min_effect, down = 1 / (1 + min_effect);
    if (low >= up) return TimeCall::faster;
    if (high <= down) return TimeCall::slower;
    if (low >= down && high <= up) return TimeCall::no_difference;
    return TimeCall::inconclusive;
}

std::optional<int> more_rounds_to_decide(const SpeedupInterval& s, double min_effect) {
    if (!s.has_interval) return std::nullopt;
    // The call is decided once the half-width is below the distance from the centre to the
    // nearest boundary, whichever side of it the centre lies.
    const double target = std::fabs(std::fabs(s.centre_log) - std::log1p(min_effect));
    if (s.half_width_log < target) return 0;
    if (s.se_log <= 0 || target <= 0) return std::nullopt;
    auto decided = [&](int rounds) { return half_width_at(s, rounds) < target; };
    // The half-width falls monotonically with the rounds: double, then bisect.
    int hi = s.rounds + 1;
    while (!decided(hi)) {
        if (hi >= kMaxRoundsEstimate) return std::nullopt;
        hi = std::min(2 * hi, kMaxRoundsEstimate);
    }
    int lo = s.rounds;  // not decided
    while (hi - lo > 1) {
        const int mid = lo + (hi - lo) / 2;
        (decided(mid) ? hi : lo) = mid;
    }
    return hi - s.rounds;
}

TimeCallResult make_time_call(const SpeedupInterval& s, double min_effect) {
    TimeCallResult r;
    // "(1 round left out: why)", or "(3 rounds left out: 2 why, 1 why)" for several reasons.
    const std::pair<int, const char*> reasons[] = {
        {s.rounds_left_out, "the two slices met different loads"},
        {s.rounds_unsteady, "a slice's steps changed speed midway"},
        {s.rounds_outlying, "the machine changed speed between the two slices"}};
    int total = 0, kinds = 0;
    for (const auto& [n, why] : reasons) total += n, kinds += n > 0;
    std::string left_out;
    if (total > 0) {
        std::vector<std::string> parts;
        for (const auto& [n, why] : reasons)
            if (n > 0) parts.push_back(kinds > 1 ? std::to_string(n) + " where " + why : why);
        left_out = " (" + std::to_string(total) + (total == 1 ? " round" : " rounds") +
                   " left out: " + join(parts, "; ") + ")";
    }
    const std::string tail = (s.paired ? "" : " (unpaired)") + left_out;
    if (!s.has_interval) {
        r.call = TimeCall::inconclusive;
        r.text = s.paired ? "inconclusive: " + std::to_string(s.rounds) + " paired round" +
                                (s.rounds == 1 ? "" : "s") + ", an interval needs at least " +
                                std::to_string(kMinRoundsForInterval) + " (run.rounds)" + left_out
                          : "inconclusive: an unpaired interval needs at least " +
                                std::to_string(kMinRoundsForInterval) +
                                " rounds in each run (run.rounds); they have " +
                                std::to_string(s.rounds_baseline) + " and " +
                                std::to_string(s.rounds_variant) + tail;
        return r;
    }
    const double low = s.low(), high = s.high();
    r.ci95 = std::make_pair(low, high);
    r.call = call_from_interval(low, high, min_effect);
    const std::string bounds = bounds_text(low, high, min_effect);
    char point[32];
    std::snprintf(point, sizeof point, "%.2fx ", s.centre());
    if (r.call != TimeCall::inconclusive) {
        r.text = point + std::string(enum_name(r.call)) + " " + bounds + tail;
        return r;
    }
    r.more_rounds = more_rounds_to_decide(s, min_effect);
    const std::string each = s.paired ? "" : " in each run";
    r.text = "inconclusive " + bounds + tail + ": ";
    if (r.more_rounds)
        r.text += "about " + std::to_string(*r.more_rounds) + " more round" +
                  (*r.more_rounds == 1 ? "" : "s") + each + " would decide it";
    else
        r.text += "the speedup sits at the ±" + fmt_g(100 * min_effect) +
                  " % boundary (compare.min_effect): more rounds would not decide it";
    return r;
}

double student_t_cdf(double t, double df) {
    if (std::isinf(t)) return t > 0 ? 1 : 0;
    const double tail = 0.5 * incomplete_beta(0.5 * df, 0.5, df / (df + t * t));
    return t > 0 ? 1 - tail : tail;
}

double student_t_quantile(double p, double df) {
    if (p <= 0) return -std::numeric_limits<double>::infinity();
    if (p >= 1) return std::numeric_limits<double>::infinity();
    if (p < 0.5) return -student_t_quantile(1 - p, df);
    if (p == 0.5) return 0;
    double lo = 0, hi = 2;
    while (student_t_cdf(hi, df) < p && hi < 1e12) lo = hi, hi *= 2;
    for (int i = 0; i < 100 && hi - lo > 1e-12 * hi; ++i) {
        const double mid = 0.5 * (lo + hi);
        (student_t_cdf(mid, df) < p ? lo : hi) = mid;
    }
    return 0.5 * (lo + hi);
}

}  // namespace mt
