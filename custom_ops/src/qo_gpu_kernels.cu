// GPU kernels for the com.quark_onnx ops; one source for CUDA (nvcc), HIP (hipcc) and HIP-CPU (g++), see
// qo_gpu_compat.h. One kernel template per path, instantiated per weight format (Format<Kind> below):
//  - gemv path (M <= 8, K % 8 == 0, aligned weights): one warp per output channel, each lane decodes 8 consecutive
//    weights per step (FP4: one uint32 = 8 nibbles sharing one block scale; FP8/INT8: one uint2 = 8 codes; BF16:
//    one uint4 = 8 bit patterns) and multiplies them with up to 8 activation rows; warp-shuffle reduction.
//  - tiled path (any M): 32x64 output tile per 256-thread block, K in steps of 32 through shared memory, the weight
//    tile decoded to float32 on load, each thread accumulating 2x4 outputs.
// FP8 W8A8 activations are quantized on load (a_q = sat_e4m3fn(a / scale)); per-tensor / per-channel scales
// (activation and weight) are applied in the epilogue, block scales (MXFP4, NVFP4) on decode.
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

template <typename T> struct Activation;
template <> struct Activation<float> {
  static __device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
  static __device__ __forceinline__ float store(float v) { return v; }
};
template <> struct Activation<uint16_t> {  // fp16 bit patterns
  static __device__ __forceinline__ float load(const uint16_t* p, int64_t i) { return qo_f16_to_f32(p[i]); }
  static __device__ __forceinline__ uint16_t store(float v) { return qo_f32_to_f16(v); }
};

// Per-tensor / per-row / per-channel scales applied to the float32 sum. a_scale == nullptr: no activation
// quantization (weight-only formats); b_scale == nullptr: no weight scale outside the format (MXFP4, NVFP4, BF16).
struct Scales {
  const float* a_scale;  // [1] static or [M] per row
  int a_per_row;
  const float* b_scale;  // [1] or [N]
  int b_per_channel;
  __device__ __forceinline__ float row(int64_t m) const { return a_scale[a_per_row ? m : 0]; }
  __device__ __forceinline__ float col(int64_t n) const { return b_scale[b_per_channel ? n : 0]; }
};

__device__ __forceinline__ float quantize_activation(float a, const Scales& s, int64_t m) {
  return s.a_scale ? qo_e4m3fn_to_f32(qo_f32_to_e4m3fn_sat(a / s.row(m))) : a;
}

// W8A8: a_scale * b_scale (the product first, as before); weight-only: b_scale; x * 1.0f is exact.
__device__ __forceinline__ float output_scale(const Scales& s, int64_t m, int64_t n) {
  return (s.a_scale ? s.row(m) : 1.0f) * (s.b_scale ? s.col(n) : 1.0f);
}

// The weight of one op: codes row-major [N, K] (FP4: two per byte, element 2j in the low nibble of byte j).
struct Weight {
  const uint8_t* codes;
  const uint8_t* block_scale;  // MXFP4: e8m0 [N, K/32]; NVFP4: e4m3fn [N, K/16]; else nullptr
  float global_scale;          // NVFP4 B_scale_2; unused otherwise
};

enum WeightKind { kMxfp4 = 0, kFp8 = 1, kNvfp4 = 2, kInt8 = 3, kBf16 = 4 };

__device__ __forceinline__ float bf16_to_f32(uint32_t bits16) { return qo_bits_to_f32(bits16 << 16); }

// Format<Kind>: K multiple required, bytes one lane loads for 8 elements (gemv), and the two decoders.
template <int Kind> struct Format;

template <> struct Format<kMxfp4> {
  static constexpr int kBlock = 32;
  static constexpr int kLoadBytes = 4;
  static __device__ __forceinline__ float block_scale(const Weight& w, int64_t n, int64_t k, int64_t K) {
    return qo_e8m0_to_f32(w.block_scale[n * (K / kBlock) + k / kBlock]);
  }
  static __device__ __forceinline__ float at(const Weight& w, int64_t n, int64_t k, int64_t K) {
    const uint8_t byte = w.codes[n * (K / 2) + k / 2];
    const uint8_t code = (k & 1) ? (uint8_t)(byte >> 4) : (uint8_t)(byte & 0x0F);
    return qo_e2m1_to_f32(code) * block_scale(w, n, k, K);
  }
  static __device__ __forceinline__ void eight(const Weight& w, int64_t n, int64_t k0, int64_t K, float* out) {
    const uint32_t nibbles = *reinterpret_cast<const uint32_t*>(w.codes + n * (K / 2) + k0 / 2);
    const float scale = block_scale(w, n, k0, K);
#pragma unroll
    for (int j = 0; j < 8; ++j) out[j] = qo_e2m1_to_f32((uint8_t)((nibbles >> (4 * j)) & 0xF)) * scale;
  }
};

// NVFP4: e2m1 * (float32(e4m3fn block scale) * B_scale_2), the block scale product rounded first, as Quark's
// SequentialRealQuantizer.forward does (see qo_kernels.h).
template <> struct Format<kNvfp4> {
  static constexpr int kBlock = 16;
  static constexpr int kLoadBytes = 4;
  static __device__ __forceinline__ float block_scale(const Weight& w, int64_t n, int64_t k, int64_t K) {
    return qo_e4m3fn_to_f32(w.block_scale[n * (K / kBlock) + k / kBlock]) * w.global_scale;
  }
  static __device__ __forceinline__ float at(const Weight& w, int64_t n, int64_t k, int64_t K) {
    const uint8_t byte = w.codes[n * (K / 2) + k / 2];
    const uint8_t code = (k & 1) ? (uint8_t)(byte >> 4) : (uint8_t)(byte & 0x0F);
    return qo_e2m1_to_f32(code) * block_scale(w, n, k, K);
  }
  static __device__ __forceinline__ void eight(const Weight& w, int64_t n, int64_t k0, int64_t K, float* out) {
    const uint32_t nibbles = *reinterpret_cast<const uint32_t*>(w.codes + n * (K / 2) + k0 / 2);
    const float scale = block_scale(w, n, k0, K);  // k0 % 8 == 0: all 8 in one block of 16
#pragma unroll
    for (int j = 0; j < 8; ++j) out[j] = qo_e2m1_to_f32((uint8_t)((nibbles >> (4 * j)) & 0xF)) * scale;
  }
};

template <> struct Format<kFp8> {
  static constexpr int kBlock = 1;
  static constexpr int kLoadBytes = 8;
  static __device__ __forceinline__ float at(const Weight& w, int64_t n, int64_t k, int64_t K) {
    return qo_e4m3fn_to_f32(w.codes[n * K + k]);
  }
  static __device__ __forceinline__ void eight(const Weight& w, int64_t n, int64_t k0, int64_t K, float* out) {
    const uint2 codes = *reinterpret_cast<const uint2*>(w.codes + n * K + k0);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      out[j] = qo_e4m3fn_to_f32((uint8_t)(codes.x >> (8 * j)));
      out[j + 4] = qo_e4m3fn_to_f32((uint8_t)(codes.y >> (8 * j)));
    }
  }
};

template <> struct Format<kInt8> {
  static constexpr int kBlock = 1;
  static constexpr int kLoadBytes = 8;
  static __device__ __forceinline__ float at(const Weight& w, int64_t n, int64_t k, int64_t K) {
    return (float)(int8_t)w.codes[n * K + k];
  }
  static __device__ __forceinline__ void eight(const Weight& w, int64_t n, int64_t k0, int64_t K, float* out) {
    const uint2 codes = *reinterpret_cast<const uint2*>(w.codes + n * K + k0);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      out[j] = (float)(int8_t)(uint8_t)(codes.x >> (8 * j));
      out[j + 4] = (float)(int8_t)(uint8_t)(codes.y >> (8 * j));
    }
  }
};

template <> struct Format<kBf16> {  // codes: bf16 bit patterns, 2 bytes per element, little-endian
  static constexpr int kBlock = 1;
  static constexpr int kLoadBytes = 16;
  static __device__ __forceinline__ float at(const Weight& w, int64_t n, int64_t k, int64_t K) {
    return bf16_to_f32(reinterpret_cast<const uint16_t*>(w.codes)[n * K + k]);
  }
  static __device__ __forceinline__ void eight(const Weight& w, int64_t n, int64_t k0, int64_t K, float* out) {
    const uint4 bits = *reinterpret_cast<const uint4*>(reinterpret_cast<const uint16_t*>(w.codes) + n * K + k0);
    const uint32_t words[4] = {bits.x, bits.y, bits.z, bits.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      out[2 * j] = bf16_to_f32(words[j] & 0xFFFFu);
      out[2 * j + 1] = bf16_to_f32(words[j] >> 16);
    }
  }
};

template <typename TA, int Kind>
__global__ void __launch_bounds__(kThreads) gemm_tile_kernel(const TA* __restrict__ A, Weight w, Scales scales,
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
      w_tile[r][kk] = (n < N && k < K) ? Format<Kind>::at(w, n, k, K) : 0.f;
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < kTileK; ++kk) {
      const float a0 = a_tile[2 * ty][kk], a1 = a_tile[2 * ty + 1][kk];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float wv = w_tile[tx + 16 * j][kk];
        acc[0][j] += a0 * wv;
        acc[1][j] += a1 * wv;
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

// Needs K % 8 == 0, codes aligned to Format<Kind>::kLoadBytes, M <= kGemvMaxM.
// The channel loop is block-uniform: every warp of a block runs it the same number of times and every lane reaches
// every shuffle, also for the channels past N (they compute nothing and store nothing). A per-warp loop bound would
// leave some warps shuffling while others have left the loop: undefined on a GPU, a deadlock or skipped lanes on
// HIP-CPU, whose shuffles are barriers across the block.
template <typename TA, int Kind>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const TA* __restrict__ A, Weight w, Scales scales,
                                                        TA* __restrict__ Y, int M, int64_t N, int64_t K) {
  const int warp_size = QO_WARP_SIZE;
  const int lane = threadIdx.x % warp_size;
  const int64_t warps_per_block = blockDim.x / warp_size;
  // Grid-stride over channels, so the grid is valid whatever the warp size (32 on NVIDIA/RDNA, 64 on CDNA).
  for (int64_t n_base = (int64_t)blockIdx.x * warps_per_block; n_base < N;
       n_base += (int64_t)gridDim.x * warps_per_block) {
    const int64_t n = n_base + threadIdx.x / warp_size;
    float acc[kGemvMaxM];
#pragma unroll
    for (int m = 0; m < kGemvMaxM; ++m) acc[m] = 0.f;

    if (n < N) {
      for (int64_t k0 = (int64_t)lane * 8; k0 < K; k0 += (int64_t)warp_size * 8) {
        float wv[8];
        Format<Kind>::eight(w, n, k0, K, wv);
#pragma unroll
        for (int m = 0; m < kGemvMaxM; ++m) {
          if (m < M) {
#pragma unroll
            for (int j = 0; j < 8; ++j)
              acc[m] += quantize_activation(Activation<TA>::load(A, (int64_t)m * K + k0 + j), scales, m) * wv[j];
          }
        }
      }
    }
#pragma unroll
    for (int m = 0; m < kGemvMaxM; ++m) {
      for (int offset = warp_size / 2; offset > 0; offset /= 2) acc[m] += qo_shfl_down(acc[m], offset);
    }
    if (n < N && lane == 0) {
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
int launch(const TA* A, Weight w, Scales scales, TA* Y, int64_t M, int64_t N, int64_t K, void* stream) {
  if (!A || !w.codes || !Y || M < 0 || N < 0 || K <= 0) return QO_ERR_ARGUMENT;
  if (Format<Kind>::kBlock > 1 && (!w.block_scale || K % Format<Kind>::kBlock != 0)) return QO_ERR_ARGUMENT;
  if (M == 0 || N == 0) return QO_OK;
  qo_stream_t s = static_cast<qo_stream_t>(stream);
  const bool gemv_ok = M <= kGemvMaxM && K % 8 == 0 && aligned(w.codes, Format<Kind>::kLoadBytes);
  if (gemv_ok) {
    const int warps_per_block = kThreads / 32;  // the kernel strides over channels if warps are wider
    const int64_t wanted = (N + warps_per_block - 1) / warps_per_block;
    const dim3 grid((unsigned)(wanted < 0x7FFFFFFF ? wanted : 0x7FFFFFFF));
    auto kernel = gemv_kernel<TA, Kind>;
    QO_LAUNCH(kernel, grid, dim3(kThreads), 0, s, A, w, scales, Y, (int)M, N, K);
  } else {
    if ((M + kTileM - 1) / kTileM > 65535 || (N + kTileN - 1) / kTileN > 0x7FFFFFFF) return QO_ERR_ARGUMENT;
    const dim3 grid((unsigned)((N + kTileN - 1) / kTileN), (unsigned)((M + kTileM - 1) / kTileM));
    auto kernel = gemm_tile_kernel<TA, Kind>;
    QO_LAUNCH(kernel, grid, dim3(kThreads), 0, s, A, w, scales, Y, M, N, K);
  }
  return qo_gpu_get_last_error() == qo_gpu_success ? QO_OK : QO_ERR_DEVICE;
}

// FP8 and INT8 codes with a per-tensor / per-channel weight scale; A_scale: W8A8 static (device pointer to one
// float), nullptr with a workspace: W8A8 dynamic per row, nullptr without: weight-only.
template <typename TA, int Kind>
int launch_scaled(const TA* A, const uint8_t* B, const float* B_scale, int64_t b_scale_count, const float* A_scale,
                  float* row_scale_workspace, TA* Y, int64_t M, int64_t N, int64_t K, void* stream) {
  if (!B_scale || !(b_scale_count == 1 || b_scale_count == N)) return QO_ERR_ARGUMENT;
  Scales scales{A_scale, 0, B_scale, b_scale_count == N && N != 1};
  if (row_scale_workspace) {  // dynamic per-row scale
    if (!A || K <= 0) return QO_ERR_ARGUMENT;
    if (M == 0 || N == 0) return QO_OK;
    if (M > 0x7FFFFFFF) return QO_ERR_ARGUMENT;
    auto kernel = dynamic_row_scale_kernel<TA>;
    QO_LAUNCH(kernel, dim3((unsigned)M), dim3(kThreads), 0, static_cast<qo_stream_t>(stream), A,
              row_scale_workspace, K);
    if (qo_gpu_get_last_error() != qo_gpu_success) return QO_ERR_DEVICE;
    scales.a_scale = row_scale_workspace;
    scales.a_per_row = 1;
  }
  return launch<TA, Kind>(A, Weight{B, nullptr, 0.f}, scales, Y, M, N, K, stream);
}

constexpr Scales kNoScales{nullptr, 0, nullptr, 0};

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
  return launch<float, kMxfp4>(A, Weight{B, B_scale, 0.f}, kNoScales, Y, M, N, K, stream);
}

int qo_gpu_matmul_mxfp4_f16(const uint16_t* A, const uint8_t* B, const uint8_t* B_scale, uint16_t* Y, int64_t M,
                            int64_t N, int64_t K, void* stream) {
  return launch<uint16_t, kMxfp4>(A, Weight{B, B_scale, 0.f}, kNoScales, Y, M, N, K, stream);
}

int qo_gpu_matmul_fp8_w8a8_f32(const float* A, const uint8_t* B, const float* B_scale, int64_t b_scale_count,
                               const float* A_scale, float* Y, int64_t M, int64_t N, int64_t K, void* stream) {
  if (!A_scale) return QO_ERR_ARGUMENT;
  return launch_scaled<float, kFp8>(A, B, B_scale, b_scale_count, A_scale, nullptr, Y, M, N, K, stream);
}

int qo_gpu_matmul_fp8_w8a8_f16(const uint16_t* A, const uint8_t* B, const float* B_scale, int64_t b_scale_count,
                               const float* A_scale, uint16_t* Y, int64_t M, int64_t N, int64_t K, void* stream) {
  if (!A_scale) return QO_ERR_ARGUMENT;
  return launch_scaled<uint16_t, kFp8>(A, B, B_scale, b_scale_count, A_scale, nullptr, Y, M, N, K, stream);
}

int qo_gpu_matmul_fp8_w8a8_dyn_f32(const float* A, const uint8_t* B, const float* B_scale, int64_t b_scale_count,
                                   float* row_scale_workspace, float* Y, int64_t M, int64_t N, int64_t K,
                                   void* stream) {
  if (!row_scale_workspace) return QO_ERR_ARGUMENT;
  return launch_scaled<float, kFp8>(A, B, B_scale, b_scale_count, nullptr, row_scale_workspace, Y, M, N, K, stream);
}

int qo_gpu_matmul_fp8_w8a8_dyn_f16(const uint16_t* A, const uint8_t* B, const float* B_scale,
                                   int64_t b_scale_count, float* row_scale_workspace, uint16_t* Y, int64_t M,
                                   int64_t N, int64_t K, void* stream) {
  if (!row_scale_workspace) return QO_ERR_ARGUMENT;
  return launch_scaled<uint16_t, kFp8>(A, B, B_scale, b_scale_count, nullptr, row_scale_workspace, Y, M, N, K,
                                       stream);
}

int qo_gpu_matmul_fp8_f32(const float* A, const uint8_t* B, const float* B_scale, int64_t b_scale_count, float* Y,
                          int64_t M, int64_t N, int64_t K, void* stream) {
  return launch_scaled<float, kFp8>(A, B, B_scale, b_scale_count, nullptr, nullptr, Y, M, N, K, stream);
}

int qo_gpu_matmul_fp8_f16(const uint16_t* A, const uint8_t* B, const float* B_scale, int64_t b_scale_count,
                          uint16_t* Y, int64_t M, int64_t N, int64_t K, void* stream) {
  return launch_scaled<uint16_t, kFp8>(A, B, B_scale, b_scale_count, nullptr, nullptr, Y, M, N, K, stream);
}

int qo_gpu_matmul_int8_f32(const float* A, const int8_t* B, const float* B_scale, int64_t b_scale_count, float* Y,
                           int64_t M, int64_t N, int64_t K, void* stream) {
  return launch_scaled<float, kInt8>(A, reinterpret_cast<const uint8_t*>(B), B_scale, b_scale_count, nullptr,
                                     nullptr, Y, M, N, K, stream);
}

int qo_gpu_matmul_int8_f16(const uint16_t* A, const int8_t* B, const float* B_scale, int64_t b_scale_count,
                           uint16_t* Y, int64_t M, int64_t N, int64_t K, void* stream) {
  return launch_scaled<uint16_t, kInt8>(A, reinterpret_cast<const uint8_t*>(B), B_scale, b_scale_count, nullptr,
                                        nullptr, Y, M, N, K, stream);
}

int qo_gpu_matmul_nvfp4_f32(const float* A, const uint8_t* B, const uint8_t* B_scale, float B_scale_2, float* Y,
                            int64_t M, int64_t N, int64_t K, void* stream) {
  return launch<float, kNvfp4>(A, Weight{B, B_scale, B_scale_2}, kNoScales, Y, M, N, K, stream);
}

int qo_gpu_matmul_nvfp4_f16(const uint16_t* A, const uint8_t* B, const uint8_t* B_scale, float B_scale_2,
                            uint16_t* Y, int64_t M, int64_t N, int64_t K, void* stream) {
  return launch<uint16_t, kNvfp4>(A, Weight{B, B_scale, B_scale_2}, kNoScales, Y, M, N, K, stream);
}

int qo_gpu_matmul_bf16_f32(const float* A, const uint16_t* B, float* Y, int64_t M, int64_t N, int64_t K,
                           void* stream) {
  return launch<float, kBf16>(A, Weight{reinterpret_cast<const uint8_t*>(B), nullptr, 0.f}, kNoScales, Y, M, N, K,
                              stream);
}

int qo_gpu_matmul_bf16_f16(const uint16_t* A, const uint16_t* B, uint16_t* Y, int64_t M, int64_t N, int64_t K,
                           void* stream) {
  return launch<uint16_t, kBf16>(A, Weight{reinterpret_cast<const uint8_t*>(B), nullptr, 0.f}, kNoScales, Y, M, N,
                                 K, stream);
}

}  // extern "C"
