/* CPU kernels of com.quark_onnx QuantizeDequantizeMxfp4 / QuantizeDequantizeNvfp4: Quark's dynamic FP4 activation
 * fake quantization, the float32 arithmetic of builder/ops/mx_activation.py's standard-op subgraphs (which reproduce
 * Quark 0.13's quantizers), per block along the last axis, in one pass.
 *
 * MXFP4, blocks of 32:
 *   amax  = max |x| over the block;  a = max(amax, 2^-126);  p = 2^floor(log2 a) (a's exponent bits)
 *   scale = "even": a >= 1.75 p ? p / 2 : p / 4;  "floor": p / 4;  "ceil": a > p ? p / 2 : p / 4;  max(scale, 2^-127)
 *   y     = e2m1(x / scale) * scale
 * NVFP4, blocks of 16, with the static input_scale_2 s2:
 *   s     = amax / 6 (0 -> float32 eps);  sq = DequantizeLinear(QuantizeLinear(s, s2, e4m3fn, saturate=1), s2)
 *   y     = e2m1(x / (sq == 0 ? eps : sq)) * sq
 * e2m1(v) = clip(round_half_even(v / step) * step, -6, 6), step = 0.5 below |v| = 2, 1 below 4, else 2 (the sign of a
 * zero kept, as ONNX Round). v / step is exact (step a power of two), so it is computed as v * (1 / step).
 *
 * Every path (AVX-512, AVX2, scalar) gives the subgraphs' bits for blocks without a NaN (tests/test_fp4_act_ops.py).
 * An MXFP4 block holding an infinity comes out all NaN, as in the subgraph (its scale becomes infinite); an NVFP4
 * one is finite in both (its scale saturates at 448 s2). A block holding a NaN comes out all NaN (the MXFP4 subgraph
 * stops with a Gather index error there). Rows are split over ORT's intra-op pool when the tensor is large. NVFP4 also
 * by rows (qo_qdq_nvfp4_act_rows_f32), each row of Y from a row of X with its own input_scale_2: the routed experts'
 * rows, one per (token, chosen expert). Compiled with -ffp-contract=off. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "qo_fp_formats.h"
#include "qo_cpu_simd.h"
#include "qo_kernels.h"

#define MXA_BLOCK 32
#define NVA_BLOCK 16
#define FP4A_TASK_ELEMENTS 65536 /* elements per pool task */
#define F32_EPS 0x1p-23f
/* The per-block scalar steps inline into the SIMD loops: called there out of line, they run as legacy SSE code on
 * dirty upper vector state, and each call pays the transition (the NVFP4 AVX-512 path took 17.4 ms instead of 1.8 for
 * 1.8 M elements, one thread). */
#if defined(__GNUC__) || defined(__clang__)
#define FP4A_INLINE static inline __attribute__((always_inline))
#else
#define FP4A_INLINE static inline
#endif

/* the MXFP4 block's scale from its max magnitude (finite, >= 0) */
FP4A_INLINE float mxa_scale(float amax, int mode) {
  const float a = amax < 0x1p-126f ? 0x1p-126f : amax;
  const float p = qo_bits_to_f32(qo_f32_to_bits(a) & 0x7F800000u); /* a is normal: 2^floor(log2 a) */
  int up = 0;
  if (mode == QO_MX_SCALE_EVEN) up = a >= p * 1.75f;
  else if (mode == QO_MX_SCALE_CEIL) up = a > p;
  const float scale = up ? p * 0.5f : p * 0.25f;
  return scale < 0x1p-127f ? 0x1p-127f : scale;
}

/* the NVFP4 block's (scale to multiply back, divisor) from its max magnitude (not NaN; infinite saturates) */
FP4A_INLINE void nva_scale(float amax, float s2, float* mul, float* den) {
  float s = amax / 6.0f;
  if (s == 0.0f) s = F32_EPS;
  const float sq = qo_e4m3fn_qdq(s, s2);
  *mul = sq;
  *den = sq == 0.0f ? F32_EPS : sq;
}

static float e2m1_one(float x, float den, float mul) {
  const float v = x / den;
  const float m = fabsf(v);
  const float step = m < 2.0f ? 0.5f : (m < 4.0f ? 1.0f : 2.0f);
  const int r = qo_round_even_clamp(v * (1.0f / step), -16, 16); /* past +-16 the clip below gives +-6 */
  float q = copysignf((float)r * step, v);
  q = q > 6.0f ? 6.0f : (q < -6.0f ? -6.0f : q);
  return q * mul;
}

/* max |x| of n values; NaN when one is NaN */
static float block_amax(const float* x, int n) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float v = fabsf(x[i]);
    if (v != v) return v;
    if (v > amax) amax = v;
  }
  return amax;
}

FP4A_INLINE void nan_fill(float* y, int n) {
  for (int i = 0; i < n; ++i) y[i] = qo_bits_to_f32(0x7FC00000u);
}

static void mxa_blocks_portable(const float* x, float* y, int64_t blocks, int mode) {
  for (int64_t b = 0; b < blocks; ++b, x += MXA_BLOCK, y += MXA_BLOCK) {
    const float amax = block_amax(x, MXA_BLOCK);
    if (!(amax <= 3.4028235e38f)) { /* an infinity or a NaN */
      nan_fill(y, MXA_BLOCK);
      continue;
    }
    const float scale = mxa_scale(amax, mode);
    for (int i = 0; i < MXA_BLOCK; ++i) y[i] = e2m1_one(x[i], scale, scale);
  }
}

static void nva_blocks_portable(const float* x, float* y, int64_t blocks, float s2) {
  for (int64_t b = 0; b < blocks; ++b, x += NVA_BLOCK, y += NVA_BLOCK) {
    const float amax = block_amax(x, NVA_BLOCK);
    if (amax != amax) {
      nan_fill(y, NVA_BLOCK);
      continue;
    }
    float mul, den;
    nva_scale(amax, s2, &mul, &den);
    for (int i = 0; i < NVA_BLOCK; ++i) y[i] = e2m1_one(x[i], den, mul);
  }
}

#if defined(QO_HAVE_AVX512_HELPERS)
QO_TARGET_BEGIN("avx2,fma")
static inline __m256 e2m1_avx2(__m256 x, __m256 den, __m256 mul) {
  const __m256 v = _mm256_div_ps(x, den);
  const __m256 m = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v);
  const __m256 below4 = _mm256_cmp_ps(m, _mm256_set1_ps(4.0f), _CMP_LT_OQ);
  const __m256 below2 = _mm256_cmp_ps(m, _mm256_set1_ps(2.0f), _CMP_LT_OQ);
  const __m256 inv = _mm256_blendv_ps(_mm256_blendv_ps(_mm256_set1_ps(0.5f), _mm256_set1_ps(1.0f), below4),
                                      _mm256_set1_ps(2.0f), below2);  /* 1 / step */
  const __m256 step = _mm256_blendv_ps(_mm256_blendv_ps(_mm256_set1_ps(2.0f), _mm256_set1_ps(1.0f), below4),
                                       _mm256_set1_ps(0.5f), below2);
  __m256 q = _mm256_mul_ps(_mm256_round_ps(_mm256_mul_ps(v, inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                           step);
  q = _mm256_min_ps(_mm256_max_ps(q, _mm256_set1_ps(-6.0f)), _mm256_set1_ps(6.0f));
  return _mm256_mul_ps(q, mul);
}

/* n / 8 vectors of x: their max |x| (NaN lanes ignored) and whether any lane is NaN (nan_or_inf: or infinite) */
static inline float amax_avx2(const float* x, int vectors, int nan_or_inf, int* bad) {
  const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 mx = _mm256_setzero_ps(), flag = _mm256_setzero_ps();
  for (int j = 0; j < vectors; ++j) {
    const __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + 8 * j), absm);
    flag = _mm256_or_ps(flag, nan_or_inf ? _mm256_cmp_ps(a, _mm256_set1_ps(3.4028235e38f), _CMP_NLE_UQ)
                                         : _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
    mx = _mm256_max_ps(mx, a);
  }
  *bad = _mm256_movemask_ps(flag) != 0;
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
  return _mm_cvtss_f32(h);
}

static void mxa_blocks_avx2(const float* x, float* y, int64_t blocks, int mode) {
  for (int64_t b = 0; b < blocks; ++b, x += MXA_BLOCK, y += MXA_BLOCK) {
    int bad;
    const float amax = amax_avx2(x, 4, 1, &bad);
    if (bad) {
      nan_fill(y, MXA_BLOCK);
      continue;
    }
    const __m256 scale = _mm256_set1_ps(mxa_scale(amax, mode));
    for (int j = 0; j < 4; ++j) _mm256_storeu_ps(y + 8 * j, e2m1_avx2(_mm256_loadu_ps(x + 8 * j), scale, scale));
  }
}

static void nva_blocks_avx2(const float* x, float* y, int64_t blocks, float s2) {
  for (int64_t b = 0; b < blocks; ++b, x += NVA_BLOCK, y += NVA_BLOCK) {
    int bad;
    const float amax = amax_avx2(x, 2, 0, &bad);
    if (bad) {
      nan_fill(y, NVA_BLOCK);
      continue;
    }
    float mul, den;
    nva_scale(amax, s2, &mul, &den);
    const __m256 mv = _mm256_set1_ps(mul), dv = _mm256_set1_ps(den);
    for (int j = 0; j < 2; ++j) _mm256_storeu_ps(y + 8 * j, e2m1_avx2(_mm256_loadu_ps(x + 8 * j), dv, mv));
  }
}
QO_TARGET_END

QO_TARGET_BEGIN("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq")
static inline __m512 e2m1_avx512(__m512 x, __m512 den, __m512 mul) {
  const __m512 v = _mm512_div_ps(x, den);
  const __m512 m = _mm512_abs_ps(v);
  const __mmask16 below4 = _mm512_cmp_ps_mask(m, _mm512_set1_ps(4.0f), _CMP_LT_OQ);
  const __mmask16 below2 = _mm512_cmp_ps_mask(m, _mm512_set1_ps(2.0f), _CMP_LT_OQ);
  const __m512 inv = _mm512_mask_mov_ps(_mm512_mask_mov_ps(_mm512_set1_ps(0.5f), below4, _mm512_set1_ps(1.0f)),
                                        below2, _mm512_set1_ps(2.0f)); /* 1 / step */
  const __m512 step = _mm512_mask_mov_ps(_mm512_mask_mov_ps(_mm512_set1_ps(2.0f), below4, _mm512_set1_ps(1.0f)),
                                         below2, _mm512_set1_ps(0.5f));
  __m512 q = _mm512_mul_ps(_mm512_roundscale_ps(_mm512_mul_ps(v, inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                           step);
  q = _mm512_min_ps(_mm512_max_ps(q, _mm512_set1_ps(-6.0f)), _mm512_set1_ps(6.0f));
  return _mm512_mul_ps(q, mul);
}

static void mxa_blocks_avx512(const float* x, float* y, int64_t blocks, int mode) {
  const __m512 big = _mm512_set1_ps(3.4028235e38f);
  for (int64_t b = 0; b < blocks; ++b, x += MXA_BLOCK, y += MXA_BLOCK) {
    const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    const __m512 a0 = _mm512_abs_ps(v0), a1 = _mm512_abs_ps(v1);
    if (_mm512_cmp_ps_mask(a0, big, _CMP_NLE_UQ) | _mm512_cmp_ps_mask(a1, big, _CMP_NLE_UQ)) {
      nan_fill(y, MXA_BLOCK);
      continue;
    }
    const __m512 scale = _mm512_set1_ps(mxa_scale(_mm512_reduce_max_ps(_mm512_max_ps(a0, a1)), mode));
    _mm512_storeu_ps(y, e2m1_avx512(v0, scale, scale));
    _mm512_storeu_ps(y + 16, e2m1_avx512(v1, scale, scale));
  }
}

static void nva_blocks_avx512(const float* x, float* y, int64_t blocks, float s2) {
  for (int64_t b = 0; b < blocks; ++b, x += NVA_BLOCK, y += NVA_BLOCK) {
    const __m512 v = _mm512_loadu_ps(x), a = _mm512_abs_ps(v);
    if (_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q)) {
      nan_fill(y, NVA_BLOCK);
      continue;
    }
    float mul, den;
    nva_scale(_mm512_reduce_max_ps(a), s2, &mul, &den);
    _mm512_storeu_ps(y, e2m1_avx512(v, _mm512_set1_ps(den), _mm512_set1_ps(mul)));
  }
}
QO_TARGET_END
#endif

typedef struct {
  const float* x;
  float* y;
  int64_t n;
  int nv, mode, isa;
  float s2;
  /* NVFP4 by rows (qo_qdq_nvfp4_act_rows_f32): n = rows * K; row r of Y from row x_rows[r] of X with input_scale_2
   * s2_rows[s_rows[r]] */
  const int64_t *x_rows, *s_rows;
  const float* s2_rows;
  int64_t K;
  int64_t step; /* elements per pool task (whole rows in the by-rows form): fp4a_run */
} fp4a_job;

/* blocks of x into y on the job's path, with the NVFP4 scale s2 */
static void fp4a_blocks(const fp4a_job* j, const float* x, float* y, int64_t blocks, float s2) {
#if defined(QO_HAVE_AVX512_HELPERS)
  if (j->isa == QO_ISA_AVX512) {
    if (j->nv) nva_blocks_avx512(x, y, blocks, s2);
    else mxa_blocks_avx512(x, y, blocks, j->mode);
    return;
  }
  if (j->isa == QO_ISA_AVX2) {
    if (j->nv) nva_blocks_avx2(x, y, blocks, s2);
    else mxa_blocks_avx2(x, y, blocks, j->mode);
    return;
  }
#endif
  if (j->nv) nva_blocks_portable(x, y, blocks, s2);
  else mxa_blocks_portable(x, y, blocks, j->mode);
}

/* elements [i0, i1) of Y (whole rows in the by-rows form) */
static void fp4a_range(const fp4a_job* j, int64_t i0, int64_t i1) {
  const int64_t block = j->nv ? NVA_BLOCK : MXA_BLOCK;
  if (!j->x_rows) {
    fp4a_blocks(j, j->x + i0, j->y + i0, (i1 - i0) / block, j->s2);
    return;
  }
  for (int64_t r = i0 / j->K; r < i1 / j->K; ++r)
    fp4a_blocks(j, j->x + j->x_rows[r] * j->K, j->y + r * j->K, j->K / block, j->s2_rows[j->s_rows[r]]);
}

static void fp4a_task(void* data, size_t t) {
  const fp4a_job* j = (const fp4a_job*)data;
  const int64_t i0 = (int64_t)t * j->step;
  fp4a_range(j, i0, i0 + j->step < j->n ? i0 + j->step : j->n);
}

static int fp4a_run(fp4a_job* j) {
  if (j->n == 0) return QO_OK;
  j->isa = qo_cpu_isa();
  /* tasks of about FP4A_TASK_ELEMENTS, whole rows in the by-rows form */
  j->step = j->x_rows ? (FP4A_TASK_ELEMENTS + j->K - 1) / j->K * j->K : FP4A_TASK_ELEMENTS;
  const size_t tasks = (size_t)((j->n + j->step - 1) / j->step);
  if (tasks == 1) {
    fp4a_range(j, 0, j->n);
    return QO_OK;
  }
  return qo_cpu_parallel_for(fp4a_task, tasks, j);
}

int qo_qdq_mxfp4_act_f32(const float* X, float* Y, int64_t n, int mode) {
  if (n < 0 || n % MXA_BLOCK || (n > 0 && (!X || !Y)) ||
      (mode != QO_MX_SCALE_EVEN && mode != QO_MX_SCALE_FLOOR && mode != QO_MX_SCALE_CEIL))
    return QO_ERR_ARGUMENT;
  fp4a_job j = {X, Y, n, 0, mode, 0, 0.0f, NULL, NULL, NULL, 0, 0};
  return fp4a_run(&j);
}

int qo_qdq_nvfp4_act_f32(const float* X, float input_scale_2, float* Y, int64_t n) {
  if (n < 0 || n % NVA_BLOCK || (n > 0 && (!X || !Y))) return QO_ERR_ARGUMENT;
  fp4a_job j = {X, Y, n, 1, 0, 0, input_scale_2, NULL, NULL, NULL, 0, 0};
  return fp4a_run(&j);
}

int qo_qdq_nvfp4_act_rows_f32(const float* X, const int64_t* x_rows, const float* input_scale_2,
                              const int64_t* s_rows, float* Y, int64_t rows, int64_t K) {
  if (rows < 0 || K <= 0 || K % NVA_BLOCK || (rows > 0 && (!X || !x_rows || !input_scale_2 || !s_rows || !Y)))
    return QO_ERR_ARGUMENT;
  fp4a_job j = {X, Y, rows * K, 1, 0, 0, 0.0f, x_rows, s_rows, input_scale_2, K, 0};
  return fp4a_run(&j);
}
