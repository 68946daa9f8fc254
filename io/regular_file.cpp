#include "io/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace mt {
namespace {

// Why open() or stat() failed, in the words of not_a_regular_file.
std::string open_failure(int err) {
    if (err == ENOENT) return "does not exist";
    if (err == ELOOP) return "cannot be opened: too many levels of symbolic links (a loop)";
    return std::string("cannot be opened: ") + std::strerror(err);
}

std::string not_regular(mode_t mode) {
    return "is " + file_kind(mode) + ", not a regular file";
}

// The error of a write target that exists and is neither a regular file nor a symbolic link.
FileKindError not_replaceable(const std::string& path, mode_t mode) {
    return FileKindError(path + ": cannot write: it is " + file_kind(mode) +
                         ", not a regular file, and microtrain replaces only regular files: "
                         "give the path of a file");
}

}  // namespace

std::string file_kind(mode_t mode) {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISLNK(mode)) return "a symbolic link";
    if (S_ISREG(mode)) return "a regular file";
    return "a special file";
}

std::optional<std::string> not_a_regular_file(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return open_failure(errno);
    if (S_ISREG(st.st_mode)) return std::nullopt;
    return not_regular(st.st_mode);
}

ReadableFile::ReadableFile(const std::string& path) {
    // O_NONBLOCK: a FIFO with no writer would block open() (and the process, deaf to SIGTERM)
    // forever; with it the open returns and fstat refuses the FIFO. No effect on a regular file.
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd_ < 0) {
        error_ = std::string("cannot open: ") + std::strerror(errno);
        return;
    }
    struct stat st {};
    if (::fstat(fd_, &st) != 0)
        error_ = std::string("cannot be read: ") + std::strerror(errno);
    else if (!S_ISREG(st.st_mode))
        error_ = not_regular(st.st_mode);
    else
        size_ = static_cast<uint64_t>(st.st_size);
}

ReadableFile::~ReadableFile() {
    if (fd_ >= 0) ::close(fd_);
}

std::string read_regular_file(const std::string& path, size_t max_bytes) {
    const ReadableFile f(path);
    if (!f.ok()) throw FileKindError(path + ": " + f.error());
    auto too_big = [&] {
        return FileKindError(path + ": is larger than " + std::to_string(max_bytes) +
                             " bytes, more than a file of this kind ever holds; check the path");
    };
    if (f.size() > max_bytes) throw too_big();
    std::string text;
    char buf[1 << 16];
    for (;;) {
        const ssize_t n = ::read(f.fd(), buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw FileKindError(path + ": cannot be read: " + std::strerror(errno));
        if (n == 0) break;
        text.append(buf, static_cast<size_t>(n));
        if (text.size() > max_bytes) throw too_big();  // it grew while read
    }
    return text;
}

void check_replaceable(const std::string& path) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) return;  // absent (or unreachable: the write says why)
    if (S_ISREG(st.st_mode)) return;
    if (S_ISLNK(st.st_mode))
        throw FileKindError(path +
                            ": cannot write: it is a symbolic link; microtrain does not write "
                            "through symbolic links (the file replaced could be anywhere): give "
                            "the path of the file itself, or remove the link");
    throw not_replaceable(path, st.st_mode);
}

int open_regular_for_append(const std::string& path) {
    check_replaceable(path);
    // O_NOFOLLOW and O_NONBLOCK close the gap between the check and the open: a symbolic link
    // put there since fails with ELOOP, a FIFO opens at once (ENXIO without a reader) and fstat
    // refuses it.
    const int fd = ::open(
        path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
    if (fd < 0) {
        const int err = errno;
        check_replaceable(path);
        throw FileKindError(path + ": cannot open for appending: " + std::strerror(err));
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        const mode_t mode = st.st_mode;
        ::close(fd);
        throw not_replaceable(path, mode);
    }
    // Writes to a regular file never block; clear the flag so write() behaves as usual.
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
}

}  // namespace mt
