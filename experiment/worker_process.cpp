// A child process that answers requests (see worker_process.h).
#include "experiment/worker_process.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <thread>

namespace mt {
namespace {

// Writes all of `text`; false when the other end is gone.
bool write_all(int fd, const std::string& text) {
    size_t done = 0;
    while (done < text.size()) {
        const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        done += static_cast<size_t>(n);
    }
    return true;
}

// Reads up to the next newline (not kept); nullopt at the end of the pipe before one. A stop
// signal interrupts read() (EINTR): the line is still read whole.
std::optional<std::string> read_line(int fd) {
    std::string line;
    char buf[65536];
    for (;;) {
        // One byte at a time would cost a system call per byte of a results document; the
        // protocol is strictly one request, one reply, so nothing after the newline is pending.
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return std::nullopt;
        line.append(buf, static_cast<size_t>(n));
        if (line.back() == '\n') {
            line.pop_back();
            return line;
        }
    }
}

[[noreturn]] void serve_requests(int in, int out, const WorkerProcess::Serve& serve) {
    int status = 0;
    try {
        while (const std::optional<std::string> request = read_line(in)) {
            if (*request == "quit") break;
            std::string reply = serve(*request);
            std::fflush(nullptr);  // what the request printed comes before the reply is read
            if (!write_all(out, reply + "\n")) break;
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "microtrain: a variant's worker process failed: %s\n", e.what());
        status = 70;
    }
    std::fflush(nullptr);
    ::_exit(status);
}

}  // namespace

WorkerProcess::WorkerProcess(Serve serve) {
    int down[2], up[2];  // parent -> child, child -> parent
    if (::pipe2(down, O_CLOEXEC) != 0)
        throw std::runtime_error(std::string("cannot create a worker's pipe: ") +
                                 std::strerror(errno));
    if (::pipe2(up, O_CLOEXEC) != 0) {
        const int err = errno;
        ::close(down[0]), ::close(down[1]);
        throw std::runtime_error(std::string("cannot create a worker's pipe: ") +
                                 std::strerror(err));
    }
    const pid_t parent = ::getpid();
    std::fflush(nullptr);  // nothing buffered is written twice
    pid_ = ::fork();
    if (pid_ < 0) {
        const int err = errno;
        for (int fd : {down[0], down[1], up[0], up[1]}) ::close(fd);
        throw std::runtime_error(std::string("cannot start a variant's worker process (fork): ") +
                                 std::strerror(err));
    }
    if (pid_ == 0) {
        ::close(down[1]), ::close(up[0]);
        // Die with the parent; if it is already gone, so is the reason to run.
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (::getppid() != parent) ::_exit(0);
        serve_requests(down[0], up[1], serve);
    }
    ::close(down[0]), ::close(up[1]);
    to_child_ = down[1];
    from_child_ = up[0];
}

WorkerProcess::~WorkerProcess() {
    if (pid_ > 0 && death_.empty()) {
        write_all(to_child_, "quit\n");
        ::close(to_child_);
        to_child_ = -1;
        // A child that does not leave within 10 s (stuck in a kernel, a hung collective) is
        // killed: the run's report must not wait for it.
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        int status = 0;
        while (::waitpid(pid_, &status, WNOHANG) == 0) {
            if (std::chrono::steady_clock::now() > deadline) {
                ::kill(pid_, SIGKILL);
                ::waitpid(pid_, &status, 0);
                break;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
    }
    if (to_child_ >= 0) ::close(to_child_);
    if (from_child_ >= 0) ::close(from_child_);
}

std::optional<std::string> WorkerProcess::request(const std::string& line) {
    if (!death_.empty()) return std::nullopt;
    // A child that died makes write() raise SIGPIPE: ignore it for the call, the read sees the
    // end of the pipe and reap() says why.
    struct sigaction ignore {};
    struct sigaction previous {};
    ignore.sa_handler = SIG_IGN;
    ::sigaction(SIGPIPE, &ignore, &previous);
    std::optional<std::string> reply;
    if (write_all(to_child_, line + "\n")) reply = read_line(from_child_);
    ::sigaction(SIGPIPE, &previous, nullptr);
    if (!reply) reap();
    return reply;
}

void WorkerProcess::reap() {
    int status = 0;
    pid_t r;
    do r = ::waitpid(pid_, &status, 0);
    while (r < 0 && errno == EINTR);
    if (r == pid_ && WIFSIGNALED(status))
        death_ = "killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
                 strsignal(WTERMSIG(status)) + ")";
    else if (r == pid_ && WIFEXITED(status))
        death_ = "exited with status " + std::to_string(WEXITSTATUS(status));
    else
        death_ = "lost (waitpid: " + std::string(std::strerror(errno)) + ")";
}

}  // namespace mt
