#include "io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "io/regular_file.h"

namespace mt {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& step) {
    throw std::runtime_error(path + ": cannot write: " + step + ": " + std::strerror(errno));
}

// The temporary file of an atomic write: closed and unlinked unless committed.
class TempFile {
  public:
    explicit TempFile(const std::string& target) : name_(target + ".tmp.XXXXXX") {
        fd_ = mkstemp(name_.data());
        if (fd_ < 0) fail(target, "creating a temporary file next to it (mkstemp)");
        fchmod(fd_, 0644);  // mkstemp creates 0600; these are ordinary data files
    }
    ~TempFile() {
        if (fd_ >= 0) ::close(fd_);
        if (!committed_) ::unlink(name_.c_str());
    }
    TempFile(const TempFile&) = delete;
    TempFile& operator=(const TempFile&) = delete;
    int fd() const { return fd_; }
    const std::string& name() const { return name_; }
    int close() {
        const int r = ::close(fd_);
        fd_ = -1;
        return r;
    }
    void commit() { committed_ = true; }

  private:
    std::string name_;
    int fd_ = -1;
    bool committed_ = false;
};

void write_all(int fd, std::span<const std::byte> bytes, const std::string& target) {
    const std::byte* p = bytes.data();
    size_t n = bytes.size();
    while (n > 0) {
        const ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t{1} << 30));
        if (w < 0) {
            if (errno == EINTR) continue;
            fail(target, "write");
        }
        p += w;
        n -= static_cast<size_t>(w);
    }
}

}  // namespace

void write_file_atomic(const std::string& path,
                       std::span<const std::span<const std::byte>> pieces) {
    check_replaceable(path);  // the rename would replace a FIFO, a device or a symlink
    TempFile tmp(path);
    for (const auto& piece : pieces) write_all(tmp.fd(), piece, path);
    if (fsync(tmp.fd()) != 0) fail(path, "fsync");
    if (tmp.close() != 0) fail(path, "close");
    if (std::rename(tmp.name().c_str(), path.c_str()) != 0)
        fail(path, "renaming " + tmp.name() + " over it");
    tmp.commit();
    // Persist the rename itself: fsync the directory entry.
    const size_t slash = path.find_last_of('/');
    const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        ::close(dfd);
    }
}

void write_file_atomic(const std::string& path, std::string_view content) {
    const std::span<const std::byte> piece =
        std::as_bytes(std::span(content.data(), content.size()));
    write_file_atomic(path, std::span(&piece, 1));
}

}  // namespace mt
