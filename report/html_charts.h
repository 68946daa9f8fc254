// The charts of report.html (report/html_charts.cpp), and the escaping its text needs.
#pragma once

#include <string>
#include <vector>

#include "report/results.h"

namespace mt {

// `s` safe as HTML / SVG text or a quoted attribute value: & < > " escaped.
std::string html_escape(const std::string& s);

// The figures of report.html's Charts section, in order: phase breakdown, phases of every step,
// the median step on a log axis, step-time distribution, step time against tokens, loss, memory,
// communication, then a roofline per profiled variant; each only where its data exists.
std::string html_charts(const std::vector<VariantResult>& variants);

}  // namespace mt
