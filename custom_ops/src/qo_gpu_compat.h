/* The few runtime names the GPU kernels use, mapped to CUDA or HIP so one .cu source serves three toolchains:
 *  - nvcc (CUDA),
 *  - hipcc (HIP for AMD: HIP_PLATFORM=amd and explicit --offload-arch; checked with Debian 12's hipcc 5.2.3 for
 *    gfx90a, gfx1030, gfx940, see README),
 *  - a plain C++17 compiler with HIP-CPU's headers (-DQO_WITH_HIP, custom_ops/hip_cpu.py): the kernels then run on
 *    the CPU, which is how CI executes them (tests/test_gpu_kernels_hip_cpu.py).
 * The last one rules out `<<<...>>>` (not C++) and warp-divergent shuffles (HIP-CPU's shuffles are barriers across
 * the whole block), so the kernels launch through QO_LAUNCH and shuffle only in block-uniform control flow. */
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
/* hipLaunchKernelGGL is C++ (a macro over a launch function) under HIP-CPU and <<<>>> under hipcc. `kernel` must be
 * one macro argument: pass a function pointer variable, not `name<A, B>` (its comma would split the argument). */
#define QO_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
  hipLaunchKernelGGL(kernel, grid, block, shared_bytes, stream, __VA_ARGS__)
#else
#include <cuda_runtime.h>
#define QO_GPU_BACKEND "cuda"
typedef cudaStream_t qo_stream_t;
typedef cudaError_t qo_gpu_error_t;
#define qo_gpu_success cudaSuccess
#define qo_gpu_get_last_error cudaGetLastError
#define QO_WARP_SIZE 32
#define qo_shfl_down(value, offset) __shfl_down_sync(0xFFFFFFFFu, (value), (offset))
#define QO_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
  kernel<<<(grid), (block), (shared_bytes), (stream)>>>(__VA_ARGS__)
#endif

#endif /* QO_GPU_COMPAT_H */
