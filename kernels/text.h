// Small text helpers every room may include (header-only, plain C++, no project dependencies; in
// the bottom library, mt_backend_api, beside the other shared vocabulary: types.h,
// enum_names.h): joining names for a message, the shortest text of a float, bytes in MiB. The
// report's own number formats (one decimal, no unit, signed deltas) are report/format.h's.
#pragma once

#include <charconv>
#include <cstdio>
#include <string>
#include <vector>

namespace mt {

// "a, b, c": the items of `v` with `sep` between them.
inline std::string join(const std::vector<std::string>& v, const std::string& sep) {
    std::string out;
    for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
    return out;
}

// The shortest text that reads back to the same float ("0.1", "16", "3.4028235e+38"): for
// values that are floats (config fields, checkpoint metadata), so the text round-trips.
inline std::string format_float(float x) {
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, x);
    return std::string(buf, r.ptr);
}

inline constexpr double kMiB = 1024.0 * 1024.0;
// Bytes in MiB (2^20 bytes).
inline double to_mib(double bytes) {
    return bytes / kMiB;
}
// Bytes as MiB with two decimals and the unit: "12.50 MiB".
inline std::string format_mib(double bytes) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.2f MiB", to_mib(bytes));
    return buf;
}

}  // namespace mt
