/* CPU kernels for the com.quark_onnx ops.
 * Shape of the work: the weight is decoded to float32 one block of QO_ROWS_PER_BLOCK output channels at a time
 * (each block decoded exactly once, kept in L2), then every activation row is multiplied against that block with a
 * 2x4 register tile (two A rows x four weight rows share each load). Blocks are spread over OpenMP threads when the
 * library is built with OpenMP; `omp simd` reductions let the compiler vectorise the dot products without
 * -ffast-math. fp16 inputs/outputs are converted to/from float32 buffers around the float32 core. */
#include <stdlib.h>
#include <string.h>

#include "qo_fp_formats.h"
#include "qo_kernels.h"

#define QO_ROWS_PER_BLOCK 16
#define QO_MXFP4_BLOCK 32
#define QO_E4M3FN_MAX 448.0f
#define QO_DYNAMIC_SCALE_MIN 1e-12f

/* The table-lookup decodes below must stay scalar: with SSE2 only, GCC -O3 vectorises them into emulated gathers
 * that were 2.5x (MXFP4) slower than scalar code (4096x4096, M=1, 1 thread: 14 ms scalar vs 76 ms). */
#if defined(__GNUC__) && !defined(__clang__)
#define QO_SCALAR_LOOP __attribute__((optimize("no-tree-vectorize")))
#define QO_NO_VECTORIZE
#elif defined(__clang__)
#define QO_SCALAR_LOOP
#define QO_NO_VECTORIZE _Pragma("clang loop vectorize(disable)")
#else
#define QO_SCALAR_LOOP
#define QO_NO_VECTORIZE
#endif

/* The dot products are compiled for baseline x86-64 and for AVX2+FMA / AVX-512, picked at load time (GCC/clang
 * function multi-versioning through an ifunc; elsewhere the baseline only). */
#if defined(__x86_64__) && defined(__GNUC__) && defined(__ELF__) && !defined(QO_NO_CLONES)
#define QO_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define QO_SIMD_CLONES
#endif

/* Writes `rows` decoded weight rows (row n0..n0+rows-1), each K floats, to out. */
typedef void (*qo_decode_rows_fn)(const void* weight, int64_t n0, int64_t rows, int64_t K, float* out);

typedef struct {
  const uint8_t* packed; /* [N, K/2] */
  const uint8_t* scales; /* [N, K/32] */
} qo_mxfp4_weight;

QO_SCALAR_LOOP static void decode_mxfp4_rows(const void* weight, int64_t n0, int64_t rows, int64_t K, float* out) {
  const qo_mxfp4_weight* w = (const qo_mxfp4_weight*)weight;
  float table[16];
  for (int c = 0; c < 16; ++c) table[c] = qo_e2m1_to_f32((uint8_t)c);
  const int64_t blocks = K / QO_MXFP4_BLOCK;
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = w->packed + (n0 + r) * (K / 2);
    const uint8_t* row_scales = w->scales + (n0 + r) * blocks;
    float* dst = out + r * K;
    for (int64_t b = 0; b < blocks; ++b) {
      const float scale = qo_e8m0_to_f32(row_scales[b]);
      const uint8_t* bytes = row + b * (QO_MXFP4_BLOCK / 2);
      float* block_dst = dst + b * QO_MXFP4_BLOCK;
      QO_NO_VECTORIZE
      for (int j = 0; j < QO_MXFP4_BLOCK / 2; ++j) {
        block_dst[2 * j] = table[bytes[j] & 0x0F] * scale;
        block_dst[2 * j + 1] = table[bytes[j] >> 4] * scale;
      }
    }
  }
}

QO_SCALAR_LOOP static void decode_e4m3fn_rows(const void* weight, int64_t n0, int64_t rows, int64_t K, float* out) {
  const uint8_t* codes = (const uint8_t*)weight + n0 * K;
  float table[256];
  for (int c = 0; c < 256; ++c) table[c] = qo_e4m3fn_to_f32((uint8_t)c);
  QO_NO_VECTORIZE
  for (int64_t i = 0; i < rows * K; ++i) out[i] = table[codes[i]];
}

/* y[r][c] = dot(a_r, w_c) for two A rows and four weight rows. */
static void dot_2x4(const float* a0, const float* a1, const float* w0, const float* w1, const float* w2,
                    const float* w3, int64_t K, float y[2][4]) {
  float s00 = 0, s01 = 0, s02 = 0, s03 = 0, s10 = 0, s11 = 0, s12 = 0, s13 = 0;
#pragma omp simd reduction(+ : s00, s01, s02, s03, s10, s11, s12, s13)
  for (int64_t k = 0; k < K; ++k) {
    s00 += a0[k] * w0[k]; s01 += a0[k] * w1[k]; s02 += a0[k] * w2[k]; s03 += a0[k] * w3[k];
    s10 += a1[k] * w0[k]; s11 += a1[k] * w1[k]; s12 += a1[k] * w2[k]; s13 += a1[k] * w3[k];
  }
  y[0][0] = s00; y[0][1] = s01; y[0][2] = s02; y[0][3] = s03;
  y[1][0] = s10; y[1][1] = s11; y[1][2] = s12; y[1][3] = s13;
}

static float dot_1x1(const float* a, const float* w, int64_t K) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t k = 0; k < K; ++k) s += a[k] * w[k];
  return s;
}

/* Y[m][n] = dot(A[m], W[n]) * row_scale[m] * col_scale[n]; row_scale / col_scale may be NULL (= 1);
 * col_scale_count is 1 (per-tensor) or N. */
QO_SIMD_CLONES static void gemm_rows_times_block(const float* A, const float* block, int64_t n0, int64_t rows, int64_t M,
                                  int64_t N, int64_t K, const float* row_scale, const float* col_scale,
                                  int64_t col_scale_count, float* Y) {
  int64_t m = 0;
  for (; m + 2 <= M; m += 2) {
    const float* a0 = A + m * K;
    const float* a1 = a0 + K;
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) {
      float y[2][4];
      const float* w = block + r * K;
      dot_2x4(a0, a1, w, w + K, w + 2 * K, w + 3 * K, K, y);
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 4; ++j) Y[(m + i) * N + n0 + r + j] = y[i][j];
    }
    for (; r < rows; ++r) {
      Y[m * N + n0 + r] = dot_1x1(a0, block + r * K, K);
      Y[(m + 1) * N + n0 + r] = dot_1x1(a1, block + r * K, K);
    }
  }
  for (; m < M; ++m)
    for (int64_t r = 0; r < rows; ++r) Y[m * N + n0 + r] = dot_1x1(A + m * K, block + r * K, K);
  if (row_scale || col_scale) {
    for (int64_t mm = 0; mm < M; ++mm)
      for (int64_t r = 0; r < rows; ++r) {
        float scale = row_scale ? row_scale[mm] : 1.0f;
        if (col_scale) scale *= col_scale[col_scale_count == 1 ? 0 : n0 + r];
        Y[mm * N + n0 + r] *= scale;
      }
  }
}

/* ---- parallel loop: OpenMP by default, or the caller's runner (the ORT layer: ORT's intra-op thread pool) ---- */
#if defined(_MSC_VER)
#define QO_THREAD_LOCAL __declspec(thread)
#else
#define QO_THREAD_LOCAL __thread
#endif
static QO_THREAD_LOCAL const qo_parallel_runner* tls_runner = NULL;

void qo_cpu_set_parallel_runner(const qo_parallel_runner* runner) { tls_runner = runner; }

typedef struct {
  const float* A;
  int64_t M, N, K;
  qo_decode_rows_fn decode;
  const void* weight;
  const float* row_scale;
  const float* col_scale;
  int64_t col_scale_count;
  float* Y;
  volatile int failed;
} qo_gemm_job;

static void gemm_block(qo_gemm_job* job, int64_t b, float* block) {
  const int64_t n0 = b * QO_ROWS_PER_BLOCK;
  const int64_t rows = (job->N - n0) < QO_ROWS_PER_BLOCK ? (job->N - n0) : QO_ROWS_PER_BLOCK;
  job->decode(job->weight, n0, rows, job->K, block);
  gemm_rows_times_block(job->A, block, n0, rows, job->M, job->N, job->K, job->row_scale, job->col_scale,
                        job->col_scale_count, job->Y);
}

/* Decode buffer of the calling thread, kept between calls: a fresh malloc per task is an mmap (256 KB at K=4096)
 * whose page faults cost more than the work. Grows to QO_ROWS_PER_BLOCK * K floats; released at process exit. */
static QO_THREAD_LOCAL float* tls_block = NULL;
static QO_THREAD_LOCAL size_t tls_block_floats = 0;

static float* thread_block(int64_t K) {
  const size_t want = (size_t)QO_ROWS_PER_BLOCK * (size_t)K;
  if (tls_block_floats < want) {
    float* grown = (float*)realloc(tls_block, sizeof(float) * want);
    if (!grown) return NULL;
    tls_block = grown;
    tls_block_floats = want;
  }
  return tls_block;
}

static void gemm_block_task(void* data, size_t b) { /* one task per block of output channels */
  qo_gemm_job* job = (qo_gemm_job*)data;
  float* block = thread_block(job->K);
  if (!block) {
    job->failed = 1;
    return;
  }
  gemm_block(job, (int64_t)b, block);
}

static int gemm_decoded(const float* A, int64_t M, int64_t N, int64_t K, qo_decode_rows_fn decode,
                        const void* weight, const float* row_scale, const float* col_scale,
                        int64_t col_scale_count, float* Y) {
  const int64_t block_count = (N + QO_ROWS_PER_BLOCK - 1) / QO_ROWS_PER_BLOCK;
  qo_gemm_job job = {A, M, N, K, decode, weight, row_scale, col_scale, col_scale_count, Y, 0};
  const qo_parallel_runner* runner = tls_runner;
  if (runner) {
    if (runner->run(runner->context, gemm_block_task, (size_t)block_count, &job) != QO_OK) return QO_ERR_DEVICE;
    return job.failed ? QO_ERR_ALLOC : QO_OK;
  }
#pragma omp parallel
  {
    float* block = (float*)malloc(sizeof(float) * QO_ROWS_PER_BLOCK * (size_t)K);
    if (!block) job.failed = 1;
#pragma omp for schedule(dynamic, 1)
    for (int64_t b = 0; b < block_count; ++b) {
      if (!block) continue;
      gemm_block(&job, b, block);
    }
    free(block);
  }
  return job.failed ? QO_ERR_ALLOC : QO_OK;
}

static float* f16_to_f32_buffer(const uint16_t* src, int64_t count) {
  float* dst = (float*)malloc(sizeof(float) * (size_t)(count > 0 ? count : 1));
  if (dst)
    for (int64_t i = 0; i < count; ++i) dst[i] = qo_f16_to_f32(src[i]);
  return dst;
}

static void f32_to_f16_buffer(const float* src, uint16_t* dst, int64_t count) {
  for (int64_t i = 0; i < count; ++i) dst[i] = qo_f32_to_f16(src[i]);
}

/* fp16 A / Y around a float32 kernel: A widened into a buffer, the kernel run, Y narrowed (round to nearest even). */
typedef int (*qo_f32_kernel_fn)(const float* A, float* Y, int64_t M, int64_t N, int64_t K, const void* args);

static int through_f32(const uint16_t* A, uint16_t* Y, int64_t M, int64_t N, int64_t K, qo_f32_kernel_fn kernel,
                       const void* args) {
  float* a32 = f16_to_f32_buffer(A, M * K);
  float* y32 = (float*)malloc(sizeof(float) * (size_t)(M * N));
  int status = QO_ERR_ALLOC;
  if (a32 && y32) {
    status = kernel(a32, y32, M, N, K, args);
    if (status == QO_OK) f32_to_f16_buffer(y32, Y, M * N);
  }
  free(a32);
  free(y32);
  return status;
}

static int shape_ok(const void* A, const void* B, const void* Y, int64_t M, int64_t N, int64_t K) {
  return A && B && Y && M >= 0 && N >= 0 && K > 0;
}

/* ---------------- MXFP4 ---------------- */
int qo_matmul_mxfp4_f32(const float* A, const uint8_t* B, const uint8_t* B_scale, float* Y, int64_t M, int64_t N,
                        int64_t K) {
  if (!shape_ok(A, B, Y, M, N, K) || !B_scale || K % QO_MXFP4_BLOCK != 0) return QO_ERR_ARGUMENT;
  if (M == 0 || N == 0) return QO_OK;
  qo_mxfp4_weight weight = {B, B_scale};
  return gemm_decoded(A, M, N, K, decode_mxfp4_rows, &weight, NULL, NULL, 1, Y);
}

static int mxfp4_f32_kernel(const float* A, float* Y, int64_t M, int64_t N, int64_t K, const void* args) {
  const qo_mxfp4_weight* w = (const qo_mxfp4_weight*)args;
  return qo_matmul_mxfp4_f32(A, w->packed, w->scales, Y, M, N, K);
}

int qo_matmul_mxfp4_f16(const uint16_t* A, const uint8_t* B, const uint8_t* B_scale, uint16_t* Y, int64_t M,
                        int64_t N, int64_t K) {
  if (!shape_ok(A, B, Y, M, N, K) || !B_scale || K % QO_MXFP4_BLOCK != 0) return QO_ERR_ARGUMENT;
  if (M == 0 || N == 0) return QO_OK;
  const qo_mxfp4_weight weight = {B, B_scale};
  return through_f32(A, Y, M, N, K, mxfp4_f32_kernel, &weight);
}

/* ---------------- FP8 W8A8 ---------------- */
/* a_q[m][k] = e4m3fn value of sat(A[m][k] / scale_m), written as float (exact). */
static void quantize_rows_e4m3fn(const float* A, int64_t M, int64_t K, const float* row_scale, float* a_q) {
  for (int64_t m = 0; m < M; ++m) {
    const float scale = row_scale[m];
    for (int64_t k = 0; k < K; ++k) a_q[m * K + k] = qo_e4m3fn_to_f32(qo_f32_to_e4m3fn_sat(A[m * K + k] / scale));
  }
}

static void dynamic_row_scales(const float* A, int64_t M, int64_t K, float* row_scale) {
  for (int64_t m = 0; m < M; ++m) {
    float amax = 0.0f;
    for (int64_t k = 0; k < K; ++k) {
      const float v = fabsf(A[m * K + k]);
      if (!(v <= amax)) amax = v; /* NaN propagates, as numpy's max does */
    }
    const float scale = amax / QO_E4M3FN_MAX;
    row_scale[m] = (scale < QO_DYNAMIC_SCALE_MIN) ? QO_DYNAMIC_SCALE_MIN : scale;
  }
}

/* A_scale points to the static per-tensor scale; NULL selects the per-row dynamic scale. */
static int fp8_w8a8_f32(const float* A, const uint8_t* B, const float* B_scale, int64_t b_scale_count,
                        const float* A_scale, float* Y, int64_t M, int64_t N, int64_t K) {
  if (!shape_ok(A, B, Y, M, N, K) || !B_scale || !(b_scale_count == 1 || b_scale_count == N)) return QO_ERR_ARGUMENT;
  if (M == 0 || N == 0) return QO_OK;
  float* a_q = (float*)malloc(sizeof(float) * (size_t)(M * K));
  float* row_scale = (float*)malloc(sizeof(float) * (size_t)M);
  int status = QO_ERR_ALLOC;
  if (a_q && row_scale) {
    if (A_scale) {
      for (int64_t m = 0; m < M; ++m) row_scale[m] = *A_scale;
    } else {
      dynamic_row_scales(A, M, K, row_scale);
    }
    quantize_rows_e4m3fn(A, M, K, row_scale, a_q);
    status = gemm_decoded(a_q, M, N, K, decode_e4m3fn_rows, B, row_scale, B_scale, b_scale_count, Y);
  }
  free(a_q);
  free(row_scale);
  return status;
}

typedef struct {
  const uint8_t* B;
  const float* B_scale;
  int64_t b_scale_count;
  const float* A_scale;
} qo_fp8_args;

static int fp8_f32_kernel(const float* A, float* Y, int64_t M, int64_t N, int64_t K, const void* args) {
  const qo_fp8_args* f = (const qo_fp8_args*)args;
  return fp8_w8a8_f32(A, f->B, f->B_scale, f->b_scale_count, f->A_scale, Y, M, N, K);
}

static int fp8_w8a8_f16(const uint16_t* A, const uint8_t* B, const float* B_scale, int64_t b_scale_count,
                        const float* A_scale, uint16_t* Y, int64_t M, int64_t N, int64_t K) {
  if (!shape_ok(A, B, Y, M, N, K)) return QO_ERR_ARGUMENT;
  if (M == 0 || N == 0) return QO_OK;
  const qo_fp8_args args = {B, B_scale, b_scale_count, A_scale};
  return through_f32(A, Y, M, N, K, fp8_f32_kernel, &args);
}

int qo_matmul_fp8_w8a8_f32(const float* A, const uint8_t* B, const float* B_scale, int64_t b_scale_count,
                           float A_scale, float* Y, int64_t M, int64_t N, int64_t K) {
  return fp8_w8a8_f32(A, B, B_scale, b_scale_count, &A_scale, Y, M, N, K);
}

int qo_matmul_fp8_w8a8_f16(const uint16_t* A, const uint8_t* B, const float* B_scale, int64_t b_scale_count,
                           float A_scale, uint16_t* Y, int64_t M, int64_t N, int64_t K) {
  return fp8_w8a8_f16(A, B, B_scale, b_scale_count, &A_scale, Y, M, N, K);
}

int qo_matmul_fp8_w8a8_dyn_f32(const float* A, const uint8_t* B, const float* B_scale, int64_t b_scale_count,
                               float* Y, int64_t M, int64_t N, int64_t K) {
  return fp8_w8a8_f32(A, B, B_scale, b_scale_count, NULL, Y, M, N, K);
}

int qo_matmul_fp8_w8a8_dyn_f16(const uint16_t* A, const uint8_t* B, const float* B_scale, int64_t b_scale_count,
                               uint16_t* Y, int64_t M, int64_t N, int64_t K) {
  return fp8_w8a8_f16(A, B, B_scale, b_scale_count, NULL, Y, M, N, K);
}

/* ---------------- bf16 weight (lm_head=bf16) ----------------
 * Y[m][n] = sum_k A[m][k] * float(B[n][k]); bf16 -> float32 is exact (the bits shifted up), so the only rounding is
 * the float32 summation, and that is done in one fixed order on every CPU: 16 lane partial sums (lane j takes
 * k = 16i + j, in increasing i; the K % 16 tail goes to lanes 0..), folded pairwise (lanes j and j + 8, then j + 4,
 * + 2, + 1), products and sums never contracted into FMAs. The lanes are a GCC/clang vector type of 16 floats, which
 * the compiler maps onto whatever each clone has (one AVX-512 register, two AVX2, four SSE2) with the same per-lane
 * float32 operations, so the result is bit-identical across instruction sets, and a row's logits are the same
 * whether it is computed alone (M = 1, decode) or in a prompt (M > 1).
 * M = 1 reads the bf16 rows directly (4 rows per step: half the bytes of the fp32 MatMul, memory-bound); M > 1
 * decodes each task's rows to float32 once (thread-local, exact) and runs 4x4 register tiles over them. */
#define QO_LANES 16
#define QO_BF16_ROWS_PER_TASK 64

#if defined(__GNUC__) && !defined(__clang__)
#define QO_NO_CONTRACT __attribute__((optimize("fp-contract=off")))
#define QO_NO_CONTRACT_BODY
#elif defined(__clang__)
#define QO_NO_CONTRACT
#define QO_NO_CONTRACT_BODY _Pragma("clang fp contract(off)")
#else
#define QO_NO_CONTRACT
#define QO_NO_CONTRACT_BODY
#endif

#if defined(__GNUC__) || defined(__clang__)
/* The 64-byte vector helpers below are static and always inlined into each clone: no call passes a vector across
 * an ABI boundary, so GCC's note that such a call's ABI differs without AVX-512 does not apply. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif
typedef float qo_v16 __attribute__((vector_size(64)));
typedef uint16_t qo_u16x16 __attribute__((vector_size(32)));
typedef uint32_t qo_u32x16 __attribute__((vector_size(64)));

static inline __attribute__((always_inline)) qo_v16 load_f32x16(const float* p) {
  qo_v16 v;
  memcpy(&v, p, sizeof v);
  return v;
}

static inline __attribute__((always_inline)) qo_v16 load_bf16x16(const uint16_t* p) {
  qo_u16x16 h;
  memcpy(&h, p, sizeof h);
  qo_u32x16 u = __builtin_convertvector(h, qo_u32x16) << 16;
  qo_v16 v;
  memcpy(&v, &u, sizeof v);
  return v;
}
#else
#error "the bf16 kernel needs GCC or clang vector extensions"
#endif

static inline float bf16_bits_to_f32(uint16_t bits) {
  const uint32_t u = (uint32_t)bits << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static inline __attribute__((always_inline)) float fold_lanes(const qo_v16* v) {
  float s[QO_LANES];
  memcpy(s, v, sizeof s);
  for (int width = QO_LANES / 2; width >= 1; width /= 2)
    for (int j = 0; j < width; ++j) s[j] += s[j + width];
  return s[0];
}

/* One A row against four bf16 weight rows (row stride K). */
QO_SIMD_CLONES QO_NO_CONTRACT static void bf16_dot_1x4(const float* a, const uint16_t* w, int64_t K, float* y) {
  QO_NO_CONTRACT_BODY
  qo_v16 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
  int64_t k = 0;
  for (; k + QO_LANES <= K; k += QO_LANES) {
    const qo_v16 x = load_f32x16(a + k);
    s0 += x * load_bf16x16(w + k);
    s1 += x * load_bf16x16(w + K + k);
    s2 += x * load_bf16x16(w + 2 * K + k);
    s3 += x * load_bf16x16(w + 3 * K + k);
  }
  for (int j = 0; k + j < K; ++j) {
    const float x = a[k + j];
    s0[j] += x * bf16_bits_to_f32(w[k + j]);
    s1[j] += x * bf16_bits_to_f32(w[K + k + j]);
    s2[j] += x * bf16_bits_to_f32(w[2 * K + k + j]);
    s3[j] += x * bf16_bits_to_f32(w[3 * K + k + j]);
  }
  y[0] = fold_lanes(&s0);
  y[1] = fold_lanes(&s1);
  y[2] = fold_lanes(&s2);
  y[3] = fold_lanes(&s3);
}

QO_SIMD_CLONES QO_NO_CONTRACT static float bf16_dot_1x1(const float* a, const uint16_t* w, int64_t K) {
  QO_NO_CONTRACT_BODY
  qo_v16 s = {0};
  int64_t k = 0;
  for (; k + QO_LANES <= K; k += QO_LANES) s += load_f32x16(a + k) * load_bf16x16(w + k);
  for (int j = 0; k + j < K; ++j) s[j] += a[k + j] * bf16_bits_to_f32(w[k + j]);
  return fold_lanes(&s);
}

/* Four A rows (stride K) against four decoded float32 weight rows (stride K): the same per-lane operations as
 * bf16_dot_1x4, 16 accumulators. y[i * ldy + r]. */
QO_SIMD_CLONES QO_NO_CONTRACT static void f32_dot_4x4(const float* a, const float* w, int64_t K, float* y,
                                                      int64_t ldy) {
  QO_NO_CONTRACT_BODY
  qo_v16 s[4][4];
  memset(s, 0, sizeof s);
  int64_t k = 0;
  for (; k + QO_LANES <= K; k += QO_LANES) {
    const qo_v16 w0 = load_f32x16(w + k), w1 = load_f32x16(w + K + k), w2 = load_f32x16(w + 2 * K + k),
                 w3 = load_f32x16(w + 3 * K + k);
    for (int i = 0; i < 4; ++i) {
      const qo_v16 x = load_f32x16(a + i * K + k);
      s[i][0] += x * w0;
      s[i][1] += x * w1;
      s[i][2] += x * w2;
      s[i][3] += x * w3;
    }
  }
  for (int j = 0; k + j < K; ++j)
    for (int i = 0; i < 4; ++i)
      for (int r = 0; r < 4; ++r) s[i][r][j] += a[i * K + k + j] * w[r * K + k + j];
  for (int i = 0; i < 4; ++i)
    for (int r = 0; r < 4; ++r) y[i * ldy + r] = fold_lanes(&s[i][r]);
}

QO_SIMD_CLONES QO_NO_CONTRACT static float f32_dot_1x1(const float* a, const float* w, int64_t K) {
  QO_NO_CONTRACT_BODY
  qo_v16 s = {0};
  int64_t k = 0;
  for (; k + QO_LANES <= K; k += QO_LANES) s += load_f32x16(a + k) * load_f32x16(w + k);
  for (int j = 0; k + j < K; ++j) s[j] += a[k + j] * w[k + j];
  return fold_lanes(&s);
}

QO_SIMD_CLONES static void decode_bf16(const uint16_t* src, int64_t count, float* dst) {
  int64_t i = 0;
  for (; i + QO_LANES <= count; i += QO_LANES) {
    const qo_v16 v = load_bf16x16(src + i);
    memcpy(dst + i, &v, sizeof v);
  }
  for (; i < count; ++i) dst[i] = bf16_bits_to_f32(src[i]);
}

typedef struct {
  const float* A;
  const uint16_t* B;
  float* Y;
  int64_t M, N, K;
  volatile int failed;
} qo_bf16_job;

static void bf16_task(void* data, size_t t) {
  qo_bf16_job* job = (qo_bf16_job*)data;
  const int64_t n0 = (int64_t)t * QO_BF16_ROWS_PER_TASK;
  const int64_t n1 = n0 + QO_BF16_ROWS_PER_TASK < job->N ? n0 + QO_BF16_ROWS_PER_TASK : job->N;
  const int64_t K = job->K, N = job->N, M = job->M;
  const uint16_t* B = job->B;
  if (M == 1) {
    int64_t n = n0;
    for (; n + 4 <= n1; n += 4) bf16_dot_1x4(job->A, B + n * K, K, job->Y + n);
    for (; n < n1; ++n) job->Y[n] = bf16_dot_1x1(job->A, B + n * K, K);
    return;
  }
  /* M > 1: decode this task's rows once (exact), then 4x4 tiles; remainders one (m, n) at a time */
  float* w = thread_block((QO_BF16_ROWS_PER_TASK * K + QO_ROWS_PER_BLOCK - 1) / QO_ROWS_PER_BLOCK);
  if (!w) {
    job->failed = 1;
    return;
  }
  const int64_t rows = n1 - n0;
  decode_bf16(B + n0 * K, rows * K, w);
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) {
    const float* a = job->A + m * K;
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) f32_dot_4x4(a, w + r * K, K, job->Y + m * N + n0 + r, N);
    for (; r < rows; ++r)
      for (int i = 0; i < 4; ++i) job->Y[(m + i) * N + n0 + r] = f32_dot_1x1(a + i * K, w + r * K, K);
  }
  for (; m < M; ++m)
    for (int64_t r = 0; r < rows; ++r) job->Y[m * N + n0 + r] = f32_dot_1x1(job->A + m * K, w + r * K, K);
}

int qo_matmul_bf16_f32(const float* A, const uint16_t* B, float* Y, int64_t M, int64_t N, int64_t K) {
  if (!shape_ok(A, B, Y, M, N, K)) return QO_ERR_ARGUMENT;
  if (M == 0 || N == 0) return QO_OK;
  qo_bf16_job job = {A, B, Y, M, N, K, 0};
  const int64_t tasks = (N + QO_BF16_ROWS_PER_TASK - 1) / QO_BF16_ROWS_PER_TASK;
  const qo_parallel_runner* runner = tls_runner;
  if (runner) {
    if (runner->run(runner->context, bf16_task, (size_t)tasks, &job) != QO_OK) return QO_ERR_DEVICE;
    return job.failed ? QO_ERR_ALLOC : QO_OK;
  }
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tasks; ++t) bf16_task(&job, (size_t)t);
  return job.failed ? QO_ERR_ALLOC : QO_OK;
}

static int bf16_f32_kernel(const float* A, float* Y, int64_t M, int64_t N, int64_t K, const void* args) {
  return qo_matmul_bf16_f32(A, (const uint16_t*)args, Y, M, N, K);
}

int qo_matmul_bf16_f16(const uint16_t* A, const uint16_t* B, uint16_t* Y, int64_t M, int64_t N, int64_t K) {
  if (!shape_ok(A, B, Y, M, N, K)) return QO_ERR_ARGUMENT;
  if (M == 0 || N == 0) return QO_OK;
  return through_f32(A, Y, M, N, K, bf16_f32_kernel, B);
}
