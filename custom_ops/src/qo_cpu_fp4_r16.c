/* MXFP4 / NVFP4 weights in 16-row tiles ("r16"): the FP4 GEMV / GEMM whose weight bytes are laid out for the
 * decode, not as the checkpoint stores them (qo_kernels.h, qo_matmul_mxfp4_r16_f32, documents the layout).
 *
 * Why (issue #22, custom_ops/README.md "FP4 weights in 16-row tiles"): the checkpoint layout puts the 16 codes of a
 * float32 vector's lanes in one row, so the GEMVs of qo_cpu_kernels.c need byte gathers and per-row tables before
 * the FMAs. Here a 64-byte chunk holds 8 consecutive k of 16 rows, 4 bytes a row: lane r of a 16-lane vector is row
 * r, and its dword carries the row's 8 codes. Per k: `vpermps` of the 16 e2m1 values by each dword's low 4 bits
 * (the lookup reads no other bit), one multiplication by the rows' block scales, one FMA with the broadcast
 * activation, then the dwords shift right by 4 for the next k. Each of a tile's 16 rows is one
 * accumulator lane, so no fold and no per-row table; the 8 tiles a GEMV step reads are 8 contiguous streams.
 *
 * Arithmetic (every path, every M, every thread count: the same bits): per output, W_k = fp32(e2m1(code_k) * S_b)
 * with S_b the row's block scale (MXFP4: 2^(e - 127), so W_k is exact; NVFP4: fp32(e4m3(code) * B_scale_2), Quark's
 * order), and y = fmaf(W_{K-1}, a_{K-1}, ... fmaf(W_0, a_0, +0)): one sequential chain in increasing k, one rounding
 * per step, nothing after. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qo_cpu_simd.h"
#include "qo_fp_formats.h"
#include "qo_kernels.h"

#define R16_ROWS 16       /* rows per tile: one 16-lane float32 vector */
#define R16_GROUP 8       /* tiles per task (128 rows) */
#define R16_PF 2048       /* software prefetch distance in each tile's stream, bytes (measured 1024-4096 alike) */

static const float R16_E2M1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

typedef struct {
  const float* A;
  const uint8_t* B;
  const uint8_t* S;
  float s2;
  float* Y;
  int64_t M, N, K;
  int nv;  /* NVFP4 (block 16, e4m3 scales) or MXFP4 (block 32, e8m0) */
  int isa; /* QO_ISA_* */
} r16_job;

static inline int64_t r16_block(int nv) { return nv ? 16 : 32; }

/* A block scale as a float32: e8m0 2^(e - 127) (e = 255: NaN), e4m3fn times B_scale_2 rounded once. */
static inline float r16_scale(int nv, uint8_t code, float s2) {
  return nv ? qo_e4m3fn_to_f32(code) * s2 : qo_e8m0_to_f32(code);
}

/* Portable: tile t, every activation row. */
static void r16_tile_portable(const r16_job* j, int64_t t) {
  const int64_t K = j->K, blk = r16_block(j->nv), nb = K / blk;
  const uint8_t* b = j->B + t * (R16_ROWS / 2) * K;
  const uint8_t* s = j->S + t * R16_ROWS * nb;
  for (int r = 0; r < R16_ROWS; ++r)
    for (int64_t m = 0; m < j->M; ++m) {
      const float* a = j->A + m * K;
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        const uint8_t byte = b[(k / 8) * 64 + 4 * r + (k % 8) / 2];
        const float S = r16_scale(j->nv, s[(k / blk) * R16_ROWS + r], j->s2);
        const float w = R16_E2M1[(k & 1) ? byte >> 4 : byte & 15] * S;
        acc = fmaf(w, a[k], acc);
      }
      j->Y[m * j->N + t * R16_ROWS + r] = acc;
    }
}

#if defined(QO_HAVE_AVX512_HELPERS)
/* ---- AVX-512 (F + BW + VL + DQ): lanes = the 16 rows of a tile ---- */
QOZ_INLINE __m512 r16z_scales(const int nv, const uint8_t* p, __m512 s2) {
  const __m128i c = _mm_loadu_si128((const __m128i*)p);
  if (nv) return _mm512_mul_ps(qoz_fp8x16(c, 0), s2);
  const __m512i e = _mm512_cvtepu8_epi32(c);
  __m512i f = _mm512_slli_epi32(e, 23);
  f = _mm512_mask_mov_epi32(f, _mm512_cmpeq_epi32_mask(e, _mm512_setzero_si512()), _mm512_set1_epi32(0x00400000));
  f = _mm512_mask_mov_epi32(f, _mm512_cmpeq_epi32_mask(e, _mm512_set1_epi32(255)), _mm512_set1_epi32(0x7FC00000));
  return _mm512_castsi512_ps(f);
}

/* nvec consecutive tiles from t0 x activation rows m0 .. m0 + mr - 1. */
QOZ_INLINE void r16z_tiles(const int nv, const int nvec, const int mr, const r16_job* j, int64_t t0, int64_t m0) {
  const int64_t K = j->K, N = j->N, blk = nv ? 16 : 32, nb = K / blk;
  const __m512 T = _mm512_loadu_ps(R16_E2M1), s2 = _mm512_set1_ps(j->s2);
  const uint8_t* b[8];
  const uint8_t* s[8];
  __m512 acc[8][8];
  for (int v = 0; v < nvec; ++v) {
    b[v] = j->B + (t0 + v) * (R16_ROWS / 2) * K;
    s[v] = j->S + (t0 + v) * R16_ROWS * nb;
    for (int m = 0; m < mr; ++m) acc[m][v] = _mm512_setzero_ps();
  }
  const float* a = j->A + m0 * K;
  for (int64_t bi = 0; bi < nb; ++bi) {
    __m512 sc[8];
    for (int v = 0; v < nvec; ++v) sc[v] = r16z_scales(nv, s[v] + R16_ROWS * bi, s2);
    for (int c = 0; c < (nv ? 2 : 4); ++c) {
      const int64_t chunk = bi * (blk / 8) + c;
      __m512i w[8];
      for (int v = 0; v < nvec; ++v) {
        _mm_prefetch((const char*)(b[v] + 64 * chunk + R16_PF), _MM_HINT_T0);
        w[v] = _mm512_loadu_si512((const void*)(b[v] + 64 * chunk));
      }
      const float* ak = a + 8 * chunk;
      for (int q = 0; q < 8; ++q) {
        __m512 W[8];
        for (int v = 0; v < nvec; ++v) {
          W[v] = _mm512_mul_ps(_mm512_permutexvar_ps(w[v], T), sc[v]);
          w[v] = _mm512_srli_epi32(w[v], 4);
        }
        for (int m = 0; m < mr; ++m) {
          const __m512 x = _mm512_set1_ps(ak[m * K + q]);
          for (int v = 0; v < nvec; ++v) acc[m][v] = _mm512_fmadd_ps(W[v], x, acc[m][v]);
        }
      }
    }
  }
  for (int m = 0; m < mr; ++m)
    for (int v = 0; v < nvec; ++v) _mm512_storeu_ps(j->Y + (m0 + m) * N + (t0 + v) * R16_ROWS, acc[m][v]);
}

#define R16Z(NV, NVEC, MR)                                                                                   \
  static __attribute__((noinline, target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq"))) void         \
      r16z_##NV##_##NVEC##_##MR(const r16_job* j, int64_t t0, int64_t m0) {                                 \
    r16z_tiles(NV, NVEC, MR, j, t0, m0);                                                                     \
  }
#define R16Z_FMT(NV) \
  R16Z(NV, 8, 1) R16Z(NV, 1, 1) R16Z(NV, 2, 1) R16Z(NV, 2, 2) R16Z(NV, 2, 3) R16Z(NV, 2, 4) R16Z(NV, 2, 5) \
  R16Z(NV, 2, 6) R16Z(NV, 2, 7) R16Z(NV, 2, 8) R16Z(NV, 1, 2) R16Z(NV, 1, 3) R16Z(NV, 1, 4) R16Z(NV, 1, 5) \
  R16Z(NV, 1, 6) R16Z(NV, 1, 7) R16Z(NV, 1, 8)
R16Z_FMT(0)
R16Z_FMT(1)
typedef void (*r16_fn)(const r16_job*, int64_t, int64_t);
/* [nv][nvec == 2][mr - 1] */
static const r16_fn r16z_by_shape[2][2][8] = {
    {{r16z_0_1_1, r16z_0_1_2, r16z_0_1_3, r16z_0_1_4, r16z_0_1_5, r16z_0_1_6, r16z_0_1_7, r16z_0_1_8},
     {r16z_0_2_1, r16z_0_2_2, r16z_0_2_3, r16z_0_2_4, r16z_0_2_5, r16z_0_2_6, r16z_0_2_7, r16z_0_2_8}},
    {{r16z_1_1_1, r16z_1_1_2, r16z_1_1_3, r16z_1_1_4, r16z_1_1_5, r16z_1_1_6, r16z_1_1_7, r16z_1_1_8},
     {r16z_1_2_1, r16z_1_2_2, r16z_1_2_3, r16z_1_2_4, r16z_1_2_5, r16z_1_2_6, r16z_1_2_7, r16z_1_2_8}}};

/* Prefill (M > R16_PANEL_MIN_M): two tiles' weights decoded once per block of R16_KB k into a float32 panel
 * [k][32] (the same values: e2m1 x block scale), then every 12 activation rows run over it: 24 accumulators, per k two
 * panel loads, 12 broadcasts and 24 FMAs. Each output's chain goes on across blocks through Y (stored and reloaded
 * as float32, so unchanged): the same bits as the GEMV tiles. */
#define R16_KB 256
#define R16_PANEL_MR 12
#define R16_PANEL_MIN_M 8
static QO_THREAD_LOCAL float* tls_r16_panel = NULL;
static QO_THREAD_LOCAL size_t tls_r16_panel_floats = 0;

QOZ_INLINE void r16z_decode_panel(const int nv, const r16_job* j, int64_t t0, int64_t k0, int64_t k1, float* panel) {
  const int64_t K = j->K, blk = nv ? 16 : 32, nb = K / blk;
  const __m512 T = _mm512_loadu_ps(R16_E2M1), s2 = _mm512_set1_ps(j->s2);
  for (int v = 0; v < 2; ++v) {
    const uint8_t* b = j->B + (t0 + v) * (R16_ROWS / 2) * K;
    const uint8_t* s = j->S + (t0 + v) * R16_ROWS * nb;
    for (int64_t bi = k0 / blk; bi < k1 / blk; ++bi) {
      const __m512 sc = r16z_scales(nv, s + R16_ROWS * bi, s2);
      for (int64_t chunk = bi * (blk / 8); chunk < (bi + 1) * (blk / 8); ++chunk) {
        __m512i w = _mm512_loadu_si512((const void*)(b + 64 * chunk));
        float* out = panel + (8 * chunk - k0) * 32 + 16 * v;
        for (int q = 0; q < 8; ++q) {
          _mm512_storeu_ps(out + 32 * q, _mm512_mul_ps(_mm512_permutexvar_ps(w, T), sc));
          w = _mm512_srli_epi32(w, 4);
        }
      }
    }
  }
}

QOZ_INLINE void r16z_panel_rows(const int mr, const float* panel, int64_t kn, const float* a, int64_t K, float* y,
                                int64_t N, int first) {
  __m512 acc[R16_PANEL_MR][2];
  for (int m = 0; m < mr; ++m)
    for (int v = 0; v < 2; ++v) acc[m][v] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(y + m * N + 16 * v);
  for (int64_t k = 0; k < kn; ++k) {
    const __m512 w0 = _mm512_loadu_ps(panel + 32 * k), w1 = _mm512_loadu_ps(panel + 32 * k + 16);
    for (int m = 0; m < mr; ++m) {
      const __m512 x = _mm512_set1_ps(a[m * K + k]);
      acc[m][0] = _mm512_fmadd_ps(w0, x, acc[m][0]);
      acc[m][1] = _mm512_fmadd_ps(w1, x, acc[m][1]);
    }
  }
  for (int m = 0; m < mr; ++m)
    for (int v = 0; v < 2; ++v) _mm512_storeu_ps(y + m * N + 16 * v, acc[m][v]);
}

#define R16P(MR)                                                                                                   \
  static __attribute__((noinline, target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq"))) void               \
      r16z_panel_##MR(const float* panel, int64_t kn, const float* a, int64_t K, float* y, int64_t N, int first) { \
    r16z_panel_rows(MR, panel, kn, a, K, y, N, first);                                                            \
  }
R16P(1) R16P(2) R16P(3) R16P(4) R16P(5) R16P(6) R16P(7) R16P(8) R16P(9) R16P(10) R16P(11) R16P(12)
typedef void (*r16p_fn)(const float*, int64_t, const float*, int64_t, float*, int64_t, int);
typedef void (*r16d_fn)(const r16_job*, int64_t, int64_t, int64_t, float*);

/* the tiles from t that decode[nv] puts in its panel (AVX-512: 2, AVX2: 1) for every activation row, any ISA: per
 * block of R16_KB k, decode[nv] fills the panel (at most R16_KB x 32 floats), then by_mr[mr - 1] runs up to max_mr
 * activation rows over it, the outputs' chains going on across blocks through Y; 0 when the panel buffer cannot be
 * had */
static int r16_panel_run(const r16_job* j, int64_t t, const r16d_fn decode[2], const r16p_fn* by_mr, int max_mr) {
  float* panel = qo_tls_grow(&tls_r16_panel, &tls_r16_panel_floats, (size_t)(R16_KB * 32));
  if (!panel) return 0;
  const int64_t K = j->K, N = j->N;
  for (int64_t k0 = 0; k0 < K; k0 += R16_KB) {
    const int64_t k1 = k0 + R16_KB < K ? k0 + R16_KB : K;
    decode[j->nv](j, t, k0, k1, panel);
    for (int64_t m = 0; m < j->M; m += max_mr) {
      const int mr = (int)(j->M - m < max_mr ? j->M - m : max_mr);
      by_mr[mr - 1](panel, k1 - k0, j->A + m * K + k0, K, j->Y + m * N + t * R16_ROWS, N, k0 == 0);
    }
  }
  return 1;
}
static const r16p_fn r16z_panel_by_mr[R16_PANEL_MR] = {r16z_panel_1, r16z_panel_2, r16z_panel_3,  r16z_panel_4,
                                                        r16z_panel_5, r16z_panel_6, r16z_panel_7,  r16z_panel_8,
                                                        r16z_panel_9, r16z_panel_10, r16z_panel_11, r16z_panel_12};
#define R16D(NV)                                                                                                  \
  static __attribute__((noinline, target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq"))) void              \
      r16z_decode_##NV(const r16_job* j, int64_t t0, int64_t k0, int64_t k1, float* panel) {                     \
    r16z_decode_panel(NV, j, t0, k0, k1, panel);                                                                 \
  }
R16D(0)
R16D(1)

static const r16d_fn r16z_decode[2] = {r16z_decode_0, r16z_decode_1};

/* Tiles [t0, t1) for every activation row: 8 tiles at once for M = 1 (8 streams, 8 FMA chains); pairs of tiles
 * through the panel above 8 rows; else (and for a last odd tile) pairs of tiles x up to 8 rows. */
static void r16z_task(const r16_job* j, int64_t t0, int64_t t1) {
  const int nv = j->nv;
  int64_t t = t0;
  if (j->M == 1)
    for (; t + 8 <= t1; t += 8) (nv ? r16z_1_8_1 : r16z_0_8_1)(j, t, 0);
  while (j->M > R16_PANEL_MIN_M && t + 2 <= t1 &&
         r16_panel_run(j, t, r16z_decode, r16z_panel_by_mr, R16_PANEL_MR))
    t += 2;
  for (; t < t1; t += 2) {
    const int pair = t + 2 <= t1;
    for (int64_t m = 0; m < j->M; m += 8) {
      const int mr = (int)(j->M - m < 8 ? j->M - m : 8);
      r16z_by_shape[nv][pair][mr - 1](j, t, m);
    }
    if (!pair) break;
  }
}

/* ---- AVX2 + FMA + F16C: lanes = 8 rows (half a tile) ----
 * Decode per chunk (8 k of 8 rows, 32 bytes): the codes become int8 2 * e2m1 (0, 1, 2, 3, 4, 6, 8, 12 and their
 * negatives; a vpshufb table) for the low and the high nibbles; per k, one vpshufb moves that k's byte of every
 * dword into the dword's top byte (the other bytes 0): 2 v * 2^24, converted exactly, times S * 2^-25 = the exact
 * product v * S rounded once, the value e2m1 * S gives (code 8, -0, gives +0: no sum sees the difference, the
 * accumulators start at +0). Where S * 2^-25 could lose bits below FLT_MIN or differ from S by more than the
 * power of two (MXFP4 blocks with an exponent below 26; NVFP4 with B_scale_2 neither 0 nor in [2^-92, 2^118]), the
 * product is taken as (2 v * 2^24 * 2^-25) * S, each step exact but the last. 4.6 vector uops per 8 weights (3.1 on the FMA ports),
 * against 6 (4) for the 8-entry vpermps table with the sign XOR before: measured on a Xeon with QO_CPU_KERNELS=avx2,
 * NVFP4 [4096, 4096], M = 1, 1 thread, a stand-alone harness calling both back to back: with the weight in L2 1.16x,
 * streamed from memory (30 copies) 7.6 against 7.0 GB/s. */
QO_TARGET_BEGIN("avx2,fma,f16c")
/* 8 rows' block scales as float32: S (tiny = 1) or S * 2^-25 (tiny = 0; s2 is then B_scale_2 * 2^-25). NVFP4:
 * e4m3fn * s2, rounded once (the caller takes the S * 2^-25 route only where it is exact: B_scale_2 in [2^-92,
 * 2^118] or 0). MXFP4: 2^(e - 127), e = 255 NaN; S * 2^-25 = 2^(e - 152) is a normal float only for e >= 26. */
static inline __m256 r16a_scales(const int nv, const int tiny, const uint8_t* p, __m256 s2) {
  if (nv) return _mm256_mul_ps(qo_avx_fp8x8(p), s2);
  const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p));
  __m256i f = _mm256_slli_epi32(tiny ? e : _mm256_sub_epi32(e, _mm256_set1_epi32(25)), 23);
  if (tiny) f = _mm256_blendv_epi8(f, _mm256_set1_epi32(0x00400000), _mm256_cmpeq_epi32(e, _mm256_setzero_si256()));
  f = _mm256_blendv_epi8(f, _mm256_set1_epi32(0x7FC00000), _mm256_cmpeq_epi32(e, _mm256_set1_epi32(255)));
  return _mm256_castsi256_ps(f);
}

/* MXFP4: 1 where one of 8 rows' block exponents is below 26 (S * 2^-25 not a normal float) */
static inline int r16a_mx_tiny(const uint8_t* p) {
  const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p));
  return _mm256_movemask_epi8(_mm256_cmpgt_epi32(_mm256_set1_epi32(26), e)) != 0;
}

/* the vpshufb controls moving byte i of each dword to its top byte, the other bytes 0 */
static inline void r16a_take(__m256i take[4]) {
  for (int i = 0; i < 4; ++i) {
    int8_t t[32];
    for (int b = 0; b < 32; ++b) t[b] = (b & 3) == 3 ? (int8_t)((b & ~3) + i) : (int8_t)-128;
    take[i] = _mm256_loadu_si256((const __m256i*)t);
  }
}

/* NVFP4: S * 2^-25 = e4m3 * (B_scale_2 * 2^-25), exact and normal for every nonzero code where B_scale_2 is 0 or in
 * [2^-92, 2^118] (e4m3's nonzero magnitudes are 2^-9 .. 448); else (1) every block takes the 2-step route. *s2x gets
 * what r16a_scales multiplies the e4m3 values by. */
static inline int r16a_nv_tiny(const r16_job* j, __m256* s2x) {
  const float as2 = fabsf(j->s2);
  const int tiny = j->nv && !(as2 == 0.0f || (as2 >= 0x1p-92f && as2 <= 0x1p118f));
  *s2x = _mm256_set1_ps(tiny ? j->s2 : j->s2 * 0x1p-25f);
  return tiny;
}

/* one half-chunk (8 rows x 8 k, 32 bytes): int8 2 v of the low and the high nibbles */
static inline void r16a_codes(const uint8_t* p, __m256i* lo, __m256i* hi) {
  const __m256i twice = _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,
                                         0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
  const __m256i m4 = _mm256_set1_epi8(0x0F), w = _mm256_loadu_si256((const __m256i*)p);
  *lo = _mm256_shuffle_epi8(twice, _mm256_and_si256(w, m4));
  *hi = _mm256_shuffle_epi8(twice, _mm256_and_si256(_mm256_srli_epi16(w, 4), m4));
}

/* the 8 rows' weights at k = q of a half-chunk: 2 v * 2^24 converted, times sc (S * 2^-25; where tiny, times 2^-25
 * first and sc = S) */
static inline __attribute__((always_inline)) __m256 r16a_weight(__m256i lo, __m256i hi, const __m256i* take, int q,
                                                                __m256 sc, const int tiny) {
  __m256 w = _mm256_cvtepi32_ps(_mm256_shuffle_epi8((q & 1) ? hi : lo, take[q >> 1]));
  if (tiny) w = _mm256_mul_ps(w, _mm256_set1_ps(0x1p-25f));
  return _mm256_mul_ps(w, sc);
}

/* block bi of nvec halves (its scales sc: S * 2^-25, or S where tiny) x mr activation rows into acc */
static inline __attribute__((always_inline)) void r16a_block(const int nv, const int nvec, const int mr,
                                                             const int tiny, const uint8_t* const* b, const float* a,
                                                             int64_t K, int64_t bi, const __m256* sc,
                                                             const __m256i* take, __m256 acc[4][4]) {
  const int64_t blk = nv ? 16 : 32;
  for (int c = 0; c < (nv ? 2 : 4); ++c) {
    const int64_t chunk = bi * (blk / 8) + c;
    __m256i lo[4], hi[4];
    for (int v = 0; v < nvec; ++v) {
      if (v % 2 == 0) _mm_prefetch((const char*)(b[v] + 64 * chunk + R16_PF), _MM_HINT_T0);
      r16a_codes(b[v] + 64 * chunk, &lo[v], &hi[v]);
    }
    const float* ak = a + 8 * chunk;
    for (int q = 0; q < 8; ++q) {
      __m256 W[4];
      for (int v = 0; v < nvec; ++v) W[v] = r16a_weight(lo[v], hi[v], take, q, sc[v], tiny);
      for (int m = 0; m < mr; ++m) {
        const __m256 x = _mm256_broadcast_ss(ak + m * K + q);
        for (int v = 0; v < nvec; ++v) acc[m][v] = _mm256_fmadd_ps(W[v], x, acc[m][v]);
      }
    }
  }
}

/* nvec halves (half h of tile t0 + v / 2 for v = 2 * (t - t0) + h) x activation rows m0 .. m0 + mr - 1. */
static inline __attribute__((always_inline)) void r16a_halves(const int nv, const int nvec, const int mr,
                                                              const r16_job* j, int64_t t0, int64_t m0) {
  const int64_t K = j->K, N = j->N, nb = K / (nv ? 16 : 32);
  __m256i take[4];
  r16a_take(take);
  const uint8_t* b[4];
  const uint8_t* s[4];
  __m256 acc[4][4];
  for (int v = 0; v < nvec; ++v) {
    b[v] = j->B + (t0 + v / 2) * (R16_ROWS / 2) * K + 32 * (v % 2);
    s[v] = j->S + (t0 + v / 2) * R16_ROWS * nb + 8 * (v % 2);
    for (int m = 0; m < mr; ++m) acc[m][v] = _mm256_setzero_ps();
  }
  const float* a = j->A + m0 * K;
  __m256 s2x;
  const int nv_tiny = r16a_nv_tiny(j, &s2x);
  for (int64_t bi = 0; bi < nb; ++bi) {
    __m256 sc[4];
    int tiny = nv_tiny;
    if (!nv)
      for (int v = 0; v < nvec; ++v) tiny |= r16a_mx_tiny(s[v] + R16_ROWS * bi);
    if (tiny) {
      for (int v = 0; v < nvec; ++v) sc[v] = r16a_scales(nv, 1, s[v] + R16_ROWS * bi, s2x);
      r16a_block(nv, nvec, mr, 1, b, a, K, bi, sc, take, acc);
    } else {
      for (int v = 0; v < nvec; ++v) sc[v] = r16a_scales(nv, 0, s[v] + R16_ROWS * bi, s2x);
      r16a_block(nv, nvec, mr, 0, b, a, K, bi, sc, take, acc);
    }
  }
  for (int m = 0; m < mr; ++m)
    for (int v = 0; v < nvec; ++v) _mm256_storeu_ps(j->Y + (m0 + m) * N + t0 * R16_ROWS + 8 * v, acc[m][v]);
}

#define R16A(NV, NVEC, MR)                                                                             \
  static __attribute__((noinline)) void r16a_##NV##_##NVEC##_##MR(const r16_job* j, int64_t t0, int64_t m0) { \
    r16a_halves(NV, NVEC, MR, j, t0, m0);                                                              \
  }
#define R16A_FMT(NV) R16A(NV, 4, 1) R16A(NV, 2, 1) R16A(NV, 2, 2) R16A(NV, 2, 3)
R16A_FMT(0)
R16A_FMT(1)

/* Prefill (M > R16_PANEL_MIN_M) on AVX2: one tile's weights decoded once per block of R16_KB k into a float32 panel
 * [k][16] (the GEMV's values: the same decode, stored), then every 6 activation rows run over it: 12 accumulators,
 * per k two panel loads, 6 broadcasts and 12 FMAs. Each output's chain goes on across blocks through Y (stored and
 * reloaded as float32): the same bits as the GEMV. Before, M > 1 decoded the weight again for every 3 activation
 * rows: at M = 128, [4096, 14336], 1 thread, a Xeon with QO_CPU_KERNELS=avx2, 233-249 ms against 161-163 for the
 * checkpoint-order kernels' panel (the tiles' default had made prefill 1.5x slower on AVX2). */
#define R16A_PANEL_MR 6
static inline __attribute__((always_inline)) void r16a_decode_panel(const int nv, const r16_job* j, int64_t t,
                                                                    int64_t k0, int64_t k1, float* panel) {
  const int64_t K = j->K, blk = nv ? 16 : 32, nb = K / blk;
  __m256 s2x;
  const int nv_tiny = r16a_nv_tiny(j, &s2x);
  __m256i take[4];
  r16a_take(take);
  for (int v = 0; v < 2; ++v) {
    const uint8_t* b = j->B + t * (R16_ROWS / 2) * K + 32 * v;
    const uint8_t* s = j->S + t * R16_ROWS * nb + 8 * v;
    for (int64_t bi = k0 / blk; bi < k1 / blk; ++bi) {
      const int tiny = nv_tiny || (!nv && r16a_mx_tiny(s + R16_ROWS * bi));
      const __m256 sc = r16a_scales(nv, tiny, s + R16_ROWS * bi, s2x);
      for (int64_t chunk = bi * (blk / 8); chunk < (bi + 1) * (blk / 8); ++chunk) {
        __m256i lo, hi;
        r16a_codes(b + 64 * chunk, &lo, &hi);
        float* out = panel + (8 * chunk - k0) * 16 + 8 * v;
        for (int q = 0; q < 8; ++q)
          _mm256_storeu_ps(out + 16 * q, r16a_weight(lo, hi, take, q, sc, tiny));
      }
    }
  }
}

/* The accumulators are named variables, not an array: with __m256 acc[6][2] GCC 12 kept a stack copy of the array
 * and stored every accumulator after each FMA (12 ymm stores a k; a Zen 1 stores one 128-bit half a cycle, so the
 * loop ran at half its FMA rate: MatMulNvfp4R16 at M = 128, [4096, 14336], 1 thread, 0.50x MLAS's SGEMM, see
 * custom_ops/README.md "The AVX2 path on an AVX2-only CPU"). Same operations in the same order. */
static inline __attribute__((always_inline)) void r16a_panel_rows(const int mr, const float* panel, int64_t kn,
                                                                  const float* a, int64_t K, float* y, int64_t N,
                                                                  int first) {
  const __m256 z = _mm256_setzero_ps();
#define R16A_LD(M, V) (mr > M ? (first ? z : _mm256_loadu_ps(y + M * N + 8 * V)) : z)
  __m256 c00 = R16A_LD(0, 0), c01 = R16A_LD(0, 1), c10 = R16A_LD(1, 0), c11 = R16A_LD(1, 1);
  __m256 c20 = R16A_LD(2, 0), c21 = R16A_LD(2, 1), c30 = R16A_LD(3, 0), c31 = R16A_LD(3, 1);
  __m256 c40 = R16A_LD(4, 0), c41 = R16A_LD(4, 1), c50 = R16A_LD(5, 0), c51 = R16A_LD(5, 1);
#undef R16A_LD
  for (int64_t k = 0; k < kn; ++k) {
    const __m256 w0 = _mm256_loadu_ps(panel + 16 * k), w1 = _mm256_loadu_ps(panel + 16 * k + 8);
#define R16A_ROW(M, C0, C1)                                      \
    if (mr > M) {                                                \
      const __m256 x = _mm256_broadcast_ss(a + M * K + k);       \
      C0 = _mm256_fmadd_ps(w0, x, C0);                           \
      C1 = _mm256_fmadd_ps(w1, x, C1);                           \
    }
    R16A_ROW(0, c00, c01)
    R16A_ROW(1, c10, c11)
    R16A_ROW(2, c20, c21)
    R16A_ROW(3, c30, c31)
    R16A_ROW(4, c40, c41)
    R16A_ROW(5, c50, c51)
#undef R16A_ROW
  }
#define R16A_ST(M, C0, C1)                           \
  if (mr > M) {                                      \
    _mm256_storeu_ps(y + M * N, C0);                 \
    _mm256_storeu_ps(y + M * N + 8, C1);             \
  }
  R16A_ST(0, c00, c01)
  R16A_ST(1, c10, c11)
  R16A_ST(2, c20, c21)
  R16A_ST(3, c30, c31)
  R16A_ST(4, c40, c41)
  R16A_ST(5, c50, c51)
#undef R16A_ST
}

#define R16AP(MR)                                                                                                  \
  static __attribute__((noinline)) void r16a_panel_##MR(const float* panel, int64_t kn, const float* a, int64_t K, \
                                                        float* y, int64_t N, int first) {                         \
    r16a_panel_rows(MR, panel, kn, a, K, y, N, first);                                                            \
  }
R16AP(1) R16AP(2) R16AP(3) R16AP(4) R16AP(5) R16AP(6)
static const r16p_fn r16a_panel_by_mr[R16A_PANEL_MR] = {r16a_panel_1, r16a_panel_2, r16a_panel_3,
                                                        r16a_panel_4, r16a_panel_5, r16a_panel_6};
static __attribute__((noinline)) void r16a_decode_0(const r16_job* j, int64_t t, int64_t k0, int64_t k1, float* p) {
  r16a_decode_panel(0, j, t, k0, k1, p);
}
static __attribute__((noinline)) void r16a_decode_1(const r16_job* j, int64_t t, int64_t k0, int64_t k1, float* p) {
  r16a_decode_panel(1, j, t, k0, k1, p);
}

static const r16d_fn r16a_decode[2] = {r16a_decode_0, r16a_decode_1};

/* Tiles [t0, t1): two tiles (4 halves) at once for M = 1; above R16_PANEL_MIN_M rows a tile at a time through the
 * panel; else (or without a panel buffer) one tile's halves x up to 3 rows. */
static void r16a_task(const r16_job* j, int64_t t0, int64_t t1) {
  const int nv = j->nv;
  int64_t t = t0;
  if (j->M == 1)
    for (; t + 2 <= t1; t += 2) (nv ? r16a_1_4_1 : r16a_0_4_1)(j, t, 0);
  while (j->M > R16_PANEL_MIN_M && t < t1 && r16_panel_run(j, t, r16a_decode, r16a_panel_by_mr, R16A_PANEL_MR))
    ++t;
  static const r16_fn by_mr[2][3] = {{r16a_0_2_1, r16a_0_2_2, r16a_0_2_3}, {r16a_1_2_1, r16a_1_2_2, r16a_1_2_3}};
  for (; t < t1; ++t)
    for (int64_t m = 0; m < j->M; m += 3) by_mr[nv][(j->M - m < 3 ? j->M - m : 3) - 1](j, t, m);
}
QO_TARGET_END
#endif

static void r16_tiles(const r16_job* j, int64_t t0, int64_t t1) {
#if defined(QO_HAVE_AVX512_HELPERS)
  if (j->isa == QO_ISA_AVX512) {
    r16z_task(j, t0, t1);
    return;
  }
  if (j->isa == QO_ISA_AVX2) {
    r16a_task(j, t0, t1);
    return;
  }
#endif
  for (int64_t t = t0; t < t1; ++t) r16_tile_portable(j, t);
}

static void r16_task(void* data, size_t index) {
  const r16_job* j = (const r16_job*)data;
  const int64_t tiles = j->N / R16_ROWS, t0 = (int64_t)index * R16_GROUP;
  r16_tiles(j, t0, t0 + R16_GROUP < tiles ? t0 + R16_GROUP : tiles);
}

int qo_cpu_fp4_r16_rows_f32(int nv, const float* A, int64_t M, int64_t N, int64_t K, const uint8_t* B,
                            const uint8_t* B_scale, float B_scale_2, int64_t n0, int64_t n1, float* Y) {
  if (!A || !B || !B_scale || !Y || M < 0 || N % R16_ROWS || K % r16_block(nv) || n0 % R16_ROWS || n0 < 0 ||
      n1 > N || n1 % R16_ROWS)
    return QO_ERR_ARGUMENT;
  if (M == 0 || n1 <= n0) return QO_OK;
  const r16_job j = {A, B, B_scale, B_scale_2, Y, M, N, K, nv, qo_cpu_isa()};
  r16_tiles(&j, n0 / R16_ROWS, n1 / R16_ROWS);
  return QO_OK;
}

static int r16_run(int nv, const float* A, const uint8_t* B, const uint8_t* S, float s2, float* Y, int64_t M,
                   int64_t N, int64_t K) {
  if (!A || !B || !S || !Y || M < 0 || N <= 0 || K <= 0 || N % R16_ROWS || K % r16_block(nv)) return QO_ERR_ARGUMENT;
  if (M == 0) return QO_OK;
  r16_job j = {A, B, S, s2, Y, M, N, K, nv, qo_cpu_isa()};
  const int64_t tasks = (N / R16_ROWS + R16_GROUP - 1) / R16_GROUP;
  return qo_cpu_parallel_for(r16_task, (size_t)tasks, &j);
}

QO_API int qo_matmul_mxfp4_r16_f32(const float* A, const uint8_t* B, const uint8_t* B_scale, float* Y, int64_t M, int64_t N,
                            int64_t K) {
  return r16_run(0, A, B, B_scale, 1.0f, Y, M, N, K);
}

QO_API int qo_matmul_nvfp4_r16_f32(const float* A, const uint8_t* B, const uint8_t* B_scale, float B_scale_2, float* Y,
                            int64_t M, int64_t N, int64_t K) {
  return r16_run(1, A, B, B_scale, B_scale_2, Y, M, N, K);
}
