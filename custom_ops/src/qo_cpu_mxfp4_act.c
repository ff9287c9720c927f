/* CPU kernel of com.quark_onnx QuantizeDequantizeMxfp4: Quark's dynamic MXFP4 activation fake quantization, the
 * float32 arithmetic of builder/ops/mx_activation.py's standard-op subgraph (which reproduces Quark 0.13's
 * PerBlockMXObserver + e2m1 rounding), per block of 32 along the last axis, in one pass:
 *
 *   amax  = max |x| over the block;  a = max(amax, 2^-126);  p = 2^floor(log2 a) (a's exponent bits)
 *   scale = "even": a >= 1.75 p ? p / 2 : p / 4;  "floor": p / 4;  "ceil": a > p ? p / 2 : p / 4;  max(scale, 2^-127)
 *   s     = x / scale (IEEE division);  step = 0.5 below |s| = 2, 1 below 4, else 2
 *   y     = clip(round_half_even(s / step) * step, -6, 6) * scale     (the sign of a zero kept, as ONNX Round)
 *
 * s / step is exact (step a power of two, |s| < 8), so it is computed as s * (1 / step). Every path (AVX-512, AVX2,
 * scalar) gives the subgraph's bits for finite blocks (tests/test_mxfp4_act_op.py). A block holding an infinity or a
 * NaN comes out all NaN: the subgraph gives NaN for every element of a block with an infinity, and stops with a
 * Gather index error on a NaN block. Rows are split over ORT's intra-op pool when the tensor is large. Compiled with
 * -ffp-contract=off. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "qo_fp_formats.h"
#include "qo_cpu_simd.h"
#include "qo_kernels.h"

#define MXA_BLOCK 32
#define MXA_TASK_BLOCKS 2048 /* blocks per pool task (65536 elements) */

/* the block's scale from its max magnitude (finite, >= 0) */
static float mxa_scale(float amax, int mode) {
  const float a = amax < 0x1p-126f ? 0x1p-126f : amax;
  const float p = qo_bits_to_f32(qo_f32_to_bits(a) & 0x7F800000u); /* a is normal: 2^floor(log2 a) */
  int up = 0;
  if (mode == QO_MX_SCALE_EVEN) up = a >= p * 1.75f;
  else if (mode == QO_MX_SCALE_CEIL) up = a > p;
  const float scale = up ? p * 0.5f : p * 0.25f;
  return scale < 0x1p-127f ? 0x1p-127f : scale;
}

static float mxa_one(float x, float scale) {
  const float s = x / scale;
  const float m = fabsf(s);
  const float step = m < 2.0f ? 0.5f : (m < 4.0f ? 1.0f : 2.0f);
  const int r = qo_round_even_clamp(s * (1.0f / step), -16, 16); /* |s / step| < 16 */
  float q = copysignf((float)r * step, s);
  q = q > 6.0f ? 6.0f : (q < -6.0f ? -6.0f : q);
  return q * scale;
}

static void mxa_blocks_portable(const float* x, float* y, int64_t blocks, int mode) {
  for (int64_t b = 0; b < blocks; ++b, x += MXA_BLOCK, y += MXA_BLOCK) {
    float amax = 0.0f;
    int finite = 1;
    for (int i = 0; i < MXA_BLOCK; ++i) {
      const float v = fabsf(x[i]);
      if (!(v <= 3.4028235e38f)) finite = 0;
      else if (v > amax) amax = v;
    }
    if (!finite) {
      for (int i = 0; i < MXA_BLOCK; ++i) y[i] = qo_bits_to_f32(0x7FC00000u);
      continue;
    }
    const float scale = mxa_scale(amax, mode);
    for (int i = 0; i < MXA_BLOCK; ++i) y[i] = mxa_one(x[i], scale);
  }
}

#if defined(QO_HAVE_AVX512_HELPERS)
QO_TARGET_BEGIN("avx2,fma")
static inline __m256 mxa_avx2_one(__m256 x, __m256 scale) {
  const __m256 s = _mm256_div_ps(x, scale);
  const __m256 m = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), s);
  __m256 inv = _mm256_blendv_ps(_mm256_set1_ps(0.5f), _mm256_set1_ps(1.0f),
                                _mm256_cmp_ps(m, _mm256_set1_ps(4.0f), _CMP_LT_OQ));
  inv = _mm256_blendv_ps(inv, _mm256_set1_ps(2.0f), _mm256_cmp_ps(m, _mm256_set1_ps(2.0f), _CMP_LT_OQ));
  const __m256 step = _mm256_div_ps(_mm256_set1_ps(1.0f), inv); /* exact: a power of two */
  __m256 q = _mm256_mul_ps(_mm256_round_ps(_mm256_mul_ps(s, inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                           step);
  q = _mm256_min_ps(_mm256_max_ps(q, _mm256_set1_ps(-6.0f)), _mm256_set1_ps(6.0f));
  return _mm256_mul_ps(q, scale);
}

static void mxa_blocks_avx2(const float* x, float* y, int64_t blocks, int mode) {
  const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int64_t b = 0; b < blocks; ++b, x += MXA_BLOCK, y += MXA_BLOCK) {
    __m256 v[4], mx = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm256_loadu_ps(x + 8 * j);
      const __m256 a = _mm256_and_ps(v[j], absm);
      bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, _mm256_set1_ps(3.4028235e38f), _CMP_NLE_UQ)); /* inf, NaN */
      mx = _mm256_max_ps(mx, a);
    }
    if (_mm256_movemask_ps(bad)) {
      for (int j = 0; j < 4; ++j) _mm256_storeu_ps(y + 8 * j, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)));
      continue;
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    const __m256 scale = _mm256_set1_ps(mxa_scale(_mm_cvtss_f32(h), mode));
    for (int j = 0; j < 4; ++j) _mm256_storeu_ps(y + 8 * j, mxa_avx2_one(v[j], scale));
  }
}
QO_TARGET_END

QO_TARGET_BEGIN("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq")
static inline __m512 mxa_avx512_one(__m512 x, __m512 scale) {
  const __m512 s = _mm512_div_ps(x, scale);
  const __m512 m = _mm512_abs_ps(s);
  __m512 inv = _mm512_mask_mov_ps(_mm512_set1_ps(0.5f), _mm512_cmp_ps_mask(m, _mm512_set1_ps(4.0f), _CMP_LT_OQ),
                                  _mm512_set1_ps(1.0f));
  inv = _mm512_mask_mov_ps(inv, _mm512_cmp_ps_mask(m, _mm512_set1_ps(2.0f), _CMP_LT_OQ), _mm512_set1_ps(2.0f));
  const __m512 step = _mm512_div_ps(_mm512_set1_ps(1.0f), inv);
  __m512 q = _mm512_mul_ps(_mm512_roundscale_ps(_mm512_mul_ps(s, inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                           step);
  q = _mm512_min_ps(_mm512_max_ps(q, _mm512_set1_ps(-6.0f)), _mm512_set1_ps(6.0f));
  return _mm512_mul_ps(q, scale);
}

static void mxa_blocks_avx512(const float* x, float* y, int64_t blocks, int mode) {
  for (int64_t b = 0; b < blocks; ++b, x += MXA_BLOCK, y += MXA_BLOCK) {
    const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    const __m512 a0 = _mm512_abs_ps(v0), a1 = _mm512_abs_ps(v1);
    const __m512 big = _mm512_set1_ps(3.4028235e38f);
    if (_mm512_cmp_ps_mask(a0, big, _CMP_NLE_UQ) | _mm512_cmp_ps_mask(a1, big, _CMP_NLE_UQ)) {
      const __m512 nan = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FC00000));
      _mm512_storeu_ps(y, nan);
      _mm512_storeu_ps(y + 16, nan);
      continue;
    }
    const __m512 scale = _mm512_set1_ps(mxa_scale(_mm512_reduce_max_ps(_mm512_max_ps(a0, a1)), mode));
    _mm512_storeu_ps(y, mxa_avx512_one(v0, scale));
    _mm512_storeu_ps(y + 16, mxa_avx512_one(v1, scale));
  }
}
QO_TARGET_END
#endif

typedef struct {
  const float* x;
  float* y;
  int64_t blocks;
  int mode, isa;
} mxa_job;

static void mxa_range(const mxa_job* j, int64_t b0, int64_t b1) {
  const float* x = j->x + b0 * MXA_BLOCK;
  float* y = j->y + b0 * MXA_BLOCK;
#if defined(QO_HAVE_AVX512_HELPERS)
  if (j->isa == QO_ISA_AVX512) {
    mxa_blocks_avx512(x, y, b1 - b0, j->mode);
    return;
  }
  if (j->isa == QO_ISA_AVX2) {
    mxa_blocks_avx2(x, y, b1 - b0, j->mode);
    return;
  }
#endif
  mxa_blocks_portable(x, y, b1 - b0, j->mode);
}

static void mxa_task(void* data, size_t t) {
  const mxa_job* j = (const mxa_job*)data;
  const int64_t b0 = (int64_t)t * MXA_TASK_BLOCKS;
  mxa_range(j, b0, b0 + MXA_TASK_BLOCKS < j->blocks ? b0 + MXA_TASK_BLOCKS : j->blocks);
}

int qo_qdq_mxfp4_act_f32(const float* X, float* Y, int64_t n, int mode) {
  if (n < 0 || n % MXA_BLOCK || (n > 0 && (!X || !Y)) ||
      (mode != QO_MX_SCALE_EVEN && mode != QO_MX_SCALE_FLOOR && mode != QO_MX_SCALE_CEIL))
    return QO_ERR_ARGUMENT;
  if (n == 0) return QO_OK;
  mxa_job j = {X, Y, n / MXA_BLOCK, mode, qo_cpu_isa()};
  const size_t tasks = (size_t)((j.blocks + MXA_TASK_BLOCKS - 1) / MXA_TASK_BLOCKS);
  if (tasks == 1) {
    mxa_range(&j, 0, j.blocks);
    return QO_OK;
  }
  return qo_cpu_parallel_for(mxa_task, tasks, &j);
}
