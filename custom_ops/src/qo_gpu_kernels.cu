// GPU kernels for the com.quark_onnx ops; one source for CUDA (nvcc) and HIP (hipcc), see qo_gpu_compat.h.
//  - gemv path (M <= 8, aligned weights): one warp per output channel, each lane decodes 8 consecutive weights
//    per step (MXFP4: one uint32 = 8 nibbles sharing one e8m0 scale; FP8: one uint2 = 8 codes) and multiplies them
//    with up to 8 activation rows; warp-shuffle reduction.
//  - tiled path (any M): 32x64 output tile per 256-thread block, K in steps of 32 through shared memory, the weight
//    tile decoded to float32 on load, each thread accumulating 2x4 outputs.
// FP8 activations are quantized on load (a_q = sat_e4m3fn(a / scale)); the scales are applied in the epilogue.
#include <stdint.h>

#include "qo_gpu_compat.h"
#include "qo_fp_formats.h"
#include "qo_kernels.h"

namespace {

constexpr int kThreads = 256;
constexpr int kTileM = 32;
constexpr int kTileN = 64;
constexpr int kTileK = 32;
constexpr int kGemvMaxM = 8;
constexpr int kMxfp4Block = 32;

template <typename T> struct Activation;
template <> struct Activation<float> {
  static __device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
  static __device__ __forceinline__ float store(float v) { return v; }
};
template <> struct Activation<uint16_t> {  // fp16 bit patterns
  static __device__ __forceinline__ float load(const uint16_t* p, int64_t i) { return qo_f16_to_f32(p[i]); }
  static __device__ __forceinline__ uint16_t store(float v) { return qo_f32_to_f16(v); }
};

// Scales of the FP8 ops; a_scale == nullptr means "no activation quantization" (MXFP4).
struct Fp8Scales {
  const float* a_scale;  // [1] static or [M] per row
  int a_per_row;
  const float* b_scale;  // [1] or [N]
  int b_per_channel;
  __device__ __forceinline__ float row(int64_t m) const { return a_scale[a_per_row ? m : 0]; }
  __device__ __forceinline__ float col(int64_t n) const { return b_scale[b_per_channel ? n : 0]; }
};

__device__ __forceinline__ float quantize_activation(float a, const Fp8Scales& s, int64_t m) {
  return s.a_scale ? qo_e4m3fn_to_f32(qo_f32_to_e4m3fn_sat(a / s.row(m))) : a;
}

__device__ __forceinline__ float output_scale(const Fp8Scales& s, int64_t m, int64_t n) {
  return s.a_scale ? s.row(m) * s.col(n) : 1.0f;
}

enum WeightKind { kMxfp4 = 0, kFp8 = 1 };

// One weight element (n, k) as float32.
template <int Kind>
__device__ __forceinline__ float weight_at(const uint8_t* B, const uint8_t* e8m0, int64_t n, int64_t k, int64_t K) {
  if (Kind == kMxfp4) {
    const uint8_t byte = B[n * (K / 2) + k / 2];
    const uint8_t code = (k & 1) ? (uint8_t)(byte >> 4) : (uint8_t)(byte & 0x0F);
    return qo_e2m1_to_f32(code) * qo_e8m0_to_f32(e8m0[n * (K / kMxfp4Block) + k / kMxfp4Block]);
  }
  return qo_e4m3fn_to_f32(B[n * K + k]);
}

template <typename TA, int Kind>
__global__ void __launch_bounds__(kThreads) gemm_tile_kernel(const TA* __restrict__ A, const uint8_t* __restrict__ B,
                                                             const uint8_t* __restrict__ e8m0, Fp8Scales scales,
                                                             TA* __restrict__ Y, int64_t M, int64_t N, int64_t K) {
  __shared__ float a_tile[kTileM][kTileK + 1];
  __shared__ float w_tile[kTileN][kTileK + 1];
  const int tid = threadIdx.x;
  const int tx = tid % 16;  // output columns tx + 16 j
  const int ty = tid / 16;  // output rows 2 ty, 2 ty + 1
  const int64_t m0 = (int64_t)blockIdx.y * kTileM;
  const int64_t n0 = (int64_t)blockIdx.x * kTileN;
  float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};

  for (int64_t k0 = 0; k0 < K; k0 += kTileK) {
#pragma unroll
    for (int i = 0; i < kTileM * kTileK / kThreads; ++i) {
      const int e = tid + kThreads * i, r = e / kTileK, kk = e % kTileK;
      const int64_t m = m0 + r, k = k0 + kk;
      a_tile[r][kk] = (m < M && k < K) ? quantize_activation(Activation<TA>::load(A, m * K + k), scales, m) : 0.f;
    }
#pragma unroll
    for (int i = 0; i < kTileN * kTileK / kThreads; ++i) {
      const int e = tid + kThreads * i, r = e / kTileK, kk = e % kTileK;
      const int64_t n = n0 + r, k = k0 + kk;
      w_tile[r][kk] = (n < N && k < K) ? weight_at<Kind>(B, e8m0, n, k, K) : 0.f;
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < kTileK; ++kk) {
      const float a0 = a_tile[2 * ty][kk], a1 = a_tile[2 * ty + 1][kk];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float w = w_tile[tx + 16 * j][kk];
        acc[0][j] += a0 * w;
        acc[1][j] += a1 * w;
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t m = m0 + 2 * ty + i;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t n = n0 + tx + 16 * j;
      if (m < M && n < N) Y[m * N + n] = Activation<TA>::store(acc[i][j] * output_scale(scales, m, n));
    }
  }
}

// Needs K % 8 == 0 and B 8-byte aligned (FP8) / 4-byte aligned (MXFP4); M <= kGemvMaxM.
template <typename TA, int Kind>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const TA* __restrict__ A, const uint8_t* __restrict__ B,
                                                        const uint8_t* __restrict__ e8m0, Fp8Scales scales,
                                                        TA* __restrict__ Y, int M, int64_t N, int64_t K) {
  const int warp_size = QO_WARP_SIZE;
  const int lane = threadIdx.x % warp_size;
  const int64_t warps_per_block = blockDim.x / warp_size;
  // Grid-stride over channels, so the grid is valid whatever the warp size (32 on NVIDIA/RDNA, 64 on CDNA).
  for (int64_t n = (int64_t)blockIdx.x * warps_per_block + threadIdx.x / warp_size; n < N;
       n += (int64_t)gridDim.x * warps_per_block) {
    float acc[kGemvMaxM];
#pragma unroll
    for (int m = 0; m < kGemvMaxM; ++m) acc[m] = 0.f;

    for (int64_t k0 = (int64_t)lane * 8; k0 < K; k0 += (int64_t)warp_size * 8) {
      float w[8];
      if (Kind == kMxfp4) {
        const uint32_t nibbles = *reinterpret_cast<const uint32_t*>(B + n * (K / 2) + k0 / 2);
        const float block_scale = qo_e8m0_to_f32(e8m0[n * (K / kMxfp4Block) + k0 / kMxfp4Block]);
#pragma unroll
        for (int j = 0; j < 8; ++j) w[j] = qo_e2m1_to_f32((uint8_t)((nibbles >> (4 * j)) & 0xF)) * block_scale;
      } else {
        const uint2 codes = *reinterpret_cast<const uint2*>(B + n * K + k0);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          w[j] = qo_e4m3fn_to_f32((uint8_t)(codes.x >> (8 * j)));
          w[j + 4] = qo_e4m3fn_to_f32((uint8_t)(codes.y >> (8 * j)));
        }
      }
#pragma unroll
      for (int m = 0; m < kGemvMaxM; ++m) {
        if (m < M) {
#pragma unroll
          for (int j = 0; j < 8; ++j)
            acc[m] += quantize_activation(Activation<TA>::load(A, (int64_t)m * K + k0 + j), scales, m) * w[j];
        }
      }
    }
#pragma unroll
    for (int m = 0; m < kGemvMaxM; ++m) {
      for (int offset = warp_size / 2; offset > 0; offset /= 2) acc[m] += qo_shfl_down(acc[m], offset);
    }
    if (lane == 0) {
      for (int m = 0; m < M; ++m) Y[(int64_t)m * N + n] = Activation<TA>::store(acc[m] * output_scale(scales, m, n));
    }
  }
}

// scale[m] = max(max|A[m]| / 448, 1e-12); NaN in a row propagates to its scale.
template <typename TA>
__global__ void __launch_bounds__(kThreads) dynamic_row_scale_kernel(const TA* __restrict__ A, float* scale, int64_t K) {
  __shared__ float partial[kThreads];
  const int64_t m = blockIdx.x;
  float amax = 0.f;
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x) {
    const float v = fabsf(Activation<TA>::load(A, m * K + k));
    if (!(v <= amax)) amax = v;
  }
  partial[threadIdx.x] = amax;
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      const float other = partial[threadIdx.x + stride];
      if (!(other <= partial[threadIdx.x])) partial[threadIdx.x] = other;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const float s = partial[0] / 448.0f;
    scale[m] = (s < 1e-12f) ? 1e-12f : s;
  }
}

bool aligned(const void* p, uintptr_t bytes) { return (reinterpret_cast<uintptr_t>(p) % bytes) == 0; }

template <typename TA, int Kind>
int launch(const TA* A, const uint8_t* B, const uint8_t* e8m0, Fp8Scales scales, TA* Y, int64_t M, int64_t N,
           int64_t K, void* stream) {
  if (!A || !B || !Y || M < 0 || N < 0 || K <= 0) return QO_ERR_ARGUMENT;
  if (Kind == kMxfp4 && (!e8m0 || K % kMxfp4Block != 0)) return QO_ERR_ARGUMENT;
  if (M == 0 || N == 0) return QO_OK;
  qo_stream_t s = static_cast<qo_stream_t>(stream);
  const bool gemv_ok = M <= kGemvMaxM && K % 8 == 0 && aligned(B, Kind == kMxfp4 ? 4 : 8);
  if (gemv_ok) {
    const int warps_per_block = kThreads / 32;  // the kernel strides over channels if warps are wider
    const unsigned blocks = (unsigned)((N + warps_per_block - 1) / warps_per_block);
    gemv_kernel<TA, Kind><<<blocks, kThreads, 0, s>>>(A, B, e8m0, scales, Y, (int)M, N, K);
  } else {
    if ((M + kTileM - 1) / kTileM > 65535) return QO_ERR_ARGUMENT;
    dim3 grid((unsigned)((N + kTileN - 1) / kTileN), (unsigned)((M + kTileM - 1) / kTileM));
    gemm_tile_kernel<TA, Kind><<<grid, kThreads, 0, s>>>(A, B, e8m0, scales, Y, M, N, K);
  }
  return qo_gpu_get_last_error() == qo_gpu_success ? QO_OK : QO_ERR_DEVICE;
}

template <typename TA>
int launch_fp8(const TA* A, const uint8_t* B, const float* B_scale, int64_t b_scale_count, const float* A_scale,
               float* row_scale_workspace, TA* Y, int64_t M, int64_t N, int64_t K, void* stream) {
  if (!B_scale || !(b_scale_count == 1 || b_scale_count == N)) return QO_ERR_ARGUMENT;
  Fp8Scales scales{A_scale, 0, B_scale, b_scale_count == N && N != 1};
  if (!A_scale) {  // dynamic per-row scale
    if (!row_scale_workspace || !A || K <= 0) return QO_ERR_ARGUMENT;
    if (M == 0 || N == 0) return QO_OK;
    dynamic_row_scale_kernel<TA><<<(unsigned)M, kThreads, 0, static_cast<qo_stream_t>(stream)>>>(A, row_scale_workspace, K);
    if (qo_gpu_get_last_error() != qo_gpu_success) return QO_ERR_DEVICE;
    scales.a_scale = row_scale_workspace;
    scales.a_per_row = 1;
  }
  return launch<TA, kFp8>(A, B, nullptr, scales, Y, M, N, K, stream);
}

}  // namespace

extern "C" {

const char* qo_gpu_backend(void) { return QO_GPU_BACKEND; }

void* qo_gpu_workspace_alloc(int64_t bytes, void* stream) {
  void* p = nullptr;
#if defined(__HIPCC__) || defined(QO_WITH_HIP)
  (void)stream;
  if (hipMalloc(&p, (size_t)bytes) != hipSuccess) return nullptr;
#else
  if (cudaMallocAsync(&p, (size_t)bytes, static_cast<cudaStream_t>(stream)) != cudaSuccess) return nullptr;
#endif
  return p;
}

void qo_gpu_workspace_free(void* p, void* stream) {
#if defined(__HIPCC__) || defined(QO_WITH_HIP)
  (void)stream;
  (void)hipFree(p);
#else
  (void)cudaFreeAsync(p, static_cast<cudaStream_t>(stream));
#endif
}

int qo_gpu_matmul_mxfp4_f32(const float* A, const uint8_t* B, const uint8_t* B_scale, float* Y, int64_t M, int64_t N,
                            int64_t K, void* stream) {
  return launch<float, kMxfp4>(A, B, B_scale, Fp8Scales{nullptr, 0, nullptr, 0}, Y, M, N, K, stream);
}

int qo_gpu_matmul_mxfp4_f16(const uint16_t* A, const uint8_t* B, const uint8_t* B_scale, uint16_t* Y, int64_t M,
                            int64_t N, int64_t K, void* stream) {
  return launch<uint16_t, kMxfp4>(A, B, B_scale, Fp8Scales{nullptr, 0, nullptr, 0}, Y, M, N, K, stream);
}

int qo_gpu_matmul_fp8_w8a8_f32(const float* A, const uint8_t* B, const float* B_scale, int64_t b_scale_count,
                               const float* A_scale, float* Y, int64_t M, int64_t N, int64_t K, void* stream) {
  if (!A_scale) return QO_ERR_ARGUMENT;
  return launch_fp8<float>(A, B, B_scale, b_scale_count, A_scale, nullptr, Y, M, N, K, stream);
}

int qo_gpu_matmul_fp8_w8a8_f16(const uint16_t* A, const uint8_t* B, const float* B_scale, int64_t b_scale_count,
                               const float* A_scale, uint16_t* Y, int64_t M, int64_t N, int64_t K, void* stream) {
  if (!A_scale) return QO_ERR_ARGUMENT;
  return launch_fp8<uint16_t>(A, B, B_scale, b_scale_count, A_scale, nullptr, Y, M, N, K, stream);
}

int qo_gpu_matmul_fp8_w8a8_dyn_f32(const float* A, const uint8_t* B, const float* B_scale, int64_t b_scale_count,
                                   float* row_scale_workspace, float* Y, int64_t M, int64_t N, int64_t K,
                                   void* stream) {
  return launch_fp8<float>(A, B, B_scale, b_scale_count, nullptr, row_scale_workspace, Y, M, N, K, stream);
}

int qo_gpu_matmul_fp8_w8a8_dyn_f16(const uint16_t* A, const uint8_t* B, const float* B_scale,
                                   int64_t b_scale_count, float* row_scale_workspace, uint16_t* Y, int64_t M,
                                   int64_t N, int64_t K, void* stream) {
  return launch_fp8<uint16_t>(A, B, B_scale, b_scale_count, nullptr, row_scale_workspace, Y, M, N, K, stream);
}

}  // extern "C"
