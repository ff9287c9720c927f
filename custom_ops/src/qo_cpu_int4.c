/* CPU kernel of com.quark_onnx MatMulInt4 / MatMulUint4: the exact form of a Quark uint4 / int4 per-group weight.
 *
 *   Y[m][n] = sum_k A[m][k] * W[n][k],   W[n][k] = float32((float)(q[n][k] - z[n][b]) * s[n][b]),  b = k / block
 *
 * i.e. the weight decoded exactly as Quark's dequantizer does ((q - z) * s in float32: q - z is a small integer,
 * exact in float32, times the group's float32 scale, rounded once), fp32 activations, fp32 accumulation. No
 * activation quantization (that is MatMulNBits accuracy_level 4's int8 path, which this replaces where exactness
 * matters).
 *
 * Weight layout: MatMulNBits' own bytes (onnxruntime contrib_ops MatMulNBits schema, bits = 4), so the graph keeps
 * the initializers the MatMulNBits form writes:
 *   B            uint8 [N, k_blocks, block/2]: element k of row n in byte k/2 of the row, even k in the low nibble;
 *                K is padded with zero nibbles to k_blocks * block.
 *   scales       float32 [N * k_blocks] (row-major [N, k_blocks]).
 *   zero_points  uint8 [N, ceil(k_blocks / 2)] packed uint4 (block 2j in the low nibble), or NULL: z = 8 (a
 *                symmetric int4 weight stored as q + 8, as MatMulNBits stores it).
 *
 * ONE summation order on every CPU (portable C, AVX2+FMA, AVX-512; every M, every thread count, every tile), 32
 * lanes: lane j accumulates a[k] * w[k] for k = j (mod 32) in increasing k, each step one fmaf from +0; elements of
 * the last block past K (zero nibbles) are included with a = 0, which leaves every lane unchanged (a lane is never
 * -0, and a finite w times 0 is a zero). The lanes fold as: even lanes e[p] = l[2p] and odd lanes o[p] = l[2p+1]
 * (p < 16) each by halves, x[p] += x[p + h] for h = 8, 4, 2, 1, then e + o. (The AVX-512 path holds the 16 even
 * lanes in one vector and the 16 odd ones in another: the low and the high nibbles of 16 bytes; the AVX2 GEMV holds
 * 4 even and 4 odd lanes per vector and puts them back in that order before the fold.)
 *
 * Paths: M <= 4 (decode): a GEMV straight from the packed weight, nibbles decoded in registers (AVX-512: one
 * permute of a 16-entry table (c - z) * s per group; AVX2: q - z on bytes, shuffled into the top byte of dwords,
 * converted, times s * 2^-24); M <= 16: the same GEMV
 * over chunks of a few activation rows. M > 16 (prefill): qo_cpu_int4_panel.c, the order computed as an fp32 GEMM
 * (broadcast activations, weight rows in lanes, one lane's chain per pass, folded as the tree adds). block % 32 != 0
 * (block 16) runs the portable path. Work is split over weight-row blocks through qo_cpu_parallel_for (ORT's
 * intra-op pool under ORT, OpenMP otherwise). Compiled with -ffp-contract=off. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qo_fp_formats.h"
#include "qo_cpu_int4_panel.h"
#include "qo_cpu_simd.h"
#include "qo_kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(QO_NO_CLONES) && \
    !defined(QO_PORTABLE_ONLY)
#define QO_I4_X86 1
#include <immintrin.h>
#else
#define QO_I4_X86 0
#endif

#define I4_LANES 32
#define I4_GEMV_MAX_M 4
#ifndef I4_GEMV_ROWS
#define I4_GEMV_ROWS 16   /* weight rows per task, M <= 4 */
#endif
#define I4_PANEL_ROWS (2 * I4_PANEL_N) /* weight rows per task, M > 4 (qo_cpu_int4_panel.c: 32 rows per panel) */
#ifndef I4_PREFETCH
#define I4_PREFETCH 1024  /* GEMV: bytes ahead of each weight row's read, prefetched (more misses in flight) */
#endif
#ifndef I4_PREFETCH512
#define I4_PREFETCH512 4096 /* the same for the block-32 AVX-512 GEMV (measured, M = 1 from L3 / DRAM: 1.15x 1024) */
#endif

#if defined(__GNUC__) || defined(__clang__)
#define I4_INLINE static inline __attribute__((always_inline))
#else
#define I4_INLINE static inline
#endif

typedef struct {
  const float* A;        /* [M, K] */
  const float* ad;       /* SIMD paths: A per 32-chunk as [16 even k | 16 odd k], zero past K; [M, Kc] */
  const uint8_t* B;
  const float* scales;
  const uint8_t* zp;     /* NULL: 8 */
  float* Y;
  int64_t M, N, K, Kc;   /* Kc: K rounded up to 32 (SIMD) */
  int64_t block, k_blocks, row_bytes, zp_row_bytes, rows_per_task;
  int path;
  int halves;            /* AVX2, M = 1: the GEMV on 128-bit registers (the path's I4_HALVES flag) */
  volatile int failed;
} i4_job;

static inline int zero_point(const i4_job* j, int64_t n, int64_t b) {
  if (!j->zp) return 8;
  const uint8_t byte = j->zp[n * j->zp_row_bytes + (b >> 1)];
  return (b & 1) ? (byte >> 4) : (byte & 0x0F);
}

static inline float decode_one(const i4_job* j, int64_t n, int64_t k) {
  const int64_t b = k / j->block;
  const uint8_t byte = j->B[n * j->row_bytes + (k >> 1)];
  const int q = (k & 1) ? (byte >> 4) : (byte & 0x0F);
  return (float)(q - zero_point(j, n, b)) * j->scales[n * j->k_blocks + b];
}

/* the fold of the 32 lanes: evens and odds by halves, then their sum */
static inline float fold32(const float* l) {
  float e[16], o[16];
  for (int p = 0; p < 16; ++p) {
    e[p] = l[2 * p];
    o[p] = l[2 * p + 1];
  }
  for (int h = 8; h >= 1; h >>= 1)
    for (int p = 0; p < h; ++p) {
      e[p] = e[p] + e[p + h];
      o[p] = o[p] + o[p + h];
    }
  return e[0] + o[0];
}

/* ---------------- portable C ---------------- */
static QO_THREAD_LOCAL float* tls_buf = NULL;
static QO_THREAD_LOCAL size_t tls_buf_floats = 0;

static void portable_task(i4_job* j, int64_t n0, int64_t n1) {
  const int64_t Kp = j->k_blocks * j->block; /* every element of the stored blocks (a = 0 past K) */
  float* w = qo_tls_grow(&tls_buf, &tls_buf_floats, (size_t)Kp);
  if (!w) {
    j->failed = 1;
    return;
  }
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t k = 0; k < Kp; ++k) w[k] = decode_one(j, n, k);
    for (int64_t m = 0; m < j->M; ++m) {
      const float* a = j->A + m * j->K;
      float l[I4_LANES];
      for (int i = 0; i < I4_LANES; ++i) l[i] = 0.0f;
      for (int64_t k = 0; k < Kp; ++k) l[k & 31] = fmaf(k < j->K ? a[k] : 0.0f, w[k], l[k & 31]);
      j->Y[m * j->N + n] = fold32(l);
    }
  }
}

/* A [M, K] -> the GEMV's layout, [M, Kc], zero past K (row m of A at A + (src ? src[m] : m) * K). Per 32-chunk c:
 *   AVX-512: [a[32c + 2p], p < 16 | a[32c + 2p + 1], p < 16] (even k, then odd k: the low and the high nibbles);
 *   AVX2 (quads): 4 groups of 8, group q = [a[32c + 8q + 2i], i < 4 | a[32c + 8q + 2i + 1], i < 4] (the AVX2 GEMV's
 *   vector q holds the low nibbles of bytes 4q..4q+3 in its low lane and their high nibbles in its high lane). */
static void deinterleave_a(const float* A, const int64_t* src, int64_t M, int64_t K, int64_t Kc, int quads,
                           float* out) {
  for (int64_t m = 0; m < M; ++m) {
    const float* a = A + (src ? src[m] : m) * K;
    float* d = out + m * Kc;
    for (int64_t c = 0; c < Kc; c += 32)
      for (int p = 0; p < 16; ++p) {
        const int64_t ke = c + 2 * p, ko = ke + 1;
        const int64_t de = quads ? c + 8 * (p >> 2) + (p & 3) : c + p, dob = quads ? de + 4 : c + 16 + p;
        d[de] = ke < K ? a[ke] : 0.0f;
        d[dob] = ko < K ? a[ko] : 0.0f;
      }
  }
}

/* the rows entry point runs up to I4_CHUNKED_GEMV_MAX_M activation rows as GEMVs of a few rows each (the weight
 * decoded in registers once per chunk) rather than through the prefill panel, which decodes the weight to float32
 * once per task (an expert's rows at prefill: about k T / E); the same bits either way. Chunks of balanced sizes, at
 * most I4_CHUNK512 rows on AVX-512 at block 32 (measured, per activation row: 6 rows 0.77x the time of 4, 5 rows
 * 0.82x), 4 otherwise; up to 8 rows (one weight row at a time) where the chunk's activations fit in 32 KB (K <=
 * I4_CHUNK8_KC): measured with benchmarks/int4_kernel.py, 1 thread, g32, [768, 2048] (an expert's down projection):
 * M = 7 0.251 -> 0.216 ms, M = 8 0.278 -> 0.236, M = 16 0.523 -> 0.480; at [2048, 1536] the 64 KB of 8 activation
 * rows do not stay in L1: M = 8 0.516 -> 0.570, M = 16 0.987 -> 1.138 (so 6 there). */
#ifndef I4_CHUNK512
#define I4_CHUNK512 6
#endif
#ifndef I4_CHUNK8_KC
#define I4_CHUNK8_KC 1024
#endif
#ifndef I4_CHUNKED_GEMV_MAX_M
/* measured (dense [2048, 8192], g32 and g128, 1 thread): the chunks take 0.45-0.90x the panel's time at M = 5..16
 * and 1.13-1.16x at M = 24 */
#define I4_CHUNKED_GEMV_MAX_M 16
#endif
#ifndef I4_CHUNKED_GEMV_MAX_M_AVX2
/* the AVX2 path: the panel from 5 rows. Measured on an AVX2-only AMD EPYC Zen 1 after the panel's tile kept its
 * chains in registers (qo_cpu_int4_panel.c), builds with 16 / 8 / 4 here calling qo_matmul_int4_f32 in turn, 1
 * thread, g32, best of 15: [768, 2048] M = 5 1.21 / 1.22 / 1.06 ms, M = 8 1.68 / 1.67 / 1.41, M = 12 2.38 / 1.62 /
 * 1.65, M = 16 3.21 / 2.02 / 2.04; [2048, 768] M = 8 1.79 / 1.81 / 1.46, M = 16 3.49 / 2.11 / 2.03; [1536, 2048]
 * M = 8 3.24 / 3.09 / 2.72, M = 16 6.44 / 4.13 / 4.07 (custom_ops/README.md, "The exact 4-bit panel from 5 rows on
 * AVX2"). The AVX-512 path keeps the chunks up to 16 rows (measured there, above). */
#define I4_CHUNKED_GEMV_MAX_M_AVX2 4
#endif

/* the most activation rows that run as chunked GEMVs on a path (above: the panel) */
static inline int64_t chunked_gemv_max_m(int path) {
  return path == I4_AVX2 ? I4_CHUNKED_GEMV_MAX_M_AVX2 : I4_CHUNKED_GEMV_MAX_M;
}

/* the job's A prepared for its M: the GEMV's layout up to I4_CHUNKED_GEMV_MAX_M rows, else the panel kernel's */
static void prepare_a(const i4_job* j, const int64_t* src, float* out) {
  if (j->M <= chunked_gemv_max_m(j->path)) deinterleave_a(j->A, src, j->M, j->K, j->Kc, j->path == I4_AVX2, out);
  else qo_i4_panel_pack_a(j->path, j->A, src, j->M, j->K, j->Kc, out);
}

static void pack_tile_task(void* data, size_t t) {
  const i4_job* j = (const i4_job*)data;
  qo_i4_panel_pack_tile(j->path, j->A, NULL, j->M, j->K, j->Kc, (int64_t)t, (float*)j->ad);
}

#if QO_I4_X86
/* rows [n0, n1) through the panel kernel */
static void panel_task(i4_job* j, int64_t n0, int64_t n1) {
  const i4_weight w = {j->B, j->scales, j->zp, j->N, j->K, j->Kc, j->block, j->k_blocks, j->row_bytes,
                       j->zp_row_bytes};
  if (qo_i4_panel_rows(j->path, &w, j->ad, j->M, n0, n1, j->Y, j->N) != QO_OK) j->failed = 1;
}
#endif

#if QO_I4_X86
/* ================= AVX2 + FMA ================= */
QO_TARGET_BEGIN("avx2,fma")

/* the fold on vectors, lane for lane the same additions as fold32: its last three halvings of the 8 even (odd) sums
 * are qo_fold8's tree */
static inline float fold_avx2(__m256 e0, __m256 e1, __m256 o0, __m256 o1) {
  return qo_fold8_avx2(_mm256_add_ps(e0, e1)) + qo_fold8_avx2(_mm256_add_ps(o0, o1));
}

/* the zero points of groups [b0, b0 + count) of a weight row (b0 even) -> out[i]: z of group b0 + i in every byte
 * (a pure load then gives the byte-subtraction vector of a group). 16 groups (8 zero-point bytes) a step, each
 * byte repeated by vpshufb (before 2026-12-06: 32 groups a step, repeated by vpmulld, which a Zen 1 runs at a
 * quarter of vpshufb's rate, and a scalar loop below 32 groups); the last count % 16 groups one at a time. */
I4_INLINE void expand_zero_points_avx2(const uint8_t* zrow, int64_t b0, int64_t count, uint32_t* out) {
  const uint8_t* zb = zrow + (b0 >> 1);
  const __m128i m4 = _mm_set1_epi8(0x0F);
  const __m256i rep0 = _mm256_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 6, 6,
                                        6, 6, 7, 7, 7, 7);
  const __m256i rep1 = _mm256_add_epi8(rep0, _mm256_set1_epi8(8));
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    const __m128i raw = _mm_loadl_epi64((const __m128i*)(zb + (i >> 1)));
    const __m128i lo = _mm_and_si128(raw, m4), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m4);
    const __m256i z = _mm256_broadcastsi128_si256(_mm_unpacklo_epi8(lo, hi)); /* groups i..i+15 in each lane */
    _mm256_storeu_si256((__m256i*)(out + i), _mm256_shuffle_epi8(z, rep0));
    _mm256_storeu_si256((__m256i*)(out + i + 8), _mm256_shuffle_epi8(z, rep1));
  }
  for (; i < count; ++i) out[i] = 0x01010101u * (uint32_t)((zb[i >> 1] >> ((i & 1) << 2)) & 0x0F);
}

/* GEMV: one weight row x MM activation rows, 4 accumulators each. The row is walked 64 bytes (4 chunks of 32
 * elements) a step with one software prefetch I4_PREFETCH_AVX2 bytes ahead. The zero points and scales of I4_ZSEG
 * groups at a time are first put in stack tables (z in every byte of a uint32; s * 2^-24), so that a chunk's zero
 * point and scale are two broadcast loads and no scalar work.
 *
 * A chunk's decode (19 vector uops per 32 weights, 13 of them on the FMA ports, against 23 and 13 for the
 * vpmovsxbd decode before): its 16 bytes broadcast to both lanes, shifted right by 0 (low lane) or 4 (high lane)
 * bits, masked and minus z as bytes: the low lane holds the 16 low nibbles' q - z, the high lane the high ones'.
 * Vector q (q < 4) takes bytes 4q..4q+3 of each lane into the top byte of a dword (vpshufb; the other bytes 0):
 * (q - z) * 2^24, a signed integer, converted exactly, then times s * 2^-24: the exact product (q - z) * s, rounded
 * once, the value (float)(q - z) * s gives. Where a segment has a scale with 0 < |s| < 2^-102 (s * 2^-24 would
 * lose bits below FLT_MIN), it multiplies by 2^-24 first (exact) and then by s. The accumulators' lanes are then
 * [e 4q..4q+3 | o 4q..4q+3] (the activations' "quads" layout); the fold puts them back in the fold32 order.
 *
 * Measured on a Xeon with QO_CPU_KERNELS=avx2, [4096, 4096] g32 with zero points, M = 1, 1 thread, a stand-alone
 * harness calling the loops directly: with the weight in L2 8.0 cycles per chunk (4.04 GHz) against 9.1 for the
 * vpmovsxbd decode in the same 64-byte loop and 9.5-10.0 for the loop before that (one chunk a step, the zero point
 * taken from its nibble each group, the prefetch every 64 bytes behind a test); streamed from memory 9.0 against
 * 8.2 and 7.4-7.6 GB/s (prefetch 2048-4096 ahead; 1024: 7.9; 512: 4.9). */
#ifndef I4_PREFETCH_AVX2
#define I4_PREFETCH_AVX2 4096
#endif
#define I4_ZSEG 256 /* groups whose zero points and scales are tabled at a time */
typedef struct {
  __m256i take[4]; /* vpshufb controls: bytes 4q..4q+3 of each lane to the top byte of its dwords */
  __m256i shift;   /* 0 in the low lane, 4 in the high lane */
  __m256i m4;
} i4_avx2_consts;

static inline i4_avx2_consts avx2_consts(void) {
  i4_avx2_consts c;
  for (int q = 0; q < 4; ++q) {
    int8_t t[32];
    for (int i = 0; i < 32; ++i) t[i] = (i & 3) == 3 ? (int8_t)(4 * q + ((i & 15) >> 2)) : (int8_t)-128;
    c.take[q] = _mm256_loadu_si256((const __m256i*)t);
  }
  c.shift = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
  c.m4 = _mm256_set1_epi8(0x0F);
  return c;
}

I4_INLINE void gemv_avx2_chunk(const i4_avx2_consts* k, const uint8_t* p, const uint32_t* z, const float* s,
                               const float* a, int64_t Kc, __m256 acc[4][4], const int MM, const int tiny) {
  const __m256i raw = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)p));
  const __m256i d = _mm256_sub_epi8(_mm256_and_si256(_mm256_srlv_epi32(raw, k->shift), k->m4),
                                    _mm256_set1_epi32((int)*z));
  const __m256 sv = _mm256_broadcast_ss(s);
  for (int q = 0; q < 4; ++q) {
    __m256 w = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(d, k->take[q]));
    if (tiny) w = _mm256_mul_ps(w, _mm256_set1_ps(0x1p-24f));
    w = _mm256_mul_ps(w, sv);
    for (int m = 0; m < MM; ++m) acc[m][q] = _mm256_fmadd_ps(_mm256_loadu_ps(a + m * Kc + 8 * q), w, acc[m][q]);
  }
}

/* The M = 1 chunk on 128-bit registers, for CPUs that run each 256-bit instruction as two 128-bit halves (AMD Zen 1
 * and Zen+, avx2_halves): the same operations on the same lanes as gemv_avx2_chunk (ax[2q] holds the low half of its
 * acc[q], the even elements; ax[2q + 1] the high half, the odd ones), so the same bits. The low nibbles' q - z come
 * from an xmm mask, the high ones' from an xmm shift and the mask, instead of a broadcast and a vpsrlvd. Measured on
 * a Zen 1 (benchmarks/int4_avx2_chunk_ablation.c, [128, 4096] g32 in L2, 1 thread): 14.9 cycles per 32 weights
 * against 17.6 for the 256-bit chunk. */
I4_INLINE void gemv_avx2_chunk_x(const __m128i* take, __m128i m4, const uint8_t* p, const uint32_t* z,
                                 const float* s, const float* a, __m128 ax[8], const int tiny) {
  const __m128i x = _mm_loadu_si128((const __m128i*)p), zv = _mm_set1_epi32((int)*z);
  const __m128i dl = _mm_sub_epi8(_mm_and_si128(x, m4), zv);
  const __m128i dh = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(x, 4), m4), zv);
  const __m128 sv = _mm_broadcast_ss(s);
  for (int q = 0; q < 4; ++q) {
    __m128 wl = _mm_cvtepi32_ps(_mm_shuffle_epi8(dl, take[q]));
    __m128 wh = _mm_cvtepi32_ps(_mm_shuffle_epi8(dh, take[q]));
    if (tiny) {
      wl = _mm_mul_ps(wl, _mm_set1_ps(0x1p-24f));
      wh = _mm_mul_ps(wh, _mm_set1_ps(0x1p-24f));
    }
    ax[2 * q] = _mm_fmadd_ps(_mm_loadu_ps(a + 8 * q), _mm_mul_ps(wl, sv), ax[2 * q]);
    ax[2 * q + 1] = _mm_fmadd_ps(_mm_loadu_ps(a + 8 * q + 4), _mm_mul_ps(wh, sv), ax[2 * q + 1]);
  }
}

/* chunks [0, chunks) of a segment (chunk c in group c >> shift of the tables), into acc, or with halves (MM = 1)
 * on 128-bit registers into ax */
I4_INLINE void gemv_avx2_segment(const i4_avx2_consts* k, const uint8_t* p, const uint32_t* zr, const float* sq,
                                 const float* a, int64_t Kc, int64_t chunks, int shift, __m256 acc[4][4],
                                 __m128 ax[8], const int MM, const int tiny, const int halves) {
  __m128i take[4];
  for (int q = 0; q < 4; ++q) take[q] = _mm256_castsi256_si128(k->take[q]);
  const __m128i m4 = _mm256_castsi256_si128(k->m4);
  int64_t c = 0;
  for (; c + 4 <= chunks; c += 4, p += 64, a += 128) {
    _mm_prefetch((const char*)p + I4_PREFETCH_AVX2, _MM_HINT_T0);
    for (int g = 0; g < 4; ++g) {
      const int64_t b = (c + g) >> shift;
      if (halves) gemv_avx2_chunk_x(take, m4, p + 16 * g, zr + b, sq + b, a + 32 * g, ax, tiny);
      else gemv_avx2_chunk(k, p + 16 * g, zr + b, sq + b, a + 32 * g, Kc, acc, MM, tiny);
    }
  }
  for (; c < chunks; ++c, p += 16, a += 32) {
    const int64_t b = c >> shift;
    if (halves) gemv_avx2_chunk_x(take, m4, p, zr + b, sq + b, a, ax, tiny);
    else gemv_avx2_chunk(k, p, zr + b, sq + b, a, Kc, acc, MM, tiny);
  }
}

/* the scales of a segment -> sq (s * 2^-24); 1 when one of them has 0 < |s| < 2^-102 (then sq = s). The last step
 * loads the remaining scales under a mask (zeros past nb, which are not tiny) and writes up to 7 entries past nb (sq
 * holds I4_ZSEG + 8). */
I4_INLINE int avx2_scale_table(const float* sc, int64_t nb, float* sq) {
  const __m256 lo = _mm256_set1_ps(0x1p-102f), absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256 tiny = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; i += 8) {
    const __m256 v = i + 8 <= nb ? _mm256_loadu_ps(sc + i)
                                 : _mm256_maskload_ps(sc + i, _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(nb - i)), lane));
    const __m256 av = _mm256_and_ps(v, absm);
    tiny = _mm256_or_ps(tiny, _mm256_and_ps(_mm256_cmp_ps(av, lo, _CMP_LT_OQ),
                                            _mm256_cmp_ps(av, _mm256_setzero_ps(), _CMP_GT_OQ)));
    _mm256_storeu_ps(sq + i, _mm256_mul_ps(v, _mm256_set1_ps(0x1p-24f)));
  }
  const int t = _mm256_movemask_ps(tiny) != 0;
  if (t) memcpy(sq, sc, sizeof(float) * (size_t)nb);
  return t;
}

I4_INLINE void gemv_avx2_row(const i4_job* j, int64_t n, const int MM, const int halves) {
  const i4_avx2_consts k = avx2_consts();
  __m256 acc[4][4]; /* [m][q]: lanes [e 4q..4q+3 | o 4q..4q+3] */
  __m128 ax[8];     /* halves (MM = 1): the halves of acc[0] */
  for (int m = 0; m < MM; ++m)
    for (int v = 0; v < 4; ++v) acc[m][v] = _mm256_setzero_ps();
  for (int v = 0; v < 8; ++v) ax[v] = _mm_setzero_ps();
  const int64_t kb = j->k_blocks, Kc = j->Kc;
  const int shift = __builtin_ctzll((unsigned long long)j->block) - 5; /* chunk -> group: block / 32 chunks a group */
  const uint8_t* p = j->B + n * j->row_bytes;
  const float* sc = j->scales + n * kb;
  const uint8_t* zrow = j->zp ? j->zp + n * j->zp_row_bytes : NULL;
  const float* a = j->ad;
  uint32_t zr[I4_ZSEG];
  float sq[I4_ZSEG + 8];
  if (!zrow) /* z = 8 for the groups the row has (before 2026-12-06: all I4_ZSEG entries, a row at a time) */
    for (int64_t i = 0; i < (kb < I4_ZSEG ? kb : I4_ZSEG); ++i) zr[i] = 0x08080808u;
  for (int64_t b0 = 0; b0 < kb; b0 += I4_ZSEG) {
    const int64_t nb = kb - b0 < I4_ZSEG ? kb - b0 : I4_ZSEG, chunks = nb << shift;
    if (zrow) expand_zero_points_avx2(zrow, b0, nb, zr);
    if (avx2_scale_table(sc + b0, nb, sq)) gemv_avx2_segment(&k, p, zr, sq, a, Kc, chunks, shift, acc, ax, MM, 1, halves);
    else gemv_avx2_segment(&k, p, zr, sq, a, Kc, chunks, shift, acc, ax, MM, 0, halves);
    p += chunks * 16;
    a += chunks * 32;
  }
  if (halves)
    for (int q = 0; q < 4; ++q) acc[0][q] = _mm256_set_m128(ax[2 * q + 1], ax[2 * q]);
  for (int m = 0; m < MM; ++m) {
    const __m256 e0 = _mm256_permute2f128_ps(acc[m][0], acc[m][1], 0x20), o0 = _mm256_permute2f128_ps(acc[m][0], acc[m][1], 0x31);
    const __m256 e1 = _mm256_permute2f128_ps(acc[m][2], acc[m][3], 0x20), o1 = _mm256_permute2f128_ps(acc[m][2], acc[m][3], 0x31);
    j->Y[m * j->N + n] = fold_avx2(e0, e1, o0, o1);
  }
}

static void gemv_avx2_task(i4_job* j, int64_t n0, int64_t n1) {
  int64_t n = n0;
  switch (j->M) {
    case 1:
      /* one row at a time: 4 rows' 16 accumulators alone fill AVX2's 16 registers (measured on a Xeon with
       * QO_CPU_KERNELS=avx2, [2048, 8192] and [8192, 2048] g32, 1 thread, two runs: 1.76-1.83 ms against
       * 1.84-2.01 for 4 rows) */
      if (j->halves)
        for (; n < n1; ++n) gemv_avx2_row(j, n, 1, 1);
      else
        for (; n < n1; ++n) gemv_avx2_row(j, n, 1, 0);
      break;
    case 2: /* also one row (2 x 2 tiles' 16 accumulators spilled: 2.19-2.30 ms against 2.48-2.66, as above) */
      for (; n < n1; ++n) gemv_avx2_row(j, n, 2, 0);
      break;
    case 3:
      for (; n < n1; ++n) gemv_avx2_row(j, n, 3, 0);
      break;
    default:
      for (; n < n1; ++n) gemv_avx2_row(j, n, 4, 0);
      break;
  }
}

QO_TARGET_END

/* ================= AVX-512 (F + BW + VL + DQ) ================= */
QO_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")

static inline float fold_avx512(__m512 e, __m512 o) {
  const __m256 e8 = _mm256_add_ps(_mm512_castps512_ps256(e), _mm512_extractf32x8_ps(e, 1));
  const __m256 o8 = _mm256_add_ps(_mm512_castps512_ps256(o), _mm512_extractf32x8_ps(o, 1));
  return qo_fold8_avx2(e8) + qo_fold8_avx2(o8);
}

/* (c - z) for c < 16, one 64-byte row per zero point z < 16 (exact small integers): a group's table is row z times
 * the broadcast scale: the 16 decoded values of a group, T[c] = ((float)c - (float)z) * s, in one multiply */
#define I4_CZ(z) {0.f - z, 1.f - z, 2.f - z, 3.f - z, 4.f - z, 5.f - z, 6.f - z, 7.f - z, 8.f - z, 9.f - z, 10.f - z, \
                  11.f - z, 12.f - z, 13.f - z, 14.f - z, 15.f - z}
static const float i4_c_minus_z[16][16] __attribute__((aligned(64))) = {
    I4_CZ(0), I4_CZ(1), I4_CZ(2),  I4_CZ(3),  I4_CZ(4),  I4_CZ(5),  I4_CZ(6),  I4_CZ(7),
    I4_CZ(8), I4_CZ(9), I4_CZ(10), I4_CZ(11), I4_CZ(12), I4_CZ(13), I4_CZ(14), I4_CZ(15)};
#undef I4_CZ

I4_INLINE __m512 group_table_z(unsigned z, const float* s) {
  return _mm512_mul_ps(_mm512_load_ps(i4_c_minus_z[z]), _mm512_set1_ps(*s));
}

/* one group of block 32 (16 bytes of each of the R rows at byte offset off, the zero point in the low (half 0) or
 * the high (half 1) nibble of the rows' zero-point byte zb_off) for gemv512_g32: the group's tables, then
 * first_decode = 0: the activations of the group loaded once, then row by row decoded and multiplied (MM <= 4);
 * 1: the R rows' weights decoded first, then activation row by activation row (MM 5, 6 with R = 2, MM 7, 8 with R = 1:
 * 2 MM R accumulators, 2 R weights, 2 activations in registers). The additions are the same either way. */
I4_INLINE void g32_group(__m512 acc[8][8][2], const uint8_t* p, int64_t rb, const uint8_t* zp, int64_t zb,
                         int64_t zb_off, const float* sc, int64_t kb, int64_t b, const float* a, int64_t Kc, int64_t off,
                         const int half, const int R, const int MM, const int first_decode) {
  __m512 t[8];
  for (int r = 0; r < R; ++r) {
    const unsigned z = zp ? (half ? zp[r * zb + zb_off] >> 4 : zp[r * zb + zb_off] & 0x0F) : 8;
    t[r] = group_table_z(z, sc + r * kb + b);
  }
  if (first_decode) {
    __m512 we[8], wo[8];
    for (int r = 0; r < R; ++r) {
      const __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(p + r * rb + off)));
      we[r] = _mm512_permutexvar_ps(idx, t[r]);
      wo[r] = _mm512_permutexvar_ps(_mm512_srli_epi32(idx, 4), t[r]);
    }
    for (int m = 0; m < MM; ++m) {
      const __m512 xe = _mm512_loadu_ps(a + m * Kc + 2 * off), xo = _mm512_loadu_ps(a + m * Kc + 2 * off + 16);
      for (int r = 0; r < R; ++r) {
        acc[r][m][0] = _mm512_fmadd_ps(xe, we[r], acc[r][m][0]);
        acc[r][m][1] = _mm512_fmadd_ps(xo, wo[r], acc[r][m][1]);
      }
    }
    return;
  }
  __m512 xe[4], xo[4];
  for (int m = 0; m < MM; ++m) {
    xe[m] = _mm512_loadu_ps(a + m * Kc + 2 * off);
    xo[m] = _mm512_loadu_ps(a + m * Kc + 2 * off + 16);
  }
  for (int r = 0; r < R; ++r) {
    const __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(p + r * rb + off)));
    const __m512 we = _mm512_permutexvar_ps(idx, t[r]);
    const __m512 wo = _mm512_permutexvar_ps(_mm512_srli_epi32(idx, 4), t[r]);
    for (int m = 0; m < MM; ++m) {
      acc[r][m][0] = _mm512_fmadd_ps(xe[m], we, acc[r][m][0]);
      acc[r][m][1] = _mm512_fmadd_ps(xo[m], wo, acc[r][m][1]);
    }
  }
}

/* GEMV at block 32: R weight rows x MM activation rows (2 accumulators each: the even and the odd lanes), two
 * groups (32 bytes of each row, one zero-point byte) per step, rows addressed from one base (row r at r *
 * row_bytes), one software prefetch per row per 64 bytes. Measured against the per-group loop kept below for other
 * blocks (Xeon, 1 thread, [768, 2048], L2-resident): 1.25x at M = 4, 1.6x at M = 6. */
I4_INLINE void gemv512_g32(const i4_job* j, int64_t n, const int R, const int MM, const int first_decode) {
  __m512 acc[8][8][2];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MM; ++m) acc[r][m][0] = acc[r][m][1] = _mm512_setzero_ps();
  const int64_t kb = j->k_blocks, Kc = j->Kc, rb = j->row_bytes, zb = j->zp_row_bytes;
  const uint8_t* p = j->B + n * rb;
  const float* sc = j->scales + n * kb;
  const uint8_t* zp = j->zp ? j->zp + n * zb : NULL;
  const float* a = j->ad;
  int64_t b = 0;
  for (; b + 2 <= kb; b += 2) {
    const int64_t off = b * 16;
    if ((off & 63) == 0) { /* I4_PREFETCH512 ahead; past the row's end, the next tile's row r */
      const int64_t ahead = off + I4_PREFETCH512 < rb ? I4_PREFETCH512 : I4_PREFETCH512 + (R - 1) * rb;
      for (int r = 0; r < R; ++r) _mm_prefetch((const char*)p + r * rb + off + ahead, _MM_HINT_T0);
    }
    g32_group(acc, p, rb, zp, zb, b >> 1, sc, kb, b, a, Kc, off, 0, R, MM, first_decode);
    g32_group(acc, p, rb, zp, zb, b >> 1, sc, kb, b + 1, a, Kc, off + 16, 1, R, MM, first_decode);
  }
  if (b < kb) g32_group(acc, p, rb, zp, zb, b >> 1, sc, kb, b, a, Kc, b * 16, 0, R, MM, first_decode);
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MM; ++m) j->Y[m * j->N + n + r] = fold_avx512(acc[r][m][0], acc[r][m][1]);
}

/* rows [n, n1) of the job (block 32) at M = MM, R rows per tile then single rows */
#define I4_GEMV512(R, MM, FD)                                           \
  do {                                                                  \
    for (; n + R <= n1; n += R) gemv512_g32(j, n, R, MM, FD);           \
    for (; n < n1; ++n) gemv512_g32(j, n, 1, MM, FD);                   \
  } while (0)

/* other block sizes (the tables built per group as before; not retuned) */
/* the 16 decoded values of a group: T[c] = ((float)c - (float)z) * s */
I4_INLINE __m512 group_table(int z, float s) {
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  return _mm512_mul_ps(_mm512_sub_ps(iota, _mm512_set1_ps((float)z)), _mm512_set1_ps(s));
}

/* M = 3, 4: every row indexed from the job each step (measured: 1.1-1.2x the tile below at these M) */
I4_INLINE void gemv_avx512_rows_indexed(const i4_job* j, int64_t n, const int R, const int MM) {
  __m512 acc[4][4][2]; /* [r][m][even, odd] */
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MM; ++m) acc[r][m][0] = acc[r][m][1] = _mm512_setzero_ps();
  const int64_t chunks = j->block / 32;
  for (int64_t b = 0; b < j->k_blocks; ++b) {
    __m512 t[4];
    for (int r = 0; r < R; ++r) t[r] = group_table(zero_point(j, n + r, b), j->scales[(n + r) * j->k_blocks + b]);
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t k = b * j->block + c * 32;
      for (int r = 0; r < R; ++r) {
        const uint8_t* src = j->B + (n + r) * j->row_bytes + k / 2;
        if ((k & 127) == 0) _mm_prefetch((const char*)src + I4_PREFETCH, _MM_HINT_T0);
        const __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)src));
        const __m512 we = _mm512_permutexvar_ps(idx, t[r]);  /* low 4 bits index: the low nibble */
        const __m512 wo = _mm512_permutexvar_ps(_mm512_srli_epi32(idx, 4), t[r]);
        for (int m = 0; m < MM; ++m) {
          const float* a = j->ad + m * j->Kc + k;
          acc[r][m][0] = _mm512_fmadd_ps(_mm512_loadu_ps(a), we, acc[r][m][0]);
          acc[r][m][1] = _mm512_fmadd_ps(_mm512_loadu_ps(a + 16), wo, acc[r][m][1]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MM; ++m) j->Y[m * j->N + n + r] = fold_avx512(acc[r][m][0], acc[r][m][1]);
}

/* GEMV: R weight rows x MM activation rows (2 accumulators each: the even and the odd lanes). Each row's bytes
 * are read through a pointer advanced group by group, one software prefetch per row per 64 bytes; the group's
 * tables are built once per (row, group). Measured (Zen 5, M = 1, g128, L2-resident): 8 rows 1.4x the earlier
 * 4-row tile that indexed every row from the job each step (its address arithmetic, not the permutes, bound it:
 * the same loop with no permutes at all was only 1.14x faster); 12 rows 0.8x, 2 rows 1.0x. */
I4_INLINE void gemv_avx512_rows(const i4_job* j, int64_t n, const int R, const int MM) {
  __m512 acc[8][2][2]; /* [r][m][even, odd] */
  const uint8_t* p[8];
  for (int r = 0; r < R; ++r) {
    p[r] = j->B + (n + r) * j->row_bytes;
    for (int m = 0; m < MM; ++m) acc[r][m][0] = acc[r][m][1] = _mm512_setzero_ps();
  }
  const float* a = j->ad;
  const float* sc = j->scales + n * j->k_blocks;
  const uint8_t* zp = j->zp ? j->zp + n * j->zp_row_bytes : NULL;
  const int64_t kb = j->k_blocks, gbytes = j->block / 2, Kc = j->Kc, rb = j->row_bytes;
  for (int64_t b = 0; b < kb; ++b) {
    __m512 t[8];
    for (int r = 0; r < R; ++r)
      t[r] = group_table(zp ? (zp[r * j->zp_row_bytes + (b >> 1)] >> (4 * (b & 1))) & 0x0F : 8, sc[r * kb + b]);
    for (int64_t c = 0; c < gbytes; c += 16) {
      if ((c & 63) == 0) {
        /* I4_PREFETCH bytes ahead in the row; past its end, the same place in row r of the next tile (the rows
         * of a tile are contiguous: row r's continuation is row r + 1, read by its own stream already) */
        const int64_t ahead = b * gbytes + c + I4_PREFETCH < rb ? I4_PREFETCH : I4_PREFETCH + (R - 1) * rb;
        for (int r = 0; r < R; ++r) _mm_prefetch((const char*)p[r] + c + ahead, _MM_HINT_T0);
      }
      __m512 xe[2], xo[2];
      for (int m = 0; m < MM; ++m) {
        xe[m] = _mm512_loadu_ps(a + m * Kc + 2 * c);
        xo[m] = _mm512_loadu_ps(a + m * Kc + 2 * c + 16);
      }
      for (int r = 0; r < R; ++r) {
        const __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(p[r] + c)));
        const __m512 we = _mm512_permutexvar_ps(idx, t[r]); /* low 4 bits index: the low nibble */
        const __m512 wo = _mm512_permutexvar_ps(_mm512_srli_epi32(idx, 4), t[r]);
        for (int m = 0; m < MM; ++m) {
          acc[r][m][0] = _mm512_fmadd_ps(xe[m], we, acc[r][m][0]);
          acc[r][m][1] = _mm512_fmadd_ps(xo[m], wo, acc[r][m][1]);
        }
      }
    }
    for (int r = 0; r < R; ++r) p[r] += gbytes;
    a += j->block;
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MM; ++m) j->Y[m * j->N + n + r] = fold_avx512(acc[r][m][0], acc[r][m][1]);
}

static void gemv_avx512_task(i4_job* j, int64_t n0, int64_t n1) {
  int64_t n = n0;
  if (j->block == 32) {
    switch (j->M) { /* tiles: measured on a Xeon (AVX-512, 1 thread, [768, 2048] g32) */
      case 1: I4_GEMV512(1, 1, 0); return; /* one sequential stream: from L3 / DRAM 1.2x 8 rows (L2: 0.8x) */
      case 2: I4_GEMV512(4, 2, 0); return;
      case 3: I4_GEMV512(2, 3, 0); return;
      case 4: I4_GEMV512(2, 4, 0); return;
      case 5: I4_GEMV512(2, 5, 1); return;
      case 6: I4_GEMV512(2, 6, 1); return;
      case 7: I4_GEMV512(1, 7, 1); return;
      default: I4_GEMV512(1, 8, 1); return;
    }
  }
  switch (j->M) {
    case 1:
      for (; n + 8 <= n1; n += 8) gemv_avx512_rows(j, n, 8, 1);
      for (; n + 2 <= n1; n += 2) gemv_avx512_rows(j, n, 2, 1);
      for (; n < n1; ++n) gemv_avx512_rows(j, n, 1, 1);
      break;
    case 2:
      for (; n + 4 <= n1; n += 4) gemv_avx512_rows(j, n, 4, 2);
      for (; n < n1; ++n) gemv_avx512_rows(j, n, 1, 2);
      break;
    case 3:
      for (; n + 2 <= n1; n += 2) gemv_avx512_rows_indexed(j, n, 2, 3);
      for (; n < n1; ++n) gemv_avx512_rows_indexed(j, n, 1, 3);
      break;
    default:
      for (; n + 2 <= n1; n += 2) gemv_avx512_rows_indexed(j, n, 2, 4);
      for (; n < n1; ++n) gemv_avx512_rows_indexed(j, n, 1, 4);
      break;
  }
}

QO_TARGET_END
#endif /* QO_I4_X86 */

/* ---------------- dispatch ---------------- */
/* 1 where the AVX2 M = 1 GEMV runs on 128-bit registers: a CPU that runs each 256-bit instruction as two 128-bit
 * halves, AMD Zen 1 and Zen+ (__builtin_cpu_is "znver1": family 17h below model 30h). QO_AVX2_HALVES=0 | 1 forces
 * it either way (read with QO_CPU_KERNELS, once per call of the op: tests and benchmarks; the same bits). */
static int avx2_halves(void) {
  const char* force = getenv("QO_AVX2_HALVES");
  if (force && (force[0] == '0' || force[0] == '1') && force[1] == 0) return force[0] == '1';
#if QO_I4_X86
  static int zen1 = -1;
  if (zen1 < 0) {
    __builtin_cpu_init();
    zen1 = __builtin_cpu_is("znver1") ? 1 : 0;
  }
  return zen1;
#else
  return 0;
#endif
}

#define I4_HALVES 8 /* a flag on the path pick_path returns: I4_AVX2 with the M = 1 GEMV on 128-bit registers */

static int pick_isa_path(int64_t block) {
  const char* force = getenv("QO_CPU_KERNELS"); /* portable | avx2 | (unset: the best the CPU has) */
  if (block % 32 != 0 || (force && strcmp(force, "portable") == 0)) return I4_PORTABLE;
#if QO_I4_X86
  static int best = -1;
  if (best < 0) {
    __builtin_cpu_init();
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const int avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    best = avx512 ? I4_AVX512 : avx2 ? I4_AVX2 : I4_PORTABLE;
  }
  if (force && strcmp(force, "avx2") == 0) return best >= I4_AVX2 ? I4_AVX2 : I4_PORTABLE;
  return best;
#else
  return I4_PORTABLE;
#endif
}

/* weight rows [n0, n1) of the job on the calling thread, on its path */
static void run_rows(i4_job* j, int64_t n0, int64_t n1, int gemv) {
#if QO_I4_X86
  if (j->path == I4_AVX512) {
    gemv ? gemv_avx512_task(j, n0, n1) : panel_task(j, n0, n1);
    return;
  }
  if (j->path == I4_AVX2) {
    gemv ? gemv_avx2_task(j, n0, n1) : panel_task(j, n0, n1);
    return;
  }
#endif
  (void)gemv;
  portable_task(j, n0, n1);
}

/* rows [n0, n1) of the job: M <= 4 the GEMV; up to I4_CHUNKED_GEMV_MAX_M rows (SIMD paths) the GEMV in chunks of a
 * few activation rows, A in the GEMV's layout; above, the panel */
static void rows_of(i4_job* j, int64_t n0, int64_t n1) {
  if (j->M > I4_GEMV_MAX_M && j->M <= chunked_gemv_max_m(j->path) && j->path != I4_PORTABLE) {
    const int64_t most = j->path != I4_AVX512 || j->block != 32 ? I4_GEMV_MAX_M
                         : j->Kc <= I4_CHUNK8_KC ? 8 : I4_CHUNK512;
    const int64_t chunks = (j->M + most - 1) / most;
    const int64_t size = (j->M + chunks - 1) / chunks;
    for (int64_t m0 = 0; m0 < j->M && n0 < n1; m0 += size) {
      i4_job c = *j;
      c.M = j->M - m0 < size ? j->M - m0 : size;
      c.A = j->A ? j->A + m0 * j->K : NULL;
      c.ad = j->ad + m0 * j->Kc;
      c.Y = j->Y + m0 * j->N;
      run_rows(&c, n0, n1, 1);
      if (c.failed) j->failed = c.failed;
    }
  } else if (j->M > 0 && n0 < n1) {
    run_rows(j, n0, n1, j->M <= I4_GEMV_MAX_M);
  }
}

static void i4_task(void* data, size_t t) {
  i4_job* j = (i4_job*)data;
  const int64_t n0 = (int64_t)t * j->rows_per_task;
  const int64_t n1 = n0 + j->rows_per_task < j->N ? n0 + j->rows_per_task : j->N;
  rows_of(j, n0, n1);
}

/* the job of one weight (no A yet); its path picked now */
static i4_job job_of(int path, const uint8_t* B, const float* scales, const uint8_t* zero_points, int64_t M,
                     int64_t N, int64_t K, int64_t block_size) {
  i4_job j;
  memset(&j, 0, sizeof j);
  j.B = B;
  j.scales = scales;
  j.zp = zero_points;
  j.M = M;
  j.N = N;
  j.K = K;
  j.block = block_size;
  j.k_blocks = (K + block_size - 1) / block_size;
  j.row_bytes = j.k_blocks * block_size / 2;
  j.zp_row_bytes = (j.k_blocks + 1) / 2;
  j.Kc = (K + 31) / 32 * 32;
  j.path = block_size % 32 ? I4_PORTABLE : path & ~I4_HALVES;
  if (j.path != I4_PORTABLE) j.Kc = j.k_blocks * block_size; /* block % 32 == 0 here */
  j.halves = j.path == I4_AVX2 && (path & I4_HALVES);
  return j;
}

/* the path and its flag, as qo_cpu_int4_path hands them to the rows entry points (read once per call of the op) */
static int pick_path(int64_t block) {
  const int path = pick_isa_path(block);
  return path == I4_AVX2 && avx2_halves() ? path | I4_HALVES : path;
}

int qo_cpu_int4_path(int64_t block_size) { return pick_path(block_size); }

int64_t qo_cpu_int4_prepared_floats(int path, int64_t M, int64_t K, int64_t block_size) {
  const i4_job j = job_of(path, NULL, NULL, NULL, M, 0, K, block_size);
  return j.path == I4_PORTABLE ? 0 : M * j.Kc;
}


void qo_cpu_int4_prepare_a(int path, const float* A, const int64_t* rows, int64_t M, int64_t K, int64_t block_size,
                           float* prepared) {
  i4_job j = job_of(path, NULL, NULL, NULL, M, 0, K, block_size);
  j.A = A;
  if (j.path != I4_PORTABLE) prepare_a(&j, rows, prepared);
}

int qo_cpu_int4_rows_f32(int path, const float* A, const float* prepared, int64_t M, int64_t N, int64_t K,
                         const uint8_t* B, const float* scales, const uint8_t* zero_points, int64_t block_size,
                         int64_t n0, int64_t n1, float* Y) {
  if (!B || !scales || !Y || M < 0 || K <= 0 || n0 < 0 || n1 > N || block_size < 16 ||
      (block_size & (block_size - 1)))
    return QO_ERR_ARGUMENT;
  i4_job j = job_of(path, B, scales, zero_points, M, N, K, block_size);
  if (j.path != I4_PORTABLE ? !prepared : !A) return QO_ERR_ARGUMENT;
  j.A = A;
  j.ad = prepared;
  j.Y = Y;
  rows_of(&j, n0, n1);
  return j.failed ? QO_ERR_ALLOC : QO_OK;
}

int qo_matmul_int4_f32(const float* A, const uint8_t* B, const float* scales, const uint8_t* zero_points, float* Y,
                       int64_t M, int64_t N, int64_t K, int64_t block_size) {
  if (!A || !B || !scales || !Y || M < 0 || N < 0 || K < 0 || block_size < 16 || (block_size & (block_size - 1)))
    return QO_ERR_ARGUMENT;
  if (M == 0 || N == 0) return QO_OK;
  i4_job j = job_of(pick_path(block_size), B, scales, zero_points, M, N, K, block_size);
  j.A = A;
  j.Y = Y;
  j.rows_per_task = M <= chunked_gemv_max_m(j.path) ? I4_GEMV_ROWS : I4_PANEL_ROWS;
  float* ad = NULL;
  const int64_t ad_floats = j.path == I4_PORTABLE ? 0 : M * j.Kc;
  if (ad_floats) {
    ad = (float*)malloc(sizeof(float) * (size_t)ad_floats + 64);
    if (!ad) return QO_ERR_ALLOC;
    /* aligned (measured at M = 16 and 128, [2048, 8192] and [8192, 2048], g32, 1 thread: 2-12 % less time) */
    float* ad64 = qo_align64(ad);
    j.ad = ad64;
    if (M <= chunked_gemv_max_m(j.path)) {
      prepare_a(&j, NULL, ad64);
    } else { /* the panel's layout, tile by tile on the pool (K = 8192, M = 128: about 0.45 ms of one thread) */
      const int status = qo_cpu_parallel_for(pack_tile_task, (size_t)qo_i4_panel_tiles(j.path, M), &j);
      if (status != QO_OK) {
        free(ad);
        return status;
      }
    }
  }
  if (K == 0 || j.k_blocks == 0) {
    for (int64_t i = 0; i < M * N; ++i) Y[i] = 0.0f;
    free(ad);
    return QO_OK;
  }
  const int64_t tasks = (N + j.rows_per_task - 1) / j.rows_per_task;
  int status = qo_cpu_parallel_for(i4_task, (size_t)tasks, &j);
  free(ad);
  if (status == QO_OK && j.failed) status = QO_ERR_ALLOC;
  return status;
}

typedef struct {
  const uint8_t* B;
  const float* scales;
  const uint8_t* zero_points;
  int64_t block_size;
} i4_f16_args;

static int int4_f32_kernel(const float* A, float* Y, int64_t M, int64_t N, int64_t K, const void* args) {
  const i4_f16_args* p = (const i4_f16_args*)args;
  return qo_matmul_int4_f32(A, p->B, p->scales, p->zero_points, Y, M, N, K, p->block_size);
}

int qo_matmul_int4_f16(const uint16_t* A, const uint8_t* B, const float* scales, const uint8_t* zero_points,
                       uint16_t* Y, int64_t M, int64_t N, int64_t K, int64_t block_size) {
  if (!A || !Y || M < 0 || N < 0 || K < 0) return QO_ERR_ARGUMENT;
  const i4_f16_args args = {B, scales, zero_points, block_size};
  return qo_cpu_through_f32(A, Y, M, N, K, int4_f32_kernel, &args);
}
