// Number formatting shared by the report writers (report.md, report.html, the comparison
// table): printf-style values, MiB, signed deltas and percentages.
#pragma once

#include <cmath>
#include <cstdio>
#include <string>

#include "kernels/text.h"

namespace mt::report_text {

// `x` printed with the printf conversion `spec` ("%.2f").
inline std::string f(const char* spec, double x) {
    char b[64];
    std::snprintf(b, sizeof b, spec, x);
    return b;
}
// `x` with `decimals` digits after the point (the precision chosen at run time).
inline std::string fixed(double x, int decimals) {
    char b[64];
    std::snprintf(b, sizeof b, "%.*f", decimals, x);
    return b;
}
// Bytes as MiB (2^20) with one decimal.
inline std::string mib(double bytes) {
    return f("%.1f", to_mib(bytes));
}
// Bytes as MiB with one decimal, or as exact bytes ("14094 B") when they are not zero but would
// print as 0.0 MiB: a small allocation (a sample cache's 14 KB) is shown, not rounded away.
// `sign`: a leading '+' for x >= 0 (deltas).
inline std::string mib_or_bytes(double bytes, bool sign = false) {
    const char* spec = sign ? "%+.0f B" : "%.0f B";
    if (bytes != 0 && std::fabs(to_mib(bytes)) < 0.05) return f(spec, bytes);
    return f(sign ? "%+.1f" : "%.1f", to_mib(bytes));
}
// Like f, with a leading '+' for x >= 0 (deltas). A small negative that rounds to zero prints as
// "+0.0", not "-0.0": a sign is only shown where the digits can carry it.
inline std::string signed_f(const char* spec, double x) {
    std::string s = f(spec, x);
    if (s[0] == '-' && s.find_first_of("123456789") == std::string::npos) s.erase(0, 1);
    return s[0] == '-' ? s : "+" + s;
}
// A fraction as a percentage with one decimal ("12.5%").
inline std::string pct(double frac) {
    return f("%.1f%%", 100.0 * frac);
}

}  // namespace mt::report_text
