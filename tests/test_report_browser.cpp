// report.html in a real browser: the microtrain binary (MT_BINARY) runs a tiny two-variant
// experiment, headless Chromium renders its report.html at a 1280 px viewport, and a checker
// script appended to a copy of the page measures every chart's SVG after layout (present, in the
// SVG namespace, with shapes, a non-empty rendered box, drawn inside its viewBox) and whether the
// comparison tables overflow sideways; the console must hold no error (uncaught exception,
// console.error, failed resource load), and the page as written must close every tag it opens
// (tests/html_tags.h: the browser would repair it silently). A deliberately broken page proves
// that every check can fail. Needs Debian's `chromium` (tools/setup.sh installs it): without it
// these tests FAIL, unless MT_SKIP_BROWSER_TESTS=1 asks to skip them (see docs/report.md).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/html_tags.h"

namespace {

using mt::tag_problems;

namespace fs = std::filesystem;
using nlohmann::json;

// Runs first in the page (inserted after <meta charset>): marks console.error calls and failed
// resource loads, which Chromium's stderr log prints at the same level as console.log.
constexpr const char* kConsoleHook =
    R"(<script>(function(){const e=console.error.bind(console);)"
    R"(console.error=(...a)=>e("[console.error]",...a);)"
    R"(addEventListener("error",v=>{if(v.target!==window)console.log("[resource error] "+)"
    R"((v.target.src||v.target.href||v.target.tagName));},true);})();</script>)";

// Runs last (inserted before </body>): one JSON record per <figure>, and per comparison table
// (table.cmp) how many px it overflows its box or the viewport, written into the DOM that
// --dump-dom prints. getBBox / getBoundingClientRect force layout, so the sizes are rendered ones.
constexpr const char* kChartChecker = R"(<script>(function(){
const out=[];
for(const fig of document.querySelectorAll("figure")){
  const cap=fig.querySelector("figcaption"),svg=fig.querySelector("svg");
  const r={caption:cap?cap.textContent:"",svg:!!svg};
  if(svg){
    const b=svg.getBBox(),c=svg.getBoundingClientRect(),vb=svg.viewBox.baseVal;
    r.svg_namespace=svg.namespaceURI==="http://www.w3.org/2000/svg";
    r.shapes=svg.querySelectorAll("rect,line,polyline,polygon,circle,path").length;
    r.box=[b.x,b.y,b.width,b.height];
    r.viewbox=vb?[vb.x,vb.y,vb.width,vb.height]:null;
    r.rendered=[c.width,c.height];
  }
  out.push(r);
}
const wide=[];
for(const t of document.querySelectorAll("table.cmp")){
  const box=t.closest(".tw")||t;
  wide.push({table:t.rows[0]?t.rows[0].textContent.slice(0,60):"",
    overflow:Math.max(box.scrollWidth-box.clientWidth,t.getBoundingClientRect().right-innerWidth)});
}
const pre=document.createElement("pre");
pre.id="mt-browser-check";
pre.textContent=JSON.stringify({figures:out,comparison:wide,
  page_overflow:document.documentElement.scrollWidth-innerWidth});
document.body.appendChild(pre);
})();</script>)";

// The viewport the page is laid out in: a laptop screen. The comparison must fit it.
constexpr int kViewportWidth = 1280;

// The chromium executable: $MT_CHROMIUM (empty when it is not executable), else the first of the
// usual names on PATH.
std::string find_chromium() {
    if (const char* env = std::getenv("MT_CHROMIUM"); env && *env)
        return ::access(env, X_OK) == 0 ? env : "";
    const char* path = std::getenv("PATH");
    std::stringstream dirs(path ? path : "");
    std::string dir;
    while (std::getline(dirs, dir, ':'))
        for (const char* name : {"chromium", "chromium-browser", "google-chrome"}) {
            const fs::path p = fs::path(dir) / name;
            if (::access(p.c_str(), X_OK) == 0) return p.string();
        }
    return "";
}

std::string read_file(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::ostringstream s;
    s << f.rdbuf();
    return s.str();
}

std::string quoted(const std::string& s) {
    std::string o = "'";
    for (char c : s) o += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return o + "'";
}

// What one headless render gave: the exit code, the DOM after the scripts ran, the console lines
// of stderr, and those of them that are errors.
struct Render {
    int code = -1;
    std::string dom;
    std::vector<std::string> console, errors;
};

bool is_console_error(const std::string& line) {
    const size_t q = line.find("] \"");
    if (q == std::string::npos) return false;
    const std::string msg = line.substr(q + 3);
    for (const char* p : {"Uncaught", "[console.error]", "[resource error]",
                          "Failed to load resource", "Assertion failed"})
        if (msg.rfind(p, 0) == 0) return true;
    return false;
}

// Renders `page` in headless Chromium (its own profile in `work`), killed after 60 s.
Render render(const std::string& chromium, const fs::path& page, const fs::path& work) {
    const fs::path dom = work / "dom.html", log = work / "chromium.log";
    const std::string cmd =
        "timeout -k 5 60 " + quoted(chromium) +
        " --headless=new --no-sandbox --disable-gpu --no-first-run"
        " --no-default-browser-check --disable-extensions --disable-dev-shm-usage"
        " --window-size=" +
        std::to_string(kViewportWidth) +
        ",2000"
        " --enable-logging=stderr --v=0 --user-data-dir=" +
        quoted((work / "profile").string()) + " --dump-dom " +
        quoted("file://" + fs::absolute(page).string()) + " > " + quoted(dom.string()) + " 2> " +
        quoted(log.string()) + " < /dev/null";
    Render r;
    const int st = std::system(cmd.c_str());
    r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    r.dom = read_file(dom);
    std::istringstream lines(read_file(log));
    for (std::string l; std::getline(lines, l);)
        if (l.find(":CONSOLE") != std::string::npos) {
            r.console.push_back(l);
            if (is_console_error(l)) r.errors.push_back(l);
        }
    return r;
}

// The page with the console hook first and the chart checker last.
std::string instrument(std::string html) {
    const std::string meta = "<meta charset=\"utf-8\">";
    size_t at = html.find(meta);
    at = at == std::string::npos ? html.find("<head>") + 6 : at + meta.size();
    html.insert(at, kConsoleHook);
    const size_t body = html.rfind("</body>");
    html.insert(body == std::string::npos ? html.size() : body, kChartChecker);
    return html;
}

std::string unescape_html(std::string s) {
    for (const auto& [from, to] : {std::pair<std::string, std::string>{"&lt;", "<"},
                                   {"&gt;", ">"},
                                   {"&quot;", "\""},
                                   {"&#39;", "'"},
                                   {"&amp;", "&"}})
        for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size()))
            s.replace(p, from.size(), to);
    return s;
}

// The checker's records ({figures, comparison, page_overflow}), or a null json when the checker's
// output is not in the DOM.
json checker_records(const std::string& dom) {
    const std::string open = "<pre id=\"mt-browser-check\">";
    const size_t a = dom.find(open);
    if (a == std::string::npos) return nullptr;
    const size_t b = dom.find("</pre>", a);
    if (b == std::string::npos) return nullptr;
    return json::parse(unescape_html(dom.substr(a + open.size(), b - a - open.size())), nullptr,
                       false);
}

// Every comparison table that overflows (its scroll box or the viewport), one line each.
std::vector<std::string> overflow_problems(const json& records) {
    std::vector<std::string> p;
    for (const json& t : records["comparison"])
        if (t["overflow"].get<double>() > 0.5)
            p.push_back("comparison table '" + t["table"].get<std::string>() +
                        "...' overflows by " + t["overflow"].dump() + " px at " +
                        std::to_string(kViewportWidth) + " px");
    if (records["page_overflow"].get<double>() > 0.5)
        p.push_back("the page scrolls sideways by " + records["page_overflow"].dump() + " px");
    return p;
}

// Every way a chart record falls short, one line each; empty when the chart is drawn.
std::vector<std::string> chart_problems(const json& r) {
    const std::string name = "chart '" + r.value("caption", std::string("?")) + "': ";
    if (!r.value("svg", false)) return {name + "no <svg>"};
    std::vector<std::string> p;
    if (!r.value("svg_namespace", false))
        p.push_back(name + "the <svg> is not in the SVG namespace");
    if (r.value("shapes", 0) == 0) p.push_back(name + "the <svg> has no shapes");
    const json& box = r["box"];
    const json& rendered = r["rendered"];
    if (!(box[2].get<double>() > 0 && box[3].get<double>() > 0))
        p.push_back(name + "empty bounding box " + box.dump());
    if (!(rendered[0].get<double>() > 0 && rendered[1].get<double>() > 0))
        p.push_back(name + "rendered with no area " + rendered.dump());
    const json& vb = r["viewbox"];
    if (vb.is_array()) {
        constexpr double tol = 1.0;  // px of the viewBox: rounding of text metrics
        const double x = box[0], y = box[1], w = box[2], h = box[3];
        if (x < vb[0].get<double>() - tol || y < vb[1].get<double>() - tol ||
            x + w > vb[0].get<double>() + vb[2].get<double>() + tol ||
            y + h > vb[1].get<double>() + vb[3].get<double>() + tol)
            p.push_back(name + "drawn outside its viewBox: box " + box.dump() + ", viewBox " +
                        vb.dump());
    } else {
        p.push_back(name + "no viewBox");
    }
    return p;
}

std::string joined(const std::vector<std::string>& v) {
    std::string s;
    for (const std::string& l : v) s += "  " + l + "\n";
    return s;
}

class ReportBrowser : public ::testing::Test {
  protected:
    void SetUp() override {
        chromium_ = find_chromium();
        if (chromium_.empty()) {
            const char* skip = std::getenv("MT_SKIP_BROWSER_TESTS");
            if (skip && std::string(skip) == "1")
                GTEST_SKIP() << "MT_SKIP_BROWSER_TESTS=1: the report is not checked in a browser";
            FAIL() << "headless Chromium not found (looked for $MT_CHROMIUM, then chromium, "
                      "chromium-browser, google-chrome on PATH): run `bash tools/setup.sh`, which "
                      "installs Debian's chromium (CI does), or set MT_SKIP_BROWSER_TESTS=1 to "
                      "skip these tests on purpose";
        }
        dir_ = fs::temp_directory_path() /
               ("mt_test_report_browser_" + std::to_string(::getpid()) + "_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(dir_);
        fs::create_directories(dir_);
    }
    void TearDown() override {
        if (!dir_.empty() && !HasFailure()) fs::remove_all(dir_);  // kept for a look when failed
    }

    // A real run folder: the binary on a tiny 2-variant experiment (1 warm-up + 2 steps), profiled
    // per op (the roofline charts).
    fs::path run_tiny_experiment() {
        const fs::path yaml = dir_ / "tiny.yaml";
        std::ofstream(yaml) << "name: tiny\nbackend: cpu\n"
                               "model: { n_layer: 1, n_embd: 32, n_head: 2, max_seq_len: 16, "
                               "vocab_size: 128 }\n"
                               "data: { source: synthetic, batch_size: 2, seq_len: 16 }\n"
                               "optim: { lr: 1.0e-3, impl: unfused }\n"
                               "run: { seed: 7, warmup_steps: 1, measure_steps: 2, threads: 1 }\n"
                               "profile: { kernels: true }\n"
                               "variants:\n  - name: baseline\n  - name: fused\n"
                               "    set: { optim.impl: fused }\n"
                               "compare: { baseline: baseline, loss_tolerance: 0.02 }\n"
                               "report: { out_dir: "
                            << (dir_ / "runs").string() << " }\n";
        const std::string cmd = "MICROTRAIN_CACHE_DIR=" + quoted((dir_ / "cache").string()) + " " +
                                quoted(MT_BINARY) + " run " + quoted(yaml.string()) +
                                " --quiet 2>&1";
        std::string out;
        if (std::FILE* f = ::popen(cmd.c_str(), "r")) {
            char buf[4096];
            for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
            const int st = ::pclose(f);
            EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << out;
        }
        const size_t pos = out.find("run folder: ");
        if (pos == std::string::npos) return {};
        return out.substr(pos + 12, out.find('\n', pos) - pos - 12);
    }

    std::string chromium_;
    fs::path dir_;
};

TEST_F(ReportBrowser, ChartsRenderTheComparisonFitsAt1280PxTagsCloseAndNothingLogsAnError) {
    const fs::path run = run_tiny_experiment();
    ASSERT_FALSE(run.empty()) << "microtrain run printed no run folder";
    ASSERT_TRUE(fs::exists(run / "report.html"));
    const fs::path page = run / "report.browser-check.html";
    const std::string html = read_file(run / "report.html");
    std::ofstream(page, std::ios::binary) << instrument(html);

    const Render r = render(chromium_, page, dir_);
    ASSERT_EQ(r.code, 0) << "chromium failed or timed out; console:\n" << joined(r.console);
    EXPECT_TRUE(r.errors.empty()) << "the page logged errors:\n" << joined(r.errors);
    EXPECT_EQ(tag_problems(html), std::vector<std::string>{}) << joined(tag_problems(html));
    const json records = checker_records(r.dom);
    ASSERT_TRUE(records.is_object()) << "the checker's output is not in the DOM:\n" << r.dom;
    EXPECT_EQ(overflow_problems(records), std::vector<std::string>{})
        << joined(overflow_problems(records));
    EXPECT_EQ(records["comparison"].size(), 2u) << records["comparison"].dump(1);
    // The charts report_html.cpp draws for this run, in its order: a profiled CPU run on one rank
    // with fixed batch lengths (no communication or tokens chart). The ladder (a log axis) is
    // drawn only where the medians span a factor 3, which two tiny steps may or may not do.
    json charts = json::array();
    for (const json& f : records["figures"])
        if (f.value("caption", std::string()).rfind("Median step time", 0) != 0)
            charts.push_back(f);
    const std::vector<std::string> expected = {
        "Phase breakdown", "Phases of every step", "Step-time distribution", "Loss per step",
        "Memory",          "Roofline of baseline", "Roofline of fused"};
    ASSERT_EQ(charts.size(), expected.size()) << charts.dump(1);
    for (size_t i = 0; i < expected.size(); ++i) {
        const std::string caption = charts[i].value("caption", std::string());
        EXPECT_EQ(caption.rfind(expected[i], 0), 0u) << "chart " << i << ": " << caption;
        EXPECT_TRUE(chart_problems(charts[i]).empty()) << joined(chart_problems(charts[i]));
    }
}

// The same checks on a page with one fault of each kind: each must be reported.
TEST_F(ReportBrowser, ChecksDetectErrorsAMissingSvgAnOverflowingTableAndAnUnclosedTag) {
    const fs::path page = dir_ / "broken.html";
    const std::string broken =
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>broken</title></head><body>"
        "<figure><figcaption>no chart here</figcaption><p>nothing</p></figure>"
        "<figure><figcaption>empty chart</figcaption><svg xmlns=\"http://www.w3.org/2000/svg\" "
        "width=\"100\" height=\"50\" viewBox=\"0 0 100 50\"></svg></figure>"
        "<img src=\"no-such-image.png\">"
        "<div class=\"tw\"><table class=\"cmp\"><tr><td><div style=\"width:3000px\">wide</div></td>"
        "<td><em>left open</td></tr></table></div>"
        "<script>console.error(\"deliberate console error\");</script>"
        "<script>throw new Error(\"deliberate uncaught error\");</script>"
        "</body></html>";
    std::ofstream(page) << instrument(broken);

    const Render r = render(chromium_, page, dir_);
    ASSERT_EQ(r.code, 0) << "chromium failed or timed out; console:\n" << joined(r.console);
    const std::string errors = joined(r.errors);
    EXPECT_NE(errors.find("Uncaught Error: deliberate uncaught error"), std::string::npos)
        << errors;
    EXPECT_NE(errors.find("[console.error] deliberate console error"), std::string::npos) << errors;
    EXPECT_NE(errors.find("no-such-image.png"), std::string::npos) << errors;

    const json records = checker_records(r.dom);
    ASSERT_TRUE(records.is_object()) << r.dom;
    const json& charts = records["figures"];
    ASSERT_EQ(charts.size(), 2u) << charts.dump(1);
    EXPECT_EQ(joined(chart_problems(charts[0])), "  chart 'no chart here': no <svg>\n");
    const std::string empty = joined(chart_problems(charts[1]));
    EXPECT_NE(empty.find("has no shapes"), std::string::npos) << empty;
    EXPECT_NE(empty.find("empty bounding box"), std::string::npos) << empty;

    const std::string wide = joined(overflow_problems(records));
    EXPECT_NE(wide.find("comparison table 'wideleft open...' overflows by"), std::string::npos)
        << wide;
    EXPECT_NE(wide.find("the page scrolls sideways"), std::string::npos) << wide;
    const std::string tags = joined(tag_problems(broken));
    EXPECT_NE(tags.find("</td> at "), std::string::npos) << tags;
    EXPECT_NE(tags.find(" closes <em>"), std::string::npos) << tags;
}

}  // namespace
