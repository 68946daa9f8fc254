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
// The target must be absent or a regular file: a FIFO, a device, a directory or a symbolic link
// there is refused before anything is written (check_replaceable, io/regular_file.h).
// Throws std::runtime_error "<path>: cannot write: <step>: <OS error>" (FileKindError for a
// refused target).
void write_file_atomic(const std::string& path, std::span<const std::span<const std::byte>> pieces);
void write_file_atomic(const std::string& path, std::string_view content);

}  // namespace mt
