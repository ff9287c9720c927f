/* Shared by the CPU kernel sources (qo_cpu_kernels.c and any other kernel file): which SIMD path to run, and the
 * AVX-512 decode helpers of the compact weight formats.
 *
 * qo_cpu_isa(): the widest path this CPU runs (QO_ISA_AVX512 needs AVX-512 F + BW + VL + DQ, QO_ISA_AVX2 needs
 * AVX2 + FMA + F16C; __builtin_cpu_supports, detected once), lowered by the environment variable
 * QO_CPU_KERNELS=portable | avx2 | avx512 (read at every call, for tests and benchmarks; a path the CPU lacks is
 * never picked), and QO_ISA_PORTABLE while the caller's MXCSR has DAZ set (denormal inputs would be flushed).
 * Every path must give the same bits (the fixed summation order of qo_cpu_kernels.c's header comment).
 *
 * qo_fold8 (and qo_fold8_avx2) is the 8-lane fold of qo_kernels.h's summation order. qo_avx_fp8x8(p): 8 e4m3fn
 * codes -> float32 on AVX2 + F16C (the fp16 route, exact for every code; NaN codes -> +qNaN).
 * The qoz_* helpers carry their own target attribute, so a file can include this header without pragmas; they
 * inline into functions compiled for AVX-512 (F/BW/VL/DQ) only. Each decodes exactly (no rounding):
 *   qoz_join(lo, hi)            two 8-float vectors as one zmm [lo | hi]
 *   qoz_fp8x16(codes, normal)   16 e4m3fn codes -> float32 (integer route when every magnitude is 8..0x7E, else
 *                               the fp16 route; NaN codes -> +qNaN); qoz_fp8_special32(p) says which to take
 *   qoz_fp8x32(codes, lo, hi)   32 e4m3fn codes -> 2 x 16 float32, no branch (the fp16 route for every code)
 *   qoz_int8x16(codes)          16 int8 -> float32
 *   qoz_bf16x16(bits)           16 bf16 bit patterns -> float32 */
#ifndef QO_CPU_SIMD_H
#define QO_CPU_SIMD_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

enum { QO_ISA_PORTABLE = 0, QO_ISA_AVX2 = 1, QO_ISA_AVX512 = 2 };

/* The functions between QO_TARGET_BEGIN("avx2,fma") and QO_TARGET_END are compiled for those ISA extensions (GCC's
 * target pragma, clang's attribute push); the file picks the path at run time (qo_cpu_isa). */
#define QO_PRAGMA(x) _Pragma(#x)
#if defined(__clang__)
#define QO_TARGET_BEGIN(isa) QO_PRAGMA(clang attribute push(__attribute__((target(isa))), apply_to = function))
#define QO_TARGET_END QO_PRAGMA(clang attribute pop)
#else
#define QO_TARGET_BEGIN(isa) QO_PRAGMA(GCC push_options) QO_PRAGMA(GCC target(isa))
#define QO_TARGET_END QO_PRAGMA(GCC pop_options)
#endif

/* Defined in qo_cpu_kernels.c (not exported from the library). */
int qo_cpu_isa(void);
enum { QO_EXT_VBMI = 0, QO_EXT_VNNI = 1 };
int qo_cpu_avx512_ext(int ext); /* AVX512_VBMI / AVX512_VNNI present and not turned off (QO_CPU_KERNELS) */
/* An fp16-io entry point through a float32 kernel: A widened exactly, kernel(A32, Y32, M, N, K, args), Y rounded to
 * nearest even; QO_ERR_ALLOC when the buffers cannot be had. */
typedef int (*qo_f32_kernel_fn)(const float* A, float* Y, int64_t M, int64_t N, int64_t K, const void* args);
int qo_cpu_through_f32(const uint16_t* A, uint16_t* Y, int64_t M, int64_t N, int64_t K, qo_f32_kernel_fn kernel,
                       const void* args);
/* v rounded half to even, whatever the caller's rounding mode, and clamped to [lo, hi] (small integers: |v| < 2^7 past
 * the clamp); NaN -> lo. The activation quantizers' scalar step (qo_cpu_int8_w8a8.c, qo_cpu_int4_a8.c), which their
 * SIMD code matches with an explicit rounding immediate. */
static inline int qo_round_even_clamp(float v, int lo, int hi) {
  if (!(v > (float)lo)) return lo; /* NaN too */
  if (v >= (float)hi) return hi;
  const int r = (int)v;           /* toward zero, exact */
  const float d = v - (float)r;   /* exact */
  if (d > 0.5f || (d == 0.5f && (r & 1))) return r + 1;
  if (d < -0.5f || (d == -0.5f && (r & 1))) return r - 1;
  return r;
}

/* The fold every 8-lane sum of the CPU kernels ends in (qo_kernels.h): ((l0 + l4) + (l2 + l6)) + ((l1 + l5) +
 * (l3 + l7)); qo_fold8_avx2 below does the same three additions on a vector. */
static inline float qo_fold8(const float l[8]) {
  const float s0 = l[0] + l[4], s1 = l[1] + l[5], s2 = l[2] + l[6], s3 = l[3] + l[7];
  return (s0 + s2) + (s1 + s3);
}

#if defined(_MSC_VER)
#define QO_THREAD_LOCAL __declspec(thread)
#else
#define QO_THREAD_LOCAL __thread
#endif

/* A thread-local buffer kept between calls (a fresh malloc per task is an mmap whose page faults cost more than the
 * work; released at process exit): *buffer grown to at least `want` floats, 64 bytes over (room for qo_align64);
 * NULL when the allocation fails. */
static inline float* qo_tls_grow(float** buffer, size_t* have, size_t want) {
  if (*have < want) {
    float* grown = (float*)realloc(*buffer, sizeof(float) * want + 64);
    if (!grown) return NULL;
    *buffer = grown;
    *have = want;
  }
  return *buffer;
}

/* p rounded up to a multiple of 64 bytes (buffers allocated 64 bytes longer): a kernel's prepared operands start on
 * a cache line, so no vector load of them splits one (glibc's large blocks start 16 bytes into a page). */
static inline void* qo_align64(void* p) { return (void*)(((uintptr_t)p + 63) & ~(uintptr_t)63); }

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(QO_NO_CLONES) && \
    !defined(QO_PORTABLE_ONLY)
#define QO_HAVE_AVX512_HELPERS 1
#include <immintrin.h>

#define QOZ_INLINE \
  static inline __attribute__((always_inline, target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")))

/* qo_fold8 on an 8-float vector: (l_j + l_j+4), then (s0 + s2, s1 + s3), then t0 + t1. */
static inline __attribute__((always_inline, target("avx2,fma"))) float qo_fold8_avx2(__m256 x) {
  __m128 v = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  v = _mm_add_ps(v, _mm_movehl_ps(v, v));
  return _mm_cvtss_f32(_mm_add_ss(v, _mm_shuffle_ps(v, v, 1)));
}

/* 8 e4m3fn codes -> float32, exact for every code (AVX2 + F16C): the code's sign to bit 15 and magnitude to bits
 * 7..13 make an fp16 number 2^-8 times the e4m3 value (subnormals on fp16 subnormals); vcvtph2ps widens it exactly,
 * times 2^8 is exact; NaN codes (0x7F / 0xFF) blended in. */
#define QOA_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))
QOA_INLINE __m128i qo_avx_fp8_to_half_bits(__m128i codes8) { /* 8 codes in the low 8 bytes -> 8 fp16 patterns */
  return _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(codes8), 7), _mm_set1_epi16((short)0xBF80));
}

QOA_INLINE __m256 qo_avx_fp8x8_finite(__m128i codes8) { /* NaN codes not handled */
  return _mm256_mul_ps(_mm256_cvtph_ps(qo_avx_fp8_to_half_bits(codes8)), _mm256_set1_ps(256.0f));
}

QOA_INLINE __m256 qo_avx_fp8x8(const uint8_t* p) {
  const __m128i codes = _mm_loadl_epi64((const __m128i*)p);
  const __m256 v = qo_avx_fp8x8_finite(codes);
  const __m128i m7f = _mm_set1_epi8(0x7F);
  const __m128i nan8 = _mm_cmpeq_epi8(_mm_and_si128(codes, m7f), m7f);
  const __m256i nan = _mm256_cvtepi8_epi32(nan8);
  return _mm256_blendv_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)), _mm256_castsi256_ps(nan));
}

QOZ_INLINE __m512 qoz_join(__m256 lo, __m256 hi) { return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1); }

QOZ_INLINE __m512 qoz_fp8x16(__m128i codes, int all_normal) {
  if (all_normal) { /* sign to bit 31, magnitude to bits 20..26, + 120 on the float32 exponent */
    const __m512i x = _mm512_cvtepi8_epi32(codes);
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_and_si512(_mm512_slli_epi32(x, 20),
                                                                 _mm512_set1_epi32((int)0x87F00000u)),
                                                _mm512_set1_epi32(120 << 23)));
  }
  /* fp16 2^-8 times the value (subnormal codes on fp16 subnormals), widened exactly, times 2^8 (exact) */
  const __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(codes), 7),
                                     _mm256_set1_epi16((short)0xBF80));
  const __m512 v = _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0f));
  const __m128i m7f = _mm_set1_epi8(0x7F);
  const __mmask16 nan = _mm_cmpeq_epi8_mask(_mm_and_si128(codes, m7f), m7f);
  return _mm512_mask_blend_ps(nan, v, _mm512_castsi512_ps(_mm512_set1_epi32(0x7FC00000)));
}

/* 32 e4m3fn codes -> float32, codes 0..15 into *lo and 16..31 into *hi, every code exact and without a branch:
 * the fp16 route of qoz_fp8x16 (sign to bit 15, magnitude to bits 7..13: an fp16 number 2^-8 times the value,
 * subnormal codes on fp16 subnormals; vcvtph2ps widens exactly, times 2^8 is exact), NaN codes -> +qNaN. */
QOZ_INLINE void qoz_fp8x32(__m256i codes, __m512* lo, __m512* hi) {
  const __m512i x = _mm512_cvtepi8_epi16(codes);
  const __m512i h = _mm512_and_si512(_mm512_slli_epi16(x, 7), _mm512_set1_epi16((short)0xBF80));
  const __mmask32 nan = _mm512_cmpeq_epi16_mask(_mm512_and_si512(x, _mm512_set1_epi16(0x7F)),
                                                _mm512_set1_epi16(0x7F));
  const __m512 k256 = _mm512_set1_ps(256.0f), qnan = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FC00000));
  *lo = _mm512_mask_blend_ps((__mmask16)nan, _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(h)), k256), qnan);
  *hi = _mm512_mask_blend_ps((__mmask16)(nan >> 16),
                             _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)), k256), qnan);
}

QOZ_INLINE __m512 qoz_int8x16(__m128i codes) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(codes)); }

QOZ_INLINE __m512 qoz_bf16x16(__m256i bits) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

/* Any of the 32 e4m3fn codes at p zero, subnormal or NaN (magnitude + 1, as a signed byte, <= 8 exactly then)? */
QOZ_INLINE int qoz_fp8_special32(const uint8_t* p) {
  const __m256i raw = _mm256_loadu_si256((const __m256i*)p);
  const __m256i t = _mm256_add_epi8(_mm256_and_si256(raw, _mm256_set1_epi8(0x7F)), _mm256_set1_epi8(1));
  return _mm256_movemask_epi8(_mm256_cmpgt_epi8(_mm256_set1_epi8(9), t)) != 0;
}
#endif

#endif /* QO_CPU_SIMD_H */
