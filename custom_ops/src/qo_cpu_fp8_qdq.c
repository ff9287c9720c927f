/* CPU kernel of com.quark_onnx QuantizeDequantizeFp8: an activation's static per-tensor FP8 fake quantization,
 *
 *   Y = DequantizeLinear(QuantizeLinear(X, s, float8e4m3fn zero point, saturate = 1), s)
 *     = e4m3fn value of sat(X / s), as float32 (exact), times s (rounded once),
 *
 * the pair of standard ops the graph has without the library, bit for bit: ONNX Runtime's float8 QuantizeLinear
 * divides (x / scale), rounds half to even, saturates |x / s| >= 448 (and +-inf) to +-448 and keeps NaN (+-NaN ->
 * the code 0x7F / 0xFF, dequantized to +-qNaN); its DequantizeLinear multiplies the code's value by s. Checked against
 * ONNX Runtime 1.32's pair on every float32 bit pattern class by tests/test_fp8_qdq_op.py. Quark's FP8 fake quantizer
 * divides too (qo_cpu_kernels.c, FP8 W8A8).
 *
 * One pass over X, 16 (AVX-512) or 8 (AVX2) elements a step; the portable path is the scalar qo_fp_formats.h
 * conversion. Every path gives the same bits: the division is IEEE's, the rounding is done on the quotient's bits
 * (add 2^19 - 1 plus the kept lowest bit, clear 20 bits) for quotients of at least 2^-6 and as rint(q * 512) / 512
 * below (e4m3fn subnormals are multiples of 2^-9), both exact. Rows are split over ORT's intra-op pool
 * (qo_cpu_parallel_for) when X is large. Compiled with -ffp-contract=off. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "qo_fp_formats.h"
#include "qo_cpu_simd.h"
#include "qo_kernels.h"

#define QDQ_TASK_ELEMENTS 65536 /* elements per pool task (about 20 us of one thread) */

static void qdq_portable(const float* x, float s, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = qo_e4m3fn_qdq(x[i], s);
}

#if defined(QO_HAVE_AVX512_HELPERS)
QO_TARGET_BEGIN("avx2,fma")
/* 8 quotients v -> their e4m3fn values as float32 (sign kept; NaN -> qNaN of v's sign) */
static inline __m256 e4m3_round_avx2(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i sign = _mm256_and_si256(bits, _mm256_set1_epi32((int)0x80000000u));
  const __m256i mag = _mm256_and_si256(bits, _mm256_set1_epi32(0x7FFFFFFF));
  /* normal: round half to even at bit 20, clear bits 0..19 */
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(mag, 20), _mm256_set1_epi32(1));
  const __m256i normal = _mm256_and_si256(_mm256_add_epi32(mag, _mm256_add_epi32(_mm256_set1_epi32(0x7FFFF), odd)),
                                          _mm256_set1_epi32((int)0xFFF00000u));
  /* below 2^-6: rint(|v| * 512) * 2^-9 */
  const __m256 units = _mm256_round_ps(_mm256_mul_ps(_mm256_castsi256_ps(mag), _mm256_set1_ps(512.0f)),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256i sub = _mm256_castps_si256(_mm256_mul_ps(units, _mm256_set1_ps(0x1p-9f)));
  __m256i r = _mm256_blendv_epi8(normal, sub, _mm256_cmpgt_epi32(_mm256_set1_epi32(0x3C800000), mag));
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x43E00000), _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x43DFFFFF)));
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC00000), _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7F800000)));
  return _mm256_castsi256_ps(_mm256_or_si256(r, sign));
}

static void qdq_avx2(const float* x, float s, float* y, int64_t n) {
  const __m256 sv = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_mul_ps(e4m3_round_avx2(_mm256_div_ps(_mm256_loadu_ps(x + i), sv)), sv));
  for (; i < n; ++i) y[i] = qo_e4m3fn_qdq(x[i], s);
}
QO_TARGET_END

QO_TARGET_BEGIN("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq")
static inline __m512 e4m3_round_avx512(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i sign = _mm512_and_si512(bits, _mm512_set1_epi32((int)0x80000000u));
  const __m512i mag = _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF));
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(mag, 20), _mm512_set1_epi32(1));
  __m512i r = _mm512_and_si512(_mm512_add_epi32(mag, _mm512_add_epi32(_mm512_set1_epi32(0x7FFFF), odd)),
                               _mm512_set1_epi32((int)0xFFF00000u));
  const __m512 units = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_castsi512_ps(mag), _mm512_set1_ps(512.0f)),
                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512i sub = _mm512_castps_si512(_mm512_mul_ps(units, _mm512_set1_ps(0x1p-9f)));
  r = _mm512_mask_mov_epi32(r, _mm512_cmplt_epu32_mask(mag, _mm512_set1_epi32(0x3C800000)), sub);
  r = _mm512_mask_mov_epi32(r, _mm512_cmpge_epu32_mask(mag, _mm512_set1_epi32(0x43E00000)),
                            _mm512_set1_epi32(0x43E00000));
  r = _mm512_mask_mov_epi32(r, _mm512_cmpgt_epu32_mask(mag, _mm512_set1_epi32(0x7F800000)),
                            _mm512_set1_epi32(0x7FC00000));
  return _mm512_castsi512_ps(_mm512_or_si512(r, sign));
}

static void qdq_avx512(const float* x, float s, float* y, int64_t n) {
  const __m512 sv = _mm512_set1_ps(s);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i, _mm512_mul_ps(e4m3_round_avx512(_mm512_div_ps(_mm512_loadu_ps(x + i), sv)), sv));
  for (; i < n; ++i) y[i] = qo_e4m3fn_qdq(x[i], s);
}
QO_TARGET_END
#endif

typedef struct {
  const float* x;
  float s;
  float* y;
  int64_t n;
  int isa;
} qdq_job;

static void qdq_range(const qdq_job* j, int64_t i0, int64_t i1) {
#if defined(QO_HAVE_AVX512_HELPERS)
  if (j->isa == QO_ISA_AVX512) {
    qdq_avx512(j->x + i0, j->s, j->y + i0, i1 - i0);
    return;
  }
  if (j->isa == QO_ISA_AVX2) {
    qdq_avx2(j->x + i0, j->s, j->y + i0, i1 - i0);
    return;
  }
#endif
  qdq_portable(j->x + i0, j->s, j->y + i0, i1 - i0);
}

static void qdq_task(void* data, size_t t) {
  const qdq_job* j = (const qdq_job*)data;
  const int64_t i0 = (int64_t)t * QDQ_TASK_ELEMENTS;
  const int64_t i1 = i0 + QDQ_TASK_ELEMENTS < j->n ? i0 + QDQ_TASK_ELEMENTS : j->n;
  qdq_range(j, i0, i1);
}

int qo_qdq_fp8_f32(const float* X, float scale, float* Y, int64_t n) {
  if (n < 0 || (n > 0 && (!X || !Y))) return QO_ERR_ARGUMENT;
  if (n == 0) return QO_OK;
  qdq_job j = {X, scale, Y, n, qo_cpu_isa()};
  const size_t tasks = (size_t)((n + QDQ_TASK_ELEMENTS - 1) / QDQ_TASK_ELEMENTS);
  if (tasks == 1) {
    qdq_range(&j, 0, n);
    return QO_OK;
  }
  return qo_cpu_parallel_for(qdq_task, tasks, &j);
}
