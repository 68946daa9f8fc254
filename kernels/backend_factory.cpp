// The backend factory: the one place above both backends that knows which exist in this build.
// It lives in its own library (mt_backends) so the interface library below the backends
// (mt_backend_api) does not depend on them.
#include "kernels/backend.h"
#include "kernels/collectives.h"
#include "kernels/cpu/cpu_backend.h"
#if defined(MT_HAVE_CUDA)
#include "kernels/cuda/cuda_backend.h"
#endif
#if defined(MT_HAVE_NCCL)
#include "kernels/cuda/nccl_collectives.h"
#endif

namespace mt {

bool cuda_available(std::string* why_not) {
#if defined(MT_HAVE_CUDA)
    return cuda_device_available(why_not);
#else
    if (why_not) *why_not = "this build has no CUDA backend (nvcc was not found at configure time)";
    return false;
#endif
}

std::unique_ptr<Backend> create_backend(BackendKind kind, const BackendOptions& options) {
    if (kind == BackendKind::cpu) return create_cpu_backend(options);
#if defined(MT_HAVE_CUDA)
    return create_cuda_backend(options);
#else
    throw BackendError(
        "backend 'cuda' is not available: this build has no CUDA backend (nvcc was not found "
        "when CMake configured it); use backend: cpu, or rebuild on a machine with the CUDA "
        "toolkit");
#endif
}

std::unique_ptr<Collectives> create_device_collectives(Backend& backend, int rank, int size,
                                                       const BroadcastFromRank0& broadcast,
                                                       double timeout_s) {
    if (backend.kind() == BackendKind::cpu) return nullptr;
#if defined(MT_HAVE_NCCL)
    return create_nccl_collectives(backend, rank, size, broadcast, timeout_s);
#else
    (void)rank, (void)size, (void)broadcast, (void)timeout_s;
    throw BackendError(
        "data parallel on the CUDA backend needs NCCL, and this build has none (nccl.h and "
        "libnccl were not found when CMake configured it); install NCCL or use backend: cpu");
#endif
}

}  // namespace mt
