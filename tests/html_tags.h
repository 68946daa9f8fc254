// A strict check of an HTML page's tags, for the report tests: a browser silently repairs an
// unclosed or misnested tag (and italicises or swallows the text after it), so the tests check the
// page as written.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

namespace mt {

// Every way the page's tags fail to nest, one line each: a closing tag that does not match the
// innermost open one, or a tag left open at the end. Void elements and self-closed SVG shapes
// (`<rect .../>`) open nothing; script and style bodies are skipped.
inline std::vector<std::string> tag_problems(const std::string& html) {
    static const std::vector<std::string> kVoid = {"meta", "br", "hr", "img", "input", "link"};
    std::vector<std::string> open, problems;
    for (size_t p = html.find('<'); p != std::string::npos; p = html.find('<', p + 1)) {
        if (html.compare(p, 2, "<!") == 0) continue;  // doctype, comment
        const size_t end = html.find('>', p);
        if (end == std::string::npos) return {"a '<' never closed by '>' at " + std::to_string(p)};
        const bool closing = html[p + 1] == '/';
        const size_t a = p + (closing ? 2 : 1);
        const std::string name = html.substr(a, html.find_first_of(" \t\n/>", a) - a);
        if (closing) {
            if (open.empty() || open.back() != name)
                problems.push_back("</" + name + "> at " + std::to_string(p) + " closes <" +
                                   (open.empty() ? std::string("nothing") : open.back()) + ">");
            else
                open.pop_back();
        } else if (html[end - 1] != '/' &&
                   std::find(kVoid.begin(), kVoid.end(), name) == kVoid.end()) {
            open.push_back(name);
            if (name == "script" || name == "style") p = html.find("</" + name, end) - 1;
        }
    }
    for (const std::string& t : open) problems.push_back("<" + t + "> never closed");
    return problems;
}

}  // namespace mt
