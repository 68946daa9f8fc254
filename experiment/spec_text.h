// The raw text of an experiment file, read and checked before yaml-cpp sees it: what yaml-cpp
// would silently misread (an unclosed quote, a second document), what would overflow its
// recursion (deep nesting) and what is not a small UTF-8 text file at all. Used by spec.cpp.
#pragma once

#include <cstddef>
#include <string>

namespace mt {

// Limits of an experiment file (docs/experiment-file.md, "Limits").
inline constexpr size_t kMaxExperimentFileBytes = size_t(1) << 20;  // 1 MiB
inline constexpr int kMaxExperimentNesting = 64;  // lists / mappings inside one another

// Reads `path` without blocking (a FIFO or device is refused, not read): throws SpecError saying
// what the path is when it is not a readable regular file of at most kMaxExperimentFileBytes.
std::string read_experiment_text(const std::string& path);

// Throws SpecError at FILE:LINE:COL for a NUL byte, invalid UTF-8, a quoted string not closed on
// the line it opens, nesting deeper than kMaxExperimentNesting, or more than one YAML document.
// With `set_value` the text is the value of a --set argument and `path` that argument: positions
// read "--set key=value: in the value at column C".
void check_experiment_text(const std::string& text, const std::string& path,
                           bool set_value = false);

}  // namespace mt
