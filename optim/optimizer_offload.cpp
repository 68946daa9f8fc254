// Optimizer-state offload (see optimizer_offload.h for the pipeline).
#include "optim/optimizer_offload.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

namespace mt {

OptimizerOffload::OptimizerOffload(Backend& device, Backend& host, size_t n,
                                   std::vector<TensorSlice> tensors, size_t chunk_elems)
    : device_(device), host_(host), n_(n), tensors_(std::move(tensors)) {
    if (chunk_elems == 0) throw std::invalid_argument("OptimizerOffload: chunk_elems must be > 0");
    if (host_.kind() != BackendKind::cpu)
        throw std::invalid_argument("optim.offload: the update runs on a CPU backend, got " +
                                    std::string(to_string(host_.kind())));
    const size_t bytes = n_ * sizeof(float);
    m_ = HostBuffer(device_, bytes, true);
    v_ = HostBuffer(device_, bytes, true);
    params_ = HostBuffer(device_, bytes, true);
    grads_ = HostBuffer(device_, bytes, true);
    clip_scale_ = HostBuffer(device_, sizeof(float), true);
    std::memset(m_.get(), 0, bytes);
    std::memset(v_.get(), 0, bytes);
    for (size_t begin = 0; begin < n_; begin += chunk_elems) {
        Chunk c;
        c.begin = begin;
        c.count = std::min(chunk_elems, n_ - begin);
        // The tensors that overlap [begin, begin + count), cut to it.
        for (const TensorSlice& t : tensors_) {
            const size_t lo = std::max(t.offset, begin);
            const size_t hi = std::min(t.offset + t.count, begin + c.count);
            if (lo < hi) c.tensors.push_back({lo - begin, hi - lo, t.decay});
        }
        c.grads_down = device_.create_stream_event();
        chunks_.push_back(std::move(c));
    }
    grads_final_ = device_.create_stream_event();
    params_up_ = device_.create_stream_event();
}

OptimizerOffload::~OptimizerOffload() {
    // Uploads may still read the host master copy: let them finish before it is freed.
    try {
        device_.synchronize();
    } catch (...) {  // a device error was already reported by the call that caused it
    }
}

void OptimizerOffload::update(float* d_params, const float* d_grads, const float* d_clip_scale,
                              const AdamWParams& hp, uint64_t params_version) {
    if (params_version_ != params_version) {
        // Ordered after the compute work that set the weights; blocks until they are here.
        device_.copy_to_host(params_.get(), d_params, n_ * sizeof(float));
        params_version_ = params_version;
    }
    float* h_params = params_.as<float>();
    float* h_grads = grads_.as<float>();
    float* h_m = m_.as<float>();
    float* h_v = v_.as<float>();
    // Down: the copy stream starts once backward (and the clip factor's kernel) are done.
    device_.record_event(*grads_final_, Stream::compute);
    device_.wait_event(Stream::copy, *grads_final_);
    if (d_clip_scale)
        device_.copy_async(clip_scale_.get(), d_clip_scale, sizeof(float), CopyDirection::to_host,
                           Stream::copy);
    for (Chunk& c : chunks_) {
        device_.copy_async(h_grads + c.begin, d_grads + c.begin, c.count * sizeof(float),
                           CopyDirection::to_host, Stream::copy);
        device_.record_event(*c.grads_down, Stream::copy);
    }
    // Host: update chunk by chunk as the gradients arrive; each chunk's weights go up at once.
    device_.range_push("optimizer_offload_host_adamw");
    for (Chunk& c : chunks_) {
        device_.wait_event_on_host(*c.grads_down);
        host_.run(op::AdamWUpdate{.impl = AdamWImpl::fused,
                                  .params = h_params + c.begin,
                                  .grads = h_grads + c.begin,
                                  .m = h_m + c.begin,
                                  .v = h_v + c.begin,
                                  .tensors = c.tensors,
                                  .total = c.count,
                                  .hp = hp,
                                  .grad_scale = d_clip_scale ? clip_scale_.as<float>() : nullptr});
        device_.copy_async(d_params + c.begin, h_params + c.begin, c.count * sizeof(float),
                           CopyDirection::to_device, Stream::copy);
    }
    device_.range_pop();
    // Up: nothing later on the compute stream reads the weights before they are all back.
    device_.record_event(*params_up_, Stream::copy);
    device_.wait_event(Stream::compute, *params_up_);
}

std::vector<float> OptimizerOffload::get_m() const {
    const float* p = m_.as<float>();
    return std::vector<float>(p, p + n_);
}

std::vector<float> OptimizerOffload::get_v() const {
    const float* p = v_.as<float>();
    return std::vector<float>(p, p + n_);
}

void OptimizerOffload::set_moments(const std::vector<float>& m, const std::vector<float>& v) {
    if (m.size() != n_ || v.size() != n_)
        throw std::invalid_argument("OptimizerOffload::set_moments: expected " +
                                    std::to_string(n_) + " floats for m and v");
    // The host update of the last step has returned, so no copy reads m or v now.
    std::memcpy(m_.get(), m.data(), n_ * sizeof(float));
    std::memcpy(v_.get(), v.data(), n_ * sizeof(float));
}

}  // namespace mt
