/* Prefill (M above the GEMV's rows) of com.quark_onnx MatMulUint4 / MatMulInt4: qo_cpu_int4.c's 32-lane order
 * computed the way an fp32 GEMM runs, activations broadcast and weight columns in vector lanes.
 *
 * The order (qo_cpu_int4.c): output (m, n) is fold(l[0..31]), lane l[j] the fmaf chain over k = j, j + 32, j + 64,
 * ... in increasing k from +0, and the fold adds the even lanes e[p] = l[2p] as ((e0 + e8) + (e4 + e12)) + ((e2 +
 * e10) + (e6 + e14)), ... (x[p] += x[p + h] for h = 8, 4, 2, 1), the odd lanes alike, then e + o. Here each lane is
 * its own pass over K: a register tile of MR activation rows x 32 weight rows (AVX-512: 12 x 2 zmm; AVX2: 6 x 2 ymm,
 * two halves of 16) runs the chain of lane j for all its outputs at once (one broadcast activation, one fmadd per 16
 * weight rows), then joins the tree: the leaves come in bit-reversed order (p = 0, 8, 4, 12, 2, ...), so a leaf is
 * added to the partial sums of its finished siblings at once, a stack of 4 levels in L1. Same additions, same
 * operands, so the same bits as the GEMV and the portable C path (IEEE addition and fma are commutative in the
 * operands that are swapped here). The elements past K (zero nibbles of the last block) run with a = 0 (A is packed
 * with zeros there), which leaves a lane unchanged (lanes are never -0), as in the GEMV.
 *
 * Layouts (per task: a panel of 32 weight rows):
 *   A packed  per tile of MR rows, [j][i][m] (k = 32 i + j): the broadcasts of a chain are consecutive floats;
 *   W panel   decoded once per task to float32, [j][i][32 rows] (one 128-byte line per step of a chain; chain j at
 *             j * P_JS(I) floats), by a 16 x 16
 *             byte transpose of 16 rows' 16 bytes (32 k): byte c holds k = 32 i + 2c (low nibble) and + 1 (high),
 *             then ((float)q - (float)z) * s with the rows' zero points and scales in lanes, Quark's exact value.
 * No K blocking: one chain is K / 32 steps of one 128-byte weight line and MR floats of A. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qo_cpu_int4_panel.h"
#include "qo_cpu_simd.h"
#include "qo_kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(QO_NO_CLONES) && \
    !defined(QO_PORTABLE_ONLY)
#define QO_P_X86 1
#include <immintrin.h>
#else
#define QO_P_X86 0
#endif

#if defined(_MSC_VER)
#define P_INLINE static inline
#else
#define P_INLINE static inline __attribute__((always_inline))
#endif

/* floats from one lane's chain to the next in the decoded panel: its I steps of 32 rows plus one cache line. A decode
 * step writes a line of each of the 32 chains; without the line they are a multiple of 4 KB apart for K a multiple of
 * 1024 (8 KB at K = 2048), in one L1 set. Measured ([1536, 2048] g32, 1 thread, C harness, the panel forced at
 * every M, old and new builds alternating): the panel's decode alone 0.62 -> 0.36 ms, M = 6 0.82 -> 0.55 ms, M = 32
 * 1.57 -> 1.29-1.34 ms. What is left of the decode is bound by its stores (a build storing constants takes 0.31-0.33
 * of its 0.34-0.36 ms): 4 bytes a weight. The chunked GEMV (qo_cpu_int4.c) now crosses over at M = 12-14 on this
 * shape (M = 16: 1.04-1.07 ms against the panel's 0.93; [2048, 768]: even), left at I4_CHUNKED_GEMV_MAX_M = 16.
 * On the AVX2 path the panel now runs from 5 rows (I4_CHUNKED_GEMV_MAX_M_AVX2, qo_cpu_int4.c: measured on a Zen 1). */
#define P_JS(I) ((I) * 32 + 16)

#define P_MR512 12 /* activation rows per AVX-512 tile: 24 accumulators, 2 weight vectors, 1 broadcast */
#define P_MR256 6  /* per AVX2 tile: 12 accumulators, 2 weight vectors, 1 broadcast */

static int mr_of(int path) { return path == I4_AVX512 ? P_MR512 : P_MR256; }

int64_t qo_i4_panel_tiles(int path, int64_t M) { return (M + mr_of(path) - 1) / mr_of(path); }

void qo_i4_panel_pack_tile(int path, const float* A, const int64_t* src, int64_t M, int64_t K, int64_t Kc,
                           int64_t tile, float* out) {
  const int64_t MR = mr_of(path), I = Kc / 32, t0 = tile * MR, mr = M - t0 < MR ? M - t0 : MR;
  const float* rows[P_MR512];
  for (int64_t m = 0; m < mr; ++m) rows[m] = A + (src ? src[t0 + m] : t0 + m) * K;
  float* d = out + t0 * Kc;
  /* blocks of 16 steps (the tile's rows' 512 floats each in L1), each lane's run of them written in order */
  for (int64_t i0 = 0; i0 < I; i0 += 16) {
    const int64_t i1 = I - i0 < 16 ? I : i0 + 16;
    for (int64_t j = 0; j < 32; ++j) {
      float* dj = d + (j * I + i0) * mr;
      for (int64_t i = i0; i < i1; ++i, dj += mr) {
        const int64_t k = 32 * i + j;
        for (int64_t m = 0; m < mr; ++m) dj[m] = k < K ? rows[m][k] : 0.0f;
      }
    }
  }
}

void qo_i4_panel_pack_a(int path, const float* A, const int64_t* src, int64_t M, int64_t K, int64_t Kc, float* out) {
  const int64_t tiles = qo_i4_panel_tiles(path, M);
  for (int64_t t = 0; t < tiles; ++t) qo_i4_panel_pack_tile(path, A, src, M, K, Kc, t, out);
}

#if QO_P_X86
static QO_THREAD_LOCAL float* tls_panel = NULL;
static QO_THREAD_LOCAL size_t tls_panel_floats = 0;

/* the leaves of the fold in the order its tree joins them: 4-bit bit reversal */
static const int p_leaf[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};

/* The tree join of leaf t of parity par (the lane chain's sums in acc[m][0..1], m < MR): while the leaf is a right
 * child it is added to its finished sibling's partial sum (st[level], the left operand as in the fold), then kept at
 * its level; the even lanes' root goes to even[], the odd lanes' root is added to it (acc then holds the outputs:
 * returns 1). V: the vector type, ADD its addition. */
#define P_JOIN_LEAF_FN(name, V, ADD, MRMAX)                                                          \
  P_INLINE int name(V st[4][MRMAX][2], V even[MRMAX][2], V acc[MRMAX][2], const int MR, int t, int par) { \
    int lvl = 0;                                                                                     \
    for (; lvl < 4 && ((t >> lvl) & 1); ++lvl)                                                       \
      for (int m = 0; m < MR; ++m)                                                                   \
        for (int v = 0; v < 2; ++v) acc[m][v] = ADD(st[lvl][m][v], acc[m][v]);                       \
    if (lvl < 4) {                                                                                   \
      for (int m = 0; m < MR; ++m)                                                                   \
        for (int v = 0; v < 2; ++v) st[lvl][m][v] = acc[m][v];                                       \
      return 0;                                                                                      \
    }                                                                                                \
    if (par == 0) {                                                                                  \
      for (int m = 0; m < MR; ++m)                                                                   \
        for (int v = 0; v < 2; ++v) even[m][v] = acc[m][v];                                          \
      return 0;                                                                                      \
    }                                                                                                \
    for (int m = 0; m < MR; ++m)                                                                     \
      for (int v = 0; v < 2; ++v) acc[m][v] = ADD(even[m][v], acc[m][v]);                            \
    return 1;                                                                                        \
  }

static inline int zero_point_of(const i4_weight* w, int64_t n, int64_t b) {
  if (!w->zp) return 8;
  const uint8_t byte = w->zp[n * w->zp_row_bytes + (b >> 1)];
  return (b & 1) ? (byte >> 4) : (byte & 0x0F);
}

/* the zero points and scales of 16 rows (n0.. ; rows from n_end: 0) at block b */
static void group_lanes(const i4_weight* w, int64_t n0, int64_t n_end, int64_t b, float* zf, float* s) {
  for (int r = 0; r < 16; ++r) {
    const int64_t n = n0 + r;
    zf[r] = n < n_end ? (float)zero_point_of(w, n, b) : 0.0f;
    s[r] = n < n_end ? w->scales[n * w->k_blocks + b] : 0.0f;
  }
}

QO_TARGET_BEGIN("avx2,fma")

/* x[r] = 16 bytes of row r -> x[c] = byte c of the 16 rows (row r in byte r) */
P_INLINE void transpose16x16(__m128i x[16]) {
  __m128i a[16], b[16], c[16];
  for (int p = 0; p < 8; ++p) {
    a[2 * p] = _mm_unpacklo_epi8(x[2 * p], x[2 * p + 1]);
    a[2 * p + 1] = _mm_unpackhi_epi8(x[2 * p], x[2 * p + 1]);
  }
  for (int q = 0; q < 4; ++q) { /* rows 4q .. 4q + 3 */
    b[4 * q + 0] = _mm_unpacklo_epi16(a[4 * q], a[4 * q + 2]);
    b[4 * q + 1] = _mm_unpackhi_epi16(a[4 * q], a[4 * q + 2]);
    b[4 * q + 2] = _mm_unpacklo_epi16(a[4 * q + 1], a[4 * q + 3]);
    b[4 * q + 3] = _mm_unpackhi_epi16(a[4 * q + 1], a[4 * q + 3]);
  } /* b[4q + g]: bytes 4g .. 4g + 3, each as the 4 rows' bytes */
  for (int h = 0; h < 2; ++h) /* rows 8h .. 8h + 7 */
    for (int g = 0; g < 4; ++g) {
      c[8 * h + 2 * g] = _mm_unpacklo_epi32(b[8 * h + g], b[8 * h + 4 + g]);
      c[8 * h + 2 * g + 1] = _mm_unpackhi_epi32(b[8 * h + g], b[8 * h + 4 + g]);
    } /* c[8h + e]: bytes 2e, 2e + 1, each as the 8 rows' bytes */
  for (int e = 0; e < 8; ++e) {
    x[2 * e] = _mm_unpacklo_epi64(c[e], c[8 + e]);
    x[2 * e + 1] = _mm_unpackhi_epi64(c[e], c[8 + e]);
  }
}

/* the 16 rows' bytes of the 32-k step i (rows from n_end: zero) */
P_INLINE void load_rows16(const i4_weight* w, int64_t n0, int64_t n_end, int64_t i, __m128i x[16]) {
  for (int r = 0; r < 16; ++r)
    x[r] = n0 + r < n_end ? _mm_loadu_si128((const __m128i*)(w->B + (n0 + r) * w->row_bytes + 16 * i))
                         : _mm_setzero_si128();
}

/* the panel's rows n0 .. n0 + 31 decoded, [j][i][32] (rows from n0 + nv: zero) */
static void decode_panel_avx2(const i4_weight* w, int64_t n0, int64_t nv, float* out) {
  const int64_t I = w->Kc / 32;
  for (int h = 0; h < 2; ++h) {
    const int64_t r0 = n0 + 16 * h;
    int64_t b = -1;
    __m256 zf[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()}, s[2] = {zf[0], zf[0]};
    for (int64_t i = 0; i < I; ++i) {
      if ((32 * i) / w->block != b) {
        b = (32 * i) / w->block;
        float zl[16], sl[16];
        group_lanes(w, r0, n0 + nv, b, zl, sl);
        zf[0] = _mm256_loadu_ps(zl);
        zf[1] = _mm256_loadu_ps(zl + 8);
        s[0] = _mm256_loadu_ps(sl);
        s[1] = _mm256_loadu_ps(sl + 8);
      }
      __m128i x[16];
      load_rows16(w, r0, n0 + nv, i, x);
      transpose16x16(x);
      const __m256i lo = _mm256_set1_epi32(0x0F);
      for (int c = 0; c < 16; ++c) {
        float* de = out + (2 * c) * P_JS(I) + i * 32 + 16 * h;
        float* dodd = out + (2 * c + 1) * P_JS(I) + i * 32 + 16 * h;
        for (int v = 0; v < 2; ++v) {
          const __m256i q = _mm256_cvtepu8_epi32(v ? _mm_srli_si128(x[c], 8) : x[c]);
          _mm256_store_ps(de + 8 * v,
                          _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_and_si256(q, lo)), zf[v]), s[v]));
          _mm256_store_ps(dodd + 8 * v,
                          _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(q, 4)), zf[v]), s[v]));
        }
      }
    }
  }
}

P_JOIN_LEAF_FN(p_join_leaf_avx2, __m256, _mm256_add_ps, P_MR256)

/* MR rows x 16 weight rows (half h of the panel): the 32 chains, folded; y[m * ldy + c] for c < nv */
P_INLINE void chains_avx2(const float* ap, const float* wp, int64_t I, const int MR, float* y, int64_t ldy, int nv) {
  __m256 st[4][P_MR256][2], even[P_MR256][2];
  for (int m = 0; m < MR; ++m) even[m][0] = even[m][1] = _mm256_setzero_ps(); /* set at the even lanes' root */
  for (int par = 0; par < 2; ++par)
    for (int t = 0; t < 16; ++t) {
      const int64_t j = 2 * p_leaf[t] + par;
      const float* a = ap + j * I * MR;
      const float* wv = wp + j * P_JS(I);
      /* the chains in named variables, copied to acc after the loop: with acc itself in the loop (its address goes to
       * p_join_leaf_avx2) GCC 12 stored every accumulator to the stack after each FMA, which halved the loop's
       * rate on a Zen 1 (one 128-bit store a cycle; custom_ops/README.md, "The AVX2 path on an AVX2-only CPU") */
      __m256 acc[P_MR256][2];
      const __m256 z = _mm256_setzero_ps();
      __m256 c00 = z, c01 = z, c10 = z, c11 = z, c20 = z, c21 = z, c30 = z, c31 = z, c40 = z, c41 = z, c50 = z, c51 = z;
      for (int64_t i = 0; i < I; ++i) {
        const __m256 w0 = _mm256_load_ps(wv + 32 * i), w1 = _mm256_load_ps(wv + 32 * i + 8);
        const float* ai = a + i * MR;
#define P_ROW256(M, C0, C1)                          \
        if (MR > M) {                                \
          const __m256 x = _mm256_broadcast_ss(ai + M); \
          C0 = _mm256_fmadd_ps(x, w0, C0);           \
          C1 = _mm256_fmadd_ps(x, w1, C1);           \
        }
        P_ROW256(0, c00, c01)
        P_ROW256(1, c10, c11)
        P_ROW256(2, c20, c21)
        P_ROW256(3, c30, c31)
        P_ROW256(4, c40, c41)
        P_ROW256(5, c50, c51)
#undef P_ROW256
      }
      acc[0][0] = c00, acc[0][1] = c01, acc[1][0] = c10, acc[1][1] = c11, acc[2][0] = c20, acc[2][1] = c21;
      acc[3][0] = c30, acc[3][1] = c31, acc[4][0] = c40, acc[4][1] = c41, acc[5][0] = c50, acc[5][1] = c51;
      if (p_join_leaf_avx2(st, even, acc, MR, t, par)) {
        for (int m = 0; m < MR; ++m) {
          float out[16];
          _mm256_storeu_ps(out, acc[m][0]);
          _mm256_storeu_ps(out + 8, acc[m][1]);
          if (nv >= 16) {
            memcpy(y + m * ldy, out, 16 * sizeof(float));
          } else {
            for (int c = 0; c < nv; ++c) y[m * ldy + c] = out[c];
          }
        }
      }
    }
}

static void tile_avx2(const float* ap, const float* wp, int64_t I, int mr, float* y, int64_t ldy, int nv) {
  switch (mr) {
    case 6: chains_avx2(ap, wp, I, 6, y, ldy, nv); break;
    case 5: chains_avx2(ap, wp, I, 5, y, ldy, nv); break;
    case 4: chains_avx2(ap, wp, I, 4, y, ldy, nv); break;
    case 3: chains_avx2(ap, wp, I, 3, y, ldy, nv); break;
    case 2: chains_avx2(ap, wp, I, 2, y, ldy, nv); break;
    default: chains_avx2(ap, wp, I, 1, y, ldy, nv); break;
  }
}

static void panel_avx2(const i4_weight* w, const float* pa, int64_t M, int64_t n0, int64_t nv, float* wbuf, float* Y,
                       int64_t ldy) {
  const int64_t I = w->Kc / 32;
  decode_panel_avx2(w, n0, nv, wbuf);
  for (int h = 0; h < 2 && 16 * h < nv; ++h)
    for (int64_t t0 = 0; t0 < M; t0 += P_MR256) {
      const int mr = M - t0 < P_MR256 ? (int)(M - t0) : P_MR256;
      tile_avx2(pa + t0 * w->Kc, wbuf + 16 * h, I, mr, Y + t0 * ldy + n0 + 16 * h, ldy,
                (int)(nv - 16 * h < 16 ? nv - 16 * h : 16));
    }
}

QO_TARGET_END

QO_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")

static void decode_panel_avx512(const i4_weight* w, int64_t n0, int64_t nv, float* out) {
  const int64_t I = w->Kc / 32;
  for (int h = 0; h < 2; ++h) {
    const int64_t r0 = n0 + 16 * h;
    int64_t b = -1;
    __m512 zf = _mm512_setzero_ps(), s = zf;
    for (int64_t i = 0; i < I; ++i) {
      if ((32 * i) / w->block != b) {
        b = (32 * i) / w->block;
        float zl[16], sl[16];
        group_lanes(w, r0, n0 + nv, b, zl, sl);
        zf = _mm512_loadu_ps(zl);
        s = _mm512_loadu_ps(sl);
      }
      __m128i x[16];
      load_rows16(w, r0, n0 + nv, i, x);
      transpose16x16(x);
      const __m512i lo = _mm512_set1_epi32(0x0F);
      for (int c = 0; c < 16; ++c) {
        const __m512i q = _mm512_cvtepu8_epi32(x[c]);
        _mm512_store_ps(out + (2 * c) * P_JS(I) + i * 32 + 16 * h,
                        _mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_and_si512(q, lo)), zf), s));
        _mm512_store_ps(out + (2 * c + 1) * P_JS(I) + i * 32 + 16 * h,
                        _mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(q, 4)), zf), s));
      }
    }
  }
}

P_JOIN_LEAF_FN(p_join_leaf_avx512, __m512, _mm512_add_ps, P_MR512)

/* MR rows x the panel's 32 weight rows: the 32 chains, folded; y[m * ldy + c] for c < nv */
P_INLINE void chains_avx512(const float* ap, const float* wp, int64_t I, const int MR, float* y, int64_t ldy,
                            int nv) {
  __m512 st[4][P_MR512][2], even[P_MR512][2];
  for (int m = 0; m < MR; ++m) even[m][0] = even[m][1] = _mm512_setzero_ps(); /* set at the even lanes' root */
  for (int par = 0; par < 2; ++par)
    for (int t = 0; t < 16; ++t) {
      const int64_t j = 2 * p_leaf[t] + par;
      const float* a = ap + j * I * MR;
      const float* wv = wp + j * P_JS(I);
      __m512 acc[P_MR512][2];
      for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
      for (int64_t i = 0; i < I; ++i) {
        const __m512 w0 = _mm512_load_ps(wv + 32 * i), w1 = _mm512_load_ps(wv + 32 * i + 16);
        for (int m = 0; m < MR; ++m) {
          const __m512 x = _mm512_set1_ps(a[i * MR + m]);
          acc[m][0] = _mm512_fmadd_ps(x, w0, acc[m][0]);
          acc[m][1] = _mm512_fmadd_ps(x, w1, acc[m][1]);
        }
      }
      if (p_join_leaf_avx512(st, even, acc, MR, t, par)) {
        const __mmask16 k0 = nv >= 16 ? 0xFFFF : (__mmask16)((1u << nv) - 1);
        const __mmask16 k1 = nv >= 32 ? 0xFFFF : nv <= 16 ? 0 : (__mmask16)((1u << (nv - 16)) - 1);
        for (int m = 0; m < MR; ++m) {
          _mm512_mask_storeu_ps(y + m * ldy, k0, acc[m][0]);
          _mm512_mask_storeu_ps(y + m * ldy + 16, k1, acc[m][1]);
        }
      }
    }
}

static void tile_avx512(const float* ap, const float* wp, int64_t I, int mr, float* y, int64_t ldy, int nv) {
  switch (mr) {
    case 12: chains_avx512(ap, wp, I, 12, y, ldy, nv); break;
    case 11: chains_avx512(ap, wp, I, 11, y, ldy, nv); break;
    case 10: chains_avx512(ap, wp, I, 10, y, ldy, nv); break;
    case 9: chains_avx512(ap, wp, I, 9, y, ldy, nv); break;
    case 8: chains_avx512(ap, wp, I, 8, y, ldy, nv); break;
    case 7: chains_avx512(ap, wp, I, 7, y, ldy, nv); break;
    case 6: chains_avx512(ap, wp, I, 6, y, ldy, nv); break;
    case 5: chains_avx512(ap, wp, I, 5, y, ldy, nv); break;
    case 4: chains_avx512(ap, wp, I, 4, y, ldy, nv); break;
    case 3: chains_avx512(ap, wp, I, 3, y, ldy, nv); break;
    case 2: chains_avx512(ap, wp, I, 2, y, ldy, nv); break;
    default: chains_avx512(ap, wp, I, 1, y, ldy, nv); break;
  }
}

static void panel_avx512(const i4_weight* w, const float* pa, int64_t M, int64_t n0, int64_t nv, float* wbuf, float* Y,
                         int64_t ldy) {
  const int64_t I = w->Kc / 32;
  decode_panel_avx512(w, n0, nv, wbuf);
  for (int64_t t0 = 0; t0 < M; t0 += P_MR512) {
    const int mr = M - t0 < P_MR512 ? (int)(M - t0) : P_MR512;
    tile_avx512(pa + t0 * w->Kc, wbuf, I, mr, Y + t0 * ldy + n0, ldy, (int)nv);
  }
}

QO_TARGET_END
#endif /* QO_P_X86 */

int qo_i4_panel_rows(int path, const i4_weight* w, const float* packed_a, int64_t M, int64_t n0, int64_t n1,
                     float* Y, int64_t ldy) {
#if QO_P_X86
  float* wbuf = qo_tls_grow(&tls_panel, &tls_panel_floats, (size_t)(32 * P_JS(w->Kc / 32)));
  if (!wbuf) return QO_ERR_ALLOC;
  wbuf = (float*)qo_align64(wbuf);
  for (int64_t n = n0; n < n1; n += I4_PANEL_N) {
    const int64_t nv = n1 - n < I4_PANEL_N ? n1 - n : I4_PANEL_N;
    if (path == I4_AVX512) panel_avx512(w, packed_a, M, n, nv, wbuf, Y, ldy);
    else panel_avx2(w, packed_a, M, n, nv, wbuf, Y, ldy);
  }
  return QO_OK;
#else
  (void)path; (void)w; (void)packed_a; (void)M; (void)n0; (void)n1; (void)Y; (void)ldy;
  return QO_ERR_ARGUMENT;
#endif
}
