// Backend plumbing shared by every implementation: allocator accounting, the graph-capture fronts.
// (The factory that knows the concrete backends is kernels/backend_factory.cpp.)
#include "kernels/backend.h"

#include <algorithm>

namespace mt {

void Backend::account_alloc(MemoryCategory c, size_t bytes) {
    auto i = static_cast<int>(c);
    stats_.current[i] += bytes;
    stats_.peak[i] = std::max(stats_.peak[i], stats_.current[i]);
    stats_.current_total += bytes;
    stats_.peak_total = std::max(stats_.peak_total, stats_.current_total);
}

void Backend::account_free(MemoryCategory c, size_t bytes) {
    auto i = static_cast<int>(c);
    stats_.current[i] -= std::min(stats_.current[i], bytes);
    stats_.current_total -= std::min(stats_.current_total, bytes);
}

void Backend::reset_peaks() {
    stats_.peak = stats_.current;
    stats_.peak_total = stats_.current_total;
}

// ---- graph capture (run.cuda_graph) ----------------------------------------------------------

void Backend::begin_capture(const std::string& what) {
    if (capturing())
        throw BackendError("begin_capture(" + what + "): a capture of " + capture_what_ +
                           " is already open");
    begin_capture_device();
    capture_what_ = what.empty() ? std::string("device work") : what;
}

std::unique_ptr<StepGraph> Backend::end_capture() {
    if (!capturing()) throw BackendError("end_capture: no capture is open (begin_capture)");
    const std::string what = std::exchange(capture_what_, std::string());
    try {
        return end_capture_device();
    } catch (const BackendError& e) {
        throw BackendError("capturing " + what + " into a graph failed: " + e.what());
    }
}

void Backend::abort_capture() noexcept {
    if (!capturing()) return;
    capture_what_.clear();
    abort_capture_device();
}

void Backend::begin_capture_device() {
    throw BackendError(std::string("the ") + to_string(kind()) +
                       " backend cannot capture a graph (its ops run as the host calls them): "
                       "run.cuda_graph needs backend: cuda");
}

std::unique_ptr<StepGraph> Backend::end_capture_device() {
    throw BackendError(std::string("the ") + to_string(kind()) + " backend has no graphs");
}

void Backend::throw_host_wait_in_capture(const char* call, size_t bytes) const {
    throw BackendError(
        std::string(call) + (bytes ? " of " + std::to_string(bytes) + " bytes" : std::string()) +
        " was called while " + capture_what_ +
        " was being captured into a graph: it makes the host wait for the device, and a graph "
        "replays device work without the host (run.cuda_graph). Move the read-back after the "
        "replay (the step's sync phase), or run this step without run.cuda_graph" +
        (sync_after_every_op_ ? " (run.host_sync: every_op synchronises after every op)" : ""));
}

}  // namespace mt
