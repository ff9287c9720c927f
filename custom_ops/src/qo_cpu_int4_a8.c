/* CPU kernel of 4-bit per-group weights times int8-quantized activations: the arithmetic of onnxruntime's
 * MatMulNBits and QMoE at accuracy_level 4 (MLAS "CompInt8"), read from the stored weight in place (no pre-packed
 * copy). It serves MatMulExpertsUint4 / MatMulExpertsInt4 with accuracy_level = 4 (qo_cpu_experts.c) and the dense
 * entry qo_matmul_int4_a8_f32 (tests and benchmarks).
 *
 * Activations, per row and per weight block b of `block` elements (the last one padded with zeros past K), as MLAS
 * quantizes them (onnxruntime/core/mlas/lib/sqnbitgemm_kernel_avx512.cpp, QuantizeARow_CompInt8_avx512: amax over
 * the block, scale = amax / 127, inverse = 127 / amax, each element multiplied by the inverse and rounded to nearest
 * even):
 *   amax_b = max |a[k]|;  sa_b = fp32(amax_b / 127);  inv_b = amax_b ? fp32(127 / amax_b) : 0
 *   qa[k]  = clamp(round_half_even(fp32(a[k] * inv_b)), -127, 127)     (NaN -> -127; C, AVX2 or AVX-512: the same
 *                                                                       codes, whatever the caller's rounding mode)
 * Weight: MatMulNBits' 4-bit layout (qo_cpu_int4.c's header: codes [N, k_blocks, block/2], even k in the low nibble;
 * fp32 scales sw [N, k_blocks]; zero points packed uint4 [N, ceil(k_blocks/2)] or NULL = 8).
 *
 *   v_b  = sum_{k in b} qa[k] * (q[k] - z_b)                    an exact integer (int32: |v_b| <= block * 15 * 127)
 *   Y    = sum_b fp32(v_b) * fp32(sa_b * sw_b)                 in ONE float order on every path:
 * 16 lanes, lane l accumulates blocks b = l (mod 16) in increasing b, each step one fmaf(v_b, sa_b * sw_b, lane) from
 * +0; the lanes fold by halves, x[p] += x[p + h] for h = 8, 4, 2, 1. The integers are exact, so the bits depend on
 * neither the CPU (portable C, AVX2, AVX-512 VNNI), nor M, nor the tile, nor the thread count. MLAS computes the same
 * v_b (as sum qa q, then subtracts z sum qa in float through its block sums) and sums in its own order, so this
 * equals MatMulNBits / QMoE at accuracy_level 4 up to float summation order, not bit for bit.
 *
 * Paths: AVX-512 with VNNI (vpdpbusd: the nibbles are the unsigned operand, qa the signed one) and AVX2 (vpmaddubsw
 * then vpmaddwd: the int16 pair sums are at most 2 * 15 * 127, so they never saturate), both for block % 32 == 0
 * up to 256; portable C otherwise. A prepared row holds qa reordered for the nibble lanes (per 128 elements: the 64
 * even elements of its four 32-element units, then the 64 odd ones: a 64-byte load of codes masked to its low
 * nibbles meets the even half, shifted down the odd half), then sa_b and sum_{k in b} qa[k], all padded to a
 * multiple of 16 blocks. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qo_cpu_simd.h"
#include "qo_kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(QO_NO_CLONES) && \
    !defined(QO_PORTABLE_ONLY)
#define QO_A8_X86 1
#include <immintrin.h>
#else
#define QO_A8_X86 0
#endif

enum { A8_PORTABLE = 0, A8_AVX2 = 1, A8_VNNI = 2 };
#define A8_GROUP 16       /* blocks per step: the 16 float lanes */
#define A8_MAX_UNITS 8    /* SIMD paths: block <= 256 (8 units of 32) */
#define A8_ROWS_PER_TASK 16
#define A8_PF 1024        /* bytes ahead of the weight row's read, prefetched */

typedef struct {
  int64_t K, block, k_blocks, groups, code_bytes, stride; /* stride: bytes of one prepared row, a multiple of 64 */
} a8_shape;

static a8_shape shape_of(int64_t K, int64_t block) {
  a8_shape s;
  s.K = K;
  s.block = block;
  s.k_blocks = (K + block - 1) / block;
  s.groups = (s.k_blocks + A8_GROUP - 1) / A8_GROUP;
  s.code_bytes = s.groups * A8_GROUP * block; /* a multiple of 128 for block >= 8 */
  s.stride = (s.code_bytes + s.groups * A8_GROUP * 8 + 63) / 64 * 64;
  return s;
}

/* where element k of a row sits among the prepared codes */
static inline int64_t code_pos(int64_t k) {
  const int64_t e = k & 31;
  return (k & ~(int64_t)127) + (e & 1) * 64 + ((k >> 5) & 3) * 16 + (e >> 1);
}

static inline int8_t round_q(float v) { return (int8_t)qo_round_even_clamp(v, -127, 127); } /* NaN -> -127 */

#if QO_A8_X86
/* 32 elements of a row (a unit, all in the row) to their codes: the scalar loop's values (fp32(a * inv), rounded half
 * to even by the explicit rounding immediate, clamped: vmaxps gives -127 for a NaN product, as round_q), stored as
 * the unit's 16 even then 16 odd codes; returns their sum. */
static __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq"))) int32_t unit_codes_avx512(
    const float* a, float inv, int8_t* even, int8_t* odd) {
  const __m512 vinv = _mm512_set1_ps(inv), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  const __m512 v0 = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(_mm512_loadu_ps(a), vinv), lo), hi);
  const __m512 v1 = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(_mm512_loadu_ps(a + 16), vinv), lo), hi);
  const __m512i i0 = _mm512_cvt_roundps_epi32(v0, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512i i1 = _mm512_cvt_roundps_epi32(v1, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  const __m512i e = _mm512_permutex2var_epi32(i0, ev, i1), o = _mm512_permutex2var_epi32(i0, od, i1);
  _mm_storeu_si128((__m128i*)even, _mm512_cvtepi32_epi8(e));
  _mm_storeu_si128((__m128i*)odd, _mm512_cvtepi32_epi8(o));
  return _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1)); /* integers: any order */
}

static __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq"))) float amax_avx512(const float* a,
                                                                                               int64_t n) {
  const __m512 sign = _mm512_set1_ps(-0.0f);
  __m512 m = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) m = _mm512_max_ps(_mm512_andnot_ps(sign, _mm512_loadu_ps(a + k)), m); /* NaN: m */
  float amax = _mm512_reduce_max_ps(m);
  for (; k < n; ++k) {
    const float v = fabsf(a[k]);
    if (v > amax) amax = v;
  }
  return amax;
}

/* the same with AVX2: the codes packed to bytes in element order, then split into even and odd bytes */
static __attribute__((target("avx2,fma"))) int32_t unit_codes_avx2(const float* a, float inv, int8_t* even,
                                                                   int8_t* odd) {
  const __m256 vinv = _mm256_set1_ps(inv), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  __m256i i[4];
  for (int c = 0; c < 4; ++c) {
    const __m256 v = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(a + 8 * c), vinv), lo), hi);
    i[c] = _mm256_cvtps_epi32(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)); /* exact */
  }
  const __m256i w0 = _mm256_permute4x64_epi64(_mm256_packs_epi32(i[0], i[1]), 0xD8); /* int16, elements 0..15 */
  const __m256i w1 = _mm256_permute4x64_epi64(_mm256_packs_epi32(i[2], i[3]), 0xD8); /* 16..31 */
  const __m256i b = _mm256_permute4x64_epi64(_mm256_packs_epi16(w0, w1), 0xD8);      /* int8, 0..31 */
  const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                         0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  const __m256i eo = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(b, split), 0xD8); /* [16 even | 16 odd] */
  _mm_storeu_si128((__m128i*)even, _mm256_castsi256_si128(eo));
  _mm_storeu_si128((__m128i*)odd, _mm256_extracti128_si256(eo, 1));
  int32_t lanes[8];
  _mm256_storeu_si256((__m256i*)lanes, _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3])));
  return lanes[0] + lanes[1] + lanes[2] + lanes[3] + lanes[4] + lanes[5] + lanes[6] + lanes[7];
}

static __attribute__((target("avx2,fma"))) float amax_avx2(const float* a, int64_t n) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 m = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(a + k)), m); /* NaN: m */
  float lanes[8], amax = 0.0f;
  _mm256_storeu_ps(lanes, m);
  for (int l = 0; l < 8; ++l)
    if (lanes[l] > amax) amax = lanes[l];
  for (; k < n; ++k) {
    const float v = fabsf(a[k]);
    if (v > amax) amax = v;
  }
  return amax;
}
#endif

/* simd: 2 AVX-512, 1 AVX2, 0 C; the same codes on each */
static void prepare_row(const float* a, const a8_shape* s, uint8_t* out, int simd) {
  int8_t* q = (int8_t*)out;
  float* sa = (float*)(out + s->code_bytes);
  int32_t* qsum = (int32_t*)(sa + s->groups * A8_GROUP);
  memset(out, 0, (size_t)s->stride);
  for (int64_t b = 0; b < s->k_blocks; ++b) {
    const int64_t k0 = b * s->block, k1 = k0 + s->block < s->K ? k0 + s->block : s->K;
    float amax = 0.0f;
#if QO_A8_X86
    if (simd) {
      amax = simd == 2 ? amax_avx512(a + k0, k1 - k0) : amax_avx2(a + k0, k1 - k0);
    } else
#endif
      for (int64_t k = k0; k < k1; ++k) {
        const float v = fabsf(a[k]);
        if (v > amax) amax = v; /* a NaN is passed over */
      }
    const float inv = amax != 0.0f ? 127.0f / amax : 0.0f;
    int32_t sum = 0;
    int64_t k = k0;
#if QO_A8_X86
    if (simd == 2)
      for (; k + 32 <= k1; k += 32) sum += unit_codes_avx512(a + k, inv, q + code_pos(k), q + code_pos(k + 1));
    else if (simd == 1)
      for (; k + 32 <= k1; k += 32) sum += unit_codes_avx2(a + k, inv, q + code_pos(k), q + code_pos(k + 1));
#endif
    for (; k < k1; ++k) {
      const int8_t v = round_q(a[k] * inv);
      q[code_pos(k)] = v;
      sum += v;
    }
    sa[b] = amax / 127.0f;
    qsum[b] = sum;
  }
}

int64_t qo_cpu_int4a8_prepared_floats(int64_t M, int64_t K, int64_t block_size) {
  return M * (shape_of(K, block_size).stride / 4);
}

void qo_cpu_int4a8_prepare_a(const float* A, const int64_t* rows, int64_t M, int64_t K, int64_t block_size,
                             float* prepared) {
  const a8_shape s = shape_of(K, block_size);
  const int isa = qo_cpu_isa(); /* the same codes on every path */
  const int simd = isa == QO_ISA_AVX512 ? 2 : isa == QO_ISA_AVX2 ? 1 : 0;
  for (int64_t m = 0; m < M; ++m)
    prepare_row(A + (rows ? rows[m] : m) * K, &s, (uint8_t*)prepared + m * s.stride, simd);
}

/* ---------------- the weight operands of one row ---------------- */
typedef struct {
  const uint8_t* codes; /* the row's [k_blocks, block/2] */
  const float* sw;      /* [k_blocks] */
  const uint8_t* zp;    /* [ceil(k_blocks/2)] or NULL */
} a8_row;

static inline int zero_point(const a8_row* w, int64_t b) {
  return w->zp ? (b & 1 ? w->zp[b >> 1] >> 4 : w->zp[b >> 1] & 15) : 8;
}

static inline float fold16(const float* x) { /* x[p] += x[p + h], h = 8, 4, 2, 1 */
  float t[8];
  for (int p = 0; p < 8; ++p) t[p] = x[p] + x[p + 8];
  for (int p = 0; p < 4; ++p) t[p] = t[p] + t[p + 4];
  for (int p = 0; p < 2; ++p) t[p] = t[p] + t[p + 2];
  return t[0] + t[1];
}


/* the zero points of blocks [16 g, 16 g + nb) as 8 bytes, zero padded (the SIMD paths read 8) */
static inline uint64_t zp_group(const a8_row* w, int64_t g, int64_t nb) {
  uint64_t z = 0;
  for (int64_t i = 0; i < (nb + 1) / 2; ++i) z |= (uint64_t)w->zp[g * 8 + i] << (8 * i);
  return z;
}

/* one prepared activation row's parts */
typedef struct {
  const int8_t* q;      /* codes, in the nibble-lane order */
  const float* sa;      /* [groups * 16] */
  const int32_t* qsum;  /* [groups * 16] */
} a8_act;

static inline a8_act act_of(const uint8_t* prep, const a8_shape* s) {
  a8_act a;
  a.q = (const int8_t*)prep;
  a.sa = (const float*)(prep + s->code_bytes);
  a.qsum = (const int32_t*)(a.sa + s->groups * A8_GROUP);
  return a;
}

static float portable_dot(const a8_row* w, const a8_act* a, const a8_shape* s) {
  const int8_t* q = a->q;
  const float* sa = a->sa;
  const int32_t* qsum = a->qsum;
  float lane[A8_GROUP] = {0};
  for (int64_t b = 0; b < s->k_blocks; ++b) {
    int32_t dot = 0;
    for (int64_t k = b * s->block; k < (b + 1) * s->block; ++k) {
      const int c = (w->codes[k >> 1] >> ((k & 1) * 4)) & 15;
      dot += c * q[code_pos(k)];
    }
    const int32_t v = dot - zero_point(w, b) * qsum[b];
    lane[b % A8_GROUP] = fmaf((float)v, sa[b] * w->sw[b], lane[b % A8_GROUP]);
  }
  return fold16(lane);
}

#if QO_A8_X86
/* ---------------- AVX-512 VNNI ---------------- */
#define A8_TGT_VNNI __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#define A8_VNNI_INLINE static inline __attribute__((always_inline)) A8_TGT_VNNI

A8_VNNI_INLINE __m512i pairs_vnni(__m512i a, __m512i b) { /* [a | b] -> 16 sums of neighbours */
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  return _mm512_add_epi32(_mm512_permutex2var_epi32(a, even, b), _mm512_permutex2var_epi32(a, odd, b));
}

/* q[c]'s 128-bit lane L holds 4 partial sums of unit 4c + L: the 16 unit sums, in unit order (the transpose-add
 * leaves lane L of its result with units L, 4 + L, 8 + L, 12 + L; the permute puts them in order) */
A8_VNNI_INLINE __m512i unit_sums_vnni(const __m512i* q) {
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m512i t0 = _mm512_add_epi32(_mm512_unpacklo_epi32(q[0], q[1]), _mm512_unpackhi_epi32(q[0], q[1]));
  const __m512i t1 = _mm512_add_epi32(_mm512_unpacklo_epi32(q[2], q[3]), _mm512_unpackhi_epi32(q[2], q[3]));
  const __m512i s = _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));
  return _mm512_permutexvar_epi32(order, s);
}

/* 8 bytes of packed uint4 zero points (block 2j in the low nibble of byte j) as 16 int32, in block order */
A8_VNNI_INLINE __m512i zero_points_vnni(uint64_t bytes) {
  const __m128i b = _mm_cvtsi64_si128((long long)bytes), m4 = _mm_set1_epi8(0x0F);
  return _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(_mm_and_si128(b, m4), _mm_and_si128(_mm_srli_epi16(b, 4), m4)));
}

/* One group g of 16 blocks (16 * units units of 32 elements; `valid` of them in the weight, the rest of the group
 * past its end) of one weight row against mr prepared activation rows: acc[r] += fp32(v_b) * fp32(sa_b * sw_b) on
 * the blocks in `mask`. Per 256 weight bytes (16 units): four 64-byte loads, split into nibbles once, then per
 * activation row eight vpdpbusd and a transpose-add that leaves the 16 unit sums in order. */
A8_VNNI_INLINE void group_vnni(int mr, __m512* acc, const uint8_t* codes, const float* sw, const uint8_t* zp,
                               const a8_act* act, int64_t g, int64_t block, int units, int valid, __mmask16 mask) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  __m512i u[4][A8_MAX_UNITS];
  for (int i = 0; i < units; ++i) {
    const int vu = valid - 16 * i < 0 ? 0 : valid - 16 * i > 16 ? 16 : valid - 16 * i; /* units of this batch */
    __m512i lo[4], hi[4];
    for (int c = 0; c < 4; ++c) {
      const int bytes = vu * 16 - 64 * c;
      const uint8_t* p = codes + 256 * i + 64 * c;
      const __m512i x = bytes >= 64 ? _mm512_loadu_si512((const void*)p)
                        : bytes > 0 ? _mm512_maskz_loadu_epi8((__mmask64)((1ull << bytes) - 1), p)
                                    : _mm512_setzero_si512();
      lo[c] = _mm512_and_si512(x, m4);
      hi[c] = _mm512_and_si512(_mm512_srli_epi16(x, 4), m4);
    }
    for (int r = 0; r < mr; ++r) {
      const int8_t* a = act[r].q + g * A8_GROUP * block + 512 * i;
      __m512i q[4];
      for (int c = 0; c < 4; ++c) {
        if (vu * 16 <= 64 * c) { /* past the weight's end */
          q[c] = _mm512_setzero_si512();
          continue;
        }
        const __m512i t = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[c],
                                              _mm512_load_si512((const void*)(a + 128 * c)));
        q[c] = _mm512_dpbusd_epi32(t, hi[c], _mm512_load_si512((const void*)(a + 128 * c + 64)));
      }
      u[r][i] = unit_sums_vnni(q);
    }
  }
  uint64_t zb = 0;
  if (zp) memcpy(&zb, zp, 8);
  const __m512i z = zp ? zero_points_vnni(zb) : _mm512_set1_epi32(8);
  const __m512 w_scale = _mm512_maskz_loadu_ps(mask, sw);
  for (int r = 0; r < mr; ++r) {
    for (int n = units; n > 1; n /= 2)
      for (int i = 0; i < n / 2; ++i) u[r][i] = pairs_vnni(u[r][2 * i], u[r][2 * i + 1]);
    const __m512i qs = _mm512_load_si512((const void*)(act[r].qsum + g * A8_GROUP));
    const __m512i v = _mm512_sub_epi32(u[r][0], _mm512_mullo_epi32(z, qs));
    const __m512 t = _mm512_mul_ps(_mm512_load_ps(act[r].sa + g * A8_GROUP), w_scale);
    acc[r] = _mm512_mask3_fmadd_ps(_mm512_cvtepi32_ps(v), t, acc[r], mask);
  }
}

A8_VNNI_INLINE float fold16_avx512(__m512 acc) { /* x[p] += x[p + h], h = 8, 4, 2, 1 */
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1));
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
}

A8_VNNI_INLINE void dot_vnni(int mr, const a8_row* w, const a8_act* act, const a8_shape* s, float* y) {
  const int units = (int)(s->block / 32);
  const int64_t gbytes = A8_GROUP * s->block / 2, full = s->k_blocks / A8_GROUP, nb = s->k_blocks - full * A8_GROUP;
  __m512 acc[4];
  for (int r = 0; r < mr; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < full; ++g) {
    _mm_prefetch((const char*)(w->codes + g * gbytes + A8_PF), _MM_HINT_T0);
    group_vnni(mr, acc, w->codes + g * gbytes, w->sw + g * A8_GROUP, w->zp ? w->zp + g * 8 : NULL, act, g, s->block,
               units, 16 * units, 0xFFFF);
  }
  if (nb) {
    const uint64_t z = w->zp ? zp_group(w, full, nb) : 0;
    group_vnni(mr, acc, w->codes + full * gbytes, w->sw + full * A8_GROUP, w->zp ? (const uint8_t*)&z : NULL, act,
               full, s->block, units, (int)(nb * units), (__mmask16)((1u << nb) - 1));
  }
  for (int r = 0; r < mr; ++r) y[r] = fold16_avx512(acc[r]);
}

/* Block 32, k_blocks = 16 g + 8 (K = 768: Qwen3-30B-A3B's down projection): the 8-block tails of two weight rows as
 * one group, lanes 0-7 row 0's blocks 16 g .. 16 g + 7 and lanes 8-15 row 1's (each tail 128 bytes of its own row),
 * against the activation's chunks of those blocks twice. Each row's lanes 0-7 then get one fma per block, in the
 * order group_vnni gives them: the same bits, at about half the tail's cost. */
A8_VNNI_INLINE void tail_pair_vnni(__m512* acc0, __m512* acc1, const a8_row* w, const a8_act* act, int64_t g) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const int8_t* a = act->q + g * A8_GROUP * 32;
  __m512i q[4];
  for (int c = 0; c < 4; ++c) {
    const __m512i x = _mm512_loadu_si512((const void*)(w[c >> 1].codes + g * 256 + 64 * (c & 1)));
    const __m512i lo = _mm512_and_si512(x, m4), hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), m4);
    const int8_t* ac = a + 128 * (c & 1);
    const __m512i t = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_load_si512((const void*)ac));
    q[c] = _mm512_dpbusd_epi32(t, hi, _mm512_load_si512((const void*)(ac + 64)));
  }
  const __m512i u = unit_sums_vnni(q);
  __m512i z = _mm512_set1_epi32(8);
  if (w[0].zp) { /* each row's 4 bytes of its tail's zero points */
    uint32_t z0, z1;
    memcpy(&z0, w[0].zp + g * 8, 4);
    memcpy(&z1, w[1].zp + g * 8, 4);
    z = zero_points_vnni((uint64_t)z0 | (uint64_t)z1 << 32);
  }
  const __m512i qs = _mm512_broadcast_i64x4(_mm256_load_si256((const __m256i*)(act->qsum + g * A8_GROUP)));
  const __m512 sa = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_load_ps(act->sa + g * A8_GROUP))));
  const __m512 sw = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(w[0].sw + g * A8_GROUP)),
                                       _mm256_loadu_ps(w[1].sw + g * A8_GROUP), 1);
  const __m512 f = _mm512_cvtepi32_ps(_mm512_sub_epi32(u, _mm512_mullo_epi32(z, qs)));
  const __m512 t = _mm512_mul_ps(sa, sw);
  *acc0 = _mm512_mask3_fmadd_ps(f, t, *acc0, 0x00FF);
  *acc1 = _mm512_mask3_fmadd_ps(_mm512_shuffle_f32x4(f, f, 0x4E), _mm512_shuffle_f32x4(t, t, 0x4E), *acc1, 0x00FF);
}

/* two weight rows against one activation row: two independent chains (a row at K = 768 is 1.5 groups, too short
 * to hide one chain's latency) */
static A8_TGT_VNNI void dot2_vnni(const a8_row* w, const a8_act* act, const a8_shape* s, float* y0, float* y1) {
  const int units = (int)(s->block / 32);
  const int64_t gbytes = A8_GROUP * s->block / 2, full = s->k_blocks / A8_GROUP, nb = s->k_blocks - full * A8_GROUP;
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  for (int64_t g = 0; g < full; ++g) {
    _mm_prefetch((const char*)(w[0].codes + g * gbytes + A8_PF), _MM_HINT_T0);
    _mm_prefetch((const char*)(w[1].codes + g * gbytes + A8_PF), _MM_HINT_T0);
    group_vnni(1, &acc0, w[0].codes + g * gbytes, w[0].sw + g * A8_GROUP, w[0].zp ? w[0].zp + g * 8 : NULL, act, g,
               s->block, units, 16 * units, 0xFFFF);
    group_vnni(1, &acc1, w[1].codes + g * gbytes, w[1].sw + g * A8_GROUP, w[1].zp ? w[1].zp + g * 8 : NULL, act, g,
               s->block, units, 16 * units, 0xFFFF);
  }
  if (nb == 8 && units == 1) {
    tail_pair_vnni(&acc0, &acc1, w, act, full);
  } else if (nb) {
    const uint64_t z0 = w[0].zp ? zp_group(&w[0], full, nb) : 0, z1 = w[1].zp ? zp_group(&w[1], full, nb) : 0;
    const __mmask16 mask = (__mmask16)((1u << nb) - 1);
    group_vnni(1, &acc0, w[0].codes + full * gbytes, w[0].sw + full * A8_GROUP, w[0].zp ? (const uint8_t*)&z0 : NULL,
               act, full, s->block, units, (int)(nb * units), mask);
    group_vnni(1, &acc1, w[1].codes + full * gbytes, w[1].sw + full * A8_GROUP, w[1].zp ? (const uint8_t*)&z1 : NULL,
               act, full, s->block, units, (int)(nb * units), mask);
  }
  *y0 = fold16_avx512(acc0);
  *y1 = fold16_avx512(acc1);
}

static A8_TGT_VNNI void rows_vnni(const a8_row* w, const a8_act* act, int64_t M, const a8_shape* s, float* y) {
  for (int64_t m = 0; m < M; m += 4) {
    const int64_t mr = M - m < 4 ? M - m : 4;
    if (mr == 4) dot_vnni(4, w, act + m, s, y + m);
    else if (mr == 3) dot_vnni(3, w, act + m, s, y + m);
    else if (mr == 2) dot_vnni(2, w, act + m, s, y + m);
    else dot_vnni(1, w, act + m, s, y + m);
  }
}

/* ---------------- AVX2 ---------------- */
#define A8_TGT_AVX2 __attribute__((target("avx2,fma")))
#define A8_AVX2_INLINE static inline __attribute__((always_inline)) A8_TGT_AVX2

A8_AVX2_INLINE __m256i pairs_avx2(__m256i a, __m256i b) { /* [a | b] -> 8 sums of neighbours */
  return _mm256_permute4x64_epi64(_mm256_hadd_epi32(a, b), 0xD8);
}

/* group_vnni's step with 8-lane vectors: per 128 weight bytes (8 units) four 32-byte loads, then per activation row
 * vpmaddubsw (nibble x code pairs, at most 2 * 15 * 127: no saturation) and vpmaddwd, and the transpose-add. */
A8_AVX2_INLINE void group_avx2(int mr, __m256* acc, const uint8_t* codes, const float* sw, const uint8_t* zp,
                               const a8_act* act, int64_t g, int64_t block, int units, int valid, int blocks) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256i u[4][2 * A8_MAX_UNITS];
  for (int i = 0; i < 2 * units; ++i) {
    const int vu = valid - 8 * i < 0 ? 0 : valid - 8 * i > 8 ? 8 : valid - 8 * i;
    __m256i lo[4], hi[4];
    for (int c = 0; c < 4; ++c) {
      const int bytes = vu * 16 - 32 * c;
      const uint8_t* p = codes + 128 * i + 32 * c;
      const __m256i x = bytes >= 32 ? _mm256_loadu_si256((const __m256i*)p)
                        : bytes > 0 ? _mm256_maskload_epi32((const int*)p,
                                                            _mm256_cmpgt_epi32(_mm256_set1_epi32(bytes / 4), lane))
                                    : _mm256_setzero_si256();
      lo[c] = _mm256_and_si256(x, m4);
      hi[c] = _mm256_and_si256(_mm256_srli_epi16(x, 4), m4);
    }
    for (int r = 0; r < mr; ++r) {
      const int8_t* a = act[r].q + g * A8_GROUP * block + 256 * i;
      __m256i q[4];
      for (int c = 0; c < 4; ++c) { /* units 2c, 2c + 1: the prepared halves in chunk c / 2 */
        const int8_t* ac = a + 128 * (c / 2) + 32 * (c % 2);
        const __m256i pl = _mm256_maddubs_epi16(lo[c], _mm256_load_si256((const __m256i*)ac));
        const __m256i ph = _mm256_maddubs_epi16(hi[c], _mm256_load_si256((const __m256i*)(ac + 64)));
        q[c] = _mm256_madd_epi16(_mm256_add_epi16(pl, ph), ones); /* |pl + ph| <= 4 * 15 * 127 */
      }
      /* q[c]'s 128-bit lane L: unit 2c + L -> lane L of s: units L, 2 + L, 4 + L, 6 + L */
      const __m256i t0 = _mm256_add_epi32(_mm256_unpacklo_epi32(q[0], q[1]), _mm256_unpackhi_epi32(q[0], q[1]));
      const __m256i t1 = _mm256_add_epi32(_mm256_unpacklo_epi32(q[2], q[3]), _mm256_unpackhi_epi32(q[2], q[3]));
      const __m256i s = _mm256_add_epi32(_mm256_unpacklo_epi64(t0, t1), _mm256_unpackhi_epi64(t0, t1));
      u[r][i] = _mm256_permutevar8x32_epi32(s, order);
    }
  }
  int32_t zb[16];
  for (int b = 0; b < 16; ++b) zb[b] = zp ? (b & 1 ? zp[b >> 1] >> 4 : zp[b >> 1] & 15) : 8;
  for (int h = 0; h < 2; ++h) {
    if (blocks <= 8 * h) break;
    const __m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32(blocks - 8 * h), lane);
    const __m256 w_scale = _mm256_maskload_ps(sw + 8 * h, live);
    const __m256i z = _mm256_loadu_si256((const __m256i*)(zb + 8 * h));
    for (int r = 0; r < mr; ++r) {
      if (h == 0)
        for (int n = 2 * units; n > 2; n /= 2)
          for (int i = 0; i < n / 2; ++i) u[r][i] = pairs_avx2(u[r][2 * i], u[r][2 * i + 1]);
      const __m256i qs = _mm256_load_si256((const __m256i*)(act[r].qsum + g * A8_GROUP + 8 * h));
      const __m256i v = _mm256_sub_epi32(u[r][h], _mm256_mullo_epi32(z, qs));
      const __m256 t = _mm256_mul_ps(_mm256_load_ps(act[r].sa + g * A8_GROUP + 8 * h), w_scale);
      const __m256 f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), t, acc[2 * r + h]);
      acc[2 * r + h] = blocks >= 8 * (h + 1) ? f : _mm256_blendv_ps(acc[2 * r + h], f, _mm256_castsi256_ps(live));
    }
  }
}

A8_AVX2_INLINE void dot_avx2(int mr, const a8_row* w, const a8_act* act, const a8_shape* s, float* y) {
  const int units = (int)(s->block / 32);
  const int64_t gbytes = A8_GROUP * s->block / 2, full = s->k_blocks / A8_GROUP, nb = s->k_blocks - full * A8_GROUP;
  __m256 acc[8];
  for (int r = 0; r < 2 * mr; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < full; ++g) {
    _mm_prefetch((const char*)(w->codes + g * gbytes + A8_PF), _MM_HINT_T0);
    group_avx2(mr, acc, w->codes + g * gbytes, w->sw + g * A8_GROUP, w->zp ? w->zp + g * 8 : NULL, act, g, s->block,
               units, 16 * units, A8_GROUP);
  }
  if (nb) {
    const uint64_t z = w->zp ? zp_group(w, full, nb) : 0;
    group_avx2(mr, acc, w->codes + full * gbytes, w->sw + full * A8_GROUP, w->zp ? (const uint8_t*)&z : NULL, act,
               full, s->block, units, (int)(nb * units), (int)nb);
  }
  for (int r = 0; r < mr; ++r) { /* x[p] += x[p + 8], then 4, 2, 1 */
    const __m256 h = _mm256_add_ps(acc[2 * r], acc[2 * r + 1]);
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    y[r] = _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
  }
}

static A8_TGT_AVX2 void rows_avx2(const a8_row* w, const a8_act* act, int64_t M, const a8_shape* s, float* y) {
  for (int64_t m = 0; m < M; m += 4) {
    const int64_t mr = M - m < 4 ? M - m : 4;
    if (mr == 4) dot_avx2(4, w, act + m, s, y + m);
    else if (mr == 3) dot_avx2(3, w, act + m, s, y + m);
    else if (mr == 2) dot_avx2(2, w, act + m, s, y + m);
    else dot_avx2(1, w, act + m, s, y + m);
  }
}
#endif /* QO_A8_X86 */

/* ---------------- dispatch ---------------- */
int qo_cpu_int4a8_path(int64_t block_size) {
  if (block_size % 32 != 0 || block_size / 32 > A8_MAX_UNITS) return A8_PORTABLE;
#if QO_A8_X86
  const int isa = qo_cpu_isa(); /* QO_CPU_KERNELS lowers it */
  if (isa == QO_ISA_AVX512 && qo_cpu_avx512_ext(QO_EXT_VNNI)) return A8_VNNI;
  if (isa >= QO_ISA_AVX2) return A8_AVX2;
#endif
  return A8_PORTABLE;
}

int qo_cpu_int4a8_rows_f32(int path, const float* prepared, int64_t M, int64_t N, int64_t K, const uint8_t* B,
                           const float* scales, const uint8_t* zero_points, int64_t block_size, int64_t n0, int64_t n1,
                           float* Y) {
  if (!prepared || !B || !scales || !Y || M < 0 || K <= 0 || n0 < 0 || n1 > N || block_size < 16 ||
      (block_size & (block_size - 1)))
    return QO_ERR_ARGUMENT;
  const a8_shape s = shape_of(K, block_size);
  if (block_size % 32 != 0 || block_size / 32 > A8_MAX_UNITS) path = A8_PORTABLE;
  const int64_t zp_row = (s.k_blocks + 1) / 2;
  a8_act act_stack[16];
  a8_act* act = M <= 16 ? act_stack : (a8_act*)malloc(sizeof(a8_act) * (size_t)M);
  float y_stack[16];
  float* y = M <= 16 ? y_stack : (float*)malloc(sizeof(float) * (size_t)M);
  if (!act || !y) {
    if (act != act_stack) free(act);
    if (y != y_stack) free(y);
    return QO_ERR_ALLOC;
  }
  for (int64_t m = 0; m < M; ++m) act[m] = act_of((const uint8_t*)prepared + m * s.stride, &s);
  for (int64_t n = n0; n < n1; ++n) {
    const a8_row w = {B + n * s.k_blocks * block_size / 2, scales + n * s.k_blocks,
                      zero_points ? zero_points + n * zp_row : NULL};
#if QO_A8_X86
    if (path == A8_VNNI && M <= 2 && n + 1 < n1) { /* GEMV: weight rows in pairs */
      const a8_row w2[2] = {w, {w.codes + s.k_blocks * block_size / 2, w.sw + s.k_blocks, w.zp ? w.zp + zp_row : NULL}};
      for (int64_t m = 0; m < M; ++m) dot2_vnni(w2, &act[m], &s, &Y[m * N + n], &Y[m * N + n + 1]);
      ++n;
      continue;
    }
#endif
#if QO_A8_X86
    if (path == A8_VNNI) rows_vnni(&w, act, M, &s, y);
    else if (path == A8_AVX2) rows_avx2(&w, act, M, &s, y);
    else
#endif
      for (int64_t m = 0; m < M; ++m) y[m] = portable_dot(&w, &act[m], &s);
    for (int64_t m = 0; m < M; ++m) Y[m * N + n] = y[m];
  }
  if (act != act_stack) free(act);
  if (y != y_stack) free(y);
  return QO_OK;
}

/* ---------------- dense entry (tests, benchmarks) ---------------- */
typedef struct {
  const float* prepared;
  int64_t M, N, K, block;
  const uint8_t* B;
  const float* scales;
  const uint8_t* zp;
  float* Y;
  int path;
  volatile int failed;
} a8_job;

static void a8_task(void* data, size_t t) {
  a8_job* j = (a8_job*)data;
  const int64_t n0 = (int64_t)t * A8_ROWS_PER_TASK, n1 = n0 + A8_ROWS_PER_TASK < j->N ? n0 + A8_ROWS_PER_TASK : j->N;
  const int status = qo_cpu_int4a8_rows_f32(j->path, j->prepared, j->M, j->N, j->K, j->B, j->scales, j->zp, j->block,
                                            n0, n1, j->Y);
  if (status != QO_OK) j->failed = status;
}

int qo_matmul_int4_a8_f32(const float* A, const uint8_t* B, const float* scales, const uint8_t* zero_points, float* Y,
                          int64_t M, int64_t N, int64_t K, int64_t block_size) {
  if (!A || !B || !scales || !Y || M < 0 || N < 0 || K <= 0 || block_size < 16 || (block_size & (block_size - 1)))
    return QO_ERR_ARGUMENT;
  if (M == 0 || N == 0) return QO_OK;
  float* raw = (float*)malloc(sizeof(float) * (size_t)qo_cpu_int4a8_prepared_floats(M, K, block_size) + 64);
  if (!raw) return QO_ERR_ALLOC;
  float* prep = (float*)qo_align64(raw);
  qo_cpu_int4a8_prepare_a(A, NULL, M, K, block_size, prep);
  a8_job j = {prep, M, N, K, block_size, B, scales, zero_points, Y, qo_cpu_int4a8_path(block_size), 0};
  int status = qo_cpu_parallel_for(a8_task, (size_t)((N + A8_ROWS_PER_TASK - 1) / A8_ROWS_PER_TASK), &j);
  if (status == QO_OK && j.failed) status = j.failed;
  free(raw);
  return status;
}
