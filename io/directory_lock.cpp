#include "io/directory_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "io/regular_file.h"

namespace mt {
namespace {

// The PID the holder wrote, as text ("" when it has not written it yet).
std::string holder_pid(int fd) {
    char buf[32] = {};
    const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    std::string pid = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
    return pid.find_first_not_of("0123456789") == std::string::npos ? pid : std::string();
}

}  // namespace

DirectoryLock::DirectoryLock(const std::string& dir) {
    const std::string path = dir + "/" + kFileName;
    check_replaceable(path);  // a FIFO or a symbolic link planted there is refused
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
    if (fd_ < 0)
        throw std::runtime_error(path + ": cannot create the lock file of " + dir + ": " +
                                 std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
        const int err = errno;
        const std::string pid = holder_pid(fd_);
        ::close(fd_);
        fd_ = -1;
        if (err != EWOULDBLOCK)
            throw std::runtime_error(path + ": cannot lock: " + std::strerror(err));
        throw DirectoryLockedError(
            dir + ": is in use by another microtrain process" +
            (pid.empty() ? std::string() : " (PID " + pid + ")") + " (it holds the lock " + path +
            "); two processes writing one run directory would corrupt it: wait for that "
            "process to end, or use another directory");
    }
    // Ours: record this process as the holder (the file may hold an earlier holder's PID). A
    // failure loses only the PID in a refused process's message, not the lock.
    const std::string pid = std::to_string(::getpid()) + "\n";
    const bool recorded = ::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, pid.data(), pid.size(), 0) ==
                                                          static_cast<ssize_t>(pid.size());
    (void)recorded;
}

DirectoryLock::~DirectoryLock() {
    if (fd_ >= 0) ::close(fd_);  // releases the flock
}

}  // namespace mt
