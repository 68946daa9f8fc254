// Status-to-exception plumbing for CUDA and cuBLAS (messages formatted by
// kernels/cuda_error_format.h, which the CPU tests pin).
#include "kernels/cuda/runtime.cuh"

namespace mt::cuda {

void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
    std::string msg = format_gpu_error("CUDA", cudaGetErrorName(status), cudaGetErrorString(status),
                                       call, file, line);
    if (status == cudaErrorMemoryAllocation) throw OutOfMemoryError(msg);
    throw BackendError(msg);
}

const char* cublas_status_name(cublasStatus_t status) {
    switch (status) {
        case CUBLAS_STATUS_SUCCESS:
            return "CUBLAS_STATUS_SUCCESS";
        case CUBLAS_STATUS_NOT_INITIALIZED:
            return "CUBLAS_STATUS_NOT_INITIALIZED";
        case CUBLAS_STATUS_ALLOC_FAILED:
            return "CUBLAS_STATUS_ALLOC_FAILED";
        case CUBLAS_STATUS_INVALID_VALUE:
            return "CUBLAS_STATUS_INVALID_VALUE";
        case CUBLAS_STATUS_ARCH_MISMATCH:
            return "CUBLAS_STATUS_ARCH_MISMATCH";
        case CUBLAS_STATUS_MAPPING_ERROR:
            return "CUBLAS_STATUS_MAPPING_ERROR";
        case CUBLAS_STATUS_EXECUTION_FAILED:
            return "CUBLAS_STATUS_EXECUTION_FAILED";
        case CUBLAS_STATUS_INTERNAL_ERROR:
            return "CUBLAS_STATUS_INTERNAL_ERROR";
        case CUBLAS_STATUS_NOT_SUPPORTED:
            return "CUBLAS_STATUS_NOT_SUPPORTED";
        case CUBLAS_STATUS_LICENSE_ERROR:
            return "CUBLAS_STATUS_LICENSE_ERROR";
        default:
            return "CUBLAS_STATUS_UNKNOWN";
    }
}

void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line) {
    const char* desc = status == CUBLAS_STATUS_NOT_SUPPORTED
                           ? "this shape/type/epilogue combination is not supported"
                       : status == CUBLAS_STATUS_ALLOC_FAILED ? "cuBLAS could not allocate memory"
                                                              : "";
    std::string msg =
        format_gpu_error("cuBLAS", cublas_status_name(status), desc, call, file, line);
    if (status == CUBLAS_STATUS_ALLOC_FAILED) throw OutOfMemoryError(msg);
    throw BackendError(msg);
}

}  // namespace mt::cuda
