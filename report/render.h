// The human reports, rendered from the typed results (report/results.h): report.md, and the
// same report as one self-contained HTML page with inline SVG charts (report_html.cpp).
#pragma once

#include <string>

#include "report/results.h"

namespace mt {

// The full human report.
std::string render_report_md(const Results& results);
// The same report as one self-contained HTML page with inline SVG charts (report_html.cpp).
std::string render_report_html(const Results& results);

}  // namespace mt
