// The device memory one process holds, read from a counter that counts every process on the
// device (cudaMemGetInfo: total - free). Without this, a variant's device peak would include
// whatever other processes held at the time: other variants' worker processes that stay resident
// between their round slices (experiment/worker_process.h), or another user of a shared GPU.
//
// The method: device memory only changes where someone works. While this process works, the
// other processes of the run are idle (one slice at a time) and their share is constant, so
// every change of the counter is this process's own:
//
//   start (context created, nothing allocated):  others = used           own = 0
//   while this process works:                    own    = used - others
//   after a pause (others may have changed):     others = used - own     (rebase)
//
// `own` is what the process allocated beyond its CUDA context (allocations, library
// workspaces, the driver's page rounding and fragmentation); the context itself, a fixed few
// hundred MiB per process and the same for every variant on one device, is not counted. An
// outside process that allocates while this one works is still counted (a busy device is
// noise the report names, not something a counter of the whole device can separate).
#pragma once

#include <cstddef>

namespace mt {

class OwnDeviceMemory {
  public:
    // `used_at_start`: the device's used bytes once this process's context exists, before it
    // allocates anything.
    explicit OwnDeviceMemory(size_t used_at_start) : others_(used_at_start) {}

    // This process's bytes, given the device's used bytes now (this process working).
    size_t observe(size_t used) {
        own_ = used > others_ ? used - others_ : 0;
        return own_;
    }

    // This process resumes after a pause: what the device holds beyond this process's last
    // figure belongs to others.
    void rebase(size_t used) { others_ = used > own_ ? used - own_ : 0; }

    size_t own() const { return own_; }

  private:
    size_t others_;
    size_t own_ = 0;
};

}  // namespace mt
