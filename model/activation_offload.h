// Activation offload (run.offload: activations): the saved activations of most layers live in
// pinned host memory between their forward and their backward, so the device holds only a few
// layers' worth at a time. Written against Backend only (its copy stream and stream events,
// kernels/backend.h); the model calls five hooks from its layer loops and never sees a stream.
//
// Layout. Each layer's saved activations are one contiguous range of the activation arena
// (compute precision) and one of the fp32 arena (LayerNorm statistics, attention state), as laid
// out by GPT's activation plan. With offload the plan gives the layers only kSlots distinct
// ranges, slot s = l % kSlots: layer l reuses the device memory of layer l - kSlots. Layers
// 0 .. n_layer-kSlots-1 ("offloaded") are copied to the host before their slot is reused; the
// last kSlots layers are still on the device when backward starts and never travel.
//
//   host arena (pinned): [layer 0: act bytes | f32 bytes][layer 1: ...] ... [layer n_off-1]
//   (each part rounded up to 256 bytes)
//
// Ordering (C = compute stream, X = copy stream; events are per layer, so each wait is exact):
//   forward  after layer l:        C records; X waits, copies slot -> host[l], records stored[l]
//            before layer l:       C waits stored[l+1-kSlots]. Layer l writes its own slot and,
//                                  with the fused residual+LayerNorm, layer l+1's ln_1 (slot
//                                  (l+1) % kSlots), whose previous occupant is l+1-kSlots.
//   backward after layer l:        C records (slot l is free: nothing later reads it); X waits,
//                                  copies host[l-kSlots] -> its slot, records loaded[l-kSlots]
//            before layer l:       C waits loaded[l] and loaded[l-1] (backward of layer l reads
//                                  its own activations and layer l-1's output, its residual
//                                  input).
// With kSlots = 3 each copy overlaps one layer's compute: the copy-out of layer l runs during
// forward(l+1), the prefetch of layer l during backward(l+2). Every host range is written by
// its copy-out and read by its prefetch on the same (in-order) copy stream, so a step's
// copy-out never overtakes the previous step's prefetch.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "kernels/backend.h"

namespace mt {

// run.offload: what lives in host memory between forward and backward.
enum class OffloadMode { none, activations };
template <>
struct EnumSpelling<OffloadMode> {
    static constexpr std::array<std::string_view, 2> names{"none", "activations"};
};

// One layer's saved activations: [act_begin, act_begin + act_count) elements of the activation
// arena and [f32_begin, f32_begin + f32_count) of the fp32 arena.
struct LayerActivationRange {
    size_t act_begin = 0, act_count = 0;
    size_t f32_begin = 0, f32_count = 0;
};

class ActivationOffload {
  public:
    // Device slots the layers rotate through (see the ordering above: 3 lets each copy overlap
    // one layer of compute; 2 would serialise them).
    static constexpr int kSlots = 3;
    // How many distinct layer ranges the plan lays out for n_layer layers.
    static int slots_for(int n_layer, OffloadMode mode) {
        return mode == OffloadMode::activations && n_layer > kSlots ? kSlots : n_layer;
    }
    // How many layers travel to the host (the first ones); 0: offload changes nothing.
    static int offloaded_layers(int n_layer, OffloadMode mode) {
        return n_layer - slots_for(n_layer, mode);
    }
    // Pinned host bytes for `offloaded` layers of one range each (all layers share one size).
    static size_t host_bytes(const LayerActivationRange& layer, size_t act_elem_bytes,
                             int offloaded);

    // `layers[l]` is layer l's range (layers l and l % kSlots share one); `act` and `f32` are
    // the arenas. Allocates the pinned host arena and the events (never inside a step).
    ActivationOffload(Backend& backend, void* act, size_t act_elem_bytes, float* f32,
                      std::vector<LayerActivationRange> layers);
    ~ActivationOffload();
    ActivationOffload(const ActivationOffload&) = delete;
    ActivationOffload& operator=(const ActivationOffload&) = delete;

    // The hooks, in the order the model calls them. `backward_follows`: the forward computes a
    // loss whose backward will run; without it nothing is copied (the slots rotate all the same).
    void begin_forward(bool backward_follows);
    void before_forward_layer(int l);
    void after_forward_layer(int l);
    void before_backward_layer(int l);
    void after_backward_layer(int l);

    int offloaded() const { return n_off_; }

  private:
    void copy_layer(int l, CopyDirection direction);
    bool offloaded_layer(int l) const { return l >= 0 && l < n_off_; }

    Backend& backend_;
    char* act_;
    size_t act_elem_bytes_;
    float* f32_;
    std::vector<LayerActivationRange> layers_;
    int n_off_ = 0;
    size_t host_layer_bytes_ = 0;             // one layer's act bytes + f32 bytes
    HostBuffer host_;                         // pinned: n_off_ layers
    bool active_ = false;                     // this forward's activations go to the host
    std::unique_ptr<StreamEvent> mark_;       // a point of the compute stream, waited on at once
    std::unique_ptr<StreamEvent> copy_idle_;  // the end of the copy stream's work so far
    std::vector<std::unique_ptr<StreamEvent>> stored_, loaded_;  // per offloaded layer
};

}  // namespace mt
