// Activation offload: the hooks GPT's layer loops call (see activation_offload.h for the layout
// and the ordering argument).
#include "model/activation_offload.h"

#include <stdexcept>
#include <string>
#include <utility>

namespace mt {

namespace {
// Each part of a layer's host range starts 256-byte aligned (fast DMA, and the fp32 part is
// aligned whatever the size of the act part in bf16).
size_t aligned(size_t bytes) {
    return (bytes + 255) / 256 * 256;
}
}  // namespace

size_t ActivationOffload::host_bytes(const LayerActivationRange& layer, size_t act_elem_bytes,
                                     int offloaded) {
    const size_t per_layer =
        aligned(layer.act_count * act_elem_bytes) + aligned(layer.f32_count * sizeof(float));
    return per_layer * static_cast<size_t>(offloaded > 0 ? offloaded : 0);
}

ActivationOffload::ActivationOffload(Backend& backend, void* act, size_t act_elem_bytes, float* f32,
                                     std::vector<LayerActivationRange> layers)
    : backend_(backend),
      act_(static_cast<char*>(act)),
      act_elem_bytes_(act_elem_bytes),
      f32_(f32),
      layers_(std::move(layers)) {
    const int n_layer = static_cast<int>(layers_.size());
    n_off_ = offloaded_layers(n_layer, OffloadMode::activations);
    if (n_off_ == 0) return;
    host_layer_bytes_ = host_bytes(layers_[0], act_elem_bytes_, 1);
    for (int l = 0; l < n_layer; ++l) {
        const LayerActivationRange& r = layers_[static_cast<size_t>(l)];
        const LayerActivationRange& slot = layers_[static_cast<size_t>(l % kSlots)];
        if (r.act_begin != slot.act_begin || r.act_count != slot.act_count ||
            r.f32_begin != slot.f32_begin || r.f32_count != slot.f32_count)
            throw std::logic_error("ActivationOffload: layer " + std::to_string(l) +
                                   " does not share the range of slot " +
                                   std::to_string(l % kSlots) + " (the plan must rotate them)");
    }
    host_ = HostBuffer(backend_, host_layer_bytes_ * static_cast<size_t>(n_off_), true);
    mark_ = backend_.create_stream_event();
    copy_idle_ = backend_.create_stream_event();
    for (int l = 0; l < n_off_; ++l) {
        stored_.push_back(backend_.create_stream_event());
        loaded_.push_back(backend_.create_stream_event());
    }
}

ActivationOffload::~ActivationOffload() {
    // The copy stream may still read or write the arenas and the host buffer: let it finish
    // before either is freed (the arenas belong to the model, freed after this object).
    if (n_off_ > 0) {
        try {
            backend_.synchronize();
        } catch (...) {  // a device error was already reported by the call that caused it
        }
    }
}

// Copies layer l's two ranges between its device slot and its host range on the copy stream.
void ActivationOffload::copy_layer(int l, CopyDirection direction) {
    const LayerActivationRange& r = layers_[static_cast<size_t>(l)];
    char* host = host_.as<char>() + host_layer_bytes_ * static_cast<size_t>(l);
    char* host_f32 = host + aligned(r.act_count * act_elem_bytes_);
    void* dev_act = act_ + r.act_begin * act_elem_bytes_;
    void* dev_f32 = f32_ + r.f32_begin;
    const size_t act_bytes = r.act_count * act_elem_bytes_, f32_bytes = r.f32_count * 4;
    if (direction == CopyDirection::to_host) {
        backend_.copy_async(host, dev_act, act_bytes, direction, Stream::copy);
        backend_.copy_async(host_f32, dev_f32, f32_bytes, direction, Stream::copy);
    } else {
        backend_.copy_async(dev_act, host, act_bytes, direction, Stream::copy);
        backend_.copy_async(dev_f32, host_f32, f32_bytes, direction, Stream::copy);
    }
}

void ActivationOffload::begin_forward(bool backward_follows) {
    if (n_off_ == 0) return;
    // Whatever the copy stream still does with the slots (the copy-outs of a forward whose
    // backward never ran) finishes before this forward writes them.
    backend_.record_event(*copy_idle_, Stream::copy);
    backend_.wait_event(Stream::compute, *copy_idle_);
    active_ = backward_follows;
}

void ActivationOffload::before_forward_layer(int l) {
    if (!active_) return;
    // Layer l writes slot l % kSlots (last held by layer l - kSlots) and, through the fused
    // residual+LayerNorm, slot (l+1) % kSlots (last held by layer l + 1 - kSlots).
    for (int prev : {l - kSlots, l + 1 - kSlots})
        if (offloaded_layer(prev)) backend_.wait_event(Stream::compute, *stored_[prev]);
}

void ActivationOffload::after_forward_layer(int l) {
    if (!active_ || !offloaded_layer(l)) return;
    backend_.record_event(*mark_, Stream::compute);  // layer l's activations are written
    backend_.wait_event(Stream::copy, *mark_);
    copy_layer(l, CopyDirection::to_host);
    backend_.record_event(*stored_[l], Stream::copy);
}

void ActivationOffload::before_backward_layer(int l) {
    if (!active_) return;
    // Backward of layer l reads its own activations and layer l-1's output (its residual input).
    for (int need : {l, l - 1})
        if (offloaded_layer(need)) backend_.wait_event(Stream::compute, *loaded_[need]);
}

void ActivationOffload::after_backward_layer(int l) {
    const int next = l - kSlots;  // the layer that occupies slot l % kSlots next in backward
    if (!active_ || !offloaded_layer(next)) return;
    backend_.record_event(*mark_, Stream::compute);  // nothing after this reads layer l's slot
    backend_.wait_event(Stream::copy, *mark_);
    copy_layer(next, CopyDirection::to_device);
    backend_.record_event(*loaded_[next], Stream::copy);
}

}  // namespace mt
