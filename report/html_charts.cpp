// The charts of report.html: inline SVG written from the run's record (report/results.h), no
// scripts, no external resources. Each chart is drawn only where its data exists; docs/report.md
// lists them and when each is drawn.
#include "report/html_charts.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <sstream>
#include <utility>

#include "report/format.h"

namespace mt {

std::string html_escape(const std::string& s) {
    std::string o;
    for (char c : s) {
        switch (c) {
            case '&':
                o += "&amp;";
                break;
            case '<':
                o += "&lt;";
                break;
            case '>':
                o += "&gt;";
                break;
            case '"':
                o += "&quot;";
                break;
            default:
                o += c;
        }
    }
    return o;
}

namespace {

// ---- colours, axes, legends, and the charts of every run ---------------------------------------

// One colour per phase column (the phases, then other); comm, the data-parallel wait, is yellow.
// The static_assert makes a new phase without a colour a compile error rather than a null
// pointer printed into the SVG.
const char* const kPhaseColors[] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759",
                                    "#edc948", "#b07aa1", "#76b7b2", "#bab0ac"};
static_assert(std::size(kPhaseColors) == kPhaseColumnCount, "one colour per phase column");
const char* kCatColors[kMemoryCategoryCount] = {"#4e79a7", "#e15759", "#f28e2b",
                                                "#59a14f", "#b07aa1", "#9c755f"};
const char* kLineColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                             "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};

// A "nice" axis maximum and tick step for values up to `x`.
struct Axis {
    double max, tick;
};
Axis nice_axis(double x) {
    if (!(x > 0)) return {1, 0.25};
    const double p = std::pow(10.0, std::floor(std::log10(x)));
    for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
        if (m * p >= x) return {m * p, m * p / (m == 2.5 ? 5 : (m == 2.0 ? 4 : 5))};
    return {10 * p, 2 * p};
}

std::string axis_x(double x0, double y, double w, double max, double tick,
                   const std::string& unit) {
    std::ostringstream o;
    o << "<line x1=\"" << x0 << "\" y1=\"" << y << "\" x2=\"" << x0 + w << "\" y2=\"" << y
      << "\" stroke=\"#888\"/>";
    for (double t = 0; t <= max * 1.0001; t += tick) {
        const double x = x0 + w * t / max;
        o << "<line x1=\"" << x << "\" y1=\"" << y << "\" x2=\"" << x << "\" y2=\"" << y + 4
          << "\" stroke=\"#888\"/><text x=\"" << x << "\" y=\"" << y + 16
          << "\" font-size=\"11\" text-anchor=\"middle\">"
          << report_text::fixed(t, tick < 1 ? 2 : (tick < 10 ? 1 : 0)) << "</text>";
    }
    o << "<text x=\"" << x0 + w << "\" y=\"" << y + 30 << "\" font-size=\"11\" text-anchor=\"end\">"
      << html_escape(unit) << "</text>";
    return o.str();
}

std::string legend(double x, double y,
                   const std::vector<std::pair<std::string, std::string>>& items) {
    std::ostringstream o;
    for (const auto& [name, color] : items) {
        o << "<rect x=\"" << x << "\" y=\"" << y - 9 << "\" width=\"10\" height=\"10\" fill=\""
          << color << "\"/><text x=\"" << x + 14 << "\" y=\"" << y << "\" font-size=\"11\">"
          << html_escape(name) << "</text>";
        x += 22 + 7.0 * name.size();
    }
    return o.str();
}

// Bars leave ~150 px right of the longest bar for its label.
constexpr double kW = 960, kLeft = 170, kPlotW = 640;

// Mean ms of a phase column, negative `other` drawn as nothing.
double bar_ms(const VariantResult& v, int column) {
    return std::max(0.0, phase_column_stats(v.stats, column).mean);
}

std::string phase_chart(const std::vector<VariantResult>& vs) {
    std::vector<const VariantResult*> rows;
    double max_ms = 0;
    for (const VariantResult& v : vs)
        if (v.measured()) {
            rows.push_back(&v);
            double sum = 0;
            for (int i = 0; i < kPhaseColumnCount; ++i) sum += bar_ms(v, i);
            max_ms = std::max({max_ms, sum, v.stats.step_ms.mean});
        }
    if (rows.empty()) return "";
    const Axis axis = nice_axis(max_ms);
    const double bar = 26, gap = 12, top = 34;
    const double h = top + rows.size() * (bar + gap) + 44;
    std::ostringstream o;
    o << "<figure><figcaption>Phase breakdown: mean ms per measured step (stacked)</figcaption>"
      << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kW << "\" height=\"" << h
      << "\" viewBox=\"0 0 " << kW << " " << h << "\">";
    std::vector<std::pair<std::string, std::string>> leg;
    for (int i = 0; i < kPhaseColumnCount; ++i)
        leg.emplace_back(phase_column_name(i), kPhaseColors[i]);
    o << legend(kLeft, 16, leg);
    double y = top;
    for (const VariantResult* v : rows) {
        o << "<text x=\"" << kLeft - 8 << "\" y=\"" << y + bar / 2 + 4
          << "\" font-size=\"12\" text-anchor=\"end\">" << html_escape(v->name) << "</text>";
        double x = kLeft;
        for (int i = 0; i < kPhaseColumnCount; ++i) {
            const double ms = bar_ms(*v, i);
            const double w = kPlotW * ms / axis.max;
            if (w <= 0) continue;
            o << "<rect x=\"" << x << "\" y=\"" << y << "\" width=\"" << w << "\" height=\"" << bar
              << "\" fill=\"" << kPhaseColors[i] << "\"><title>" << phase_column_name(i) << ": "
              << report_text::fixed(ms, 3) << " ms</title></rect>";
            if (w > 34)
                o << "<text x=\"" << x + w / 2 << "\" y=\"" << y + bar / 2 + 4
                  << "\" font-size=\"10\" fill=\"#fff\" text-anchor=\"middle\">"
                  << report_text::fixed(ms, ms < 10 ? 2 : 1) << "</text>";
            x += w;
        }
        o << "<text x=\"" << x + 4 << "\" y=\"" << y + bar / 2 + 4 << "\" font-size=\"11\">"
          << report_text::fixed(v->stats.step_ms.mean, 2) << " ms</text>";
        y += bar + gap;
    }
    o << axis_x(kLeft, y, kPlotW, axis.max, axis.tick, "ms") << "</svg></figure>\n";
    return o.str();
}

std::string distribution_chart(const std::vector<VariantResult>& vs) {
    std::vector<const VariantResult*> rows;
    double max_ms = 0;
    for (const VariantResult& v : vs)
        if (v.measured()) {
            rows.push_back(&v);
            max_ms = std::max(max_ms, v.stats.step_ms.max);
        }
    if (rows.empty()) return "";
    const Axis axis = nice_axis(max_ms);
    const double band = 40, top = 12;
    const double h = top + rows.size() * band + 44;
    std::ostringstream o;
    o << "<figure><figcaption>Step-time distribution (measured steps): box = IQR, line = median, "
         "whiskers = p10–p90, dots = steps</figcaption><svg xmlns=\"http://www.w3.org/2000/svg\" "
         "width=\""
      << kW << "\" height=\"" << h << "\" viewBox=\"0 0 " << kW << " " << h << "\">";
    double y = top;
    auto X = [&](double ms) { return kLeft + kPlotW * ms / axis.max; };
    for (const VariantResult* v : rows) {
        const SeriesSummary& s = v->stats.step_ms;
        const double cy = y + band / 2;
        o << "<text x=\"" << kLeft - 8 << "\" y=\"" << cy + 4
          << "\" font-size=\"12\" text-anchor=\"end\">" << html_escape(v->name) << "</text>";
        o << "<line x1=\"" << X(s.p10) << "\" y1=\"" << cy << "\" x2=\"" << X(s.p90) << "\" y2=\""
          << cy << "\" stroke=\"#555\"/>";
        for (double q : {s.p10, s.p90})
            o << "<line x1=\"" << X(q) << "\" y1=\"" << cy - 7 << "\" x2=\"" << X(q) << "\" y2=\""
              << cy + 7 << "\" stroke=\"#555\"/>";
        o << "<rect x=\"" << X(s.q1) << "\" y=\"" << cy - 11 << "\" width=\""
          << std::max(1.0, X(s.q3) - X(s.q1))
          << "\" height=\"22\" fill=\"#a6c8e6\" stroke=\"#4e79a7\"/>";
        o << "<line x1=\"" << X(s.median) << "\" y1=\"" << cy - 11 << "\" x2=\"" << X(s.median)
          << "\" y2=\"" << cy + 11 << "\" stroke=\"#1b3a5c\" stroke-width=\"2\"/>";
        int i = 0;
        for (const StepRow& st : v->steps) {
            if (st.warmup) continue;
            const double jy = cy - 14 + (i++ * 7 % 29);  // deterministic vertical spread
            o << "<circle cx=\"" << X(st.wall_ms) << "\" cy=\"" << jy
              << "\" r=\"2.2\" fill=\"#e15759\" fill-opacity=\"0.7\"><title>step " << st.step
              << ": " << report_text::fixed(st.wall_ms, 3) << " ms</title></circle>";
        }
        o << "<text x=\"" << X(s.max) + 8 << "\" y=\"" << cy + 4 << "\" font-size=\"11\">median "
          << report_text::fixed(s.median, 2) << " ms</text>";
        y += band;
    }
    o << axis_x(kLeft, y + 4, kPlotW, axis.max, axis.tick, "ms per step") << "</svg></figure>\n";
    return o.str();
}

std::string loss_chart(const std::vector<VariantResult>& vs) {
    double lo = 1e300, hi = -1e300;
    int max_step = 0, warm = 0;
    for (const VariantResult& v : vs)
        for (const StepRow& s : v.steps) {
            if (!std::isfinite(s.loss)) continue;
            lo = std::min(lo, s.loss);
            hi = std::max(hi, s.loss);
            max_step = std::max(max_step, s.step);
            if (s.warmup) warm = std::max(warm, s.step + 1);
        }
    if (hi < lo) return "";
    if (hi - lo < 1e-6) {
        hi += 0.5;
        lo -= 0.5;
    }
    const double pad = 0.05 * (hi - lo);
    lo -= pad;
    hi += pad;
    const double top = 30, ph = 240, left = 70, pw = kW - left - 40;
    const double h = top + ph + 46;
    auto X = [&](double step) { return left + pw * (max_step > 0 ? step / max_step : 0.5); };
    auto Y = [&](double loss) { return top + ph * (hi - loss) / (hi - lo); };
    std::ostringstream o;
    o << "<figure><figcaption>Loss per step (shaded: warm-up, excluded from the statistics; "
         "identical curves overlap, earlier variants are drawn wider)"
      << "</figcaption><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kW << "\" height=\""
      << h << "\" viewBox=\"0 0 " << kW << " " << h << "\">";
    if (warm > 0)
        o << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << X(warm - 0.5) - left
          << "\" height=\"" << ph << "\" fill=\"#eee\"/>";
    o << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << pw << "\" height=\"" << ph
      << "\" fill=\"none\" stroke=\"#888\"/>";
    for (int t = 0; t <= 4; ++t) {
        const double val = lo + (hi - lo) * t / 4;
        o << "<text x=\"" << left - 6 << "\" y=\"" << Y(val) + 4
          << "\" font-size=\"11\" text-anchor=\"end\">" << report_text::fixed(val, 3)
          << "</text><line x1=\"" << left << "\" y1=\"" << Y(val) << "\" x2=\"" << left + pw
          << "\" y2=\"" << Y(val) << "\" stroke=\"#ddd\"/>";
    }
    const int xt = std::max(1, max_step / 10);
    for (int s = 0; s <= max_step; s += xt)
        o << "<text x=\"" << X(s) << "\" y=\"" << top + ph + 16
          << "\" font-size=\"11\" text-anchor=\"middle\">" << s << "</text>";
    o << "<text x=\"" << left + pw << "\" y=\"" << top + ph + 32
      << "\" font-size=\"11\" text-anchor=\"end\">step</text>";
    std::vector<std::pair<std::string, std::string>> leg;
    // Same seed and batches often give identical curves: earlier variants are drawn wider, so a
    // curve hidden under a later one still shows as its border.
    int n_curves = 0;
    for (const VariantResult& v : vs) n_curves += v.steps.empty() ? 0 : 1;
    int ci = 0, drawn = 0;
    for (const VariantResult& v : vs) {
        const char* color = kLineColors[ci++ % 8];
        std::string pts;
        for (const StepRow& s : v.steps)
            if (std::isfinite(s.loss))
                pts +=
                    report_text::fixed(X(s.step), 1) + "," + report_text::fixed(Y(s.loss), 1) + " ";
        if (pts.empty()) continue;
        leg.emplace_back(v.name, color);
        const double width = std::max(1.6, 1.6 + 2.4 * (n_curves - 1 - drawn++));
        o << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"" << width
          << "\" stroke-linejoin=\"round\" points=\"" << pts << "\"/>";
    }
    o << legend(left, 18, leg) << "</svg></figure>\n";
    return o.str();
}

std::string memory_chart(const std::vector<VariantResult>& vs) {
    std::vector<const VariantResult*> rows;
    double max_b = 0;
    for (const VariantResult& v : vs)
        if (v.status != RunStatus::skipped) {
            rows.push_back(&v);
            double sum = 0;
            for (size_t bytes : v.memory.tracked_peak) sum += static_cast<double>(bytes);
            max_b = std::max({max_b, sum, static_cast<double>(v.memory.estimate_total)});
        }
    if (rows.empty()) return "";
    const Axis axis = nice_axis(to_mib(max_b));
    const double bar = 26, gap = 14, top = 34;
    const double h = top + rows.size() * (bar + gap) + 44;
    std::ostringstream o;
    o << "<figure><figcaption>Memory: tracked peak per category (stacked, MiB); black tick = the "
         "analytic estimate's total</figcaption><svg xmlns=\"http://www.w3.org/2000/svg\" width=\""
      << kW << "\" height=\"" << h << "\" viewBox=\"0 0 " << kW << " " << h << "\">";
    std::vector<std::pair<std::string, std::string>> leg;
    for (int c = 0; c < kMemoryCategoryCount; ++c)
        leg.emplace_back(to_string(static_cast<MemoryCategory>(c)), kCatColors[c]);
    o << legend(kLeft, 16, leg);
    double y = top;
    for (const VariantResult* v : rows) {
        o << "<text x=\"" << kLeft - 8 << "\" y=\"" << y + bar / 2 + 4
          << "\" font-size=\"12\" text-anchor=\"end\">" << html_escape(v->name) << "</text>";
        double x = kLeft, total = 0;
        for (int c = 0; c < kMemoryCategoryCount; ++c) {
            const std::string cat = to_string(static_cast<MemoryCategory>(c));
            const double m = to_mib(static_cast<double>(v->memory.tracked_peak[c]));
            total += m;
            const double w = kPlotW * m / axis.max;
            if (w <= 0) continue;
            o << "<rect x=\"" << x << "\" y=\"" << y << "\" width=\"" << w << "\" height=\"" << bar
              << "\" fill=\"" << kCatColors[c] << "\"><title>" << cat << ": "
              << report_text::fixed(m, 2) << " MiB</title></rect>";
            x += w;
        }
        const double est = to_mib(static_cast<double>(v->memory.estimate_total));
        const double ex = kLeft + kPlotW * est / axis.max;
        o << "<line x1=\"" << ex << "\" y1=\"" << y - 3 << "\" x2=\"" << ex << "\" y2=\""
          << y + bar + 3 << "\" stroke=\"#000\" stroke-width=\"2\"><title>estimate "
          << report_text::fixed(est, 2) << " MiB</title></line>";
        o << "<text x=\"" << std::max(x, ex) + 6 << "\" y=\"" << y + bar / 2 + 4
          << "\" font-size=\"11\">" << report_text::fixed(total, 1) << " MiB (est. "
          << report_text::fixed(est, 1) << ")</text>";
        y += bar + gap;
    }
    o << axis_x(kLeft, y, kPlotW, axis.max, axis.tick, "MiB") << "</svg></figure>\n";
    return o.str();
}

// ---- the charts a lesson needs, each drawn only where its data exists -------------------------

// Ticks of a log10 axis from `lo` to `hi` (both > 0): the decades between them, and 2 and 5 times
// each where the range spans under three decades, so a short range still has labelled ticks.
std::vector<double> log_ticks(double lo, double hi) {
    std::vector<double> t;
    const bool fine = hi / lo < 1000;
    for (double d = std::pow(10.0, std::floor(std::log10(lo))); d <= hi * 1.0001; d *= 10)
        for (double m : {1.0, 2.0, 5.0})
            if ((m == 1.0 || fine) && d * m >= lo * 0.9999 && d * m <= hi * 1.0001)
                t.push_back(d * m);
    return t;
}

// A number for an axis's tick, with no needless digits ("0.0002", "5", "2000").
std::string tick_text(double v) {
    return report_text::f("%g", v);
}

// The log10 range [lo, hi] widened to whole decades around the values.
struct LogSpan {
    double lo, hi;
};
LogSpan decades(double lo, double hi) {
    return {std::pow(10.0, std::floor(std::log10(lo))), std::pow(10.0, std::ceil(std::log10(hi)))};
}

std::string svg_open(double h) {
    std::ostringstream o;
    o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kW << "\" height=\"" << h
      << "\" viewBox=\"0 0 " << kW << " " << h << "\">";
    return o.str();
}

// The roofline of one profiled variant: each op's achieved GFLOP/s against its arithmetic
// intensity (FLOP/byte), log-log, under the roof min(peak FLOP/s, bandwidth x intensity) of the
// measured peaks. An op far under the roof left performance on the table; which side of the ridge
// it sits on says whether more FLOP/s (compute-bound) or fewer bytes (memory-bound) would help.
std::string roofline_chart(const VariantResult& v) {
    const RooflineRecord& roof = v.roofline;
    std::vector<const KernelRecord*> ops;
    for (const KernelRecord& k : v.kernels)
        if (k.intensity > 0 && k.gflops_per_s > 0) ops.push_back(&k);
    if (ops.empty() || !(roof.peak_flops_per_s > 0 && roof.bandwidth_bytes_per_s > 0)) return "";
    const double peak = roof.peak_flops_per_s / 1e9, bw = roof.bandwidth_bytes_per_s / 1e9;
    double ilo = roof.ridge_flops_per_byte, ihi = ilo, glo = peak, ghi = peak;
    for (const KernelRecord* k : ops) {
        ilo = std::min(ilo, k->intensity), ihi = std::max(ihi, k->intensity);
        glo = std::min(glo, k->gflops_per_s), ghi = std::max(ghi, k->gflops_per_s);
    }
    const LogSpan xs = decades(ilo, ihi);
    const LogSpan ys = decades(glo, ghi);
    const double top = 14, ph = 280, left = 70, pw = kW - left - 190, h = top + ph + 48;
    auto X = [&](double i) { return left + pw * std::log(i / xs.lo) / std::log(xs.hi / xs.lo); };
    auto Y = [&](double g) {
        return top + ph * (1 - std::log(g / ys.lo) / std::log(ys.hi / ys.lo));
    };
    std::ostringstream o;
    o << "<figure><figcaption>Roofline of " << html_escape(v.name)
      << ": each op's achieved GFLOP/s against its arithmetic intensity (log–log), under the "
         "roof of the measured peaks</figcaption>"
      << svg_open(h) << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << pw
      << "\" height=\"" << ph << "\" fill=\"none\" stroke=\"#888\"/>";
    for (double t : log_ticks(xs.lo, xs.hi))
        o << "<text x=\"" << X(t) << "\" y=\"" << top + ph + 16
          << "\" font-size=\"11\" text-anchor=\"middle\">" << tick_text(t) << "</text>";
    for (double t : log_ticks(ys.lo, ys.hi))
        o << "<text x=\"" << left - 6 << "\" y=\"" << Y(t) + 4
          << "\" font-size=\"11\" text-anchor=\"end\">" << tick_text(t) << "</text><line x1=\""
          << left << "\" y1=\"" << Y(t) << "\" x2=\"" << left + pw << "\" y2=\"" << Y(t)
          << "\" stroke=\"#eee\"/>";
    o << "<text x=\"" << left + pw << "\" y=\"" << top + ph + 32
      << "\" font-size=\"11\" text-anchor=\"end\">arithmetic intensity (FLOP/byte)</text>"
      << "<text x=\"12\" y=\"" << top + ph / 2 << "\" font-size=\"11\" transform=\"rotate(-90 12 "
      << top + ph / 2 << ")\" text-anchor=\"middle\">GFLOP/s</text>";
    // The roof: the bandwidth slope up to the ridge, then flat at the peak.
    const double ridge = peak / bw;
    const double slope_start = std::max(xs.lo, ys.lo / bw);
    o << "<polyline fill=\"none\" stroke=\"#d62728\" stroke-width=\"2\" points=\"" << X(slope_start)
      << "," << Y(slope_start * bw) << " " << X(ridge) << "," << Y(peak) << " " << X(xs.hi) << ","
      << Y(peak) << "\"><title>roof: " << report_text::fixed(bw, 1) << " GB/s × intensity, at most "
      << report_text::fixed(peak, 1) << " GFLOP/s (ridge " << report_text::fixed(ridge, 2)
      << " FLOP/byte)</title></polyline>"
      << "<text x=\"" << left + pw + 6 << "\" y=\"" << Y(peak) + 4
      << "\" font-size=\"11\" fill=\"#d62728\">peak " << report_text::fixed(peak, 1)
      << " GFLOP/s</text>";
    for (const KernelRecord* k : ops) {
        const double cx = X(k->intensity), cy = Y(k->gflops_per_s);
        o << "<circle cx=\"" << cx << "\" cy=\"" << cy << "\" r=\"4\" fill=\"#4e79a7\"><title>"
          << html_escape(k->name) << ": " << report_text::fixed(k->gflops_per_s, 2)
          << " GFLOP/s at " << report_text::fixed(k->intensity, 2)
          << " FLOP/byte</title></circle><text x=\"" << cx + 6 << "\" y=\"" << cy + 4
          << "\" font-size=\"10\">" << html_escape(k->name) << "</text>";
    }
    o << "</svg></figure>\n";
    return o.str();
}

// One stacked bar per step (warm-up ones included, shaded): what changes from step to step — a
// cold data cache filled in the first steps, a jittered batch length — is invisible in the means.
// One panel per measured variant, all on the same ms scale.
std::string step_phase_chart(const std::vector<VariantResult>& vs) {
    std::vector<const VariantResult*> rows;
    double max_ms = 0;
    for (const VariantResult& v : vs)
        if (v.measured()) {
            rows.push_back(&v);
            for (const StepRow& s : v.steps) max_ms = std::max(max_ms, s.wall_ms);
        }
    if (rows.empty()) return "";
    const Axis axis = nice_axis(max_ms);
    const double panel = 90, gap = 26, top = 30, left = kLeft, pw = kPlotW;
    const double h = top + rows.size() * (panel + gap) + 20;
    std::ostringstream o;
    o << "<figure><figcaption>Phases of every step (stacked ms; shaded: warm-up)</figcaption>"
      << svg_open(h);
    std::vector<std::pair<std::string, std::string>> leg;
    for (int i = 0; i < kPhaseColumnCount; ++i)
        leg.emplace_back(phase_column_name(i), kPhaseColors[i]);
    o << legend(left, 16, leg);
    double y = top;
    for (const VariantResult* v : rows) {
        const double slot = pw / std::max<size_t>(1, v->steps.size());
        o << "<text x=\"" << left - 8 << "\" y=\"" << y + panel / 2 + 4
          << "\" font-size=\"12\" text-anchor=\"end\">" << html_escape(v->name) << "</text>"
          << "<line x1=\"" << left << "\" y1=\"" << y + panel << "\" x2=\"" << left + pw
          << "\" y2=\"" << y + panel << "\" stroke=\"#888\"/><text x=\"" << left + pw + 6
          << "\" y=\"" << y + 10 << "\" font-size=\"11\">" << report_text::fixed(axis.max, 1)
          << " ms</text><line x1=\"" << left << "\" y1=\"" << y << "\" x2=\"" << left + pw
          << "\" y2=\"" << y << "\" stroke=\"#eee\"/>";
        for (size_t k = 0; k < v->steps.size(); ++k) {
            const StepRow& s = v->steps[k];
            const double x = left + slot * k;
            if (s.warmup)
                o << "<rect x=\"" << x << "\" y=\"" << y << "\" width=\"" << slot << "\" height=\""
                  << panel << "\" fill=\"#f0f0f0\"/>";
            double base = y + panel;
            for (int i = 0; i < kPhaseColumnCount; ++i) {
                const double ms = std::max(0.0, i < kPhaseCount ? s.phases_ms[i] : s.other_ms);
                const double bh = panel * ms / axis.max;
                if (bh <= 0) continue;
                base -= bh;
                o << "<rect x=\"" << x + slot * 0.1 << "\" y=\"" << base << "\" width=\""
                  << slot * 0.8 << "\" height=\"" << bh << "\" fill=\"" << kPhaseColors[i]
                  << "\"><title>step " << s.step << " " << phase_column_name(i) << ": "
                  << report_text::fixed(ms, 3) << " ms</title></rect>";
            }
        }
        o << "<text x=\"" << left + pw << "\" y=\"" << y + panel + 14
          << "\" font-size=\"11\" text-anchor=\"end\">step (" << v->steps.size() << ")</text>";
        y += panel + gap;
    }
    o << "</svg></figure>\n";
    return o.str();
}

// The median step of every measured variant on a log axis: a kernel ladder's rungs differ by
// factors, and on a linear axis the fast ones shrink to slivers beside the slowest. Drawn where the
// medians span more than kLadderSpan.
constexpr double kLadderSpan = 3.0;

std::string ladder_chart(const std::vector<VariantResult>& vs) {
    std::vector<const VariantResult*> rows;
    double lo = 1e300, hi = 0;
    for (const VariantResult& v : vs)
        if (v.measured() && v.stats.step_ms.median > 0) {
            rows.push_back(&v);
            lo = std::min(lo, v.stats.step_ms.median), hi = std::max(hi, v.stats.step_ms.median);
        }
    if (rows.size() < 2 || hi / lo <= kLadderSpan) return "";
    const LogSpan xs = decades(lo, hi);
    const double bar = 22, gap = 10, top = 10;
    const double h = top + rows.size() * (bar + gap) + 40;
    auto X = [&](double ms) {
        return kLeft + kPlotW * std::log(ms / xs.lo) / std::log(xs.hi / xs.lo);
    };
    std::ostringstream o;
    o << "<figure><figcaption>Median step time per variant, log axis (each gridline a factor)"
      << "</figcaption>" << svg_open(h);
    double y = top;
    for (const VariantResult* v : rows) {
        const double ms = v->stats.step_ms.median;
        o << "<text x=\"" << kLeft - 8 << "\" y=\"" << y + bar / 2 + 4
          << "\" font-size=\"12\" text-anchor=\"end\">" << html_escape(v->name)
          << "</text><rect x=\"" << kLeft << "\" y=\"" << y << "\" width=\""
          << std::max(1.0, X(ms) - kLeft) << "\" height=\"" << bar
          << "\" fill=\"#4e79a7\"/><text x=\"" << X(ms) + 6 << "\" y=\"" << y + bar / 2 + 4
          << "\" font-size=\"11\">" << report_text::fixed(ms, 2) << " ms"
          << (ms < hi ? " (" + report_text::fixed(hi / ms, 1) + "x faster than the slowest)" : "")
          << "</text>";
        y += bar + gap;
    }
    for (double t : log_ticks(xs.lo, xs.hi))
        o << "<line x1=\"" << X(t) << "\" y1=\"" << top << "\" x2=\"" << X(t) << "\" y2=\"" << y
          << "\" stroke=\"#ccc\"/><text x=\"" << X(t) << "\" y=\"" << y + 14
          << "\" font-size=\"11\" text-anchor=\"middle\">" << tick_text(t) << "</text>";
    o << "<text x=\"" << kLeft + kPlotW << "\" y=\"" << y + 30
      << "\" font-size=\"11\" text-anchor=\"end\">ms per step (median, log scale)</text>"
      << "</svg></figure>\n";
    return o.str();
}

// Communication per data-parallel variant (rank 0's medians): the exposed wait, which the step
// pays, beside the part hidden under backward (overlapped), which it does not.
std::string comm_chart(const std::vector<VariantResult>& vs) {
    std::vector<const VariantResult*> rows;
    double max_ms = 0;
    for (const VariantResult& v : vs)
        if (v.data_parallel && v.measured()) {
            rows.push_back(&v);
            max_ms = std::max(
                max_ms, v.data_parallel->comm_exposed_ms + v.data_parallel->comm_overlapped_ms);
        }
    if (rows.empty()) return "";
    const Axis axis = nice_axis(max_ms);
    const double bar = 24, gap = 12, top = 34;
    const double h = top + rows.size() * (bar + gap) + 44;
    const char* const exposed_color = "#e15759";
    const char* const hidden_color = "#a0cbe8";
    std::ostringstream o;
    o << "<figure><figcaption>Communication per step (rank 0, median ms): exposed (the step waits) "
         "vs overlapped (hidden under backward)</figcaption>"
      << svg_open(h)
      << legend(kLeft, 16, {{"exposed", exposed_color}, {"overlapped", hidden_color}});
    double y = top;
    for (const VariantResult* v : rows) {
        const DataParallelRecord& d = *v->data_parallel;
        const double we = kPlotW * d.comm_exposed_ms / axis.max;
        const double wo = kPlotW * d.comm_overlapped_ms / axis.max;
        o << "<text x=\"" << kLeft - 8 << "\" y=\"" << y + bar / 2 + 4
          << "\" font-size=\"12\" text-anchor=\"end\">" << html_escape(v->name)
          << "</text><rect x=\"" << kLeft << "\" y=\"" << y << "\" width=\"" << we << "\" height=\""
          << bar << "\" fill=\"" << exposed_color << "\"><title>exposed "
          << report_text::fixed(d.comm_exposed_ms, 3) << " ms</title></rect><rect x=\""
          << kLeft + we << "\" y=\"" << y << "\" width=\"" << wo << "\" height=\"" << bar
          << "\" fill=\"" << hidden_color << "\"><title>overlapped "
          << report_text::fixed(d.comm_overlapped_ms, 3) << " ms</title></rect><text x=\""
          << kLeft + we + wo + 6 << "\" y=\"" << y + bar / 2 + 4 << "\" font-size=\"11\">"
          << report_text::fixed(d.comm_exposed_ms, 2) << " exposed + "
          << report_text::fixed(d.comm_overlapped_ms, 2) << " overlapped ms ("
          << report_text::pct(d.comm_share) << " of the step)</text>";
        y += bar + gap;
    }
    o << axis_x(kLeft, y, kPlotW, axis.max, axis.tick, "ms per step") << "</svg></figure>\n";
    return o.str();
}

// Whether a variant's measured steps trained different token counts (data.seq_len_jitter); a
// results.json written before StepRow::tokens was stored reads 0 tokens: no chart.
bool tokens_vary(const VariantResult& v) {
    double lo = 1e300, hi = 0;
    for (const StepRow& s : v.steps)
        if (!s.warmup && s.tokens > 0) lo = std::min(lo, s.tokens), hi = std::max(hi, s.tokens);
    return hi > lo;
}

// Step time against the tokens the step trained, one dot per measured step: with jittered batch
// lengths the step time follows the length, so its spread is the data's, not the machine's noise.
// Drawn where a variant's tokens vary; every variant with token counts is plotted beside it.
std::string jitter_chart(const std::vector<VariantResult>& vs) {
    if (std::none_of(vs.begin(), vs.end(), tokens_vary)) return "";
    double max_tok = 0, max_ms = 0;
    for (const VariantResult& v : vs)
        for (const StepRow& s : v.steps)
            if (!s.warmup && s.tokens > 0)
                max_tok = std::max(max_tok, s.tokens), max_ms = std::max(max_ms, s.wall_ms);
    const Axis tokens_axis = nice_axis(max_tok);
    const Axis ms_axis = nice_axis(max_ms);
    const double top = 30, ph = 240, left = 70, pw = kW - left - 40, h = top + ph + 48;
    auto X = [&](double t) { return left + pw * t / tokens_axis.max; };
    auto Y = [&](double ms) { return top + ph * (1 - ms / ms_axis.max); };
    std::ostringstream o;
    o << "<figure><figcaption>Step time against the tokens each measured step trained (one dot "
         "per step)</figcaption>"
      << svg_open(h) << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << pw
      << "\" height=\"" << ph << "\" fill=\"none\" stroke=\"#888\"/>";
    for (double t = 0; t <= ms_axis.max * 1.0001; t += ms_axis.tick)
        o << "<text x=\"" << left - 6 << "\" y=\"" << Y(t) + 4
          << "\" font-size=\"11\" text-anchor=\"end\">" << tick_text(t) << "</text>";
    o << "<text x=\"12\" y=\"" << top + ph / 2 << "\" font-size=\"11\" transform=\"rotate(-90 12 "
      << top + ph / 2 << ")\" text-anchor=\"middle\">ms per step</text>"
      << axis_x(left, top + ph, pw, tokens_axis.max, tokens_axis.tick, "tokens per step");
    std::vector<std::pair<std::string, std::string>> leg;
    int ci = 0;
    for (const VariantResult& v : vs) {
        const char* color = kLineColors[ci++ % std::size(kLineColors)];
        bool any = false;
        for (const StepRow& s : v.steps) {
            if (s.warmup || !(s.tokens > 0)) continue;
            any = true;
            o << "<circle cx=\"" << X(s.tokens) << "\" cy=\"" << Y(s.wall_ms)
              << "\" r=\"3\" fill=\"" << color << "\" fill-opacity=\"0.8\"><title>"
              << html_escape(v.name) << " step " << s.step << ": "
              << report_text::fixed(s.tokens, 0) << " tokens, " << report_text::fixed(s.wall_ms, 2)
              << " ms</title></circle>";
        }
        if (any) leg.emplace_back(v.name, color);
    }
    o << legend(left, 18, leg) << "</svg></figure>\n";
    return o.str();
}

}  // namespace

std::string html_charts(const std::vector<VariantResult>& vs) {
    std::string charts = phase_chart(vs) + step_phase_chart(vs) + ladder_chart(vs) +
                         distribution_chart(vs) + jitter_chart(vs) + loss_chart(vs) +
                         memory_chart(vs) + comm_chart(vs);
    for (const VariantResult& v : vs) charts += roofline_chart(v);
    return charts;
}

}  // namespace mt
