// One writer per directory: an exclusive lock that two `microtrain train` processes on one run
// directory cannot both hold (two writers interleave train.csv rows and delete each other's
// checkpoints and temporaries).
//
// The lock is flock(LOCK_EX | LOCK_NB) on DIR/.microtrain.lock, whose content is the holder's
// PID (so the refused process can name it). The kernel releases a flock when its descriptor is
// closed, which happens on any exit, SIGKILL included: a lock file left behind never blocks a
// later run, only a live holder does. flock is advisory and local: it protects against other
// microtrain processes on this machine (on NFS it may not be enforced).
#pragma once

#include <stdexcept>
#include <string>

namespace mt {

// Another process holds the lock; what() names the directory and the holder's PID.
struct DirectoryLockedError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// The lock of `dir`, held from construction to destruction.
class DirectoryLock {
  public:
    // The lock file's name inside the locked directory.
    static constexpr const char* kFileName = ".microtrain.lock";

    // Takes the lock of `dir` (which must exist) without waiting. Throws DirectoryLockedError
    // when another process holds it, FileKindError (io/regular_file.h) when the lock file is not
    // a regular file, std::runtime_error when it cannot be created.
    explicit DirectoryLock(const std::string& dir);
    ~DirectoryLock();
    DirectoryLock(const DirectoryLock&) = delete;
    DirectoryLock& operator=(const DirectoryLock&) = delete;

  private:
    int fd_ = -1;
};

}  // namespace mt
