// report.html: the markdown report converted to HTML (so both always say the same), with inline
// SVG charts where the markdown has its `<!-- charts -->` marker. One file, no external
// resources: it opens offline.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "report/format.h"
#include "report/render.h"

namespace mt {
namespace {

std::string esc(const std::string& s) {
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

// Inline markdown of our own report: `code`, **bold**, *emphasis*; text is escaped first.
std::string inline_md(const std::string& raw) {
    const std::string s = esc(raw);
    std::string o;
    bool code = false, bold = false, em = false;
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '`') {
            o += code ? "</code>" : "<code>";
            code = !code;
        } else if (!code && s.compare(i, 2, "**") == 0) {
            o += bold ? "</strong>" : "<strong>";
            bold = !bold;
            ++i;
        } else if (!code && s[i] == '*' && i + 1 < s.size() && (em || s[i + 1] != ' ')) {
            o += em ? "</em>" : "<em>";
            em = !em;
        } else if (s[i] == '\\' && i + 1 < s.size() && s[i + 1] == '|') {
            o += '|';
            ++i;
        } else {
            o += s[i];
        }
    }
    if (code) o += "</code>";
    if (bold) o += "</strong>";
    if (em) o += "</em>";
    return o;
}

std::vector<std::string> split_row(const std::string& line) {
    std::vector<std::string> cells;
    std::string cur;
    for (size_t i = 0; i < line.size(); ++i) {
        if (line[i] == '\\' && i + 1 < line.size() && line[i + 1] == '|') {
            cur += "\\|";
            ++i;
        } else if (line[i] == '|') {
            cells.push_back(cur);
            cur.clear();
        } else {
            cur += line[i];
        }
    }
    cells.push_back(cur);
    // "| a | b |" -> ["", " a ", " b ", ""]: drop the outer empties.
    if (!cells.empty() && cells.front().find_first_not_of(' ') == std::string::npos)
        cells.erase(cells.begin());
    if (!cells.empty() && cells.back().find_first_not_of(' ') == std::string::npos)
        cells.pop_back();
    for (auto& c : cells) {
        const auto a = c.find_first_not_of(' '), b = c.find_last_not_of(' ');
        c = a == std::string::npos ? "" : c.substr(a, b - a + 1);
    }
    return cells;
}

std::string md_to_html(const std::string& md, const std::string& charts) {
    std::istringstream in(md);
    std::vector<std::string> lines;
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    std::ostringstream o;
    std::string para;
    int list_depth = 0;
    auto flush_para = [&] {
        if (!para.empty()) o << "<p>" << inline_md(para) << "</p>\n";
        para.clear();
    };
    auto close_lists = [&](int depth) {
        while (list_depth > depth) {
            o << "</ul>\n";
            --list_depth;
        }
    };
    for (size_t i = 0; i < lines.size(); ++i) {
        const std::string& l = lines[i];
        if (l == "<!-- charts -->") {
            flush_para();
            close_lists(0);
            o << charts;
        } else if (l.rfind("### ", 0) == 0 || l.rfind("## ", 0) == 0 || l.rfind("# ", 0) == 0) {
            flush_para();
            close_lists(0);
            const size_t level = l.find(' ');
            o << "<h" << level << ">" << inline_md(l.substr(level + 1)) << "</h" << level << ">\n";
        } else if (!l.empty() && l[0] == '|') {
            flush_para();
            close_lists(0);
            std::vector<std::string> head = split_row(l);
            std::vector<bool> right;
            size_t j = i + 1;
            if (j < lines.size() && lines[j].rfind("|-", 0) == 0) {
                for (const auto& c : split_row(lines[j]))
                    right.push_back(!c.empty() && c.back() == ':');
                ++j;
            }
            o << "<div class=\"tw\"><table>\n<thead><tr>";
            for (const auto& c : head) o << "<th>" << inline_md(c) << "</th>";
            o << "</tr></thead>\n<tbody>\n";
            for (; j < lines.size() && !lines[j].empty() && lines[j][0] == '|'; ++j) {
                const auto cells = split_row(lines[j]);
                o << "<tr>";
                for (size_t k = 0; k < cells.size(); ++k)
                    o << (k < right.size() && right[k] ? "<td class=\"r\">" : "<td>")
                      << inline_md(cells[k]) << "</td>";
                o << "</tr>\n";
            }
            o << "</tbody></table></div>\n";
            i = j - 1;
        } else if (l.rfind("- ", 0) == 0 || l.rfind("  - ", 0) == 0) {
            flush_para();
            const int depth = l[0] == '-' ? 1 : 2;
            while (list_depth < depth) {
                o << "<ul>\n";
                ++list_depth;
            }
            close_lists(depth);
            o << "<li>" << inline_md(l.substr(l.find("- ") + 2)) << "</li>\n";
        } else if (l.empty()) {
            flush_para();
            close_lists(0);
        } else {
            if (list_depth > 0) close_lists(0);
            para += (para.empty() ? "" : " ") + l;
        }
    }
    flush_para();
    close_lists(0);
    return o.str();
}

// ---- charts -------------------------------------------------------------------------------------

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
std::pair<double, double> nice_axis(double x) {
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
      << esc(unit) << "</text>";
    return o.str();
}

std::string legend(double x, double y,
                   const std::vector<std::pair<std::string, std::string>>& items) {
    std::ostringstream o;
    for (const auto& [name, color] : items) {
        o << "<rect x=\"" << x << "\" y=\"" << y - 9 << "\" width=\"10\" height=\"10\" fill=\""
          << color << "\"/><text x=\"" << x + 14 << "\" y=\"" << y << "\" font-size=\"11\">"
          << esc(name) << "</text>";
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
    const auto [amax, tick] = nice_axis(max_ms);
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
          << "\" font-size=\"12\" text-anchor=\"end\">" << esc(v->name) << "</text>";
        double x = kLeft;
        for (int i = 0; i < kPhaseColumnCount; ++i) {
            const double ms = bar_ms(*v, i);
            const double w = kPlotW * ms / amax;
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
    o << axis_x(kLeft, y, kPlotW, amax, tick, "ms") << "</svg></figure>\n";
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
    const auto [amax, tick] = nice_axis(max_ms);
    const double band = 40, top = 12;
    const double h = top + rows.size() * band + 44;
    std::ostringstream o;
    o << "<figure><figcaption>Step-time distribution (measured steps): box = IQR, line = median, "
         "whiskers = p10–p90, dots = steps</figcaption><svg xmlns=\"http://www.w3.org/2000/svg\" "
         "width=\""
      << kW << "\" height=\"" << h << "\" viewBox=\"0 0 " << kW << " " << h << "\">";
    double y = top;
    auto X = [&](double ms) { return kLeft + kPlotW * ms / amax; };
    for (const VariantResult* v : rows) {
        const SeriesSummary& s = v->stats.step_ms;
        const double cy = y + band / 2;
        o << "<text x=\"" << kLeft - 8 << "\" y=\"" << cy + 4
          << "\" font-size=\"12\" text-anchor=\"end\">" << esc(v->name) << "</text>";
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
    o << axis_x(kLeft, y + 4, kPlotW, amax, tick, "ms per step") << "</svg></figure>\n";
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
    const auto [amax, tick] = nice_axis(to_mib(max_b));
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
          << "\" font-size=\"12\" text-anchor=\"end\">" << esc(v->name) << "</text>";
        double x = kLeft, total = 0;
        for (int c = 0; c < kMemoryCategoryCount; ++c) {
            const std::string cat = to_string(static_cast<MemoryCategory>(c));
            const double m = to_mib(static_cast<double>(v->memory.tracked_peak[c]));
            total += m;
            const double w = kPlotW * m / amax;
            if (w <= 0) continue;
            o << "<rect x=\"" << x << "\" y=\"" << y << "\" width=\"" << w << "\" height=\"" << bar
              << "\" fill=\"" << kCatColors[c] << "\"><title>" << cat << ": "
              << report_text::fixed(m, 2) << " MiB</title></rect>";
            x += w;
        }
        const double est = to_mib(static_cast<double>(v->memory.estimate_total));
        const double ex = kLeft + kPlotW * est / amax;
        o << "<line x1=\"" << ex << "\" y1=\"" << y - 3 << "\" x2=\"" << ex << "\" y2=\""
          << y + bar + 3 << "\" stroke=\"#000\" stroke-width=\"2\"><title>estimate "
          << report_text::fixed(est, 2) << " MiB</title></line>";
        o << "<text x=\"" << std::max(x, ex) + 6 << "\" y=\"" << y + bar / 2 + 4
          << "\" font-size=\"11\">" << report_text::fixed(total, 1) << " MiB (est. "
          << report_text::fixed(est, 1) << ")</text>";
        y += bar + gap;
    }
    o << axis_x(kLeft, y, kPlotW, amax, tick, "MiB") << "</svg></figure>\n";
    return o.str();
}

const char* kStyle = R"(
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1200px;color:#222;line-height:1.45;padding:0 16px}
h1{font-size:1.6em;border-bottom:2px solid #4e79a7;padding-bottom:4px}
h2{font-size:1.25em;margin-top:1.8em;border-bottom:1px solid #ddd;padding-bottom:2px}
h3{font-size:1.05em}
.tw{overflow-x:auto}
table{border-collapse:collapse;font-size:12.5px;margin:8px 0}
th,td{border:1px solid #d5d5d5;padding:3px 7px;vertical-align:top}
th{background:#f1f4f8;text-align:left}
td.r{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr:nth-child(even) td{background:#fafafa}
code{background:#f3f3f3;padding:0 3px;border-radius:3px;font-size:0.92em}
figure{margin:18px 0}
figcaption{font-weight:600;margin-bottom:4px}
svg{font-family:inherit;max-width:100%;height:auto}
li{margin:2px 0}
)";

}  // namespace

std::string render_report_html(const Results& results) {
    const std::vector<VariantResult>& vs = results.variants;
    const std::string charts = "<h2>Charts</h2>\n" + phase_chart(vs) + distribution_chart(vs) +
                               loss_chart(vs) + memory_chart(vs);
    std::ostringstream o;
    o << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>"
      << esc(results.experiment.name) << " — microtrain report</title>\n<style>" << kStyle
      << "</style></head><body>\n"
      << md_to_html(render_report_md(results), charts) << "</body></html>\n";
    return o.str();
}

}  // namespace mt
