// Atomic file writes: every file microtrain writes (checkpoints, token files, run folders, the
// peak cache, benchmark results) goes through here, so a crash or a full disk leaves either the
// old file or the new one, never a half-written one.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>

namespace mt {

// Writes the byte ranges `pieces`, in order, to `path`: a temporary file beside it (mkstemp),
// fsync, rename over the target, fsync of the directory. The temporary is removed on failure.
// Throws std::runtime_error "<path>: cannot write: <step>: <OS error>".
void write_file_atomic(const std::string& path, std::span<const std::span<const std::byte>> pieces);
void write_file_atomic(const std::string& path, std::string_view content);

}  // namespace mt
