// report.html: the markdown report converted to HTML (so both always say the same), with the
// inline SVG charts (report/html_charts.h) where the markdown has its `<!-- charts -->` marker.
// One file, no external resources: it opens offline.
#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "report/html_charts.h"
#include "report/render.h"

namespace mt {
namespace {

// Whether the `*` at `i` closes an emphasis: it follows a non-space, and is not half of a `**`.
bool closes_em(const std::string& s, size_t i) {
    return i > 0 && s[i - 1] != ' ' && s[i - 1] != '*' && (i + 1 >= s.size() || s[i + 1] != '*');
}

// Whether the `*` at `i` opens an emphasis, as in CommonMark: it starts a word (the text's start,
// or after a space or an opening bracket) and is followed by a non-space, and a closing `*` comes
// later. So the `*` of a key pattern such as `kernels.*` (after a dot) or `2 * 3` is text, not an
// <em> left open to italicise the rest of the paragraph.
bool opens_em(const std::string& s, size_t i) {
    const bool word_start = i == 0 || s[i - 1] == ' ' || s[i - 1] == '(' || s[i - 1] == '[';
    if (!word_start || i + 1 >= s.size() || s[i + 1] == ' ' || s[i + 1] == '*') return false;
    for (size_t j = i + 2; j < s.size(); ++j)
        if (s[j] == '*' && closes_em(s, j)) return true;
    return false;
}

// Inline markdown of our own report: `code`, **bold**, *emphasis*; text is escaped first. A
// marker that does not pair with a later one is printed as text, so every tag opened is closed.
std::string inline_md(const std::string& raw) {
    const std::string s = html_escape(raw);
    std::string o;
    bool code = false, bold = false, em = false;
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '`' && (code || s.find('`', i + 1) != std::string::npos)) {
            o += code ? "</code>" : "<code>";
            code = !code;
        } else if (!code && s.compare(i, 2, "**") == 0 &&
                   (bold || s.find("**", i + 2) != std::string::npos)) {
            o += bold ? "</strong>" : "<strong>";
            bold = !bold;
            ++i;
        } else if (!code && s[i] == '*' && (em ? closes_em(s, i) : opens_em(s, i))) {
            o += em ? "</em>" : "<em>";
            em = !em;
        } else if (s[i] == '\\' && i + 1 < s.size() && s[i + 1] == '|') {
            o += '|';
            ++i;
        } else {
            o += s[i];
        }
    }
    // A marker whose partner sits inside a code span is left open: close those, innermost first.
    if (code) o += "</code>";
    if (em) o += "</em>";
    if (bold) o += "</strong>";
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

// A markdown table: its header cells, which columns are right-aligned, its body rows.
struct MdTable {
    std::vector<std::string> head;
    std::vector<bool> right;
    std::vector<std::vector<std::string>> rows;
};

// The columns `cols` of `t` (indices into its header) as one HTML table. With `verdict_col` >= 0,
// each row is followed by a row of its own holding that column's text across the whole width:
// the verdict is a sentence, and as a column it either pushes the table past the page's right
// edge or is squeezed into a cell many lines tall.
std::string table_html(const MdTable& t, const std::vector<size_t>& cols, int verdict_col = -1,
                       const std::string& css_class = "") {
    std::ostringstream o;
    o << "<div class=\"tw\"><table" << (css_class.empty() ? "" : " class=\"" + css_class + "\"")
      << ">\n<thead><tr>";
    for (size_t c : cols) o << "<th>" << inline_md(t.head[c]) << "</th>";
    o << "</tr></thead>\n<tbody>\n";
    for (const auto& cells : t.rows) {
        o << "<tr>";
        for (size_t c : cols)
            o << (c < t.right.size() && t.right[c] ? "<td class=\"r\">" : "<td>")
              << (c < cells.size() ? inline_md(cells[c]) : "") << "</td>";
        o << "</tr>\n";
        const auto v = static_cast<size_t>(verdict_col);
        if (verdict_col >= 0 && v < cells.size())
            o << "<tr class=\"verdict\"><td colspan=\"" << cols.size() << "\"><strong>"
              << inline_md(t.head[v]) << ":</strong> " << inline_md(cells[v]) << "</td></tr>\n";
    }
    o << "</tbody></table></div>\n";
    return o.str();
}

// The comparison table (the one whose last column is the Verdict), readable at 1280 px: first a
// narrow summary (what changed, the time call, memory, loss) with each verdict on its own line,
// then the measured numbers. Without the summary's columns (another table that ends in a
// Verdict), every column but the verdict, with the verdict on its own line.
std::string comparison_html(const MdTable& t) {
    const size_t verdict = t.head.size() - 1;
    auto index = [&](const std::string& name) {
        return static_cast<size_t>(std::find(t.head.begin(), t.head.end(), name) - t.head.begin());
    };
    std::vector<size_t> summary;
    for (const char* name :
         {"Variant", "Changed", "Time call [95% CI]", "Δmem MiB", "Loss within tol."})
        if (const size_t c = index(name); c < verdict) summary.push_back(c);
    std::vector<size_t> numbers{0};
    for (size_t c = 1; c < verdict; ++c)
        if (std::find(summary.begin(), summary.end(), c) == summary.end()) numbers.push_back(c);
    if (summary.size() < 3 || summary.front() != 0) {
        numbers.resize(verdict);
        for (size_t c = 0; c < verdict; ++c) numbers[c] = c;
        return table_html(t, numbers, static_cast<int>(verdict), "cmp");
    }
    return table_html(t, summary, static_cast<int>(verdict), "cmp") +
           "<p class=\"cmp-numbers\">The measured numbers of each variant:</p>\n" +
           table_html(t, numbers, -1, "cmp");
}

// The markdown table starting at lines[i], as HTML; `i` is left on its last line.
std::string table_at(const std::vector<std::string>& lines, size_t& i) {
    MdTable t;
    t.head = split_row(lines[i]);
    size_t j = i + 1;
    if (j < lines.size() && lines[j].rfind("|-", 0) == 0) {
        for (const auto& c : split_row(lines[j])) t.right.push_back(!c.empty() && c.back() == ':');
        ++j;
    }
    for (; j < lines.size() && !lines[j].empty() && lines[j][0] == '|'; ++j)
        t.rows.push_back(split_row(lines[j]));
    i = j - 1;
    if (!t.head.empty() && t.head.back() == "Verdict") return comparison_html(t);
    std::vector<size_t> all(t.head.size());
    for (size_t c = 0; c < all.size(); ++c) all[c] = c;
    return table_html(t, all);
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
            o << table_at(lines, i);
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
table.cmp tr td{background:#fff}
table.cmp tr.verdict td{border-top:none;padding:1px 7px 7px 22px;color:#333}
.cmp-numbers{margin-bottom:0}
code{background:#f3f3f3;padding:0 3px;border-radius:3px;font-size:0.92em}
figure{margin:18px 0}
figcaption{font-weight:600;margin-bottom:4px}
svg{font-family:inherit;max-width:100%;height:auto}
li{margin:2px 0}
)";

}  // namespace

std::string render_report_html(const Results& results) {
    const std::vector<VariantResult>& vs = results.variants;
    const std::string charts = "<h2>Charts</h2>\n" + html_charts(vs);
    std::ostringstream o;
    o << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>"
      << html_escape(results.experiment.name) << " — microtrain report</title>\n<style>" << kStyle
      << "</style></head><body>\n"
      << md_to_html(render_report_md(results), charts) << "</body></html>\n";
    return o.str();
}

}  // namespace mt
