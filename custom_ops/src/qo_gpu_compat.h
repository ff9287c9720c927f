/* The few runtime names the GPU kernels use, mapped to CUDA or HIP so one .cu source serves both.
 * HIP: compiled for AMD only (hipcc with HIP_PLATFORM=amd and explicit --offload-arch; checked with Debian 12's
 * hipcc 5.2.3 for gfx90a, gfx1030, gfx940, see README). */
#ifndef QO_GPU_COMPAT_H
#define QO_GPU_COMPAT_H

#if defined(__HIPCC__) || defined(QO_WITH_HIP)
#include <hip/hip_runtime.h>
#define QO_GPU_BACKEND "hip"
typedef hipStream_t qo_stream_t;
typedef hipError_t qo_gpu_error_t;
#define qo_gpu_success hipSuccess
#define qo_gpu_get_last_error hipGetLastError
#define QO_WARP_SIZE warpSize /* 64 on CDNA, 32 on RDNA (wave32 default): fixed per --offload-arch target */
#define qo_shfl_down(value, offset) __shfl_down((value), (offset))
#else
#include <cuda_runtime.h>
#define QO_GPU_BACKEND "cuda"
typedef cudaStream_t qo_stream_t;
typedef cudaError_t qo_gpu_error_t;
#define qo_gpu_success cudaSuccess
#define qo_gpu_get_last_error cudaGetLastError
#define QO_WARP_SIZE 32
#define qo_shfl_down(value, offset) __shfl_down_sync(0xFFFFFFFFu, (value), (offset))
#endif

#endif /* QO_GPU_COMPAT_H */
