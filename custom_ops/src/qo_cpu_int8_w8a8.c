/* CPU kernel of com.quark_onnx MatMulInt8W8A8: Quark's INT8 W8A8 linear (int8 weight, static per-tensor symmetric
 * int8 activation) as an exact integer GEMM.
 *
 *   inv     = fp32(1 / A_scale)                                      (a float32 division, rounded once)
 *   q[m][k] = clamp(round_half_even(fp32(A[m][k] * inv)), -128, 127)  NaN -> -128
 *   P[m][n] = sum_k q[m][k] * B[n][k]                                 exact (int64; K <= 2^24)
 *   Y[m][n] = fp32(fp32(fp32(P) * A_scale) * B_scale[n])              three roundings, left to right
 *
 * q is Quark's int8 fake quantizer (torch.fake_quantize_per_tensor_affine with zero point 0: x * fp32(1/s), rounded
 * half to even, clamped; a NaN becomes quant_min there too: the x86 conversion of NaN to int64 is INT64_MIN, clamped
 * to -128 by aten's fake_quantize kernel), the same q as the standard-op form `Mul(1/s) -> QuantizeLinear(1, 0) ->
 * DequantizeLinear(s)` that builder/quant/int8_w8a8.py emits in front of MatMulInt8. Quark's model then sums the
 * float32 products (q * s) * (q_w * s_w); this kernel sums the integers exactly and scales once, so it differs from
 * Quark's float32 reference only by the roundings of those float32 products and sums (a few ulp of each output,
 * the same size as a summation-order difference), and its bits do not depend on the CPU, the path, M, the thread
 * count or the tile: every sum is an exact integer, and the three final roundings are the same scalar C on every path.
 *
 * Paths (picked at run time: qo_cpu_isa(), QO_CPU_KERNELS=portable|avx2|avx512|avx512-novbmi, as the other kernels):
 *   - AVX-512 with AVX512_VNNI: vpdpbusd, 64 products per instruction. Its first operand is unsigned, so the weight
 *     bytes are offset by +128 (x ^ 0x80) and sum_k 128 * q[m][k] (computed with q) is taken off. Register tiles of
 *     up to 4 activation rows x 4 (or 8, M <= 2) weight rows, 16-lane int32 accumulators reduced once per K chunk.
 *   - AVX2 (and AVX-512 without VNNI): both operands widened to int16 (A once per call, the weight in registers),
 *     vpmaddwd: exact (no vpmaddubsw, whose int16 pair sums saturate: the INT8-on-AVX2 bug of ORT's u8s8 GEMM).
 *   - portable C: plain integer loops.
 * int32 accumulators cover K chunks of QO_I8_KCHUNK elements (|sum| <= 32768 * 255 * 128 < 2^31); the chunks add in
 * int64, so P is exact for any K up to QO_I8_KMAX. Work is split over blocks of weight rows through qo_cpu_parallel_for (ORT's intra-op pool under ORT). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qo_cpu_simd.h"
#include "qo_fp_formats.h"
#include "qo_kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(QO_NO_CLONES) && \
    !defined(QO_PORTABLE_ONLY)
#define QO_I8_X86 1
#include <immintrin.h>
#else
#define QO_I8_X86 0
#endif

#define QO_I8_KMAX (1 << 24) /* K bound: the AVX-512 quantizer's int32 lane sums of q, |sum| <= K / 16 * 128 */
#define QO_I8_KCHUNK 32768   /* int32 accumulators per chunk (the +128 offset: 255 * 128 per product) */
#define QO_I8_GEMV_MAX_M 4   /* up to this many A rows: one pass over the weight (decode) */
#define QO_I8_GEMV_ROWS 16   /* weight rows per task, decode */
#define QO_I8_PANEL_ROWS 48  /* weight rows per task, prefill */
#define QO_I8_PF 512         /* software prefetch distance in a weight row (decode) */

enum { I8_PORTABLE = 0, I8_AVX2 = 1, I8_VNNI = 2 };

typedef struct {
  const int8_t* B;        /* [N, K] */
  const float* b_scale;   /* [1] or [N] */
  int64_t b_scale_count;
  float a_scale;
  int64_t M, N, K, Kp;    /* Kp: K rounded up to 64 (the padded rows of q / q16) */
  const int8_t* q;        /* [M, Kp] quantized A, zero padded */
  const int16_t* q16;     /* [M, Kp] the same, widened (AVX2 path) */
  const int64_t* qsum;    /* [M] sum_k q (the VNNI path's offset) */
  float* Y;
  int64_t rows_per_task;
  int path;
} i8_job;

/* ---------------- quantization of A: the same q on every path, whatever the caller's rounding mode (the scalar
 * code rounds half to even by hand, the SIMD code with an explicit rounding immediate) ---------------- */
static inline int8_t quantize_one(float v) { return (int8_t)qo_round_even_clamp(v, -128, 127); } /* NaN -> -128 */

static void quantize_row_portable(const float* a, int64_t K, float inv, int8_t* q, int16_t* q16, int64_t* qsum) {
  int64_t s = 0;
  for (int64_t k = 0; k < K; ++k) {
    const int8_t v = quantize_one(a[k] * inv);
    q[k] = v;
    if (q16) q16[k] = v;
    s += v;
  }
  *qsum = s;
}

#if QO_I8_X86
/* 16 at a time: max(v, -128) gives -128 for a NaN v (vmaxps returns its second operand), then min(., 127), then
 * round half to even: the scalar quantize_one's q. */
static __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq"))) void quantize_row_avx512(
    const float* a, int64_t K, float inv, int8_t* q, int64_t* qsum) {
  const __m512 vinv = _mm512_set1_ps(inv), lo = _mm512_set1_ps(-128.0f), hi = _mm512_set1_ps(127.0f);
  __m512i sum = _mm512_setzero_si512();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    const __m512 v = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(_mm512_loadu_ps(a + k), vinv), lo), hi);
    const __m512i i = _mm512_cvt_roundps_epi32(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128((__m128i*)(q + k), _mm512_cvtepi32_epi8(i));
    sum = _mm512_add_epi32(sum, i);
  }
  int64_t tail = 0;
  quantize_row_portable(a + k, K - k, inv, q + k, NULL, &tail);
  int32_t lanes[16]; /* each |lane| <= K / 16 * 128 <= 2^27; their sum in int64 */
  _mm512_storeu_si512((void*)lanes, sum);
  for (int l = 0; l < 16; ++l) tail += lanes[l];
  *qsum = tail;
}

static __attribute__((target("avx2,fma"))) void quantize_row_avx2(const float* a, int64_t K, float inv, int8_t* q,
                                                                  int16_t* q16, int64_t* qsum) {
  const __m256 vinv = _mm256_set1_ps(inv), lo = _mm256_set1_ps(-128.0f), hi = _mm256_set1_ps(127.0f);
  __m256i sum = _mm256_setzero_si256();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    const __m256 v = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(a + k), vinv), lo), hi);
    const __m256i i = _mm256_cvttps_epi32(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    const __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
    _mm_storeu_si128((__m128i*)(q16 + k), w16);
    _mm_storel_epi64((__m128i*)(q + k), _mm_packs_epi16(w16, w16));
    sum = _mm256_add_epi32(sum, i);
  }
  int64_t tail = 0;
  quantize_row_portable(a + k, K - k, inv, q + k, q16 + k, &tail);
  int32_t lanes[8];
  _mm256_storeu_si256((__m256i*)lanes, sum);
  int64_t s = tail;
  for (int l = 0; l < 8; ++l) s += lanes[l];
  *qsum = s;
}
#endif

static void quantize_rows(const float* A, int64_t M, int64_t K, int64_t Kp, float inv, int path, int8_t* q,
                          int16_t* q16, int64_t* qsum) {
  for (int64_t m = 0; m < M; ++m) {
    const float* a = A + m * K;
    int8_t* out = q + m * Kp;
    int16_t* out16 = q16 ? q16 + m * Kp : NULL;
#if QO_I8_X86
    if (path == I8_VNNI) quantize_row_avx512(a, K, inv, out, qsum + m);
    else if (path == I8_AVX2) quantize_row_avx2(a, K, inv, out, out16, qsum + m);
    else
#endif
      quantize_row_portable(a, K, inv, out, out16, qsum + m);
    memset(out + K, 0, (size_t)(Kp - K));
    if (out16) memset(out16 + K, 0, sizeof(int16_t) * (size_t)(Kp - K));
  }
}

static inline float finish(int64_t P, float a_scale, float b_scale) {
  float y = (float)P;
  y = y * a_scale;
  return y * b_scale;
}

static inline float col_scale(const i8_job* j, int64_t n) { return j->b_scale[j->b_scale_count == 1 ? 0 : n]; }

/* ---------------- portable C ---------------- */
static void portable_rows(const i8_job* j, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const int8_t* w = j->B + n * j->K;
    for (int64_t m = 0; m < j->M; ++m) {
      const int8_t* q = j->q + m * j->Kp;
      int64_t P = 0;
      for (int64_t k = 0; k < j->K; ++k) P += (int32_t)q[k] * (int32_t)w[k];
      j->Y[m * j->N + n] = finish(P, j->a_scale, col_scale(j, n));
    }
  }
}

#if QO_I8_X86
/* ---------------- AVX2: int16 products by vpmaddwd ---------------- */
#define QO_I8_AVX2 __attribute__((target("avx2,fma")))

static inline QO_I8_AVX2 int32_t hsum8(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

/* mr A rows x nr weight rows over k in [k0, k1) (k1 - k0 a multiple of 16 or the row's end; the weight's last
 * partial 16 come from a zero-padded copy) */
static inline __attribute__((always_inline)) QO_I8_AVX2 void avx2_tile(const i8_job* j, int mr, int nr, int64_t m0,
                                                                     int64_t n0, int64_t k0, int64_t k1,
                                                                     int64_t* P) {
  __m256i acc[4][2];
  for (int a = 0; a < 4; ++a) acc[a][0] = acc[a][1] = _mm256_setzero_si256();
  const int8_t* w[2];
  for (int r = 0; r < nr; ++r) w[r] = j->B + (n0 + r) * j->K;
  const int64_t kfull = k0 + (k1 - k0) / 16 * 16;
  int64_t k = k0;
  for (; k < kfull; k += 16) {
    __m256i wv[2];
    for (int r = 0; r < nr; ++r) wv[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(w[r] + k)));
    for (int a = 0; a < mr; ++a) {
      const __m256i av = _mm256_loadu_si256((const __m256i*)(j->q16 + (m0 + a) * j->Kp + k));
      for (int r = 0; r < nr; ++r) acc[a][r] = _mm256_add_epi32(acc[a][r], _mm256_madd_epi16(av, wv[r]));
    }
  }
  if (k < k1) { /* the row's last K % 16 elements */
    __m256i wv[2];
    for (int r = 0; r < nr; ++r) {
      int8_t tail[16] = {0};
      memcpy(tail, w[r] + k, (size_t)(k1 - k));
      wv[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)tail));
    }
    for (int a = 0; a < mr; ++a) {
      const __m256i av = _mm256_loadu_si256((const __m256i*)(j->q16 + (m0 + a) * j->Kp + k));
      for (int r = 0; r < nr; ++r) acc[a][r] = _mm256_add_epi32(acc[a][r], _mm256_madd_epi16(av, wv[r]));
    }
  }
  for (int a = 0; a < mr; ++a)
    for (int r = 0; r < nr; ++r) P[a * 8 + r] += hsum8(acc[a][r]);
}

static QO_I8_AVX2 void avx2_rows(const i8_job* j, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; n += 2) {
    const int nr = n1 - n >= 2 ? 2 : 1;
    for (int64_t m = 0; m < j->M; m += 4) {
      const int mr = j->M - m >= 4 ? 4 : (int)(j->M - m);
      int64_t P[32] = {0};
      for (int64_t k0 = 0; k0 < j->K; k0 += QO_I8_KCHUNK) {
        const int64_t k1 = k0 + QO_I8_KCHUNK < j->K ? k0 + QO_I8_KCHUNK : j->K;
#define QO_I8_AVX2_CASE(MR, NR) \
  if (mr == MR && nr == NR) { avx2_tile(j, MR, NR, m, n, k0, k1, P); continue; }
        QO_I8_AVX2_CASE(4, 2) QO_I8_AVX2_CASE(4, 1) QO_I8_AVX2_CASE(3, 2) QO_I8_AVX2_CASE(3, 1)
        QO_I8_AVX2_CASE(2, 2) QO_I8_AVX2_CASE(2, 1) QO_I8_AVX2_CASE(1, 2) QO_I8_AVX2_CASE(1, 1)
#undef QO_I8_AVX2_CASE
      }
      for (int a = 0; a < mr; ++a)
        for (int r = 0; r < nr; ++r)
          j->Y[(m + a) * j->N + n + r] = finish(P[a * 8 + r], j->a_scale, col_scale(j, n + r));
    }
  }
}

/* ---------------- AVX-512 VNNI: vpdpbusd on (weight + 128) x q ---------------- */
#define QO_I8_VNNI __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

static inline __attribute__((always_inline)) QO_I8_VNNI void vnni_tile(const i8_job* j, int mr, int nr, int64_t m0,
                                                                     int64_t n0, int64_t k0, int64_t k1,
                                                                     int prefetch, int64_t* P) {
  __m512i acc[4][8];
  for (int a = 0; a < 4; ++a)
    for (int r = 0; r < 8; ++r) acc[a][r] = _mm512_setzero_si512();
  const __m512i flip = _mm512_set1_epi8((char)0x80);
  const int8_t* w[8];
  for (int r = 0; r < nr; ++r) w[r] = j->B + (n0 + r) * j->K;
  const int64_t kfull = k0 + (k1 - k0) / 64 * 64;
  int64_t k = k0;
  for (; k < kfull; k += 64) {
    __m512i wv[8];
    for (int r = 0; r < nr; ++r) {
      if (prefetch) _mm_prefetch((const char*)(w[r] + k + QO_I8_PF), _MM_HINT_T0);
      wv[r] = _mm512_xor_si512(_mm512_loadu_si512((const void*)(w[r] + k)), flip);
    }
    for (int a = 0; a < mr; ++a) {
      const __m512i av = _mm512_loadu_si512((const void*)(j->q + (m0 + a) * j->Kp + k));
      for (int r = 0; r < nr; ++r) acc[a][r] = _mm512_dpbusd_epi32(acc[a][r], wv[r], av);
    }
  }
  if (k < k1) { /* the row's tail: masked weight bytes load as 0 (+128 after the flip) against q's zero padding */
    const __mmask64 mask = _cvtu64_mask64(~0ULL >> (64 - (k1 - k)));
    __m512i wv[8];
    for (int r = 0; r < nr; ++r) wv[r] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mask, (const void*)(w[r] + k)), flip);
    for (int a = 0; a < mr; ++a) {
      const __m512i av = _mm512_loadu_si512((const void*)(j->q + (m0 + a) * j->Kp + k));
      for (int r = 0; r < nr; ++r) acc[a][r] = _mm512_dpbusd_epi32(acc[a][r], wv[r], av);
    }
  }
  for (int a = 0; a < mr; ++a)
    for (int r = 0; r < nr; ++r) P[a * 8 + r] += _mm512_reduce_add_epi32(acc[a][r]);
}

static QO_I8_VNNI void vnni_rows(const i8_job* j, int64_t n0, int64_t n1) {
  const int gemv = j->M <= QO_I8_GEMV_MAX_M;
  const int nr_max = j->M <= 2 ? 8 : 4;
  for (int64_t n = n0; n < n1; n += nr_max) {
    const int nr = n1 - n >= nr_max ? nr_max : (int)(n1 - n);
    for (int64_t m = 0; m < j->M; m += 4) {
      const int mr = j->M - m >= 4 ? 4 : (int)(j->M - m);
      int64_t P[32] = {0};
      for (int64_t k0 = 0; k0 < j->K; k0 += QO_I8_KCHUNK) {
        const int64_t k1 = k0 + QO_I8_KCHUNK < j->K ? k0 + QO_I8_KCHUNK : j->K;
        if (mr == 1 && nr == 8) vnni_tile(j, 1, 8, m, n, k0, k1, gemv, P);
        else if (mr == 2 && nr == 8) vnni_tile(j, 2, 8, m, n, k0, k1, gemv, P);
        else if (mr == 4 && nr == 4) vnni_tile(j, 4, 4, m, n, k0, k1, gemv, P);
        else if (mr == 3 && nr == 4) vnni_tile(j, 3, 4, m, n, k0, k1, gemv, P);
        else if (mr == 2 && nr == 4) vnni_tile(j, 2, 4, m, n, k0, k1, gemv, P);
        else if (mr == 1 && nr == 4) vnni_tile(j, 1, 4, m, n, k0, k1, gemv, P);
        else
          for (int r = 0; r < nr; ++r) vnni_tile(j, mr, 1, m, n + r, k0, k1, gemv, P + r);
      }
      for (int a = 0; a < mr; ++a)
        for (int r = 0; r < nr; ++r)
          j->Y[(m + a) * j->N + n + r] =
              finish(P[a * 8 + r] - 128 * j->qsum[m + a], j->a_scale, col_scale(j, n + r));
    }
  }
}
#endif /* QO_I8_X86 */

static int pick_path(void) {
  const int isa = qo_cpu_isa(); /* QO_CPU_KERNELS lowers it; DAZ does not matter to integers, but one rule for all */
  if (isa == QO_ISA_AVX512 && qo_cpu_avx512_ext(QO_EXT_VNNI)) return I8_VNNI;
  if (isa >= QO_ISA_AVX2) return I8_AVX2;
  return I8_PORTABLE;
}

static void i8_task(void* data, size_t t) {
  const i8_job* j = (const i8_job*)data;
  const int64_t n0 = (int64_t)t * j->rows_per_task;
  const int64_t n1 = n0 + j->rows_per_task < j->N ? n0 + j->rows_per_task : j->N;
#if QO_I8_X86
  if (j->path == I8_VNNI) {
    vnni_rows(j, n0, n1);
    return;
  }
  if (j->path == I8_AVX2) {
    avx2_rows(j, n0, n1);
    return;
  }
#endif
  portable_rows(j, n0, n1);
}

int qo_matmul_int8_w8a8_f32(const float* A, const int8_t* B, const float* B_scale, int64_t b_scale_count,
                            float A_scale, float* Y, int64_t M, int64_t N, int64_t K) {
  if (!A || !B || !B_scale || !Y || M < 0 || N < 0 || K < 0 || K > QO_I8_KMAX ||
      !(b_scale_count == 1 || b_scale_count == N) || !(A_scale > 0.0f) || isinf(A_scale))
    return QO_ERR_ARGUMENT;
  if (M == 0 || N == 0) return QO_OK;
  const int64_t Kp = (K + 63) / 64 * 64;
  i8_job j = {.B = B, .b_scale = B_scale, .b_scale_count = b_scale_count, .a_scale = A_scale, .M = M, .N = N,
              .K = K, .Kp = Kp, .Y = Y, .path = pick_path(),
              .rows_per_task = M <= QO_I8_GEMV_MAX_M ? QO_I8_GEMV_ROWS : QO_I8_PANEL_ROWS};
  const int64_t q_bytes = M * j.Kp + 64;
  int8_t* q = (int8_t*)malloc((size_t)q_bytes);
  int64_t* qsum = (int64_t*)malloc(sizeof(int64_t) * (size_t)M);
  int16_t* q16 = NULL;
  int status = QO_ERR_ALLOC;
  if (!q || !qsum) goto done;
  if (j.path == I8_AVX2) {
    q16 = (int16_t*)malloc(sizeof(int16_t) * (size_t)(M * j.Kp) + 64);
    if (!q16) goto done;
  }
  const float inv = 1.0f / A_scale;
  /* aligned rows (Kp is a multiple of 64) */
  int8_t* q64 = qo_align64(q);
  int16_t* q16_64 = q16 ? qo_align64(q16) : NULL;
  quantize_rows(A, M, K, j.Kp, inv, j.path, q64, q16_64, qsum);
  j.q = q64;
  j.q16 = q16_64;
  j.qsum = qsum;
  status = qo_cpu_parallel_for(i8_task, (size_t)((N + j.rows_per_task - 1) / j.rows_per_task), &j);
done:
  free(q);
  free(qsum);
  free(q16);
  return status;
}

typedef struct {
  const int8_t* B;
  const float* B_scale;
  int64_t b_scale_count;
  float A_scale;
} i8_f16_args;

static int w8a8_f32_kernel(const float* A, float* Y, int64_t M, int64_t N, int64_t K, const void* args) {
  const i8_f16_args* p = (const i8_f16_args*)args;
  return qo_matmul_int8_w8a8_f32(A, p->B, p->B_scale, p->b_scale_count, p->A_scale, Y, M, N, K);
}

int qo_matmul_int8_w8a8_f16(const uint16_t* A, const int8_t* B, const float* B_scale, int64_t b_scale_count,
                            float A_scale, uint16_t* Y, int64_t M, int64_t N, int64_t K) {
  if (!A || !Y || M < 0 || N < 0 || K < 0) return QO_ERR_ARGUMENT;
  const i8_f16_args args = {B, B_scale, b_scale_count, A_scale};
  return qo_cpu_through_f32(A, Y, M, N, K, w8a8_f32_kernel, &args);
}
