// Regular files only: the one check every reader and every writer of a user-named path makes.
//
// A path a user names can be anything: a FIFO (opening it for reading waits for a writer forever,
// and a blocked open() ignores the signals microtrain stops on), a device (/dev/zero never ends,
// /dev/null replaced by a rename would break the machine), a directory, a socket or a symbolic
// link to any of these. microtrain reads and replaces regular files only:
//
// - readers open with O_NONBLOCK (a FIFO's open returns at once instead of waiting for a writer)
//   and fstat the descriptor they read, so the file checked is the file read;
// - writers refuse a target that exists and is not a regular file, *and a symbolic link* even to
//   a regular file: an atomic write renames over the link itself, and following it could replace
//   a file anywhere (outside the run folder). The error says to give the file's own path.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace mt {

// A path that is not a regular file where one is required; what() begins with the path.
struct FileKindError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// "a FIFO (named pipe)", "a character device", "a directory", ... for a mode that is not a
// regular file's.
std::string file_kind(mode_t mode);

// Why `path` cannot be read as a regular file, or nullopt when it is one (symlinks followed):
// "does not exist", "is a FIFO (named pipe), not a regular file", "is a directory, not a regular
// file", "cannot be opened: too many levels of symbolic links (a loop)", ... Without the path.
std::optional<std::string> not_a_regular_file(const std::string& path);

// A regular file open for reading, closed on destruction. The constructor never blocks and never
// throws: error() says why the path cannot be read, without the path: "cannot open: <OS error>",
// "is a FIFO (named pipe), not a regular file", ...; empty when it can.
class ReadableFile {
  public:
    explicit ReadableFile(const std::string& path);
    ~ReadableFile();
    ReadableFile(const ReadableFile&) = delete;
    ReadableFile& operator=(const ReadableFile&) = delete;

    bool ok() const { return error_.empty(); }
    const std::string& error() const { return error_; }
    int fd() const { return fd_; }
    uint64_t size() const { return size_; }

  private:
    int fd_ = -1;
    uint64_t size_ = 0;
    std::string error_;
};

// The whole content of the regular file `path`, at most `max_bytes`. Throws FileKindError
// "<path>: <why>" for a path that is not a readable regular file or is larger than the limit.
std::string read_regular_file(const std::string& path, size_t max_bytes);

// Refuses to replace `path` unless it is absent or a regular file (not a symbolic link): throws
// FileKindError "<path>: cannot write: it is a FIFO (named pipe), not a regular file; ...".
void check_replaceable(const std::string& path);

// Opens `path` for appending (created 0644 if absent) under check_replaceable's rule, without
// following a symbolic link or blocking on a FIFO. Returns the descriptor; throws FileKindError.
int open_regular_for_append(const std::string& path);

}  // namespace mt
