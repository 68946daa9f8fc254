// Optimizer-state offload (optim.offload: true): AdamW's moments m and v, and an fp32 master
// copy of the weights it updates, live in pinned host memory; the update runs on the CPU (the
// fused CPU AdamW, through a CPU backend the caller provides), while the gradients go down and
// the updated weights come back on the device backend's copy stream. The device holds no
// optimizer state at all: its `optimizer` memory category stays at zero.
//
// One update, pipelined in chunks of kChunkElems elements (C = compute stream, X = copy stream,
// H = host):
//   C: the gradients (and the clip factor, when clipping) are final -> event
//   X: waits for it; copies clip factor, then grads chunk 0, 1, ... down, an event after each
//   H: for each chunk: waits for its event, runs AdamW on it in host memory, enqueues the copy
//      of its weights up on X (so the upload of chunk c overlaps the update of chunk c+1)
//   C: waits for the last upload before anything later (the next forward) reads the weights.
// The host returns when the last chunk is updated; the uploads still in flight are ordered
// before the next compute work by that last wait, not by the host.
//
// The host master copy is the truth for the elements it updates. It is read from the device
// before the first update and again whenever the model's weights were set from outside
// (GPT::params_version), e.g. by a checkpoint load.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "kernels/backend.h"

namespace mt {

class OptimizerOffload {
  public:
    // 16 MiB of fp32 per chunk: small enough that the first upload starts early, large enough
    // that a chunk's copy is bandwidth-bound, not latency-bound.
    static constexpr size_t kChunkElems = size_t{1} << 22;
    // Pinned host bytes for n elements: m, v, the master weights, the gradient staging buffer,
    // and the clip factor.
    static size_t host_bytes(size_t n) { return 4 * n * sizeof(float) + sizeof(float); }

    // `device`: the model's backend (its copy stream carries the traffic); `host`: a CPU backend
    // that runs the update on host memory. [0, n) of the flat buffers is what AdamW updates and
    // `tensors` its slices (sorted, disjoint, inside [0, n)). Allocates every pinned buffer and
    // event up front; m and v start at zero. `chunk_elems`: the pipeline's chunk (tests use
    // small ones to cross chunk boundaries inside a tensor).
    OptimizerOffload(Backend& device, Backend& host, size_t n, std::vector<TensorSlice> tensors,
                     size_t chunk_elems = kChunkElems);
    ~OptimizerOffload();
    OptimizerOffload(const OptimizerOffload&) = delete;
    OptimizerOffload& operator=(const OptimizerOffload&) = delete;

    // One AdamW step of [0, n): d_grads down, the update on the host, d_params up.
    // `d_clip_scale` (device, null when not clipping) is the factor the gradients are scaled by.
    // `params_version`: the model's; when it differs from the last one seen, the master copy is
    // first re-read from d_params. Returns when the host is done; the device waits for the
    // uploads before its next work.
    void update(float* d_params, const float* d_grads, const float* d_clip_scale,
                const AdamWParams& hp, uint64_t params_version);

    // The moments (host copies, n elements each), for checkpoints.
    std::vector<float> get_m() const;
    std::vector<float> get_v() const;
    void set_moments(const std::vector<float>& m, const std::vector<float>& v);

  private:
    struct Chunk {
        size_t begin = 0, count = 0;
        std::vector<TensorSlice> tensors;  // the slices inside the chunk, relative to `begin`
        std::unique_ptr<StreamEvent> grads_down;
    };
    Backend& device_;
    Backend& host_;
    size_t n_;
    std::vector<TensorSlice> tensors_;
    HostBuffer m_, v_, params_, grads_, clip_scale_;  // pinned
    std::vector<Chunk> chunks_;
    std::unique_ptr<StreamEvent> grads_final_, params_up_;
    std::optional<uint64_t> params_version_;  // of the master copy; none: never read yet
};

}  // namespace mt
