// kernels.attention: cudnn — causal attention by cuDNN 9's fused SDPA kernels (the third rung
// after naive and flash: what a vendor library's flash attention gives on the same op).
// The one translation unit that includes cuDNN (built with MT_ENABLE_CUDNN=ON; see
// attention_cudnn.h). The graph API describes the computation as tensors and one SDPA node;
// cuDNN picks and compiles a kernel for it ("execution plan") once per shape.
//
// Layout, the same as naive/flash (attention.cu): qkv (B,T,3C) = [Q | K | V], head h of Q at
// columns h*hs .. h*hs+hs-1; out (B,T,C). cuDNN reads tensors as (B, NH, T, hs) with arbitrary
// strides, so Q, K and V are read in place, no transpose:
//     Q[b,h,t,d] = qkv[b*T*3C + t*3C + h*hs + d]      dims (B,NH,T,hs), strides (T*3C, hs, 3C, 1)
//     K, V: the same strides from qkv + C and qkv + 2C
//     O[b,h,t,d] = out[b*T*C + t*C + h*hs + d]        strides (T*C, hs, C, 1)
//     Stats[b,h,t] (fp32)                             dims (B,NH,T,1), strides (NH*T, T, 1, 1)
// Stats is the logsumexp of row (b,h,t) of the scaled scores, log sum_j exp(s_tj), the state
// flash saves too: attention_saved_elems(cudnn) = B*NH*T, the same layout as flash's.
//
// Backward: cuDNN's SDPA backward WRITES dQ, dK, dV (no accumulate); here they go to the
// caller's (B,T,3C) buffer in qkv's packed layout, and the backend adds that into the op's
// dqkv (the op table's backwards accumulate; see CudaBackend::kernel(AttentionBackward)).
//
// Precision: bf16 input/output, fp32 softmax statistics and accumulation inside cuDNN. The
// backend refuses kernels.attention: cudnn unless run.precision is bf16.
//
// A host-only C++ file (no device code of ours), so the heavy cudnn-frontend headers are
// compiled once by the C++ compiler, not once per CUDA architecture by nvcc.
#include "kernels/cuda/attention_cudnn.h"

#include <cudnn.h>
#include <cudnn_frontend.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "kernels/types.h"

namespace fe = cudnn_frontend;

namespace mt::cuda {

namespace {

// Tensor ids of the variant pack (the device pointers handed to a plan at execution).
enum TensorUid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

std::string shape_text(int B, int T, int C, int NH) {
    return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C) +
           " NH=" + std::to_string(NH) + " (head size " + std::to_string(C / NH) + ")";
}

void check_cudnn(cudnnStatus_t st, const char* call) {
    if (st != CUDNN_STATUS_SUCCESS)
        throw BackendError(std::string("kernels.attention: cudnn: ") + call +
                           " failed: " + cudnnGetErrorString(st));
}

// A frontend step that failed: which step, for which shape, cuDNN's own words, what to do.
void check_fe(fe::error_t e, const char* step, const std::string& shape) {
    if (e.is_bad())
        throw BackendError("kernels.attention: cudnn cannot run attention for " + shape + ": " +
                           step + " failed: " + e.get_message() +
                           "; use kernels.attention: flash or naive");
}

// The cuDNN handle (RAII), bound to the compute stream for its whole life.
class CudnnHandle {
  public:
    explicit CudnnHandle(cudaStream_t stream) {
        check_cudnn(cudnnCreate(&h_), "cudnnCreate");
        const cudnnStatus_t st = cudnnSetStream(h_, stream);
        if (st != CUDNN_STATUS_SUCCESS) {
            cudnnDestroy(h_);
            check_cudnn(st, "cudnnSetStream");
        }
    }
    ~CudnnHandle() { cudnnDestroy(h_); }
    CudnnHandle(const CudnnHandle&) = delete;
    CudnnHandle& operator=(const CudnnHandle&) = delete;
    cudnnHandle_t get() const { return h_; }

  private:
    cudnnHandle_t h_ = nullptr;
};

// One built graph: the plan cuDNN chose and the workspace it needs.
struct BuiltGraph {
    std::shared_ptr<fe::graph::Graph> graph;
    int64_t workspace = 0;
};

// The (B,NH,T,hs) views of the layout comment above.
struct SdpaLayout {
    std::vector<int64_t> dims, qkv_strides, out_strides, stats_dims, stats_strides;
    SdpaLayout(int B, int T, int C, int NH) {
        const int64_t b = B, t = T, c = C, h = NH, hs = C / NH;
        dims = {b, h, t, hs};
        qkv_strides = {t * 3 * c, hs, 3 * c, 1};
        out_strides = {t * c, hs, c, 1};
        stats_dims = {b, h, t, 1};
        stats_strides = {h * t, t, 1, 1};
    }
};

std::shared_ptr<fe::graph::Graph> new_bf16_graph() {
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    return g;
}

std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph& g, const char* name,
                                                    int64_t uid, const std::vector<int64_t>& dims,
                                                    const std::vector<int64_t>& strides) {
    return g.tensor(
        fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims).set_stride(
            strides));
}

// Validation, lowering to cuDNN's backend graph, the heuristics' plan list, the support check,
// and compiling the plans: once per shape, on the host (cuDNN may JIT a kernel here).
BuiltGraph finish(std::shared_ptr<fe::graph::Graph> g, cudnnHandle_t handle,
                  const std::string& shape) {
    check_fe(g->validate(), "graph validation", shape);
    check_fe(g->build_operation_graph(handle), "build_operation_graph", shape);
    check_fe(g->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans", shape);
    check_fe(g->check_support(handle), "check_support", shape);
    check_fe(g->build_plans(handle), "build_plans", shape);
    BuiltGraph built{std::move(g), 0};
    check_fe(built.graph->get_workspace_size(built.workspace), "get_workspace_size", shape);
    return built;
}

// O, Stats = SDPA(Q, K, V) with the causal mask and scale 1/sqrt(hs); Stats is generated
// because the training step always keeps it for the backward.
BuiltGraph build_forward(cudnnHandle_t handle, int B, int T, int C, int NH) {
    const SdpaLayout l(B, T, C, NH);
    auto g = new_bf16_graph();
    auto q = input(*g, "Q", kQ, l.dims, l.qkv_strides);
    auto k = input(*g, "K", kK, l.dims, l.qkv_strides);
    auto v = input(*g, "V", kV, l.dims, l.qkv_strides);
    auto options = fe::graph::SDPA_attributes()
                       .set_name("attention_forward")
                       .set_generate_stats(true)
                       .set_causal_mask(true)
                       .set_attn_scale(1.0f / std::sqrt(static_cast<float>(C / NH)));
    auto [o, stats] = g->sdpa(q, k, v, options);
    o->set_output(true).set_uid(kO).set_dim(l.dims).set_stride(l.out_strides);
    stats->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim(l.stats_dims)
        .set_stride(l.stats_strides);
    return finish(std::move(g), handle, shape_text(B, T, C, NH));
}

// dQ, dK, dV = SDPA_backward(Q, K, V, O, dO, Stats), written in qkv's packed layout. The
// deterministic algorithm: cuDNN's default backward adds dQ partial sums with atomics, in an
// order that changes from run to run; like every reduction here (docs/design.md, Contracts), the
// chosen one has a fixed order, so two runs give bitwise the same gradients.
BuiltGraph build_backward(cudnnHandle_t handle, int B, int T, int C, int NH) {
    const SdpaLayout l(B, T, C, NH);
    auto g = new_bf16_graph();
    auto q = input(*g, "Q", kQ, l.dims, l.qkv_strides);
    auto k = input(*g, "K", kK, l.dims, l.qkv_strides);
    auto v = input(*g, "V", kV, l.dims, l.qkv_strides);
    auto o = input(*g, "O", kO, l.dims, l.out_strides);
    auto d_o = input(*g, "dO", kDO, l.dims, l.out_strides);
    auto stats = input(*g, "Stats", kStats, l.stats_dims, l.stats_strides);
    stats->set_data_type(fe::DataType_t::FLOAT);
    auto options = fe::graph::SDPA_backward_attributes()
                       .set_name("attention_backward")
                       .set_causal_mask(true)
                       .set_deterministic_algorithm(true)
                       .set_attn_scale(1.0f / std::sqrt(static_cast<float>(C / NH)));
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, d_o, stats, options);
    dq->set_output(true).set_uid(kDQ).set_dim(l.dims).set_stride(l.qkv_strides);
    dk->set_output(true).set_uid(kDK).set_dim(l.dims).set_stride(l.qkv_strides);
    dv->set_output(true).set_uid(kDV).set_dim(l.dims).set_stride(l.qkv_strides);
    return finish(std::move(g), handle, shape_text(B, T, C, NH));
}

// Byte address of element `elems` of a bf16 tensor (2 bytes per element).
void* bf16_at(const void* base, size_t elems) {
    return static_cast<char*>(const_cast<void*>(base)) + 2 * elems;
}

}  // namespace

struct CudnnAttention::State {
    CudnnHandle handle;
    // (B, T, C, NH) -> the forward and backward plans of that shape.
    std::map<std::tuple<int, int, int, int>, std::pair<BuiltGraph, BuiltGraph>> graphs;

    explicit State(cudaStream_t s) : handle(s) {}

    const std::pair<BuiltGraph, BuiltGraph>& graphs_for(int B, int T, int C, int NH) {
        const auto key = std::make_tuple(B, T, C, NH);
        if (auto it = graphs.find(key); it != graphs.end()) return it->second;
        const int hs = C / NH;
        // cuDNN's SDPA kernels load heads in 16-byte vectors: hs a multiple of 8, at most 256.
        if (hs % 8 != 0 || hs > 256)
            throw BackendError(
                "kernels.attention: cudnn needs a head size (n_embd / n_head) "
                "that is a multiple of 8 and at most 256, got " +
                shape_text(B, T, C, NH) +
                "; use kernels.attention: flash (head sizes up to 128) or naive");
        auto fwd = build_forward(handle.get(), B, T, C, NH);
        auto bwd = build_backward(handle.get(), B, T, C, NH);
        return graphs.emplace(key, std::make_pair(std::move(fwd), std::move(bwd))).first->second;
    }
};

CudnnAttention::CudnnAttention(void* stream)
    : state_(std::make_unique<State>(static_cast<cudaStream_t>(stream))) {}
CudnnAttention::~CudnnAttention() = default;

size_t CudnnAttention::workspace_bytes(int B, int T, int C, int NH) {
    const auto& [fwd, bwd] = state_->graphs_for(B, T, C, NH);
    return static_cast<size_t>(std::max(fwd.workspace, bwd.workspace));
}

void CudnnAttention::forward(void* out, float* stats, const void* qkv, int B, int T, int C, int NH,
                             void* workspace, size_t workspace_bytes) {
    const BuiltGraph& g = state_->graphs_for(B, T, C, NH).first;
    if (static_cast<size_t>(g.workspace) > workspace_bytes)
        throw BackendError("attention_forward: cudnn's plan needs more workspace than reserved");
    std::unordered_map<int64_t, void*> pack{{kQ, bf16_at(qkv, 0)},
                                            {kK, bf16_at(qkv, C)},
                                            {kV, bf16_at(qkv, 2 * size_t(C))},
                                            {kO, out},
                                            {kStats, stats}};
    check_fe(g.graph->execute(state_->handle.get(), pack, workspace), "execute (forward)",
             shape_text(B, T, C, NH));
}

void CudnnAttention::backward(void* dqkv_out, const void* dout, const void* qkv, const void* out,
                              const float* stats, int B, int T, int C, int NH, void* workspace,
                              size_t workspace_bytes) {
    const BuiltGraph& g = state_->graphs_for(B, T, C, NH).second;
    if (static_cast<size_t>(g.workspace) > workspace_bytes)
        throw BackendError("attention_backward: cudnn's plan needs more workspace than reserved");
    std::unordered_map<int64_t, void*> pack{{kQ, bf16_at(qkv, 0)},
                                            {kK, bf16_at(qkv, C)},
                                            {kV, bf16_at(qkv, 2 * size_t(C))},
                                            {kO, const_cast<void*>(out)},
                                            {kDO, const_cast<void*>(dout)},
                                            {kStats, const_cast<float*>(stats)},
                                            {kDQ, bf16_at(dqkv_out, 0)},
                                            {kDK, bf16_at(dqkv_out, C)},
                                            {kDV, bf16_at(dqkv_out, 2 * size_t(C))}};
    check_fe(g.graph->execute(state_->handle.get(), pack, workspace), "execute (backward)",
             shape_text(B, T, C, NH));
}

}  // namespace mt::cuda
