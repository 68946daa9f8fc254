// A child process that answers requests: the runner gives each variant of an interleaved
// experiment (run.rounds > 1) its own process, so that what one variant allocates, and the peak
// RSS it reaches, is that variant's alone whatever ran before it, while its session stays
// resident between its slices.
//
// The child is a fork() of the runner, made before the variant allocates anything: it inherits
// the spec, the runner's options (test hooks included) and the stop-signal handlers, and answers
// one request line with one reply line over a pair of pipes, until "quit" or the end of the
// request pipe; then it leaves with _exit (no destructor of the parent's objects runs twice).
// The parent must not have started OpenMP or CUDA before the fork (neither survives one): the
// runner does nothing in the parent but schedule. The child dies with its parent
// (PR_SET_PDEATHSIG), so a killed `microtrain run` leaves no worker behind.
#pragma once

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>

namespace mt {

class WorkerProcess {
  public:
    // In the child: the answer to one request (one line, without its newline; the reply must
    // hold no newline either). An exception ends the child with status 70.
    using Serve = std::function<std::string(const std::string& request)>;

    // Forks the child, which serves requests with `serve`. Throws std::runtime_error when the
    // pipes or the fork cannot be made (naming the OS error).
    explicit WorkerProcess(Serve serve);
    // Asks the child to quit and waits for it (kills it when it does not end within 10 s).
    ~WorkerProcess();
    WorkerProcess(const WorkerProcess&) = delete;
    WorkerProcess& operator=(const WorkerProcess&) = delete;

    // Sends one request and returns the child's reply; nullopt when the child is gone (it
    // crashed or was killed: death() says how).
    std::optional<std::string> request(const std::string& line);

    // How the child ended, once request() returned nullopt: "killed by signal 9 (Killed)",
    // "exited with status 70".
    const std::string& death() const { return death_; }

  private:
    void reap();

    pid_t pid_ = -1;
    int to_child_ = -1, from_child_ = -1;
    std::string death_;
};

}  // namespace mt
