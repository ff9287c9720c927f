/* CPU kernels for the com.quark_onnx ops: Y[m][n] = sum_k A[m][k] * W[n][k] (* scales), W decoded from its compact
 * format (MXFP4, NVFP4, FP8 e4m3fn, INT8, BF16) on the fly.
 *
 * ONE summation order on every CPU (so logits do not depend on the CPU, the ISA, M, the thread count or the tile a
 * row falls in; issue #21). For each output (m, n):
 *   - 8 float32 lanes, lane j accumulates the products of k = 8i + j in increasing i, each step one fused
 *     multiply-add (fmaf: a single rounding), starting from +0;
 *   - the K % 8 tail elements go to lanes 0 .. K%8-1 as their last step (again fmaf);
 *   - the lanes are folded pairwise: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7));
 *   - then one multiplication by the output's scale (row scale * column scale, 1 when absent).
 * The decoded weight values are exact (every format decodes exactly to float32, see qo_kernels.h for NVFP4), so the
 * only roundings are the ones above. The portable C path does exactly this with fmaf; the AVX2+FMA path does it
 * with 8-wide vfmadd on the same lanes; the AVX-512 path (F/BW/VL/DQ) with 16-wide vfmadd whose zmm holds the
 * 8-lane accumulators of two outputs (two weight rows at decode, two activation rows at prefill), so each lane's
 * order is unchanged; all end in the same fold. The path is picked at run time (qo_cpu_isa(), qo_cpu_simd.h:
 * __builtin_cpu_supports, QO_CPU_KERNELS=portable|avx2|avx512 to force a narrower one; tests compare all three
 * bit for bit). With AVX512_VBMI as well, the GEMVs of FP8 / INT8 decode by byte permutes (FP8: two 128-byte
 * table lookups give the two upper bytes of each float32) and those of MXFP4 / NVFP4 by byte and float permutes
 * (QO_CPU_KERNELS=avx512-novbmi turns that off, and AVX512_VNNI with it); the decoded values, hence the bits, are the
 * same. MXFP4 rows of A on the MXFP4 grid: exact block-integer dot products and their own order (section "MXFP4 with
 * A on the MXFP4 grid" below). No -ffast-math anywhere; the build passes -ffp-contract=off and the numerics-relevant code has no
 * a*b+c expression a compiler could fuse.
 *
 * Shapes of the work:
 *   - M <= 4 (decode): a GEMV over blocks of weight rows; each weight byte is read once, decoded in registers
 *     (32 elements per step; on AVX-512 32 of each of two rows), and multiplied against all M activation rows. The
 *     tile streams 8 weight rows at once (AVX-512, M <= 2; 4 on AVX2), each prefetched QO_GEMV_PF bytes ahead in
 *     software (the hardware prefetcher alone keeps too few lines in flight for 8 streams: +10-30 % from DRAM).
 *     Wider tiles were slower (16 rows: -40 %, more streams than the prefetchers follow).
 *   - M > 4 (prefill): A is packed once into 4-row micro-panels; a task decodes its 48 weight rows x K to float32
 *     once, in 3-row micro-panels (thread-local), then register tiles of 4 activation rows x 3 weight rows (12
 *     accumulators) run over K blocks of 512 (L1-resident), keeping their 8-lane partial sums in a thread-local
 *     buffer between K blocks (so each lane's order is unchanged).
 * Work is split over weight-row blocks: OpenMP by default, or the caller's runner (the ORT layer: ORT's intra-op
 * pool through KernelContext_ParallelFor). fp16 A/Y are converted around the float32 core. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qo_cpu_simd.h"
#include "qo_fp_formats.h"
#include "qo_kernels.h"

#if defined(_OPENMP) && defined(__has_include)
#if __has_include(<omp.h>)
#include <omp.h>
#define QO_HAVE_OMP_H 1
#endif
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(QO_NO_CLONES) && \
    !defined(QO_PORTABLE_ONLY)
#define QO_X86_AVX2 1
#include <immintrin.h>
#else
#define QO_X86_AVX2 0
#endif

#define QO_LANES 8
#define QO_MXFP4_BLOCK 32
#define QO_NVFP4_BLOCK 16
#define QO_E4M3FN_MAX 448.0f
#define QO_DYNAMIC_SCALE_MIN 1e-12f
#define QO_GEMV_MAX_M 4       /* M up to this: GEMV straight from the compact weight */
#define QO_GEMV_ROWS 16       /* weight rows per task (GEMV) */
#ifndef QO_GEMV_PF
#define QO_GEMV_PF 512        /* GEMV: software prefetch this many bytes ahead in each weight row (0: none) */
#endif

/* Prefetch offset from a weight row's start: QO_GEMV_PF bytes past `offset`, or, once that is past the row's end,
 * the same place in row r of the next tile (a tile's `rows` rows of `row_bytes` each are contiguous, so row r + 1
 * is being read already and the next tile would start cold). */
static inline int64_t qo_pf_ahead(int64_t offset, int64_t row_bytes, int rows) {
  const int64_t ahead = offset + QO_GEMV_PF;
  return ahead >= row_bytes ? ahead + (rows - 1) * row_bytes : ahead;
}
#ifndef QO_PANEL_ROWS
#define QO_PANEL_ROWS 48      /* weight rows per task (M > 4): decoded once to float32 */
#endif
#ifndef QO_PANEL_KC
#define QO_PANEL_KC 512       /* K block of the register tiles (A 8 KB + weights 6 KB per tile: L1) */
#endif
#ifndef QO_PANEL_MB
#define QO_PANEL_MB 64        /* activation rows per pass over a panel (bounds the partial-sum buffer) */
#endif


#if defined(__GNUC__) || defined(__clang__)
#define QO_INLINE static inline __attribute__((always_inline))
#else
#define QO_INLINE static inline
#endif

/* ---------------- weight formats ---------------- */
enum { QO_W_FP8 = 0, QO_W_INT8, QO_W_BF16, QO_W_MXFP4, QO_W_NVFP4 };

typedef struct {
  int fmt;
  const uint8_t* data;    /* [N, row_bytes] */
  int64_t row_bytes;
  const uint8_t* scales;  /* [N, scales_per_row] block-scale codes (MXFP4 e8m0, NVFP4 e4m3fn), else NULL */
  int64_t scales_per_row;
  int block;              /* elements per block scale */
  float half_scale[256];  /* block-scale code -> half the float32 block scale (multiplies 2 * e2m1, an integer) */
  uint32_t lut_key;       /* MXFP4 / NVFP4: what half_scale depends on besides fmt (NVFP4: scale_2's bits) */
} qo_weight;

/* 2 * e2m1 value of each 4-bit code (bit 3 sign): exact small integers. */
static const int8_t QO_E2M1_X2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static float qo_fp8_value[256]; /* e4m3fn code -> float32; NaN codes -> +qNaN (the AVX2 decode gives the same) */
/* Bytes 3 and 2 of the float32 of magnitude codes 0..127 (the low 16 bits are 0 for every e4m3fn value: 3 mantissa
 * bits): the AVX512_VBMI FP8 GEMV's byte tables (qoz_byte_pair_vbmi). */
static uint8_t qo_fp8_hi[128] __attribute__((aligned(64)));
static uint8_t qo_fp8_lo[128] __attribute__((aligned(64)));
static int qo_fp8_value_ready = 0;

static void fp8_value_table(void) {
  if (qo_fp8_value_ready) return;
  for (int c = 0; c < 256; ++c)
    qo_fp8_value[c] = ((c & 0x7F) == 0x7F) ? qo_bits_to_f32(0x7FC00000u) : qo_e4m3fn_to_f32((uint8_t)c);
  for (int c = 0; c < 128; ++c) {
    qo_fp8_hi[c] = (uint8_t)(qo_f32_to_bits(qo_fp8_value[c]) >> 24);
    qo_fp8_lo[c] = (uint8_t)(qo_f32_to_bits(qo_fp8_value[c]) >> 16);
  }
  qo_fp8_value_ready = 1; /* benign race: every thread writes the same values */
}

/* MXFP4 / NVFP4 value tables of the GEMVs, built once per thread and weight kind (fmt, lut_key) instead of two
 * multiplications per block and row in the loop:
 *   v16 (AVX512_VBMI): v16[16 * c + i] = (float)(2 * e2m1 of code i) * half_scale[c], the very float32 products the
 *       other paths compute per element;
 *   v8 (AVX2): the bits of v8[8 * c + m] are those of v16[16 * c + m] (m < 8: the non-negative codes) XOR (m << 28).
 *       The AVX2 GEMV looks a code up by its low 3 bits (vpermps) and XORs in the code shifted left by 28: bits
 *       28..30 (m again) cancel, bit 31 is the code's sign bit, so the result is the value of code m with the code's
 *       sign: the very float32 the multiplication gives (the product of -(2 * e2m1) is the negated product; code 8,
 *       -0, gives -0 instead of +0, which leaves every sum unchanged: an accumulator starts at +0 and is never -0).
 *       Only a NaN block scale differs: a negative code gives the NaN with its sign bit flipped (NaN either way).
 * No TLS alignment is assumed: v16 is read with unaligned loads, v8 is 32-byte aligned by hand (fp4_v8). */
typedef struct {
  float v16[256 * 16];
  uint32_t v8_mem[256 * 8 + 8];
  int fmt;
  uint32_t key;
} qo_fp4_tables;
static QO_THREAD_LOCAL qo_fp4_tables tls_fp4 = {.fmt = -1};

QO_INLINE uint32_t* fp4_v8(qo_fp4_tables* t) { return (uint32_t*)(((uintptr_t)t->v8_mem + 31) & ~(uintptr_t)31); }

static __attribute__((noinline)) qo_fp4_tables* fp4_tables(const qo_weight* w) {
  qo_fp4_tables* t = &tls_fp4;
  if (t->fmt != w->fmt || t->key != w->lut_key) {
    uint32_t* v8 = fp4_v8(t);
    for (int c = 0; c < 256; ++c)
      for (int i = 0; i < 16; ++i) {
        t->v16[16 * c + i] = (float)QO_E2M1_X2[i] * w->half_scale[c];
        if (i < 8) v8[8 * c + i] = qo_f32_to_bits(t->v16[16 * c + i]) ^ ((uint32_t)i << 28);
      }
    t->fmt = w->fmt;
    t->key = w->lut_key;
  }
  return t;
}

/* Exact float32 value of weight element (n, k). */
static inline float decode_one(const qo_weight* w, int64_t n, int64_t k) {
  const uint8_t* row = w->data + n * w->row_bytes;
  switch (w->fmt) {
    case QO_W_FP8: return qo_fp8_value[row[k]];
    case QO_W_INT8: return (float)(int8_t)row[k];
    case QO_W_BF16: {
      uint16_t h;
      memcpy(&h, row + 2 * k, 2);
      return qo_bits_to_f32((uint32_t)h << 16);
    }
    default: {
      const int code = (row[k >> 1] >> ((k & 1) * 4)) & 0x0F;
      return (float)QO_E2M1_X2[code] * w->half_scale[w->scales[n * w->scales_per_row + k / w->block]];
    }
  }
}

/* Lanes + the K % 8 tail (lanes 0..t-1, fmaf) + the pairwise fold + the output scale. */
static inline float finish(const float lanes_in[QO_LANES], const float* a_tail, const float* w_tail, int t,
                           float scale) {
  float l[QO_LANES];
  memcpy(l, lanes_in, sizeof l);
  for (int j = 0; j < t; ++j) l[j] = fmaf(a_tail[j], w_tail[j], l[j]);
  return qo_fold8(l) * scale;
}

typedef struct {
  const float* A;
  int64_t M, N, K;
  const qo_weight* w;
  const float* row_scale;  /* [M] or NULL */
  const float* col_scale;  /* [1] or [N] or NULL */
  int64_t col_scale_count;
  float* Y;
  int64_t rows_per_task;
  int isa;                 /* QO_ISA_*: the path run_gemm picked */
  const float* a_pack;     /* M > 4 on AVX2: A in 4-row micro-panels, see pack_a */
  volatile int failed;
  const uint8_t* mxi;      /* MXFP4: A prepared for the block-integer path (mxi_prepare), or NULL */
  int fp8_half;            /* FP8 GEMV on AVX2: A in the range of fp8_half_range (the fp16 route, avx_fp8_half_steps) */
  int fp8_nan_free;        /* FP8: the weight is known to hold no NaN code (qo_cpu_set_fp8_weight_nan_free) */
} qo_job;

/* Whether the AVX2 FP8 GEMV may accumulate 2^-8 times the products (avx_fp8_half_steps) and give the bits of the
 * unscaled sums: every nonzero |a| in [2^-100, 2^120 / (448 K)] (no NaN or infinity). Then a product of a and a
 * scaled weight (a multiple of 2^-17, at most 448 * 2^-8) is a multiple of 2^-140 (a's exponent >= -100, 23 bits),
 * so every scaled partial sum that falls below 2^-126 is exact in the float32 subnormals (a multiple of 2^-149),
 * as the unscaled one (2^8 times it, under 2^-118) is in the normals; above that rounding commutes with the exact
 * scaling by 2^-8; and no unscaled partial sum reaches 2^120 (K products of at most 448 |a|), so none overflows. */
static int fp8_half_range(const float* A, int64_t count, int64_t K) {
  const float lo = 0x1p-100f, hi = (float)(0x1p120 / (448.0 * (double)(K > 0 ? K : 1)));
  int ok = 1;
  for (int64_t i = 0; i < count; ++i) {
    const float a = fabsf(A[i]);
    ok &= (a == 0.0f) | ((a >= lo) & (a <= hi)); /* NaN fails both comparisons */
  }
  return ok;
}

static inline float out_scale(const qo_job* job, int64_t m, int64_t n) {
  const float rs = job->row_scale ? job->row_scale[m] : 1.0f;
  const float cs = job->col_scale ? job->col_scale[job->col_scale_count == 1 ? 0 : n] : 1.0f;
  return rs * cs;
}

/* ---------------- thread-local buffers (qo_tls_grow) ---------------- */
static QO_THREAD_LOCAL float* tls_panel = NULL;
static QO_THREAD_LOCAL size_t tls_panel_floats = 0;
static QO_THREAD_LOCAL float* tls_part = NULL;
static QO_THREAD_LOCAL size_t tls_part_floats = 0;

/* ---------------- portable C path ---------------- */
static void portable_task(qo_job* job, int64_t n0, int64_t n1) {
  const int64_t K = job->K, K8 = K & ~(int64_t)(QO_LANES - 1);
  const int t = (int)(K - K8);
  float* wrow = qo_tls_grow(&tls_panel, &tls_panel_floats, (size_t)K);
  if (!wrow) {
    job->failed = 1;
    return;
  }
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t k = 0; k < K; ++k) wrow[k] = decode_one(job->w, n, k);
    for (int64_t m = 0; m < job->M; ++m) {
      const float* a = job->A + m * K;
      float l[QO_LANES] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t k = 0; k < K8; k += QO_LANES)
        for (int j = 0; j < QO_LANES; ++j) l[j] = fmaf(a[k + j], wrow[k + j], l[j]);
      job->Y[m * job->N + n] = finish(l, a + K8, wrow + K8, t, out_scale(job, m, n));
    }
  }
}

/* ---------------- MXFP4 with A on the MXFP4 grid: block-integer dot products ----------------
 * In Quark's w_mxfp4_a_mxfp4 schemes the graph fake-quantizes A per 32-block along K before the node
 * (builder/ops/mx_activation.py): every block of an A row is e2m1 * 2^e, and so is every block of the weight
 * (2 * e2m1 * 2^(s - 128), s the e8m0 code). A block's sum of products is then an integer times one power of two,
 * computed exactly with 8-bit integer dot products. mxi_prepare checks each A row ONCE per call (amortised over the
 * N weight rows): a block is on the grid when every element is q * 2^e with q an integer in [-127, 127] and e the
 * block max's exponent - 6 (checked by converting back, e in [-100, 100]; an all-zero block is on it). This holds
 * for MXFP4 activations (q = 8 * 2 * e2m1 at most 96) and for any other A that is an int8 times a power of two per
 * block. A row with one block off the grid (float A: weight-only MXFP4, mxfp4_fp8, an unquantized layer) keeps the
 * float path of the header (same bits as before).
 * The order of an on-grid row (every path and M, so still one order per row): per output 16 float32 lanes; quad j
 * (elements 8j..8j+7) of block b gives the exact integer P(b, j) = sum q_a * (2 * e2m1_w); lane L = 4 * (b % 4) + j
 * accumulates fmaf((float)P, 2^(e_b + s_b - 128), lane) over b in increasing order (|P| < 2^14: the product is
 * exact, one rounding per step), from +0; then s_i = l_i + l_(i+8), and the 8-lane fold of the header. Only the
 * float32 additions round: Quark-exact up to summation order, as the float path. A pair (row, weight row) whose
 * exponents could leave [2^-126, 2^113] (or a NaN e8m0 code 255) takes the float path for that output
 * (mxi_pair_ok), decided from the row's and the weight row's exponent ranges only: the same on every path.
 * AVX-512 (VNNI: vpdpbusd; else vpmaddubsw + vpmaddwd) and AVX2 (vpmaddubsw + vpmaddwd) decode the nibbles by one
 * vpshufb to 2 * e2m1 + 12 (unsigned) against the signed prepared A; -12 * sum(q) per quad, prepared with A, starts
 * the integer sum, so P is exact on both. */
#define QO_MXI_AMAX_SHIFT 6 /* block max / 2^e in [64, 128): q in [-127, 127] */
#define QO_MXI_E_LIMIT 100  /* |e| bound: q * 2^e exact and 2^e, 2^-e normal */

typedef struct {    /* 128 elements (4 blocks) of one prepared A row: 320 bytes */
  int8_t even[64];  /* block bb's element 2p at 16 * bb + p (the low nibbles' elements) */
  int8_t odd[64];   /* its element 2p + 1 */
  int32_t corr[16]; /* lane 4 * bb + j: -12 * sum of q over the block's elements 8j..8j+7 (the +12 weight offset) */
  int32_t eb[16];   /* lane 4 * bb + j: e_b - 1 (2^(e_b + s - 128) has biased exponent s + e_b - 1); 0 for a
                       zero block or none */
  int32_t eb23[16]; /* eb << 23 (mod 2^32): the AVX2 tile adds it to the e8m0 code << 23, the bits of
                       (s + eb) << 23 without a shift per A row (vpslld issues at half the rate of an add on Zen 1) */
} qo_mxi_chunk;

typedef struct {
  int32_t ok;         /* every block on the grid */
  int32_t nonzero;    /* some block not all zero */
  int32_t bmin, bmax; /* min / max of e_b - 1 over the nonzero blocks */
} qo_mxi_row;

QO_INLINE int64_t mxi_chunks(int64_t K) { return (K / QO_MXFP4_BLOCK + 3) / 4; }
QO_INLINE int64_t mxi_header_bytes(int64_t M) { return (M * (int64_t)sizeof(qo_mxi_row) + 63) / 64 * 64; }
QO_INLINE int64_t mxi_bytes(int64_t M, int64_t K) {
  return mxi_header_bytes(M) + M * mxi_chunks(K) * (int64_t)sizeof(qo_mxi_chunk);
}
QO_INLINE const qo_mxi_row* mxi_rows_of(const uint8_t* prep) { return (const qo_mxi_row*)prep; }
QO_INLINE const qo_mxi_chunk* mxi_chunks_of(const uint8_t* prep, int64_t M, int64_t K, int64_t m) {
  return (const qo_mxi_chunk*)(prep + mxi_header_bytes(M)) + m * mxi_chunks(K);
}

/* One 32-block of A: 0 off the grid, 1 all zero, 2 on it with q[] and *eb = e - 1. */
static int mxi_block(const float* a, int8_t q[QO_MXFP4_BLOCK], int32_t* eb) {
  float amax = 0.0f;
  for (int k = 0; k < QO_MXFP4_BLOCK; ++k) {
    const float v = fabsf(a[k]);
    if (v != v) return 0; /* NaN: off the grid (was: kept as the max until a later element replaced it, so a NaN
                             among zeros made an all-zero block and a finite output) */
    if (!(v <= amax)) amax = v;
  }
  if (!(amax <= 3.4028234663852886e38f)) return 0; /* inf, NaN */
  if (amax == 0.0f) {
    memset(q, 0, QO_MXFP4_BLOCK);
    *eb = 0;
    return 1;
  }
  const int e = ilogbf(amax) - QO_MXI_AMAX_SHIFT;
  if (e < -QO_MXI_E_LIMIT || e > QO_MXI_E_LIMIT) return 0;
  const float down = qo_bits_to_f32((uint32_t)(127 - e) << 23), up = qo_bits_to_f32((uint32_t)(127 + e) << 23);
  for (int k = 0; k < QO_MXFP4_BLOCK; ++k) {
    const int i = (int)(a[k] * down); /* |a * 2^-e| < 128 */
    if ((float)i * up != a[k]) return 0; /* exact: |i| < 128, 2^e normal */
    q[k] = (int8_t)i;
  }
  *eb = e - 1;
  return 2;
}

#if QO_X86_AVX2
static int mxi_block_z(const float* a, int8_t q[QO_MXFP4_BLOCK], int32_t* eb); /* AVX-512, the same results */
#endif
int qo_cpu_isa(void);

/* A [M, K] -> prep (mxi_bytes(M, K) bytes): row headers, then each row's chunks. Returns the rows on the grid. */
static int64_t mxi_prepare(const float* A, int64_t M, int64_t K, uint8_t* prep) {
  const int64_t nb = K / QO_MXFP4_BLOCK, C = mxi_chunks(K);
#if QO_X86_AVX2
  int (*const block_of)(const float*, int8_t*, int32_t*) = qo_cpu_isa() == QO_ISA_AVX512 ? mxi_block_z : mxi_block;
#else
  int (*const block_of)(const float*, int8_t*, int32_t*) = mxi_block;
#endif
  qo_mxi_row* rows = (qo_mxi_row*)prep;
  int64_t on = 0;
  for (int64_t m = 0; m < M; ++m) {
    qo_mxi_row row = {1, 0, INT32_MAX, INT32_MIN};
    qo_mxi_chunk* ch = (qo_mxi_chunk*)(prep + mxi_header_bytes(M)) + m * C;
    memset(ch + C - 1, 0, sizeof(qo_mxi_chunk)); /* the last chunk's blocks past K stay 0; the others are written */
    for (int64_t b = 0; b < nb && row.ok; ++b) {
      int8_t q[QO_MXFP4_BLOCK];
      int32_t eb;
      const int kind = block_of(A + m * K + b * QO_MXFP4_BLOCK, q, &eb);
      if (!kind) {
        row.ok = 0;
        break;
      }
      qo_mxi_chunk* x = ch + b / 4;
      const int bb = (int)(b % 4);
      for (int p = 0; p < 16; ++p) {
        x->even[16 * bb + p] = q[2 * p];
        x->odd[16 * bb + p] = q[2 * p + 1];
      }
      for (int j = 0; j < 4; ++j) {
        int32_t sum = 0;
        for (int e = 8 * j; e < 8 * j + 8; ++e) sum += q[e];
        x->corr[4 * bb + j] = -12 * sum;
        x->eb[4 * bb + j] = eb;
        x->eb23[4 * bb + j] = (int32_t)((uint32_t)eb << 23);
      }
      if (kind == 2) {
        row.nonzero = 1;
        if (eb < row.bmin) row.bmin = eb;
        if (eb > row.bmax) row.bmax = eb;
      }
    }
    rows[m] = row;
    on += row.ok;
  }
  return on;
}

/* May output (row, weight row with e8m0 codes in [smin, smax]) take the integer path? Every step's scale
 * 2^(e_b + s - 128) normal and every |P| * scale < 2^127 (|P| < 2^14), no NaN scale. */
QO_INLINE int mxi_pair_ok(const qo_mxi_row* r, int smin, int smax) {
  return r->ok && smax <= 254 && (!r->nonzero || (smin + r->bmin >= 1 && smax + r->bmax <= 240));
}

static void mxi_scale_range(const uint8_t* srow, int64_t nb, int* smin, int* smax) {
  uint8_t lo = 255, hi = 0; /* bytes: vectorized as byte min / max (int accumulators made it dword lanes, SSE2
                               emulating min / max: about as many instructions as the GEMV tile itself) */
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t v = srow[b];
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
  }
  *smin = lo;
  *smax = hi;
}

QO_INLINE float mxi_scale(int s, int32_t eb) { return qo_bits_to_f32((uint32_t)(s + eb) << 23); }

/* 16 lanes -> s_i = l_i + l_(i+8) -> the 8-lane fold. */
QO_INLINE float mxi_fold16(const float l[16]) {
  float s[QO_LANES];
  for (int i = 0; i < QO_LANES; ++i) s[i] = l[i] + l[i + QO_LANES];
  return qo_fold8(s);
}

/* One output, portable C: the order above, P as a plain integer sum. */
static float mxi_dot_portable(const qo_mxi_chunk* ch, const uint8_t* row, const uint8_t* srow, int64_t nb) {
  float l[16] = {0};
  for (int64_t b = 0; b < nb; ++b) {
    const qo_mxi_chunk* x = ch + b / 4;
    const int bb = (int)(b % 4);
    for (int j = 0; j < 4; ++j) {
      int32_t P = 0;
      for (int p = 4 * j; p < 4 * j + 4; ++p) {
        const uint8_t byte = row[16 * b + p];
        P += QO_E2M1_X2[byte & 15] * x->even[16 * bb + p] + QO_E2M1_X2[byte >> 4] * x->odd[16 * bb + p];
      }
      const int L = 4 * bb + j;
      l[L] = fmaf((float)P, mxi_scale(srow[b], x->eb[L]), l[L]);
    }
  }
  return mxi_fold16(l);
}

/* ---------------- AVX2 + FMA path (x86-64, picked at run time) ---------------- */
#if QO_X86_AVX2
QO_TARGET_BEGIN("avx2,fma,f16c")

/* e4m3fn, two exact routes:
 *  - fast, for 32 codes at a time when all are normal (magnitude 8..0x7E): sign to bit 31, the 7 magnitude bits
 *    to bits 20..26 and 120 added to the float32 exponent, all integer operations. (Shifting and multiplying by
 *    2^120 is exact for subnormal codes too, but feeds float32 subnormals to the multiplier, a microcode assist on
 *    Zen 3: a 4096 x 4096 GEMV of uniformly random codes took 3.6 against 2.4 ms of CPU.) Quantized weights almost
 *    never have zero or subnormal codes (|w| < 2^-6 of the scale, under 4e-5 of the row's max).
 *  - otherwise: qo_avx_fp8x8 (qo_cpu_simd.h), through fp16. */

QO_INLINE __m256 avx_int8x8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
}

QO_INLINE __m256 avx_bf16x8(const uint8_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}

/* 2 * e2m1 of 16 codes (one per byte) by a 16-entry byte shuffle. */
QO_INLINE __m128i avx_e2m1_x2(__m128i codes) {
  return _mm_shuffle_epi8(_mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12), codes);
}

QO_INLINE __m256 avx_i8_to_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }

QO_INLINE int qo_block_of(const int fmt) { return fmt == QO_W_MXFP4 ? QO_MXFP4_BLOCK : QO_NVFP4_BLOCK; }

/* Byte offset of element k (k % 2 == 0) in a weight row. */
QO_INLINE int64_t qo_row_offset(const int fmt, int64_t k) {
  return fmt == QO_W_BF16 ? 2 * k : fmt == QO_W_MXFP4 || fmt == QO_W_NVFP4 ? k / 2 : k;
}

/* 8 weight elements k..k+7 (k % 8 == 0) of one row. */
QO_INLINE __m256 avx_dec8(const int fmt, const qo_weight* w, const uint8_t* row, const uint8_t* srow, int64_t k) {
  if (fmt == QO_W_FP8) return qo_avx_fp8x8(row + k);
  if (fmt == QO_W_INT8) return avx_int8x8(row + k);
  if (fmt == QO_W_BF16) return avx_bf16x8(row + 2 * k);
  int32_t four;
  memcpy(&four, row + k / 2, 4);
  const __m128i x = _mm_cvtsi32_si128(four), m4 = _mm_set1_epi8(0x0F);
  const __m128i codes = _mm_unpacklo_epi8(_mm_and_si128(x, m4), _mm_and_si128(_mm_srli_epi16(x, 4), m4));
  const __m256 s = _mm256_set1_ps(w->half_scale[srow[k / qo_block_of(fmt)]]);
  return _mm256_mul_ps(avx_i8_to_ps(avx_e2m1_x2(codes)), s);
}

/* FP8, 32 codes: 0xFF in the bytes of a NaN (magnitude 0x7F), zero or subnormal (magnitude 0..7) code (magnitude + 1
 * as a signed byte is <= 8 exactly for those) */
QO_INLINE __m256i avx_fp8_special32(const uint8_t* p) {
  const __m256i raw = _mm256_loadu_si256((const __m256i*)p);
  const __m256i t = _mm256_add_epi8(_mm256_and_si256(raw, _mm256_set1_epi8(0x7F)), _mm256_set1_epi8(1));
  return _mm256_cmpgt_epi8(_mm256_set1_epi8(9), t);
}

/* 8 normal FP8 codes -> float32: the float32 exponent is e + 120, added as an integer (no multiply: the FMA pipes
 * stay free) */
QO_INLINE __m256 avx_fp8x8_normal(const uint8_t* p) {
  const __m256i x = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p));
  return _mm256_castsi256_ps(_mm256_add_epi32(
      _mm256_and_si256(_mm256_slli_epi32(x, 20), _mm256_set1_epi32((int)0x87F00000u)), _mm256_set1_epi32(120 << 23)));
}

/* 32 weight elements k..k+31 (k % 32 == 0) of one row into out[0..3]. */
QO_INLINE void avx_dec32(const int fmt, const qo_weight* w, const uint8_t* row, const uint8_t* srow, int64_t k,
                         __m256 out[4]) {
  if (fmt == QO_W_MXFP4 || fmt == QO_W_NVFP4) {
    const __m128i x = _mm_loadu_si128((const __m128i*)(row + k / 2)), m4 = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(x, m4), hi = _mm_and_si128(_mm_srli_epi16(x, 4), m4);
    const __m128i v0 = avx_e2m1_x2(_mm_unpacklo_epi8(lo, hi)), v1 = avx_e2m1_x2(_mm_unpackhi_epi8(lo, hi));
    const int64_t b = k / qo_block_of(fmt);
    const __m256 s0 = _mm256_set1_ps(w->half_scale[srow[b]]);
    const __m256 s1 = fmt == QO_W_MXFP4 ? s0 : _mm256_set1_ps(w->half_scale[srow[b + 1]]);
    out[0] = _mm256_mul_ps(avx_i8_to_ps(v0), s0);
    out[1] = _mm256_mul_ps(avx_i8_to_ps(_mm_unpackhi_epi64(v0, v0)), s0);
    out[2] = _mm256_mul_ps(avx_i8_to_ps(v1), s1);
    out[3] = _mm256_mul_ps(avx_i8_to_ps(_mm_unpackhi_epi64(v1, v1)), s1);
    return;
  }
  if (fmt == QO_W_FP8 && !_mm256_movemask_epi8(avx_fp8_special32(row + k))) {
    for (int i = 0; i < 4; ++i) out[i] = avx_fp8x8_normal(row + k + 8 * i);
    return;
  }
  for (int i = 0; i < 4; ++i) out[i] = avx_dec8(fmt, w, row, srow, k + 8 * i);
}

/* MXFP4 / NVFP4 elements k..k+31 (k % 32 == 0) of one row for the AVX2 GEMV, by the v8 tables of fp4_tables: per 8
 * elements one broadcast of their 4 bytes, a variable shift that leaves element L's code in the low bits of lane L,
 * one vpermps of the block's table and one XOR: 5 vector operations with the FMA, against 6.25 for the conversion
 * and multiplication of avx_dec32. The same values (see fp4_tables). */
QO_INLINE void avx_dec32_fp4(const int fmt, const uint32_t* lut8, const uint8_t* row, const uint8_t* srow, int64_t k,
                             __m256 out[4]) {
  const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  const int64_t b = k / qo_block_of(fmt);
  const __m256 t0 = _mm256_castsi256_ps(_mm256_load_si256((const __m256i*)(lut8 + 8 * srow[b])));
  const __m256 t1 = fmt == QO_W_MXFP4 ? t0 : _mm256_castsi256_ps(_mm256_load_si256((const __m256i*)(lut8 + 8 * srow[b + 1])));
  for (int i = 0; i < 4; ++i) {
    int32_t four;
    memcpy(&four, row + k / 2 + 4 * i, 4);
    const __m256i idx = _mm256_srlv_epi32(_mm256_set1_epi32(four), shifts);
    const __m256 v = _mm256_permutevar8x32_ps(i < 2 ? t0 : t1, idx);
    out[i] = _mm256_castsi256_ps(_mm256_xor_si256(_mm256_castps_si256(v), _mm256_slli_epi32(idx, 28)));
  }
}

/* finish() for K % 8 == 0 with the same three additions in the same order: (l_j + l_j+4), then (s0 + s2, s1 + s3),
 * then t0 + t1; then the scale. */
QO_INLINE float avx_fold_scale(__m256 v, float scale) { return qo_fold8_avx2(v) * scale; }

/* GEMV tile: mr activation rows (all of M) x nr weight rows starting at n, straight from the compact weight. */
/* FP8 GEMV steps of 32 k over [0, K8) where the fp16 route (avx_fp8_half_steps, below) does not apply (A out of
 * fp8_half_range, or a NaN code in the tile): the integer decode (exact for normal codes) in a loop of its own, one test
 * per step of the nr rows' 32 codes each; a step with a zero, subnormal or NaN code leaves that loop and decodes its
 * rows through fp16 (qo_avx_fp8x8), then the loop goes on. Same decoded values, same FMAs in the same order as
 * avx_dec32 in the generic loop, whose shape (the slow decode inlined beside the fast one in every step) compiled
 * into spills: measured on a Xeon with QO_CPU_KERNELS=avx2, 1 thread, M = 1, [4096, 256] with the weight in L2 9.5
 * against 10.6 cycles per 32 bytes (without any test 7.4-7.8: the test is needed); streamed (gemv_bandwidth.py)
 * 50-56 % of the read against 46-54 %, M = 3 1.15x. Returns the first k not done (K8 rounded down to 32). */
QO_INLINE int64_t avx_fp8_steps(const int mr, const int nr, const uint8_t* const* rows, const float* A, int64_t K,
                                int64_t K8, __m256 acc[4][4]) {
  int64_t k = 0;
  for (;;) {
    for (; k + 32 <= K8; k += 32) {
      if (QO_GEMV_PF && (k & 63) == 0)
        for (int r = 0; r < nr; ++r) _mm_prefetch((const char*)rows[r] + k + QO_GEMV_PF, _MM_HINT_T0);
      __m256i sp = _mm256_setzero_si256();
      for (int r = 0; r < nr; ++r) sp = _mm256_or_si256(sp, avx_fp8_special32(rows[r] + k));
      if (_mm256_movemask_epi8(sp)) break;
      for (int r = 0; r < nr; ++r)
        for (int s = 0; s < 4; ++s) {
          const __m256 wv = avx_fp8x8_normal(rows[r] + k + 8 * s);
          for (int i = 0; i < mr; ++i) acc[i][r] = _mm256_fmadd_ps(_mm256_loadu_ps(A + i * K + k + 8 * s), wv, acc[i][r]);
        }
    }
    if (k + 32 > K8) return k;
    for (int r = 0; r < nr; ++r)
      for (int s = 0; s < 4; ++s) {
        const __m256 wv = qo_avx_fp8x8(rows[r] + k + 8 * s);
        for (int i = 0; i < mr; ++i) acc[i][r] = _mm256_fmadd_ps(_mm256_loadu_ps(A + i * K + k + 8 * s), wv, acc[i][r]);
      }
    k += 32;
  }
}

/* FP8 GEMV steps of 8 k over [0, K8) through fp16 with the accumulators at 2^-8 times the sums: per 8 codes a
 * sign extension to 16 bits, a shift and a mask give the fp16 pattern of 2^-8 times each code's value (zero and
 * subnormal codes on fp16 subnormals: exact for every code but NaN), which vcvtph2ps widens exactly. Against the
 * integer route (avx_fp8_steps: widening to 32 bits, a shift, a mask and an add per 8 codes on 256-bit registers
 * plus the per-step test of 32 codes for zero, subnormal and NaN codes) that is 3 operations on 128-bit registers
 * and no test in the loop but two running byte maxima a row, which say at the end whether a row had a NaN code
 * (magnitude 0x7F: signed max 0x7F or unsigned max 0xFF). Only with job->fp8_half (see fp8_half_range, which makes
 * the scaled sums exact images of the unscaled ones). Returns 0 (acc undefined) when some row has a NaN code: the
 * caller starts the tile again by the integer route. Else acc holds the unscaled sums (times 2^8, exact). nan_free:
 * the weight is known to hold no NaN code (the ORT layer scanned its constant initializer once,
 * qo_cpu_set_fp8_weight_nan_free), and the byte maxima and their test are left out (4-13 % of the GEMV's time on a
 * Zen 1: custom_ops/README.md, "FP8 weights scanned for NaN codes once"). */
QO_INLINE __m256 avx_fp8x8_half(const uint8_t* p) {
  return _mm256_cvtph_ps(qo_avx_fp8_to_half_bits(_mm_loadl_epi64((const __m128i*)p)));
}

QO_INLINE int avx_fp8_half_steps(const int mr, const int nr, const int nan_free, const uint8_t* const* rows,
                                 const float* A, int64_t K, int64_t K8, __m256 acc[4][4]) {
  __m256i smax = _mm256_set1_epi8((char)0x80), umax = _mm256_setzero_si256();
  int64_t k = 0;
  for (; k + 32 <= K8; k += 32) {
    if (QO_GEMV_PF && (k & 63) == 0)
      for (int r = 0; r < nr; ++r) _mm_prefetch((const char*)rows[r] + k + QO_GEMV_PF, _MM_HINT_T0);
    if (!nan_free)
      for (int r = 0; r < nr; ++r) {
        const __m256i x = _mm256_loadu_si256((const __m256i*)(rows[r] + k));
        smax = _mm256_max_epi8(smax, x);
        umax = _mm256_max_epu8(umax, x);
      }
    for (int s = 0; s < 4; ++s)
      for (int r = 0; r < nr; ++r) {
        const __m256 wv = avx_fp8x8_half(rows[r] + k + 8 * s);
        for (int i = 0; i < mr; ++i) acc[i][r] = _mm256_fmadd_ps(_mm256_loadu_ps(A + i * K + k + 8 * s), wv, acc[i][r]);
      }
  }
  for (; k < K8; k += 8)
    for (int r = 0; r < nr; ++r) {
      if (!nan_free) {
        const __m128i x = _mm_loadl_epi64((const __m128i*)(rows[r] + k));
        smax = _mm256_max_epi8(smax, _mm256_zextsi128_si256(x));
        umax = _mm256_max_epu8(umax, _mm256_zextsi128_si256(x));
      }
      const __m256 wv = avx_fp8x8_half(rows[r] + k);
      for (int i = 0; i < mr; ++i) acc[i][r] = _mm256_fmadd_ps(_mm256_loadu_ps(A + i * K + k), wv, acc[i][r]);
    }
  if (!nan_free && _mm256_movemask_epi8(_mm256_or_si256(_mm256_cmpeq_epi8(smax, _mm256_set1_epi8(0x7F)),
                                                        _mm256_cmpeq_epi8(umax, _mm256_set1_epi8((char)0xFF)))))
    return 0;
  const __m256 up = _mm256_set1_ps(256.0f);
  for (int r = 0; r < nr; ++r)
    for (int i = 0; i < mr; ++i) acc[i][r] = _mm256_mul_ps(acc[i][r], up);
  return 1;
}

QO_INLINE void avx_gemv_tile(const int fmt, const int mr, const int nr, qo_job* job, int64_t n) {
  const qo_weight* w = job->w;
  const int64_t K = job->K, K8 = K & ~(int64_t)(QO_LANES - 1);
  const float* A = job->A;
  const uint8_t* rows[4];
  const uint8_t* srows[4];
  __m256 acc[4][4];
  for (int r = 0; r < nr; ++r) {
    rows[r] = w->data + (n + r) * w->row_bytes;
    srows[r] = w->scales ? w->scales + (n + r) * w->scales_per_row : NULL;
    for (int i = 0; i < mr; ++i) acc[i][r] = _mm256_setzero_ps();
  }
  const uint32_t* lut8 = fmt == QO_W_MXFP4 || fmt == QO_W_NVFP4 ? fp4_v8(fp4_tables(w)) : NULL;
  int64_t k = 0;
  if (fmt == QO_W_FP8 && job->fp8_half &&
      (job->fp8_nan_free ? avx_fp8_half_steps(mr, nr, 1, rows, A, K, K8, acc)
                         : avx_fp8_half_steps(mr, nr, 0, rows, A, K, K8, acc)))
    k = K8;
  else if (fmt == QO_W_FP8) {
    for (int r = 0; r < nr; ++r)
      for (int i = 0; i < mr; ++i) acc[i][r] = _mm256_setzero_ps();
    k = avx_fp8_steps(mr, nr, rows, A, K, K8, acc);
  }
  for (; k + 32 <= K8; k += 32) {
    if (QO_GEMV_PF && (qo_row_offset(fmt, k) & 63) == 0)
      for (int r = 0; r < nr; ++r) _mm_prefetch((const char*)rows[r] + qo_row_offset(fmt, k) + QO_GEMV_PF, _MM_HINT_T0);
    for (int r = 0; r < nr; ++r) {
      __m256 wv[4];
      if (fmt == QO_W_MXFP4 || fmt == QO_W_NVFP4)
        avx_dec32_fp4(fmt, lut8, rows[r], srows[r], k, wv);
      else
        avx_dec32(fmt, w, rows[r], srows[r], k, wv);
      for (int s = 0; s < 4; ++s)
        for (int i = 0; i < mr; ++i)
          acc[i][r] = _mm256_fmadd_ps(_mm256_loadu_ps(A + i * K + k + 8 * s), wv[s], acc[i][r]);
    }
  }
  for (; k < K8; k += 8)
    for (int r = 0; r < nr; ++r) {
      const __m256 wv = avx_dec8(fmt, w, rows[r], srows[r], k);
      for (int i = 0; i < mr; ++i) acc[i][r] = _mm256_fmadd_ps(_mm256_loadu_ps(A + i * K + k), wv, acc[i][r]);
    }
  const int t = (int)(K - K8);
  if (t == 0) {
    for (int r = 0; r < nr; ++r)
      for (int i = 0; i < mr; ++i)
        job->Y[i * job->N + n + r] = avx_fold_scale(acc[i][r], out_scale(job, i, n + r));
    return;
  }
  for (int r = 0; r < nr; ++r) {
    float wt[QO_LANES];
    for (int j = 0; j < t; ++j) wt[j] = decode_one(w, n + r, K8 + j);
    for (int i = 0; i < mr; ++i) {
      float l[QO_LANES];
      _mm256_storeu_ps(l, acc[i][r]);
      job->Y[i * job->N + n + r] = finish(l, A + i * K + K8, wt, t, out_scale(job, i, n + r));
    }
  }
}

QO_INLINE void avx_gemv_rows(const int fmt, qo_job* job, int64_t n0, int64_t n1) {
  int64_t n = n0;
  switch (job->M) {
    case 1:
      for (; n + 4 <= n1; n += 4) avx_gemv_tile(fmt, 1, 4, job, n);
      for (; n < n1; ++n) avx_gemv_tile(fmt, 1, 1, job, n);
      break;
    case 2:
      for (; n + 4 <= n1; n += 4) avx_gemv_tile(fmt, 2, 4, job, n);
      for (; n < n1; ++n) avx_gemv_tile(fmt, 2, 1, job, n);
      break;
    case 3:
      for (; n + 2 <= n1; n += 2) avx_gemv_tile(fmt, 3, 2, job, n);
      for (; n < n1; ++n) avx_gemv_tile(fmt, 3, 1, job, n);
      break;
    default:
      for (; n + 2 <= n1; n += 2) avx_gemv_tile(fmt, 4, 2, job, n);
      for (; n < n1; ++n) avx_gemv_tile(fmt, 4, 1, job, n);
      break;
  }
}

/* Decoded panel in micro-panel order: rows in groups of 3 (the tile's weight rows, zero rows pad the last group),
 * within a group 8-element steps of K, within a step the 3 rows' 8 floats: the tile kernel reads it sequentially.
 * The K % 8 tail elements go to tail[r * 8 + j]. */
QO_INLINE void avx_decode_panel(const int fmt, const qo_weight* w, int64_t n0, int64_t rows, int64_t K, float* panel,
                                float* tail) {
  const int64_t K8 = K & ~(int64_t)(QO_LANES - 1), steps = K8 / QO_LANES;
  const int64_t padded = (rows + 2) / 3 * 3;
  for (int64_t r = 0; r < padded; ++r) {
    float* base = panel + (r / 3) * steps * 24 + (r % 3) * QO_LANES;
    if (r >= rows) {
      for (int64_t s = 0; s < steps; ++s) _mm256_storeu_ps(base + s * 24, _mm256_setzero_ps());
      continue;
    }
    const uint8_t* row = w->data + (n0 + r) * w->row_bytes;
    const uint8_t* srow = w->scales ? w->scales + (n0 + r) * w->scales_per_row : NULL;
    int64_t k = 0;
    for (; k + 32 <= K8; k += 32) {
      __m256 v[4];
      avx_dec32(fmt, w, row, srow, k, v);
      for (int i = 0; i < 4; ++i) _mm256_storeu_ps(base + (k / QO_LANES + i) * 24, v[i]);
    }
    for (; k < K8; k += 8) _mm256_storeu_ps(base + (k / QO_LANES) * 24, avx_dec8(fmt, w, row, srow, k));
    for (; k < K; ++k) tail[r * QO_LANES + (k - K8)] = decode_one(w, n0 + r, k);
  }
}

typedef void (*qo_avx_gemv_fn)(qo_job* job, int64_t n0, int64_t n1);
typedef void (*qo_avx_decode_fn)(const qo_weight* w, int64_t n0, int64_t rows, int64_t K, float* panel, float* tail);

#define QO_AVX_FORMAT(F, name)                                                                                      \
  static void avx_gemv_##name(qo_job* job, int64_t n0, int64_t n1) { avx_gemv_rows(F, job, n0, n1); }             \
  static void avx_decode_##name(const qo_weight* w, int64_t n0, int64_t rows, int64_t K, float* panel,            \
                                float* tail) {                                                                      \
    avx_decode_panel(F, w, n0, rows, K, panel, tail);                                                               \
  }
QO_AVX_FORMAT(QO_W_FP8, fp8)
QO_AVX_FORMAT(QO_W_INT8, int8)
QO_AVX_FORMAT(QO_W_BF16, bf16)
QO_AVX_FORMAT(QO_W_MXFP4, mxfp4)
QO_AVX_FORMAT(QO_W_NVFP4, nvfp4)
static const qo_avx_gemv_fn avx_gemv_by_format[] = {avx_gemv_fp8, avx_gemv_int8, avx_gemv_bf16, avx_gemv_mxfp4,
                                                    avx_gemv_nvfp4};
static const qo_avx_decode_fn avx_decode_by_format[] = {avx_decode_fp8, avx_decode_int8, avx_decode_bf16,
                                                        avx_decode_mxfp4, avx_decode_nvfp4};

/* The register tile: 4 activation rows x 3 weight rows, 12 accumulators of 8 lanes, over `steps` 8-element steps
 * of K; a and p point into the micro-panels (32 and 24 floats per step). The partial sums stay in part (12 x 8
 * floats) between K blocks, so each lane keeps its order. */
static void avx_tile_4x3(const float* a, const float* p, int64_t steps, float* part, int first) {
  __m256 acc[4][3];
  for (int i = 0; i < 4; ++i)
    for (int r = 0; r < 3; ++r)
      acc[i][r] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(part + (i * 3 + r) * QO_LANES);
  for (int64_t s = 0; s < steps; ++s, a += 32, p += 24) {
    const __m256 w0 = _mm256_loadu_ps(p), w1 = _mm256_loadu_ps(p + 8), w2 = _mm256_loadu_ps(p + 16);
    for (int i = 0; i < 4; ++i) {
      const __m256 x = _mm256_loadu_ps(a + i * 8);
      acc[i][0] = _mm256_fmadd_ps(x, w0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(x, w1, acc[i][1]);
      acc[i][2] = _mm256_fmadd_ps(x, w2, acc[i][2]);
    }
  }
  for (int i = 0; i < 4; ++i)
    for (int r = 0; r < 3; ++r) _mm256_storeu_ps(part + (i * 3 + r) * QO_LANES, acc[i][r]);
}

/* MXFP4 block-integer tile (see mxi_prepare), AVX2: mr prepared A rows x nr weight rows, out[i * nr + r]. A chunk
 * is two halves of 32 weight bytes (blocks 2h, 2h + 1 of the chunk), each 8 int32 lanes (lanes 8h..8h+7); a half
 * past the last block is skipped (its steps would add +0). The accumulators are named variables c<i><r><h> (A row
 * i, weight row r, half h), the full chunks in a loop of their own: with an array acc[i][r][h] GCC 12 kept the
 * accumulators on the stack (a load and a store around every FMA; custom_ops/README.md, "The AVX2 path on an
 * AVX2-only CPU"). */
#define MXI_ROW(i, h, A)                                                                                          \
  if (mr > (i)) {                                                                                                 \
    const qo_mxi_chunk* xc = x[i] + c;                                                                            \
    const __m256i t = _mm256_add_epi16(                                                                           \
        _mm256_maddubs_epi16(wlo, _mm256_loadu_si256((const __m256i*)(xc->even + 32 * (h)))),                     \
        _mm256_maddubs_epi16(whi, _mm256_loadu_si256((const __m256i*)(xc->odd + 32 * (h)))));                     \
    const __m256i P = _mm256_add_epi32(_mm256_madd_epi16(t, ones),                                                \
                                       _mm256_loadu_si256((const __m256i*)(xc->corr + 8 * (h))));                 \
    const __m256i sc = _mm256_add_epi32(ew23, _mm256_loadu_si256((const __m256i*)(xc->eb23 + 8 * (h))));         \
    A = _mm256_fmadd_ps(_mm256_cvtepi32_ps(P), _mm256_castsi256_ps(sc), A);                                       \
  }
#define MXI_HALF(r, h, A0, A1, A2, A3)                                                                            \
  if (nr > (r) && left > 2 * (h)) {                                                                               \
    const uint8_t* src = rows[r] + 64 * c + 32 * (h);                                                             \
    const __m256i wx = left >= 2 * (h) + 2 ? _mm256_loadu_si256((const __m256i*)src)                              \
                                           : _mm256_maskload_epi32((const int*)src, _mm256_setr_epi32(-1, -1, -1, -1, 0, 0, 0, 0)); \
    const __m256i wlo = _mm256_shuffle_epi8(table, _mm256_and_si256(wx, m4));                                     \
    const __m256i whi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(wx, 4), m4));               \
    const __m256i ew23 = _mm256_slli_epi32(_mm256_shuffle_epi8(sb##r, spread##h), 23);                            \
    MXI_ROW(0, h, A0) MXI_ROW(1, h, A1) MXI_ROW(2, h, A2) MXI_ROW(3, h, A3)                                       \
  }
#define MXI_SCALES(r)                                                                                             \
  int32_t s4##r = 0;                                                                                              \
  if (nr > (r))                                                                                                   \
    for (int64_t b = 0; b < (left < 4 ? left : 4); ++b) s4##r |= (int32_t)srows[r][4 * c + b] << (8 * b);         \
  const __m256i sb##r = _mm256_set1_epi32(s4##r);
#define MXI_CHUNK                                                                                                 \
  MXI_SCALES(0)                                                                                                   \
  MXI_SCALES(1)                                                                                                   \
  MXI_HALF(0, 0, c000, c100, c200, c300)                                                                          \
  MXI_HALF(0, 1, c001, c101, c201, c301)                                                                          \
  MXI_HALF(1, 0, c010, c110, c210, c310)                                                                          \
  MXI_HALF(1, 1, c011, c111, c211, c311)

QO_INLINE void avx_mxi_tile(const int mr, const int nr, const qo_mxi_chunk* const* x, const uint8_t* const* rows,
                            const uint8_t* const* srows, int64_t nb, float* out) {
  const __m256 z = _mm256_setzero_ps();
  __m256 c000 = z, c001 = z, c100 = z, c101 = z, c200 = z, c201 = z, c300 = z, c301 = z; /* weight row 0 */
  __m256 c010 = z, c011 = z, c110 = z, c111 = z, c210 = z, c211 = z, c310 = z, c311 = z; /* weight row 1 */
  const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  const __m256i table = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,
                                         12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
  /* dword 4k + j <- scale byte 2h + k */
  const __m256i spread0 = _mm256_setr_epi32(-256, -256, -256, -256, -255, -255, -255, -255);
  const __m256i spread1 = _mm256_setr_epi32(-254, -254, -254, -254, -253, -253, -253, -253);
  const int64_t full = nb / 4, C = (nb + 3) / 4;
  int64_t c = 0;
  for (; c < full; ++c) {
    const int64_t left = 4;
    if (QO_GEMV_PF) {
      const int64_t ahead = qo_pf_ahead(64 * c, 16 * nb, nr);
      for (int r = 0; r < nr; ++r) _mm_prefetch((const char*)rows[r] + ahead, _MM_HINT_T0);
    }
    MXI_CHUNK
  }
  for (; c < C; ++c) { /* the last chunk, 1 to 3 blocks */
    const int64_t left = nb - 4 * c;
    MXI_CHUNK
  }
  const __m256 acc[4][2] = {{_mm256_add_ps(c000, c001), _mm256_add_ps(c010, c011)},
                            {_mm256_add_ps(c100, c101), _mm256_add_ps(c110, c111)},
                            {_mm256_add_ps(c200, c201), _mm256_add_ps(c210, c211)},
                            {_mm256_add_ps(c300, c301), _mm256_add_ps(c310, c311)}};
  for (int i = 0; i < mr; ++i)
    for (int r = 0; r < nr; ++r) out[i * nr + r] = avx_fold_scale(acc[i][r], 1.0f);
}
#undef MXI_CHUNK
#undef MXI_SCALES
#undef MXI_HALF
#undef MXI_ROW

/* The tiles the MXFP4 integer driver asks for (mxi_nr): nr = 2 for mr = 1, 2 (16 ymm registers), and nr = 1. */
static void avx_mxi_tiles(int mr, int nr, const qo_mxi_chunk* const* x, const uint8_t* const* rows,
                          const uint8_t* const* srows, int64_t nb, float* out) {
  switch (mr * 16 + nr) {
    case 0x12: avx_mxi_tile(1, 2, x, rows, srows, nb, out); break;
    case 0x22: avx_mxi_tile(2, 2, x, rows, srows, nb, out); break;
    case 0x11: avx_mxi_tile(1, 1, x, rows, srows, nb, out); break;
    case 0x21: avx_mxi_tile(2, 1, x, rows, srows, nb, out); break;
    case 0x31: avx_mxi_tile(3, 1, x, rows, srows, nb, out); break;
    default: avx_mxi_tile(4, 1, x, rows, srows, nb, out); break;
  }
}

QO_TARGET_END

/* ---------------- AVX-512 path (F + BW + VL + DQ; x86-64, picked at run time) ----------------
 * The same lanes and the same order as above, twice as wide: one zmm holds the 8-lane accumulators of TWO outputs
 * (low 256 bits one, high 256 bits the other), so every lane still accumulates k = 8i + j in increasing i by one
 * FMA per step, and the halves end in the AVX2 fold. Bit-identical to the AVX2 and portable paths (the decoded
 * weights are exact, the integer decode steps are the same).
 *   - GEMV (M <= 4): the two halves are two weight rows; 16 weight elements (8 of each row) decoded per zmm, the
 *     activation's 8 floats broadcast to both halves.
 *   - prefill (M > 4): the two halves are two activation rows (rows 2z and 2z+1 of a 4-row micro-panel: adjacent
 *     in pack_a's layout, one zmm load), each weight row's 8 floats broadcast; register tile 8 activation rows x 6
 *     weight rows (24 zmm accumulators) over the AVX2 path's decoded panels and partial-sum layout.
 * The 16-wide format decodes (qoz_fp8x16, qoz_int8x16, qoz_bf16x16, qoz_join) live in qo_cpu_simd.h for other
 * kernel files. */
QO_TARGET_BEGIN("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")

/* FP8 elements k..k+31 of rows a (low halves) and b (high halves), out[s] = elements k+8s..k+8s+7 of both: the
 * integer route of qoz_fp8x16 (sign to bit 31, magnitude to bits 20..26, + 120 on the float32 exponent; no multiply,
 * no blend) when all 64 codes are normal, else qoz_fp8x32's fp16 route (a branch taken for about 1 % of the steps
 * of real weights: zero and subnormal codes are |w| < 2^-6 of the scale). */
QO_INLINE void qoz_fp8_pair(const uint8_t* ra, const uint8_t* rb, int64_t k, __m512 out[4]) {
  const __m256i ca = _mm256_loadu_si256((const __m256i*)(ra + k)), cb = _mm256_loadu_si256((const __m256i*)(rb + k));
  /* any zero, subnormal or NaN code? ((code + 1) & 0x7F, a byte, is <= 8 exactly for those) */
  const __m512i t = _mm512_and_si512(_mm512_add_epi8(_mm512_inserti64x4(_mm512_castsi256_si512(ca), cb, 1),
                                                     _mm512_set1_epi8(1)), _mm512_set1_epi8(0x7F));
  if (__builtin_expect(_mm512_cmple_epu8_mask(t, _mm512_set1_epi8(8)) != 0, 0)) {
    qoz_fp8x32(_mm256_unpacklo_epi64(ca, cb), &out[0], &out[2]);
    qoz_fp8x32(_mm256_unpackhi_epi64(ca, cb), &out[1], &out[3]);
    return;
  }
  const __m256i u0 = _mm256_unpacklo_epi64(ca, cb), u1 = _mm256_unpackhi_epi64(ca, cb);
  const __m128i q[4] = {_mm256_castsi256_si128(u0), _mm256_castsi256_si128(u1), _mm256_extracti128_si256(u0, 1),
                        _mm256_extracti128_si256(u1, 1)};
  const __m512i mask = _mm512_set1_epi32((int)0x87F00000u), bias = _mm512_set1_epi32(120 << 23);
  for (int s = 0; s < 4; ++s)
    out[s] = _mm512_castsi512_ps(
        _mm512_add_epi32(_mm512_and_si512(_mm512_slli_epi32(_mm512_cvtepi8_epi32(q[s]), 20), mask), bias));
}

/* Weight elements k..k+31 (k % 32 == 0) of rows a (low halves) and b (high halves): out[s] = elements
 * k+8s..k+8s+7 of both rows. */
QO_INLINE void qoz_dec32_pair(const int fmt, const qo_weight* w, const uint8_t* ra, const uint8_t* rb,
                              const uint8_t* sa, const uint8_t* sb, int64_t k, __m512 out[4]) {
  if (fmt == QO_W_MXFP4 || fmt == QO_W_NVFP4) {
    const __m256i x = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i*)(ra + k / 2))),
                                              _mm_loadu_si128((const __m128i*)(rb + k / 2)), 1);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i lo = _mm256_and_si256(x, m4), hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), m4);
    const __m256i table = _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,
                                           0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    /* per 128-bit lane (row): elements 0..15 and 16..31; qwords then reordered to [a q, b q | a q+1, b q+1] */
    const __m256i v0 = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(table, _mm256_unpacklo_epi8(lo, hi)), 0xD8);
    const __m256i v1 = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(table, _mm256_unpackhi_epi8(lo, hi)), 0xD8);
    const int64_t b = k / qo_block_of(fmt);
    const __m512 s0 = qoz_join(_mm256_set1_ps(w->half_scale[sa[b]]), _mm256_set1_ps(w->half_scale[sb[b]]));
    const __m512 s1 = fmt == QO_W_MXFP4 ? s0 : qoz_join(_mm256_set1_ps(w->half_scale[sa[b + 1]]),
                                                        _mm256_set1_ps(w->half_scale[sb[b + 1]]));
    out[0] = _mm512_mul_ps(qoz_int8x16(_mm256_castsi256_si128(v0)), s0);
    out[1] = _mm512_mul_ps(qoz_int8x16(_mm256_extracti128_si256(v0, 1)), s0);
    out[2] = _mm512_mul_ps(qoz_int8x16(_mm256_castsi256_si128(v1)), s1);
    out[3] = _mm512_mul_ps(qoz_int8x16(_mm256_extracti128_si256(v1, 1)), s1);
    return;
  }
  if (fmt == QO_W_BF16) {
    for (int s = 0; s < 4; ++s)
      out[s] = qoz_bf16x16(_mm256_inserti128_si256(
          _mm256_castsi128_si256(_mm_loadu_si128((const __m128i*)(ra + 2 * (k + 8 * s)))),
          _mm_loadu_si128((const __m128i*)(rb + 2 * (k + 8 * s))), 1));
    return;
  }
  if (fmt == QO_W_FP8) {
    qoz_fp8_pair(ra, rb, k, out);
    return;
  }
  for (int s = 0; s < 4; ++s)
    out[s] = qoz_int8x16(_mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i*)(ra + k + 8 * s)),
                                            _mm_loadl_epi64((const __m128i*)(rb + k + 8 * s))));
}

/* MXFP4 / NVFP4 GEMV by permutes (needs AVX512_VBMI; qoz_fp4_tile_vbmi below): elements k..k+31 of rows a and b
 * (as qoz_dec32_pair: out[s] = elements k+8s..k+8s+7 of a in the low half, of b in the high half). The two rows' 16
 * packed bytes are loaded as one ymm (a, then b: the insert from memory is no shuffle), one vpermb puts into byte s
 * of dword L the byte holding the nibble of step s (element 8s + L % 8 of row L / 8); the odd lanes (high nibbles)
 * shift right by 4, one vpternlogd keeps the nibble and sets bit 4 for row b; then per step s vpermt2ps on bits 0..4
 * of (that >> 8s) looks the value up in the two rows' 16-entry tables 2 * e2m1 * half block scale (fp4_tables v16: the
 * products the other paths compute per element, the same float32 multiplications). */
static const uint8_t QOZ_FP4_IDX[64] = { /* byte s of dword L: byte 4s + (L % 8) / 2 of row L / 8 (b at 16) */
#define QOZ_L(s, L) (uint8_t)(((L) / 8) * 16 + 4 * (s) + ((L) % 8) / 2)
#define QOZ_D(L) QOZ_L(0, L), QOZ_L(1, L), QOZ_L(2, L), QOZ_L(3, L)
    QOZ_D(0), QOZ_D(1), QOZ_D(2), QOZ_D(3), QOZ_D(4), QOZ_D(5), QOZ_D(6), QOZ_D(7), QOZ_D(8), QOZ_D(9), QOZ_D(10),
    QOZ_D(11), QOZ_D(12), QOZ_D(13), QOZ_D(14), QOZ_D(15)};
#undef QOZ_D
#undef QOZ_L

#define QOZ_VBMI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi")))
#define QOZ_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

/* FP8 / INT8 elements k..k+31 of rows a and b (as qoz_dec32_pair) by byte permutes (needs AVX512_VBMI), rows a and
 * b as bytes 0..31 and 32..63 of one zmm, no branch.
 *   INT8: vpermt2b puts each code into the top byte of its dword (the rest zero), an arithmetic shift by 24
 *   sign-extends it, vcvtdq2ps (exact).
 *   FP8: every e4m3fn value's float32 has its low 16 bits zero, so two 128-byte table lookups (vpermi2b on the 7
 *   magnitude bits: qo_fp8_hi / qo_fp8_lo, bytes 3 and 2 of the float32) and the sign OR'ed into byte 3 give each
 *   code's float32 exactly (zero, subnormal and NaN codes too; 0xFF made +qNaN as on the other paths); then per 16
 *   elements one vpermt2b moves the two bytes into bytes 2..3 of the element's dword, bytes 0..1 zero. */
static const uint8_t QOZ_BYTE_IDX[4][64] = { /* INT8: byte 3 of dword L <- code of element 8s + L % 8, row L / 8 */
#define QOZ_B(s, L) 0, 0, 0, (uint8_t)(((L) / 8) * 32 + 8 * (s) + (L) % 8)
#define QOZ_ROW(s) QOZ_B(s, 0), QOZ_B(s, 1), QOZ_B(s, 2), QOZ_B(s, 3), QOZ_B(s, 4), QOZ_B(s, 5), QOZ_B(s, 6), \
    QOZ_B(s, 7), QOZ_B(s, 8), QOZ_B(s, 9), QOZ_B(s, 10), QOZ_B(s, 11), QOZ_B(s, 12), QOZ_B(s, 13), QOZ_B(s, 14), \
    QOZ_B(s, 15)
    {QOZ_ROW(0)}, {QOZ_ROW(1)}, {QOZ_ROW(2)}, {QOZ_ROW(3)}};
#undef QOZ_B
#define QOZ_B(s, L) 0, 0, (uint8_t)(((L) / 8) * 32 + 8 * (s) + (L) % 8), (uint8_t)(64 + ((L) / 8) * 32 + 8 * (s) + (L) % 8)
static const uint8_t QOZ_FP8_IDX[4][64] = { /* FP8: bytes 2, 3 of dword L <- low, high table byte of that element */
    {QOZ_ROW(0)}, {QOZ_ROW(1)}, {QOZ_ROW(2)}, {QOZ_ROW(3)}};
#undef QOZ_ROW
#undef QOZ_B

static inline QOZ_VBMI void qoz_byte_pair_vbmi(const int fmt, const uint8_t* ra, const uint8_t* rb, int64_t k,
                                               __m512 out[4]) {
  const __m512i codes = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)(ra + k))),
                                           _mm256_loadu_si256((const __m256i*)(rb + k)), 1);
  if (fmt == QO_W_INT8) {
    for (int s = 0; s < 4; ++s)
      out[s] = _mm512_cvtepi32_ps(_mm512_srai_epi32(
          _mm512_maskz_permutexvar_epi8(0x8888888888888888ULL, _mm512_loadu_si512((const void*)QOZ_BYTE_IDX[s]),
                                        codes), 24));
    return;
  }
  const __m512i lo = _mm512_permutex2var_epi8(_mm512_load_si512((const void*)qo_fp8_lo), codes,
                                              _mm512_load_si512((const void*)(qo_fp8_lo + 64)));
  __m512i hi = _mm512_permutex2var_epi8(_mm512_load_si512((const void*)qo_fp8_hi), codes,
                                        _mm512_load_si512((const void*)(qo_fp8_hi + 64)));
  hi = _mm512_ternarylogic_epi32(hi, codes, _mm512_set1_epi8((char)0x80), 0xF8); /* hi | (codes & 0x80) */
  hi = _mm512_mask_mov_epi8(hi, _mm512_cmpeq_epi8_mask(codes, _mm512_set1_epi8((char)0xFF)), _mm512_set1_epi8(0x7F));
  for (int s = 0; s < 4; ++s)
    out[s] = _mm512_castsi512_ps(_mm512_maskz_permutex2var_epi8(
        0xCCCCCCCCCCCCCCCCULL, lo, _mm512_loadu_si512((const void*)QOZ_FP8_IDX[s]), hi));
}

/* The end of a GEMV tile from element k on (k % 8 == 0): the remaining 8-element steps, the K % 8 tail, the fold. */
QO_INLINE void qoz_gemv_finish(const int fmt, const int mr, const int np, qo_job* job, int64_t n, int64_t k,
                               __m512 acc[4][4]) {
  const qo_weight* w = job->w;
  const int64_t K = job->K, K8 = K & ~(int64_t)(QO_LANES - 1);
  const float* A = job->A;
  const uint8_t* rows[8];
  const uint8_t* srows[8];
  for (int r = 0; r < 2 * np; ++r) {
    rows[r] = w->data + (n + r) * w->row_bytes;
    srows[r] = w->scales ? w->scales + (n + r) * w->scales_per_row : NULL;
  }
  for (; k < K8; k += 8)
    for (int p = 0; p < np; ++p) {
      const __m512 wv = qoz_join(avx_dec8(fmt, w, rows[2 * p], srows[2 * p], k),
                                 avx_dec8(fmt, w, rows[2 * p + 1], srows[2 * p + 1], k));
      for (int i = 0; i < mr; ++i)
        acc[i][p] = _mm512_fmadd_ps(_mm512_broadcast_f32x8(_mm256_loadu_ps(A + i * K + k)), wv, acc[i][p]);
    }
  const int t = (int)(K - K8);
  for (int p = 0; p < np; ++p)
    for (int h = 0; h < 2; ++h) {
      const int64_t nn = n + 2 * p + h;
      float wt[QO_LANES];
      for (int j = 0; j < t; ++j) wt[j] = decode_one(w, nn, K8 + j);
      for (int i = 0; i < mr; ++i) {
        const __m256 lanes = h ? _mm512_extractf32x8_ps(acc[i][p], 1) : _mm512_castps512_ps256(acc[i][p]);
        if (t == 0) {
          job->Y[i * job->N + nn] = avx_fold_scale(lanes, out_scale(job, i, nn));
        } else {
          float l[QO_LANES];
          _mm256_storeu_ps(l, lanes);
          job->Y[i * job->N + nn] = finish(l, A + i * K + K8, wt, t, out_scale(job, i, nn));
        }
      }
    }
}

/* GEMV tile: mr activation rows (all of M) x np weight-row pairs starting at n. */
QO_INLINE void qoz_gemv_tile(const int fmt, const int mr, const int np, qo_job* job, int64_t n, const int vbmi) {
  const qo_weight* w = job->w;
  const int64_t K = job->K, K8 = K & ~(int64_t)(QO_LANES - 1);
  const float* A = job->A;
  const uint8_t* rows[8];
  const uint8_t* srows[8];
  __m512 acc[4][4];
  for (int r = 0; r < 2 * np; ++r) {
    rows[r] = w->data + (n + r) * w->row_bytes;
    srows[r] = w->scales ? w->scales + (n + r) * w->scales_per_row : NULL;
  }
  for (int p = 0; p < np; ++p)
    for (int i = 0; i < mr; ++i) acc[i][p] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K8; k += 32) {
    __m512 x[4][4];
    for (int i = 0; i < mr; ++i)
      for (int s = 0; s < 4; ++s) x[i][s] = _mm512_broadcast_f32x8(_mm256_loadu_ps(A + i * K + k + 8 * s));
    if (QO_GEMV_PF && (qo_row_offset(fmt, k) & 63) == 0) { /* one prefetch per 64 bytes of each row */
      const int64_t ahead = qo_pf_ahead(qo_row_offset(fmt, k), w->row_bytes, 2 * np);
      for (int r = 0; r < 2 * np; ++r) _mm_prefetch((const char*)rows[r] + ahead, _MM_HINT_T0);
    }
    for (int p = 0; p < np; ++p) {
      __m512 wv[4];
      if (vbmi)
        qoz_byte_pair_vbmi(fmt, rows[2 * p], rows[2 * p + 1], k, wv);
      else
        qoz_dec32_pair(fmt, w, rows[2 * p], rows[2 * p + 1], srows[2 * p], srows[2 * p + 1], k, wv);
      for (int s = 0; s < 4; ++s)
        for (int i = 0; i < mr; ++i) acc[i][p] = _mm512_fmadd_ps(x[i][s], wv[s], acc[i][p]);
    }
  }
  qoz_gemv_finish(fmt, mr, np, job, n, k, acc);
}

/* MXFP4 / NVFP4 GEMV by permutes (AVX512_VBMI; the decode above QOZ_FP4_IDX): `steps` steps of 32 elements of the
 * 2 * np weight rows from w0 (row stride rb, scale rows from s0, stride sb) into acc, the same FMAs in the same order
 * as qoz_gemv_tile. Cache-resident, the loop is bound by the vector uops and the loads it issues (the two 512-bit
 * ports and the load ports; measured on an Intel Xeon by dropping parts of it, no PMU in that guest: without the
 * table loads a step of two rows took 8.3 cycles instead of 11), so it is written for few of both: the rows (and
 * scale rows) as three base pointers + multiples of the stride (rows 0, 1, 2, 4 from w0, 3, 5, 7 from w3, 6 from
 * w6: base + index * 1/2/4 addressing), advanced each step, in a function of its own (inlined into the tile, gcc
 * reloaded 9 row pointers per step from the stack or from xmm registers, the latter on port 0; now 3); one table
 * load per row and block (qoz_fp4_table). */
#define QOZ_ROW(b0, b3, b6, st, r) \
  ((r) == 0 ? (b0) : (r) == 1 ? (b0) + (st) : (r) == 2 ? (b0) + 2 * (st) : (r) == 3 ? (b3) : (r) == 4 ? (b0) + 4 * (st) \
   : (r) == 5 ? (b3) + 2 * (st) : (r) == 6 ? (b6) : (b3) + 4 * (st))
/* The 16-float table of block-scale code c: lut + 16 * c, the offset by imul (port 1; a shift would take a slot of
 * ports 0 / 6 from the vector work) with an immediate (no register for the stride). */
QO_INLINE __m512 qoz_fp4_table(const float* lut, const uint8_t* code) {
  uint64_t offset = *code;
  __asm__("imul $64, %0, %0" : "+r"(offset));
  return _mm512_loadu_ps((const float*)((const char*)lut + offset));
}

/* One 32-element step of qoz_fp4_steps, the rows' pointers advanced past it. */
QO_INLINE QOZ_VBMI void qoz_fp4_step(const int fmt, const int mr, const int np, const float* a, int64_t K,
                                     const uint8_t* w[3], int64_t rb, const uint8_t* sc[3], int64_t sb,
                                     const float* lut, int64_t ahead, int64_t sahead, __m512 acc[4][4]) {
  const __m512i gather = _mm512_loadu_si512((const void*)QOZ_FP4_IDX), nibble = _mm512_set1_epi8(0x0F);
  const __m512i row_b = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0x10101010, 0x10101010, 0x10101010, 0x10101010,
                                          0x10101010, 0x10101010, 0x10101010, 0x10101010);
  __m512 x[4][4];
  for (int i = 0; i < mr; ++i)
    for (int s = 0; s < 4; ++s) x[i][s] = _mm512_broadcast_f32x8(_mm256_loadu_ps(a + i * K + 8 * s));
  if (QO_GEMV_PF && ((uintptr_t)w[0] & 48) == 0) { /* every 4th step: 64 bytes of each row */
    for (int r = 0; r < 2 * np; ++r) _mm_prefetch((const char*)QOZ_ROW(w[0], w[1], w[2], rb, r) + ahead, _MM_HINT_T0);
    if (((uintptr_t)w[0] & (fmt == QO_W_NVFP4 ? 448 : 960)) == 0) /* and 64 bytes of each scale row */
      for (int r = 0; r < 2 * np; ++r)
        _mm_prefetch((const char*)QOZ_ROW(sc[0], sc[1], sc[2], sb, r) + sahead, _MM_HINT_T0);
  }
  for (int p = 0; p < np; ++p) {
    const uint8_t* ra = QOZ_ROW(w[0], w[1], w[2], rb, 2 * p);
    const uint8_t* rb_ = QOZ_ROW(w[0], w[1], w[2], rb, 2 * p + 1);
    const uint8_t* sa = QOZ_ROW(sc[0], sc[1], sc[2], sb, 2 * p);
    const uint8_t* sb_ = QOZ_ROW(sc[0], sc[1], sc[2], sb, 2 * p + 1);
    const __m256i ab = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i*)ra)),
                                               _mm_loadu_si128((const __m128i*)rb_), 1);
    __m512i idx = _mm512_permutexvar_epi8(gather, _mm512_castsi256_si512(ab));
    idx = _mm512_mask_srli_epi32(idx, 0xAAAA, idx, 4);         /* odd lanes: the high nibbles */
    idx = _mm512_ternarylogic_epi32(idx, nibble, row_b, 0xEA); /* (idx & 0x0F) | 0x10 in row b's lanes */
    const __m512i i1 = _mm512_srli_epi32(idx, 8), i2 = _mm512_srli_epi32(idx, 16), i3 = _mm512_srli_epi32(idx, 24);
    __m512 ta = qoz_fp4_table(lut, sa), tb = qoz_fp4_table(lut, sb_);
    __m512 wv[4];
    wv[0] = _mm512_permutex2var_ps(ta, idx, tb);
    wv[1] = _mm512_permutex2var_ps(ta, i1, tb);
    if (fmt == QO_W_NVFP4) {
      ta = qoz_fp4_table(lut, sa + 1);
      tb = qoz_fp4_table(lut, sb_ + 1);
    }
    wv[2] = _mm512_permutex2var_ps(ta, i2, tb);
    wv[3] = _mm512_permutex2var_ps(ta, i3, tb);
    for (int s = 0; s < 4; ++s)
      for (int i = 0; i < mr; ++i) acc[i][p] = _mm512_fmadd_ps(x[i][s], wv[s], acc[i][p]);
  }
  for (int j = 0; j < 3; ++j) w[j] += 16, sc[j] += fmt == QO_W_NVFP4 ? 2 : 1;
}

QO_INLINE QOZ_VBMI void qoz_fp4_steps(const int fmt, const int mr, const int np, const float* A, int64_t K,
                                      int64_t steps, const uint8_t* w0, int64_t rb, const uint8_t* s0, int64_t sb,
                                      const float* lut, __m512 acc_io[4][4]) {
  const uint8_t* w[3] = {w0, np > 1 ? w0 + 3 * rb : w0, np > 3 ? w0 + 6 * rb : w0};
  const uint8_t* sc[3] = {s0, np > 1 ? s0 + 3 * sb : s0, np > 3 ? s0 + 6 * sb : s0};
  __m512 acc[4][4];
  for (int p = 0; p < np; ++p)
    for (int i = 0; i < mr; ++i) acc[i][p] = acc_io[i][p];
  /* prefetch QO_GEMV_PF bytes ahead, or once that is past the rows' end, the same place in the next tile's rows
   * (qo_pf_ahead): two loops, so that neither tests which; the scale rows likewise, at the scales of the same
   * elements (cold-cache NVFP4 4096x4096: +2-6 % in each of 6 interleaved runs) */
  const int64_t near_steps = QO_GEMV_PF < rb ? (rb - QO_GEMV_PF + 15) / 16 : 0;
  const int64_t spf = QO_GEMV_PF * (fmt == QO_W_NVFP4 ? 2 : 1) / 16; /* the block scales of the same elements */
  const float* const a_near = A + 32 * (near_steps < steps ? near_steps : steps);
  const float* const a_end = A + 32 * steps;
  const float* a = A;
  for (; a < a_near; a += 32) qoz_fp4_step(fmt, mr, np, a, K, w, rb, sc, sb, lut, QO_GEMV_PF, spf, acc);
  for (; a < a_end; a += 32)
    qoz_fp4_step(fmt, mr, np, a, K, w, rb, sc, sb, lut, QO_GEMV_PF + (2 * np - 1) * rb, spf + (2 * np - 1) * sb, acc);
  for (int p = 0; p < np; ++p)
    for (int i = 0; i < mr; ++i) acc_io[i][p] = acc[i][p];
}
#undef QOZ_ROW

typedef void (*qoz_fp4_steps_fn)(const float*, int64_t, int64_t, const uint8_t*, int64_t, const uint8_t*, int64_t,
                                 const float*, __m512[4][4]);
#define QOZ_FP4_STEPS(F, name, MR, NP)                                                                              \
  static QOZ_VBMI __attribute__((noinline)) void qoz_fp4_steps_##name##_##MR##x##NP(                               \
      const float* A, int64_t K, int64_t steps, const uint8_t* w0, int64_t rb, const uint8_t* s0, int64_t sb,       \
      const float* lut, __m512 acc[4][4]) {                                                                         \
    qoz_fp4_steps(F, MR, NP, A, K, steps, w0, rb, s0, sb, lut, acc);                                                \
  }
#define QOZ_FP4_STEPS_ALL(F, name) \
  QOZ_FP4_STEPS(F, name, 1, 4) QOZ_FP4_STEPS(F, name, 2, 4) QOZ_FP4_STEPS(F, name, 3, 2) \
  QOZ_FP4_STEPS(F, name, 4, 2) QOZ_FP4_STEPS(F, name, 1, 1) QOZ_FP4_STEPS(F, name, 2, 1) \
  QOZ_FP4_STEPS(F, name, 3, 1) QOZ_FP4_STEPS(F, name, 4, 1)
QOZ_FP4_STEPS_ALL(QO_W_MXFP4, mxfp4)
QOZ_FP4_STEPS_ALL(QO_W_NVFP4, nvfp4)
#undef QOZ_FP4_STEPS_ALL
#undef QOZ_FP4_STEPS
/* [format is NVFP4][mr - 1][np == 1] (np = 4 for mr 1, 2; 2 for mr 3, 4: qoz_gemv_rows) */
static const qoz_fp4_steps_fn qoz_fp4_steps_by_shape[2][4][2] = {
    {{qoz_fp4_steps_mxfp4_1x4, qoz_fp4_steps_mxfp4_1x1}, {qoz_fp4_steps_mxfp4_2x4, qoz_fp4_steps_mxfp4_2x1},
     {qoz_fp4_steps_mxfp4_3x2, qoz_fp4_steps_mxfp4_3x1}, {qoz_fp4_steps_mxfp4_4x2, qoz_fp4_steps_mxfp4_4x1}},
    {{qoz_fp4_steps_nvfp4_1x4, qoz_fp4_steps_nvfp4_1x1}, {qoz_fp4_steps_nvfp4_2x4, qoz_fp4_steps_nvfp4_2x1},
     {qoz_fp4_steps_nvfp4_3x2, qoz_fp4_steps_nvfp4_3x1}, {qoz_fp4_steps_nvfp4_4x2, qoz_fp4_steps_nvfp4_4x1}}};

/* MXFP4 / NVFP4 GEMV tile by permutes: the 32-element steps (qoz_fp4_steps), then qoz_gemv_finish. */
static inline QOZ_VBMI void qoz_fp4_tile_vbmi(const int fmt, const int mr, const int np, qo_job* job, int64_t n,
                                              const float* lut) {
  const qo_weight* w = job->w;
  const int64_t K = job->K, steps = (K & ~(int64_t)(QO_LANES - 1)) / 32;
  __m512 acc[4][4];
  for (int p = 0; p < np; ++p)
    for (int i = 0; i < mr; ++i) acc[i][p] = _mm512_setzero_ps();
  qoz_fp4_steps_by_shape[fmt == QO_W_NVFP4][mr - 1][np == 1](job->A, K, steps, w->data + n * w->row_bytes,
                                                              w->row_bytes, w->scales + n * w->scales_per_row,
                                                              w->scales_per_row, lut, acc);
  qoz_gemv_finish(fmt, mr, np, job, n, 32 * steps, acc);
}

/* One tile of either kind. */
QO_INLINE void qoz_gemv_any(const int fmt, const int mr, const int np, qo_job* job, int64_t n, const int vbmi,
                            const float* lut) {
  if (vbmi && (fmt == QO_W_MXFP4 || fmt == QO_W_NVFP4))
    qoz_fp4_tile_vbmi(fmt, mr, np, job, n, lut);
  else
    qoz_gemv_tile(fmt, mr, np, job, n, vbmi);
}

QO_INLINE void qoz_gemv_rows(const int fmt, qo_job* job, int64_t n0, int64_t n1, const int vbmi) {
  int64_t n = n0;
  const float* lut = vbmi && (fmt == QO_W_MXFP4 || fmt == QO_W_NVFP4) ? fp4_tables(job->w)->v16 : NULL;
  switch (job->M) {
    case 1:
      for (; n + 8 <= n1; n += 8) qoz_gemv_any(fmt, 1, 4, job, n, vbmi, lut);
      for (; n + 2 <= n1; n += 2) qoz_gemv_any(fmt, 1, 1, job, n, vbmi, lut);
      break;
    case 2:
      for (; n + 8 <= n1; n += 8) qoz_gemv_any(fmt, 2, 4, job, n, vbmi, lut);
      for (; n + 2 <= n1; n += 2) qoz_gemv_any(fmt, 2, 1, job, n, vbmi, lut);
      break;
    case 3:
      for (; n + 4 <= n1; n += 4) qoz_gemv_any(fmt, 3, 2, job, n, vbmi, lut);
      for (; n + 2 <= n1; n += 2) qoz_gemv_any(fmt, 3, 1, job, n, vbmi, lut);
      break;
    default:
      for (; n + 4 <= n1; n += 4) qoz_gemv_any(fmt, 4, 2, job, n, vbmi, lut);
      for (; n + 2 <= n1; n += 2) qoz_gemv_any(fmt, 4, 1, job, n, vbmi, lut);
      break;
  }
  for (; n < n1; ++n) avx_gemv_tile(fmt, (int)job->M, 1, job, n); /* an odd last row: the AVX2 tile, same order */
}

#define QO_Z_FORMAT(F, name) \
  static void qoz_gemv_##name(qo_job* job, int64_t n0, int64_t n1) { qoz_gemv_rows(F, job, n0, n1, 0); }
QO_Z_FORMAT(QO_W_FP8, fp8)
QO_Z_FORMAT(QO_W_INT8, int8)
QO_Z_FORMAT(QO_W_BF16, bf16)
QO_Z_FORMAT(QO_W_MXFP4, mxfp4)
QO_Z_FORMAT(QO_W_NVFP4, nvfp4)
static const qo_avx_gemv_fn qoz_gemv_by_format[] = {qoz_gemv_fp8, qoz_gemv_int8, qoz_gemv_bf16, qoz_gemv_mxfp4,
                                                    qoz_gemv_nvfp4};

/* The FP4 GEMVs with the permute decode, for CPUs with AVX512_VBMI too. */
static QOZ_VBMI __attribute__((flatten)) void qoz_gemv_mxfp4_vbmi(qo_job* job, int64_t n0, int64_t n1) {
  qoz_gemv_rows(QO_W_MXFP4, job, n0, n1, 1);
}
static QOZ_VBMI __attribute__((flatten)) void qoz_gemv_nvfp4_vbmi(qo_job* job, int64_t n0, int64_t n1) {
  qoz_gemv_rows(QO_W_NVFP4, job, n0, n1, 1);
}
static QOZ_VBMI __attribute__((flatten)) void qoz_gemv_fp8_vbmi(qo_job* job, int64_t n0, int64_t n1) {
  qoz_gemv_rows(QO_W_FP8, job, n0, n1, 1);
}
static QOZ_VBMI __attribute__((flatten)) void qoz_gemv_int8_vbmi(qo_job* job, int64_t n0, int64_t n1) {
  qoz_gemv_rows(QO_W_INT8, job, n0, n1, 1);
}

/* Prefill register tile: ma 4-row micro-panels (a[0..ma-1]) x nb 3-row weight groups (p[0..nb-1]) over `steps`
 * 8-element steps; zmm (z, r) of micro-panel q holds activation rows 2z (low) and 2z+1 (high) against weight row r.
 * The partial sums use the AVX2 tile's layout (part[q][u]: 12 x 8 floats, (row * 3 + r) * 8). */
QO_INLINE void qoz_tile(const int ma, const int nb, const float* const a[2], const float* const p[2], int64_t steps,
                        float* const part[2][2], int first) {
  __m512 acc[2][2][2][3]; /* [q][z][u][r] */
  for (int q = 0; q < ma; ++q)
    for (int z = 0; z < 2; ++z)
      for (int u = 0; u < nb; ++u)
        for (int r = 0; r < 3; ++r) {
          const float* lo = part[q][u] + ((2 * z) * 3 + r) * QO_LANES;
          acc[q][z][u][r] = first ? _mm512_setzero_ps()
                                  : qoz_join(_mm256_loadu_ps(lo), _mm256_loadu_ps(lo + 3 * QO_LANES));
        }
  const float* ap[2] = {a[0], a[ma - 1]};
  const float* pp[2] = {p[0], p[nb - 1]};
  for (int64_t s = 0; s < steps; ++s) {
    __m512 x[2][2];
    for (int q = 0; q < ma; ++q)
      for (int z = 0; z < 2; ++z) x[q][z] = _mm512_loadu_ps(ap[q] + s * 32 + 16 * z);
    for (int u = 0; u < nb; ++u)
      for (int r = 0; r < 3; ++r) {
        const __m512 wv = _mm512_broadcast_f32x8(_mm256_loadu_ps(pp[u] + s * 24 + 8 * r));
        for (int q = 0; q < ma; ++q)
          for (int z = 0; z < 2; ++z) acc[q][z][u][r] = _mm512_fmadd_ps(x[q][z], wv, acc[q][z][u][r]);
      }
  }
  for (int q = 0; q < ma; ++q)
    for (int z = 0; z < 2; ++z)
      for (int u = 0; u < nb; ++u)
        for (int r = 0; r < 3; ++r) {
          float* lo = part[q][u] + ((2 * z) * 3 + r) * QO_LANES;
          _mm256_storeu_ps(lo, _mm512_castps512_ps256(acc[q][z][u][r]));
          _mm256_storeu_ps(lo + 3 * QO_LANES, _mm512_extractf32x8_ps(acc[q][z][u][r], 1));
        }
}

static void qoz_tile_2x2(const float* const a[2], const float* const p[2], int64_t steps, float* const part[2][2],
                         int first) {
  qoz_tile(2, 2, a, p, steps, part, first);
}
static void qoz_tile_2x1(const float* const a[2], const float* const p[2], int64_t steps, float* const part[2][2],
                         int first) {
  qoz_tile(2, 1, a, p, steps, part, first);
}
static void qoz_tile_1x2(const float* const a[2], const float* const p[2], int64_t steps, float* const part[2][2],
                         int first) {
  qoz_tile(1, 2, a, p, steps, part, first);
}
static void qoz_tile_1x1(const float* const a[2], const float* const p[2], int64_t steps, float* const part[2][2],
                         int first) {
  qoz_tile(1, 1, a, p, steps, part, first);
}

/* One K block of the panel task (see avx_panel_task): micro-panels [mb/4, mb/4 + mtiles) x groups [0, ntiles). */
static void qoz_panel_block(const float* a_pack, const float* panel, float* part, int64_t mb, int64_t mtiles,
                            int64_t ntiles, int64_t kc, int64_t n_steps, int64_t steps) {
  for (int64_t ti = 0; ti < mtiles; ti += 2) {
    const int ma = mtiles - ti >= 2 ? 2 : 1;
    const float* a[2] = {a_pack + ((mb / 4 + ti) * steps + kc) * 32, a_pack + ((mb / 4 + ti + ma - 1) * steps + kc) * 32};
    for (int64_t u = 0; u < ntiles; u += 2) {
      const int nb = ntiles - u >= 2 ? 2 : 1;
      const float* p[2] = {panel + (u * steps + kc) * 24, panel + ((u + nb - 1) * steps + kc) * 24};
      float* const pt[2][2] = {{part + (ti * ntiles + u) * 96, part + (ti * ntiles + u + nb - 1) * 96},
                               {part + ((ti + ma - 1) * ntiles + u) * 96, part + ((ti + ma - 1) * ntiles + u + nb - 1) * 96}};
      if (ma == 2)
        (nb == 2 ? qoz_tile_2x2 : qoz_tile_2x1)(a, p, n_steps, pt, kc == 0);
      else
        (nb == 2 ? qoz_tile_1x2 : qoz_tile_1x1)(a, p, n_steps, pt, kc == 0);
    }
  }
}

/* mxi_block with AVX-512: the same decisions and q (the max by the integer order of |a|'s bits, NaN / inf by its
 * exponent field, then the same multiplications, truncating conversions and comparisons, 16 elements at a time):
 * about 15 scalar operations per element were about 2 % of a 4096 x 4096 GEMV, serial before the threads start. */
static int mxi_block_z(const float* a, int8_t q[QO_MXFP4_BLOCK], int32_t* eb) {
  const __m512 a0 = _mm512_loadu_ps(a), a1 = _mm512_loadu_ps(a + 16);
  const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF);
  const __m512i mx = _mm512_max_epu32(_mm512_and_si512(_mm512_castps_si512(a0), abs_mask),
                                      _mm512_and_si512(_mm512_castps_si512(a1), abs_mask));
  const uint32_t amax = (uint32_t)_mm512_reduce_max_epu32(mx);
  if (amax >= 0x7F800000u) return 0; /* inf, NaN */
  if (amax == 0) {
    memset(q, 0, QO_MXFP4_BLOCK);
    *eb = 0;
    return 1;
  }
  if (!(amax >> 23)) return 0; /* a subnormal max: ilogbf < -126, so e < -QO_MXI_E_LIMIT */
  const int e = (int)(amax >> 23) - 127 - QO_MXI_AMAX_SHIFT;
  if (e < -QO_MXI_E_LIMIT || e > QO_MXI_E_LIMIT) return 0;
  const __m512 down = _mm512_set1_ps(qo_bits_to_f32((uint32_t)(127 - e) << 23));
  const __m512 up = _mm512_set1_ps(qo_bits_to_f32((uint32_t)(127 + e) << 23));
  const __m512i i0 = _mm512_cvttps_epi32(_mm512_mul_ps(a0, down)), i1 = _mm512_cvttps_epi32(_mm512_mul_ps(a1, down));
  if (_mm512_cmp_ps_mask(_mm512_mul_ps(_mm512_cvtepi32_ps(i0), up), a0, _CMP_NEQ_UQ) |
      _mm512_cmp_ps_mask(_mm512_mul_ps(_mm512_cvtepi32_ps(i1), up), a1, _CMP_NEQ_UQ))
    return 0;
  _mm_storeu_si128((__m128i*)q, _mm512_cvtepi32_epi8(i0));
  _mm_storeu_si128((__m128i*)(q + 16), _mm512_cvtepi32_epi8(i1));
  *eb = e - 1;
  return 2;
}

/* MXFP4 block-integer tile (see mxi_prepare), AVX-512: mr prepared A rows x nr weight rows, out[i * nr + r]; one
 * zmm per (A row, weight row) holds the 16 lanes, one chunk (64 weight bytes, 4 blocks) per step; the last chunk's
 * missing blocks are masked to weight code 0 against A 0 and scale code 0 (their steps add +0). The quad sums by
 * vpdpbusd (vnni, qoz_mxi_dot_vnni) or vpmaddubsw + vpmaddwd: the same integers. */
static inline QOZ_VNNI __m512i qoz_mxi_dot_vnni(__m512i P, __m512i wlo, __m512i whi, const qo_mxi_chunk* x) {
  P = _mm512_dpbusd_epi32(P, wlo, _mm512_loadu_si512((const void*)x->even));
  return _mm512_dpbusd_epi32(P, whi, _mm512_loadu_si512((const void*)x->odd));
}

/* One chunk c of the tile: full (4 blocks) or the last one with `left` < 4 blocks (masked). */
QO_INLINE void qoz_mxi_step(const int mr, const int nr, const int vnni, const int64_t left, const qo_mxi_chunk* const* x,
                            const uint8_t* const* rows, const uint8_t* const* srows, int64_t c, __m512 acc[4][8]) {
  const __m512i m4 = _mm512_set1_epi8(0x0F), ones = _mm512_set1_epi16(1);
  const __m512i table = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
  const __m512i spread = _mm512_setr_epi32(-256, -256, -256, -256, -255, -255, -255, -255, /* dword 4k+j <- byte k */
                                           -254, -254, -254, -254, -253, -253, -253, -253);
#pragma GCC unroll 8
  for (int r = 0; r < nr; ++r) {
    int32_t s4 = 0;
    __m512i wx;
    if (left >= 4) {
      memcpy(&s4, srows[r] + 4 * c, 4);
      wx = _mm512_loadu_si512((const void*)(rows[r] + 64 * c));
    } else {
      for (int64_t b = 0; b < left; ++b) s4 |= (int32_t)srows[r][4 * c + b] << (8 * b);
      wx = _mm512_maskz_loadu_epi8((__mmask64)((1ULL << (16 * left)) - 1), rows[r] + 64 * c);
    }
    const __m512i wlo = _mm512_shuffle_epi8(table, _mm512_and_si512(wx, m4));
    const __m512i whi = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(wx, 4), m4));
    const __m512i ew = _mm512_shuffle_epi8(_mm512_set1_epi32(s4), spread);
#pragma GCC unroll 4
    for (int i = 0; i < mr; ++i) {
      const qo_mxi_chunk* xc = x[i] + c;
      const __m512i P0 = _mm512_loadu_si512((const void*)xc->corr);
      __m512i P;
      if (vnni) {
        P = qoz_mxi_dot_vnni(P0, wlo, whi, xc);
      } else {
        const __m512i t = _mm512_add_epi16(_mm512_maddubs_epi16(wlo, _mm512_loadu_si512((const void*)xc->even)),
                                           _mm512_maddubs_epi16(whi, _mm512_loadu_si512((const void*)xc->odd)));
        P = _mm512_add_epi32(_mm512_madd_epi16(t, ones), P0);
      }
      const __m512i sc = _mm512_slli_epi32(_mm512_add_epi32(ew, _mm512_loadu_si512((const void*)xc->eb)), 23);
      acc[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(P), _mm512_castsi512_ps(sc), acc[i][r]);
    }
  }
}

QO_INLINE void qoz_mxi_tile(const int mr, const int nr, const int vnni, const qo_mxi_chunk* const* x,
                            const uint8_t* const* rows, const uint8_t* const* srows, int64_t nb, float* out) {
  __m512 acc[4][8];
#pragma GCC unroll 4
  for (int i = 0; i < mr; ++i)
#pragma GCC unroll 8
    for (int r = 0; r < nr; ++r) acc[i][r] = _mm512_setzero_ps();
  const int64_t full = nb / 4;
  for (int64_t c = 0; c < full; ++c) {
    if (QO_GEMV_PF) {
      const int64_t ahead = qo_pf_ahead(64 * c, 16 * nb, nr);
#pragma GCC unroll 8
      for (int r = 0; r < nr; ++r) _mm_prefetch((const char*)rows[r] + ahead, _MM_HINT_T0);
    }
    qoz_mxi_step(mr, nr, vnni, 4, x, rows, srows, c, acc);
  }
  if (nb % 4) qoz_mxi_step(mr, nr, vnni, nb % 4, x, rows, srows, full, acc);
#pragma GCC unroll 4
  for (int i = 0; i < mr; ++i)
#pragma GCC unroll 8
    for (int r = 0; r < nr; ++r)
      out[i * nr + r] = avx_fold_scale(_mm256_add_ps(_mm512_castps512_ps256(acc[i][r]),
                                                     _mm512_extractf32x8_ps(acc[i][r], 1)), 1.0f);
}

/* MXFP4 block-integer prefill (M > 4), AVX-512: 16 weight rows decoded once into a panel whose zmm lanes are the
 * rows (per block b: wa[j] = dword per row of 2 * e2m1 + 12 of elements 8j, 8j+2, 8j+4, 8j+6, wb[j] of 8j+1, ..,
 * 8j+7: the prepared A's even / odd dword j; ew = the rows' e8m0 codes), then per A row 16 zmm accumulators, one
 * per lane L = 4 * (b % 4) + j of the order above, each holding that lane of the 16 rows' outputs: the A dwords are
 * broadcast, and the 16-lane fold becomes 15 vertical additions. Rows past the weight's end hold code 12 (P = 0). */
typedef struct {
  int32_t wa[4][16];
  int32_t wb[4][16];
  int32_t ew[16];
} qo_mxi_pblock;

/* 16 rows' 16-byte blocks b: 4 rows per zmm (one per 128-bit lane), each nibble decoded by one vpshufb, then the
 * 16 x 4 dwords transposed to 4 x 16 (in-lane unpacks: lane i, element t holds row 4t + i; one vpermd puts row r at
 * r). Measured (gpt-oss-20b MXFP4 slice, 128-token prompt, 2 threads): the scalar extracts it replaced took about
 * 80 ms of the experts' 285. Rows past the weight's end read zero bytes, whose code 0 decodes to 12: P = 0. */
static const uint8_t qoz_mxi_zero_block[16] __attribute__((aligned(16))) = {0};

QO_INLINE void qoz_mxi_transpose_store(const __m512i v[4], const __m512i perm, int32_t dst[4][16]) {
  const __m512i t0 = _mm512_unpacklo_epi32(v[0], v[1]), t1 = _mm512_unpackhi_epi32(v[0], v[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(v[2], v[3]), t3 = _mm512_unpackhi_epi32(v[2], v[3]);
  _mm512_storeu_si512((void*)dst[0], _mm512_permutexvar_epi32(perm, _mm512_unpacklo_epi64(t0, t2)));
  _mm512_storeu_si512((void*)dst[1], _mm512_permutexvar_epi32(perm, _mm512_unpackhi_epi64(t0, t2)));
  _mm512_storeu_si512((void*)dst[2], _mm512_permutexvar_epi32(perm, _mm512_unpacklo_epi64(t1, t3)));
  _mm512_storeu_si512((void*)dst[3], _mm512_permutexvar_epi32(perm, _mm512_unpackhi_epi64(t1, t3)));
}

static void qoz_mxi_decode16(const qo_weight* w, int64_t n, int rows, int64_t nb, qo_mxi_pblock* out) {
  const __m512i table = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i perm = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const uint8_t* row[16];
  int64_t step[16];
  for (int r = 0; r < 16; ++r) {
    row[r] = r < rows ? w->data + (n + r) * w->row_bytes : qoz_mxi_zero_block;
    step[r] = r < rows ? 16 : 0;
  }
  for (int64_t b = 0; b < nb; ++b) {
    __m512i lo[4], hi[4];
    for (int k = 0; k < 4; ++k) {
      const uint8_t* const* rk = row + 4 * k;
      const int64_t* sk = step + 4 * k;
      __m512i z = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i*)(rk[0] + sk[0] * b)));
      z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i*)(rk[1] + sk[1] * b)), 1);
      z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i*)(rk[2] + sk[2] * b)), 2);
      z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i*)(rk[3] + sk[3] * b)), 3);
      lo[k] = _mm512_shuffle_epi8(table, _mm512_and_si512(z, m4));
      hi[k] = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(z, 4), m4));
    }
    qo_mxi_pblock* pb = out + b;
    qoz_mxi_transpose_store(lo, perm, pb->wa);
    qoz_mxi_transpose_store(hi, perm, pb->wb);
  }
  for (int r = 0; r < 16; ++r) { /* the e8m0 codes, row by row (0 past the end) */
    const uint8_t* srow = r < rows ? w->scales + (n + r) * w->scales_per_row : NULL;
    for (int64_t b = 0; b < nb; ++b) out[b].ew[r] = srow ? srow[b] : 0;
  }
}

static inline QOZ_VNNI __m512i qoz_mxi_quad_vnni(__m512i P, const qo_mxi_pblock* pb, int j, int32_t ev, int32_t od) {
  P = _mm512_dpbusd_epi32(P, _mm512_loadu_si512((const void*)pb->wa[j]), _mm512_set1_epi32(ev));
  return _mm512_dpbusd_epi32(P, _mm512_loadu_si512((const void*)pb->wb[j]), _mm512_set1_epi32(od));
}

/* One A row against a 16-row panel, chunks [c0, c1) (a K slice that stays in L1): the 16 accumulators start at
 * zero (first) or from part[256], and end in part or (last chunk) folded into out[r], r < 16. */
QO_INLINE void qoz_mxi_panel_row(const int vnni, const qo_mxi_chunk* x, const qo_mxi_pblock* panel, int64_t nb,
                                 int64_t c0, int64_t c1, float* part, int first, float* out) {
  __m512 acc[16];
  for (int L = 0; L < 16; ++L) acc[L] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(part + 16 * L);
  const __m512i ones = _mm512_set1_epi16(1);
  for (int64_t c = c0; c < c1; ++c) {
    const qo_mxi_chunk* xc = x + c;
    for (int bb = 0; bb < 4; ++bb) {
      if (4 * c + bb >= nb) break;
      const qo_mxi_pblock* pb = panel + 4 * c + bb;
      const __m512 sc = _mm512_castsi512_ps(_mm512_slli_epi32(
          _mm512_add_epi32(_mm512_loadu_si512((const void*)pb->ew), _mm512_set1_epi32(xc->eb[4 * bb])), 23));
      for (int j = 0; j < 4; ++j) {
        int32_t ev, od;
        memcpy(&ev, xc->even + 16 * bb + 4 * j, 4);
        memcpy(&od, xc->odd + 16 * bb + 4 * j, 4);
        const __m512i P0 = _mm512_set1_epi32(xc->corr[4 * bb + j]);
        __m512i P;
        if (vnni) {
          P = qoz_mxi_quad_vnni(P0, pb, j, ev, od);
        } else {
          const __m512i t = _mm512_add_epi16(
              _mm512_maddubs_epi16(_mm512_loadu_si512((const void*)pb->wa[j]), _mm512_set1_epi32(ev)),
              _mm512_maddubs_epi16(_mm512_loadu_si512((const void*)pb->wb[j]), _mm512_set1_epi32(od)));
          P = _mm512_add_epi32(_mm512_madd_epi16(t, ones), P0);
        }
        acc[4 * bb + j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(P), sc, acc[4 * bb + j]);
      }
    }
  }
  if (!out) {
    for (int L = 0; L < 16; ++L) _mm512_storeu_ps(part + 16 * L, acc[L]);
    return;
  }
  __m512 s[8];
  for (int i = 0; i < 8; ++i) s[i] = _mm512_add_ps(acc[i], acc[i + 8]);
  _mm512_storeu_ps(out, _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(s[0], s[4]), _mm512_add_ps(s[2], s[6])),
                                      _mm512_add_ps(_mm512_add_ps(s[1], s[5]), _mm512_add_ps(s[3], s[7]))));
}

/* count A rows x[i] (partial sums part + 256 i, outputs out + 16 i on the last slice) over chunks [c0, c1). */
#define QOZ_MXI_PANEL_ROWS(vnni)                                                                                  \
  for (int i = 0; i < count; ++i)                                                                                 \
    qoz_mxi_panel_row(vnni, x[i], panel, nb, c0, c1, part + 256 * i, c0 == 0, last ? out + 16 * i : NULL);
static void qoz_mxi_panel_rows(const qo_mxi_chunk* const* x, int count, const qo_mxi_pblock* panel, int64_t nb,
                               int64_t c0, int64_t c1, float* part, int last, float* out) {
  QOZ_MXI_PANEL_ROWS(0)
}
static QOZ_VNNI __attribute__((flatten)) void qoz_mxi_panel_rows_vnni(const qo_mxi_chunk* const* x, int count,
                                                                      const qo_mxi_pblock* panel, int64_t nb,
                                                                      int64_t c0, int64_t c1, float* part, int last,
                                                                      float* out) {
  QOZ_MXI_PANEL_ROWS(1)
}
#undef QOZ_MXI_PANEL_ROWS

/* The tiles the MXFP4 integer driver asks for (mxi_nr): nr = 8 / 4 / 4 / 2 for mr = 1 / 2 / 3 / 4, and nr = 1. */
#define QOZ_MXI_TILES(vnni)                                                                                       \
  switch (mr * 16 + nr) {                                                                                         \
    case 0x18: qoz_mxi_tile(1, 8, vnni, x, rows, srows, nb, out); break;                                          \
    case 0x24: qoz_mxi_tile(2, 4, vnni, x, rows, srows, nb, out); break;                                          \
    case 0x34: qoz_mxi_tile(3, 4, vnni, x, rows, srows, nb, out); break;                                          \
    case 0x42: qoz_mxi_tile(4, 2, vnni, x, rows, srows, nb, out); break;                                          \
    case 0x11: qoz_mxi_tile(1, 1, vnni, x, rows, srows, nb, out); break;                                          \
    case 0x21: qoz_mxi_tile(2, 1, vnni, x, rows, srows, nb, out); break;                                          \
    case 0x31: qoz_mxi_tile(3, 1, vnni, x, rows, srows, nb, out); break;                                          \
    default: qoz_mxi_tile(4, 1, vnni, x, rows, srows, nb, out); break;                                            \
  }
static void qoz_mxi_tiles(int mr, int nr, const qo_mxi_chunk* const* x, const uint8_t* const* rows,
                          const uint8_t* const* srows, int64_t nb, float* out) {
  QOZ_MXI_TILES(0)
}
static QOZ_VNNI __attribute__((flatten)) void qoz_mxi_tiles_vnni(int mr, int nr, const qo_mxi_chunk* const* x,
                                                                 const uint8_t* const* rows,
                                                                 const uint8_t* const* srows, int64_t nb, float* out) {
  QOZ_MXI_TILES(1)
}
#undef QOZ_MXI_TILES

QO_TARGET_END

QO_TARGET_BEGIN("avx2,fma,f16c")


static void avx_panel_task(qo_job* job, int64_t n0, int64_t n1) {
  const int64_t K = job->K, K8 = K & ~(int64_t)(QO_LANES - 1), steps = K8 / QO_LANES, M = job->M, N = job->N;
  const int64_t rows = n1 - n0, ntiles = (rows + 2) / 3;
  const int t = (int)(K - K8);
  float* panel = qo_tls_grow(&tls_panel, &tls_panel_floats, (size_t)(ntiles * steps * 24 + 3 * ntiles * QO_LANES + 16));
  float* part = qo_tls_grow(&tls_part, &tls_part_floats, (size_t)(QO_PANEL_MB / 4 * ntiles * 96 + 16));
  if (!panel || !part) {
    job->failed = 1;
    return;
  }
  panel = qo_align64(panel);
  part = qo_align64(part);
  float* tail = panel + ntiles * steps * 24;
  avx_decode_by_format[job->w->fmt](job->w, n0, rows, K, panel, tail);
  static const float zeros[QO_LANES] = {0};
  const int64_t kc_steps = QO_PANEL_KC / QO_LANES;
  for (int64_t mb = 0; mb < M; mb += QO_PANEL_MB) {
    const int64_t mcount = M - mb < QO_PANEL_MB ? M - mb : QO_PANEL_MB, mtiles = (mcount + 3) / 4;
    for (int64_t kc = 0; kc < steps; kc += kc_steps) {
      const int64_t n_steps = steps - kc < kc_steps ? steps - kc : kc_steps;
      if (job->isa == QO_ISA_AVX512) {
        qoz_panel_block(job->a_pack, panel, part, mb, mtiles, ntiles, kc, n_steps, steps);
        continue;
      }
#ifdef QO_PANEL_N_OUTER
      for (int64_t u = 0; u < ntiles; ++u)
        for (int64_t ti = 0; ti < mtiles; ++ti)
          avx_tile_4x3(job->a_pack + ((mb / 4 + ti) * steps + kc) * 32, panel + (u * steps + kc) * 24, n_steps,
                       part + (ti * ntiles + u) * 96, kc == 0);
#else
      for (int64_t ti = 0; ti < mtiles; ++ti) {
        const float* a = job->a_pack + ((mb / 4 + ti) * steps + kc) * 32;
        for (int64_t u = 0; u < ntiles; ++u)
          avx_tile_4x3(a, panel + (u * steps + kc) * 24, n_steps, part + (ti * ntiles + u) * 96, kc == 0);
      }
#endif
    }
    if (t == 0) {
      for (int64_t i = 0; i < mcount; ++i)
        for (int64_t r = 0; r < rows; ++r) {
          const __m256 lanes = _mm256_loadu_ps(part + ((i / 4) * ntiles + r / 3) * 96 + ((i % 4) * 3 + r % 3) * 8);
          job->Y[(mb + i) * N + n0 + r] = avx_fold_scale(lanes, out_scale(job, mb + i, n0 + r));
        }
      continue;
    }
    for (int64_t i = 0; i < mcount; ++i)
      for (int64_t r = 0; r < rows; ++r) {
        const float* lanes = K8 ? part + ((i / 4) * ntiles + r / 3) * 96 + ((i % 4) * 3 + r % 3) * QO_LANES : zeros;
        const int64_t m = mb + i;
        job->Y[m * N + n0 + r] = finish(lanes, job->A + m * K + K8, tail + r * QO_LANES, t, out_scale(job, m, n0 + r));
      }
  }
}

/* A [M, K] into 4-row micro-panels: tile ti, step s, row i: 8 floats at ((ti * steps + s) * 4 + i) * 8 (zero rows
 * pad the last tile; the K % 8 tail is read from A itself). */
static void pack_a(const float* A, int64_t M, int64_t K, float* out) {
  const int64_t steps = K / QO_LANES, mtiles = (M + 3) / 4;
  for (int64_t ti = 0; ti < mtiles; ++ti)
    for (int i = 0; i < 4; ++i) {
      const int64_t m = ti * 4 + i;
      float* dst = out + ti * steps * 32 + i * 8;
      for (int64_t s = 0; s < steps; ++s)
        _mm256_storeu_ps(dst + s * 32, m < M ? _mm256_loadu_ps(A + m * K + s * 8) : _mm256_setzero_ps());
    }
}

QO_TARGET_END
#endif /* QO_X86_AVX2 */

/* ---------------- dispatch and the parallel loop ---------------- */
/* The widest path this CPU runs, lowered by QO_CPU_KERNELS=portable | avx2 | avx512 (qo_cpu_simd.h; tests and
 * benchmarks compare the paths bit for bit; a path the CPU lacks is never picked). */
int qo_cpu_isa(void) {
#if QO_X86_AVX2
  static int supported = -1;
  if (supported < 0) {
    __builtin_cpu_init();
#if defined(__clang__) && __clang_major__ < 16
    /* clang 14's __builtin_cpu_supports has no "f16c" (every AVX2 CPU has F16C) */
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#endif
    const int avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    supported = avx512 ? QO_ISA_AVX512 : avx2 ? QO_ISA_AVX2 : QO_ISA_PORTABLE;
  }
  int isa = supported;
  const char* force = getenv("QO_CPU_KERNELS");
  if (force && strcmp(force, "portable") == 0) isa = QO_ISA_PORTABLE;
  if (force && strcmp(force, "avx2") == 0 && isa > QO_ISA_AVX2) isa = QO_ISA_AVX2;
  if (_mm_getcsr() & 0x0040) return QO_ISA_PORTABLE; /* DAZ set: the fp16 route of the e4m3 decode might flush */
  return isa;
#else
  return QO_ISA_PORTABLE;
#endif
}

/* The AVX-512 extensions some paths add (qo_cpu_simd.h): AVX512_VBMI (the FP4 / FP8 / INT8 GEMVs' permute decode),
 * AVX512_VNNI (vpdpbusd: the MXFP4 integer path, qo_cpu_int8_w8a8.c). QO_CPU_KERNELS=avx512-novbmi turns both off
 * (tests: an AVX-512 F/BW/VL/DQ-only CPU, a Skylake-X, whose paths give the same bits). */
int qo_cpu_avx512_ext(int ext) {
#if QO_X86_AVX2
  static int supported[2] = {-1, -1};
  if (supported[0] < 0) {
    __builtin_cpu_init();
    supported[QO_EXT_VNNI] = __builtin_cpu_supports("avx512vnni");
    supported[QO_EXT_VBMI] = __builtin_cpu_supports("avx512vbmi"); /* written last: the flag the check reads */
  }
  const char* force = getenv("QO_CPU_KERNELS");
  return (ext == QO_EXT_VBMI || ext == QO_EXT_VNNI) && supported[ext] &&
         !(force && strcmp(force, "avx512-novbmi") == 0);
#else
  (void)ext;
  return 0;
#endif
}
#define qo_cpu_vbmi() qo_cpu_avx512_ext(QO_EXT_VBMI)
#define qo_cpu_vnni() qo_cpu_avx512_ext(QO_EXT_VNNI)

static void rows_task(qo_job* job, int64_t n0, int64_t n1);

/* Weight rows per integer tile for mr A rows (the tiles avx_mxi_tiles / qoz_mxi_tiles have; 1 on the portable path). */
static int mxi_nr(int isa, int mr) {
  if (isa == QO_ISA_AVX512) return mr == 1 ? 8 : mr == 4 ? 2 : 4;
  if (isa == QO_ISA_AVX2) return mr <= 2 ? 2 : 1;
  return 1;
}

#define QO_MXI_ROWS 64 /* weight rows whose e8m0 range is taken at once */
#define QO_MXI_PANEL_MB 32 /* prefill: A rows per pass over a 16-row panel (their partial sums: 32 KB) */
#define QO_MXI_PANEL_KC 8  /* prefill: chunks (32 blocks: 18 KB of panel) per K slice */
#define QO_MXI_PANEL_MIN_M 12 /* AVX-512: above this many A rows the panels (decoded per 16 weight rows), else tiles */
static QO_THREAD_LOCAL float* tls_mxi_panel = NULL;
static QO_THREAD_LOCAL size_t tls_mxi_panel_floats = 0;

/* MXFP4 weight rows [n0, n1) with job->mxi prepared: the rows of A off the grid through the float path one at a
 * time (its bits do not depend on M), the others in groups of up to 4 through the integer tiles; a pair that fails
 * mxi_pair_ok gets the float path's output. */
static void mxi_rows(qo_job* job, int64_t n0, int64_t n1) {
  const int64_t M = job->M, N = job->N, K = job->K, nb = K / QO_MXFP4_BLOCK;
  const qo_weight* w = job->w;
  const qo_mxi_row* hdr = mxi_rows_of(job->mxi);
  qo_job one = *job; /* one output row (or pair) through the float path */
  one.M = 1;
  one.mxi = NULL;
  one.a_pack = NULL;
  for (int64_t m = 0; m < M; ++m)
    if (!hdr[m].ok) {
      one.A = job->A + m * K;
      one.Y = job->Y + m * N;
      rows_task(&one, n0, n1);
    }
  const int isa = job->isa;
#if QO_X86_AVX2
  const int vnni = isa == QO_ISA_AVX512 && qo_cpu_vnni();
#endif
  int smin[QO_MXI_ROWS], smax[QO_MXI_ROWS];
  for (int64_t nb0 = n0; nb0 < n1; nb0 += QO_MXI_ROWS) {
    const int64_t nb1 = nb0 + QO_MXI_ROWS < n1 ? nb0 + QO_MXI_ROWS : n1;
    for (int64_t n = nb0; n < nb1; ++n) mxi_scale_range(w->scales + n * w->scales_per_row, nb, &smin[n - nb0], &smax[n - nb0]);
#if QO_X86_AVX2
    if (isa == QO_ISA_AVX512 && M > QO_MXI_PANEL_MIN_M) { /* prefill: 16-row panels (qoz_mxi_panel_row) */
      const int64_t C = mxi_chunks(K);
      const size_t panel_floats = (size_t)(4 * C) * sizeof(qo_mxi_pblock) / sizeof(float);
      float* buffer = qo_tls_grow(&tls_mxi_panel, &tls_mxi_panel_floats, panel_floats + 256 * QO_MXI_PANEL_MB);
      qo_mxi_pblock* panel = (qo_mxi_pblock*)buffer;
      float* part = buffer + panel_floats;
      if (!buffer) {
        job->failed = 1;
        return;
      }
      for (int64_t n = nb0; n < nb1; n += 16) {
        const int rows = nb1 - n < 16 ? (int)(nb1 - n) : 16;
        qoz_mxi_decode16(w, n, rows, nb, panel);
        for (int64_t m = 0; m < M;) {
          int64_t on[QO_MXI_PANEL_MB];
          const qo_mxi_chunk* x[QO_MXI_PANEL_MB];
          float out[16 * QO_MXI_PANEL_MB];
          int count = 0;
          for (; m < M && count < QO_MXI_PANEL_MB; ++m)
            if (hdr[m].ok) {
              x[count] = mxi_chunks_of(job->mxi, M, K, m);
              on[count++] = m;
            }
          for (int64_t c0 = 0; c0 < C; c0 += QO_MXI_PANEL_KC) {
            const int64_t c1 = c0 + QO_MXI_PANEL_KC < C ? c0 + QO_MXI_PANEL_KC : C;
            (vnni ? qoz_mxi_panel_rows_vnni : qoz_mxi_panel_rows)(x, count, panel, nb, c0, c1, part, c1 == C, out);
          }
          for (int i = 0; i < count; ++i)
            for (int r = 0; r < rows; ++r) {
              if (mxi_pair_ok(&hdr[on[i]], smin[n + r - nb0], smax[n + r - nb0])) {
                job->Y[on[i] * N + n + r] = out[16 * i + r];
              } else {
                one.A = job->A + on[i] * K;
                one.Y = job->Y + on[i] * N;
                portable_task(&one, n + r, n + r + 1);
              }
            }
        }
      }
      continue;
    }
#endif
    int64_t m = 0;
    while (m < M) {
      int64_t on[4];
      int mr = 0;
      for (; m < M && mr < 4; ++m)
        if (hdr[m].ok) on[mr++] = m;
      if (!mr) break;
      const qo_mxi_chunk* x[4];
      for (int i = 0; i < mr; ++i) x[i] = mxi_chunks_of(job->mxi, M, K, on[i]);
      for (int64_t n = nb0; n < nb1;) {
        const int nr = nb1 - n >= mxi_nr(isa, mr) ? mxi_nr(isa, mr) : 1;
        const uint8_t* rows[8];
        const uint8_t* srows[8];
        float out[32];
        for (int r = 0; r < nr; ++r) {
          rows[r] = w->data + (n + r) * w->row_bytes;
          srows[r] = w->scales + (n + r) * w->scales_per_row;
        }
#if QO_X86_AVX2
        if (isa == QO_ISA_AVX512)
          (vnni ? qoz_mxi_tiles_vnni : qoz_mxi_tiles)(mr, nr, x, rows, srows, nb, out);
        else if (isa == QO_ISA_AVX2)
          avx_mxi_tiles(mr, nr, x, rows, srows, nb, out);
        else
#endif
          for (int i = 0; i < mr; ++i) out[i] = mxi_dot_portable(x[i], rows[0], srows[0], nb);
        for (int r = 0; r < nr; ++r)
          for (int i = 0; i < mr; ++i) {
            if (mxi_pair_ok(&hdr[on[i]], smin[n + r - nb0], smax[n + r - nb0])) {
              job->Y[on[i] * N + n + r] = out[i * nr + r];
            } else {
              one.A = job->A + on[i] * K;
              one.Y = job->Y + on[i] * N;
              portable_task(&one, n + r, n + r + 1);
            }
          }
        n += nr;
      }
    }
  }
  if (one.failed) job->failed = 1;
}

/* Weight rows [n0, n1) of a job: the one dispatch point (also qo_cpu_weight_rows_f32's). */
static void rows_task(qo_job* job, int64_t n0, int64_t n1) {
  if (job->mxi) {
    mxi_rows(job, n0, n1);
    return;
  }
#if QO_X86_AVX2
  if (job->isa != QO_ISA_PORTABLE) {
    if (job->M > QO_GEMV_MAX_M)
      avx_panel_task(job, n0, n1); /* the AVX-512 tiles are picked inside */
    else if (job->isa == QO_ISA_AVX512 && job->w->fmt == QO_W_MXFP4 && qo_cpu_vbmi())
      qoz_gemv_mxfp4_vbmi(job, n0, n1);
    else if (job->isa == QO_ISA_AVX512 && job->w->fmt == QO_W_NVFP4 && qo_cpu_vbmi())
      qoz_gemv_nvfp4_vbmi(job, n0, n1);
    else if (job->isa == QO_ISA_AVX512 && job->w->fmt == QO_W_FP8 && qo_cpu_vbmi())
      qoz_gemv_fp8_vbmi(job, n0, n1);
    else if (job->isa == QO_ISA_AVX512 && job->w->fmt == QO_W_INT8 && qo_cpu_vbmi())
      qoz_gemv_int8_vbmi(job, n0, n1);
    else if (job->isa == QO_ISA_AVX512)
      qoz_gemv_by_format[job->w->fmt](job, n0, n1);
    else
      avx_gemv_by_format[job->w->fmt](job, n0, n1);
    return;
  }
#endif
  portable_task(job, n0, n1);
}

static void gemm_task(void* data, size_t t) {
  qo_job* job = (qo_job*)data;
  const int64_t n0 = (int64_t)t * job->rows_per_task;
  rows_task(job, n0, n0 + job->rows_per_task < job->N ? n0 + job->rows_per_task : job->N);
}

static QO_THREAD_LOCAL const qo_parallel_runner* tls_runner = NULL;
static QO_THREAD_LOCAL int tls_fp8_nan_free = 0; /* qo_cpu_set_fp8_weight_nan_free */

void qo_cpu_set_parallel_runner(const qo_parallel_runner* runner) { tls_runner = runner; }

/* Without ORT's pool (the C ABI called directly: benchmarks, tests; ORT 1.16): OpenMP threads, each claiming tasks
 * from its own contiguous shard of [0, total) first and then from the others', as ORT's intra-op pool runs
 * KernelContext_ParallelFor (onnxruntime/core/common/threadpool.cc: ParallelForFixedBlockSizeScheduling, LoopCounter
 * and its home shards). Measured against schedule(dynamic, 1), which deals out neighbouring tasks to different
 * threads, with every call on another copy of the weight (benchmarks/gemv_bandwidth.py, 4096 x 4096, 2 threads, wall,
 * 2 runs, % of the plain read): uint4 g32 44-45 -> 48-50, NVFP4 33-34 -> 39-40, FP8 56-60 -> 63 (contiguous halves,
 * no stealing). */
static void qo_omp_for(qo_task_fn task, size_t total, void* data) {
#if defined(QO_HAVE_OMP_H) && (defined(__GNUC__) || defined(__clang__))
  int shards = omp_get_max_threads();
  if ((size_t)shards > total) shards = (int)total;
  typedef struct {
    int64_t next, end;
    char pad[64 - 2 * sizeof(int64_t)]; /* one cache line each */
  } shard_t;
  shard_t* sh = shards > 1 ? (shard_t*)malloc(sizeof(shard_t) * (size_t)shards) : NULL;
  if (sh) {
    for (int s = 0; s < shards; ++s) {
      sh[s].next = (int64_t)(total * (size_t)s / (size_t)shards);
      sh[s].end = (int64_t)(total * (size_t)(s + 1) / (size_t)shards);
    }
#pragma omp parallel num_threads(shards)
    {
      const int me = omp_get_thread_num();
      for (int i = 0; i < shards; ++i) { /* every thread visits every shard: all tasks run whatever the team size */
        shard_t* h = &sh[(me + i) % shards];
        for (int64_t t; (t = __atomic_fetch_add(&h->next, 1, __ATOMIC_RELAXED)) < h->end;) task(data, (size_t)t);
      }
    }
    free(sh);
    return;
  }
#endif
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < (int64_t)total; ++t) task(data, (size_t)t);
}

int qo_cpu_parallel_for(qo_task_fn task, size_t total, void* data) {
  const qo_parallel_runner* runner = tls_runner;
  if (runner) return runner->run(runner->context, task, total, data) != QO_OK ? QO_ERR_DEVICE : QO_OK;
  qo_omp_for(task, total, data);
  return QO_OK;
}

static int run_gemm(const float* A, int64_t M, int64_t N, int64_t K, const qo_weight* w, const float* row_scale,
                    const float* col_scale, int64_t col_scale_count, float* Y) {
  fp8_value_table();
  qo_job job = {A, M, N, K, w, row_scale, col_scale, col_scale_count, Y, QO_GEMV_ROWS, qo_cpu_isa(), NULL, 0};
  job.fp8_half = w->fmt == QO_W_FP8 && job.isa == QO_ISA_AVX2 && M <= QO_GEMV_MAX_M && fp8_half_range(A, M * K, K);
  job.fp8_nan_free = w->fmt == QO_W_FP8 && tls_fp8_nan_free;
  float* a_pack = NULL;
  uint8_t* mxi = NULL;
  if (w->fmt == QO_W_MXFP4) { /* A checked for the MXFP4 grid once (mxi_prepare) */
    mxi = (uint8_t*)malloc((size_t)mxi_bytes(M, K) + 64);
    if (!mxi) return QO_ERR_ALLOC;
    /* aligned, as its layout assumes (header padded to 64 bytes, 64-byte chunks) */
    uint8_t* mxi64 = qo_align64(mxi);
    if (mxi_prepare(A, M, K, mxi64)) job.mxi = mxi64;
  }
  if (M > QO_GEMV_MAX_M && job.mxi) job.rows_per_task = QO_PANEL_ROWS;
#if QO_X86_AVX2
  if (job.isa != QO_ISA_PORTABLE && M > QO_GEMV_MAX_M && !job.mxi) {
    job.rows_per_task = QO_PANEL_ROWS;
    a_pack = (float*)malloc(sizeof(float) * (size_t)((M + 3) / 4 * 4 * (K / QO_LANES) * QO_LANES + 16));
    if (!a_pack) return QO_ERR_ALLOC;
    job.a_pack = qo_align64(a_pack);
    pack_a(A, M, K, (float*)job.a_pack);
  }
#endif
  const int64_t tasks = (N + job.rows_per_task - 1) / job.rows_per_task;
  const qo_parallel_runner* runner = tls_runner;
  int status = QO_OK;
  if (runner) {
    status = runner->run(runner->context, gemm_task, (size_t)tasks, &job) != QO_OK ? QO_ERR_DEVICE : QO_OK;
  } else {
    qo_omp_for(gemm_task, (size_t)tasks, &job);
  }
  free(a_pack);
  free(mxi);
  if (status == QO_OK && job.failed) status = QO_ERR_ALLOC;
  return status;
}

/* ---------------- fp16 io, argument checks ---------------- */
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

int qo_cpu_through_f32(const uint16_t* A, uint16_t* Y, int64_t M, int64_t N, int64_t K, qo_f32_kernel_fn kernel,
                       const void* args) {
  float* a32 = f16_to_f32_buffer(A, M * K);
  float* y32 = (float*)malloc(sizeof(float) * (size_t)(M * N > 0 ? M * N : 1));
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

static int scale_count_ok(const float* scale, int64_t count, int64_t N) {
  return scale && (count == 1 || count == N);
}

/* The weights' descriptions. */
static void weight_plain(qo_weight* w, int fmt, const void* B, int64_t row_bytes) {
  w->fmt = fmt;
  w->data = (const uint8_t*)B;
  w->row_bytes = row_bytes;
  w->scales = NULL;
  w->scales_per_row = 0;
  w->block = 1;
}

static void weight_mxfp4(qo_weight* w, const uint8_t* B, const uint8_t* B_scale, int64_t K) {
  weight_plain(w, QO_W_MXFP4, B, K / 2);
  w->scales = B_scale;
  w->scales_per_row = K / QO_MXFP4_BLOCK;
  w->block = QO_MXFP4_BLOCK;
  w->lut_key = 0;
  for (int s = 0; s < 256; ++s) w->half_scale[s] = qo_e8m0_to_f32((uint8_t)s) * 0.5f; /* exact: powers of two */
}

static void weight_nvfp4(qo_weight* w, const uint8_t* B, const uint8_t* B_scale, float B_scale_2, int64_t K) {
  weight_plain(w, QO_W_NVFP4, B, K / 2);
  w->scales = B_scale;
  w->scales_per_row = K / QO_NVFP4_BLOCK;
  w->block = QO_NVFP4_BLOCK;
  w->lut_key = qo_f32_to_bits(B_scale_2);
  for (int c = 0; c < 256; ++c) w->half_scale[c] = (qo_e4m3fn_to_f32((uint8_t)c) * B_scale_2) * 0.5f;
}

/* ---------------- MXFP4 ---------------- */
int qo_matmul_mxfp4_f32(const float* A, const uint8_t* B, const uint8_t* B_scale, float* Y, int64_t M, int64_t N,
                        int64_t K) {
  if (!shape_ok(A, B, Y, M, N, K) || !B_scale || K % QO_MXFP4_BLOCK != 0) return QO_ERR_ARGUMENT;
  if (M == 0 || N == 0) return QO_OK;
  qo_weight w;
  weight_mxfp4(&w, B, B_scale, K);
  return run_gemm(A, M, N, K, &w, NULL, NULL, 1, Y);
}

typedef struct {
  const uint8_t* B;
  const void* B_scale;
  int64_t b_scale_count;
  const float* A_scale;
  float B_scale_2;
} qo_args;

static int mxfp4_f32_kernel(const float* A, float* Y, int64_t M, int64_t N, int64_t K, const void* args) {
  const qo_args* p = (const qo_args*)args;
  return qo_matmul_mxfp4_f32(A, p->B, (const uint8_t*)p->B_scale, Y, M, N, K);
}

int qo_matmul_mxfp4_f16(const uint16_t* A, const uint8_t* B, const uint8_t* B_scale, uint16_t* Y, int64_t M,
                        int64_t N, int64_t K) {
  if (!shape_ok(A, B, Y, M, N, K) || !B_scale || K % QO_MXFP4_BLOCK != 0) return QO_ERR_ARGUMENT;
  if (M == 0 || N == 0) return QO_OK;
  const qo_args args = {B, B_scale, 0, NULL, 0.0f};
  return qo_cpu_through_f32(A, Y, M, N, K, mxfp4_f32_kernel, &args);
}

/* ---------------- NVFP4 ---------------- */
int qo_matmul_nvfp4_f32(const float* A, const uint8_t* B, const uint8_t* B_scale, float B_scale_2, float* Y,
                        int64_t M, int64_t N, int64_t K) {
  if (!shape_ok(A, B, Y, M, N, K) || !B_scale || K % QO_NVFP4_BLOCK != 0) return QO_ERR_ARGUMENT;
  if (M == 0 || N == 0) return QO_OK;
  qo_weight w;
  weight_nvfp4(&w, B, B_scale, B_scale_2, K);
  return run_gemm(A, M, N, K, &w, NULL, NULL, 1, Y);
}

static int nvfp4_f32_kernel(const float* A, float* Y, int64_t M, int64_t N, int64_t K, const void* args) {
  const qo_args* p = (const qo_args*)args;
  return qo_matmul_nvfp4_f32(A, p->B, (const uint8_t*)p->B_scale, p->B_scale_2, Y, M, N, K);
}

int qo_matmul_nvfp4_f16(const uint16_t* A, const uint8_t* B, const uint8_t* B_scale, float B_scale_2, uint16_t* Y,
                        int64_t M, int64_t N, int64_t K) {
  if (!shape_ok(A, B, Y, M, N, K) || !B_scale || K % QO_NVFP4_BLOCK != 0) return QO_ERR_ARGUMENT;
  if (M == 0 || N == 0) return QO_OK;
  const qo_args args = {B, B_scale, 0, NULL, B_scale_2};
  return qo_cpu_through_f32(A, Y, M, N, K, nvfp4_f32_kernel, &args);
}

/* ---------------- FP8 and INT8 weight-only ---------------- */
static int scaled_weight_f32(int fmt, const float* A, const uint8_t* B, const float* B_scale, int64_t b_scale_count,
                             float* Y, int64_t M, int64_t N, int64_t K) {
  if (!shape_ok(A, B, Y, M, N, K) || !scale_count_ok(B_scale, b_scale_count, N)) return QO_ERR_ARGUMENT;
  if (M == 0 || N == 0) return QO_OK;
  qo_weight w;
  weight_plain(&w, fmt, B, K);
  return run_gemm(A, M, N, K, &w, NULL, B_scale, b_scale_count, Y);
}

static int fp8_weight_f32_kernel(const float* A, float* Y, int64_t M, int64_t N, int64_t K, const void* args) {
  const qo_args* p = (const qo_args*)args;
  return scaled_weight_f32(QO_W_FP8, A, p->B, (const float*)p->B_scale, p->b_scale_count, Y, M, N, K);
}

static int int8_weight_f32_kernel(const float* A, float* Y, int64_t M, int64_t N, int64_t K, const void* args) {
  const qo_args* p = (const qo_args*)args;
  return scaled_weight_f32(QO_W_INT8, A, p->B, (const float*)p->B_scale, p->b_scale_count, Y, M, N, K);
}

int qo_matmul_fp8_f32(const float* A, const uint8_t* B, const float* B_scale, int64_t b_scale_count, float* Y,
                      int64_t M, int64_t N, int64_t K) {
  return scaled_weight_f32(QO_W_FP8, A, B, B_scale, b_scale_count, Y, M, N, K);
}

int qo_matmul_fp8_f16(const uint16_t* A, const uint8_t* B, const float* B_scale, int64_t b_scale_count, uint16_t* Y,
                      int64_t M, int64_t N, int64_t K) {
  if (!shape_ok(A, B, Y, M, N, K) || !scale_count_ok(B_scale, b_scale_count, N)) return QO_ERR_ARGUMENT;
  if (M == 0 || N == 0) return QO_OK;
  const qo_args args = {B, B_scale, b_scale_count, NULL, 0.0f};
  return qo_cpu_through_f32(A, Y, M, N, K, fp8_weight_f32_kernel, &args);
}

int qo_matmul_int8_f32(const float* A, const int8_t* B, const float* B_scale, int64_t b_scale_count, float* Y,
                       int64_t M, int64_t N, int64_t K) {
  return scaled_weight_f32(QO_W_INT8, A, (const uint8_t*)B, B_scale, b_scale_count, Y, M, N, K);
}

int qo_matmul_int8_f16(const uint16_t* A, const int8_t* B, const float* B_scale, int64_t b_scale_count, uint16_t* Y,
                       int64_t M, int64_t N, int64_t K) {
  if (!shape_ok(A, B, Y, M, N, K) || !scale_count_ok(B_scale, b_scale_count, N)) return QO_ERR_ARGUMENT;
  if (M == 0 || N == 0) return QO_OK;
  const qo_args args = {(const uint8_t*)B, B_scale, b_scale_count, NULL, 0.0f};
  return qo_cpu_through_f32(A, Y, M, N, K, int8_weight_f32_kernel, &args);
}

/* ---------------- FP8 W8A8 ----------------
 * a_q[m][k] = e4m3fn value of sat(A[m][k] / scale_m), as float (exact). Quark's FP8 fake quantizer divides
 * (quark/torch/kernel/hw_emulation/hw_emulation_interface.py, fake_quantize_fp8_per_tensor_with_scale and
 * ..._per_channel_with_scale: `inputs / scale`, amd-quark 0.13); the x * fp32(1/s) form is Quark's INT8 quantizer
 * (torch.fake_quantize_per_tensor_affine), not its FP8 one, so this kernel divides. */
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
  if (!shape_ok(A, B, Y, M, N, K) || !scale_count_ok(B_scale, b_scale_count, N)) return QO_ERR_ARGUMENT;
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
    qo_weight w;
    weight_plain(&w, QO_W_FP8, B, K);
    status = run_gemm(a_q, M, N, K, &w, row_scale, B_scale, b_scale_count, Y);
  }
  free(a_q);
  free(row_scale);
  return status;
}

static int fp8_w8a8_f32_kernel(const float* A, float* Y, int64_t M, int64_t N, int64_t K, const void* args) {
  const qo_args* p = (const qo_args*)args;
  return fp8_w8a8_f32(A, p->B, (const float*)p->B_scale, p->b_scale_count, p->A_scale, Y, M, N, K);
}

static int fp8_w8a8_f16(const uint16_t* A, const uint8_t* B, const float* B_scale, int64_t b_scale_count,
                        const float* A_scale, uint16_t* Y, int64_t M, int64_t N, int64_t K) {
  if (!shape_ok(A, B, Y, M, N, K) || !scale_count_ok(B_scale, b_scale_count, N)) return QO_ERR_ARGUMENT;
  if (M == 0 || N == 0) return QO_OK;
  const qo_args args = {B, B_scale, b_scale_count, A_scale, 0.0f};
  return qo_cpu_through_f32(A, Y, M, N, K, fp8_w8a8_f32_kernel, &args);
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

/* ---------------- BF16 weight (lm_head=bf16) ---------------- */
int qo_matmul_bf16_f32(const float* A, const uint16_t* B, float* Y, int64_t M, int64_t N, int64_t K) {
  if (!shape_ok(A, B, Y, M, N, K)) return QO_ERR_ARGUMENT;
  if (M == 0 || N == 0) return QO_OK;
  qo_weight w;
  weight_plain(&w, QO_W_BF16, B, 2 * K);
  return run_gemm(A, M, N, K, &w, NULL, NULL, 1, Y);
}

static int bf16_f32_kernel(const float* A, float* Y, int64_t M, int64_t N, int64_t K, const void* args) {
  return qo_matmul_bf16_f32(A, (const uint16_t*)args, Y, M, N, K);
}

int qo_matmul_bf16_f16(const uint16_t* A, const uint16_t* B, uint16_t* Y, int64_t M, int64_t N, int64_t K) {
  if (!shape_ok(A, B, Y, M, N, K)) return QO_ERR_ARGUMENT;
  if (M == 0 || N == 0) return QO_OK;
  return qo_cpu_through_f32(A, Y, M, N, K, bf16_f32_kernel, B);
}

/* ---------------- one block of rows for the expert ops (qo_cpu_experts.c) ---------------- */
static QO_THREAD_LOCAL float* tls_apack = NULL;
static QO_THREAD_LOCAL size_t tls_apack_floats = 0;

static QO_THREAD_LOCAL float* tls_mxi = NULL;
static QO_THREAD_LOCAL size_t tls_mxi_floats = 0;

/* One block of weight rows on the calling thread, the gemm_task body with the caller's weight. MXFP4: prep is A
 * prepared by qo_cpu_mxfp4_prepare_a, or NULL (prepared here). */
static int weight_rows(int fmt, const float* A, const float* prep, int64_t M, int64_t N, int64_t K, const uint8_t* B,
                       const uint8_t* B_scale, float B_scale_2, const float* col_scale, int64_t col_scale_count,
                       int fp8_a_range, int fp8_nan_free, int64_t n0, int64_t n1, float* Y) {
  qo_weight w;
  switch (fmt) {
    case QO_FMT_FP8: weight_plain(&w, QO_W_FP8, B, K); break;
    case QO_FMT_INT8: weight_plain(&w, QO_W_INT8, B, K); break;
    case QO_FMT_MXFP4: weight_mxfp4(&w, B, B_scale, K); break;
    case QO_FMT_NVFP4: weight_nvfp4(&w, B, B_scale, B_scale_2, K); break;
    default: return QO_ERR_ARGUMENT;
  }
  fp8_value_table();
  qo_job job = {A, M, N, K, &w, NULL, col_scale, col_scale_count, Y, n1 - n0, qo_cpu_isa(), NULL, 0};
  job.fp8_half = fmt == QO_FMT_FP8 && job.isa == QO_ISA_AVX2 && M <= QO_GEMV_MAX_M &&
                 (fp8_a_range >= 0 ? fp8_a_range : fp8_half_range(A, M * K, K));
  job.fp8_nan_free = fmt == QO_FMT_FP8 && fp8_nan_free;
  if (fmt == QO_FMT_MXFP4) { /* A checked for the MXFP4 grid, as run_gemm does */
    if (!prep) {
      prep = qo_tls_grow(&tls_mxi, &tls_mxi_floats, (size_t)qo_cpu_mxfp4_prepared_floats(M, K));
      if (!prep) return QO_ERR_ALLOC;
      qo_cpu_mxfp4_prepare_a(A, M, K, (float*)prep);
    }
    for (int64_t m = 0; m < M && !job.mxi; ++m)
      if (mxi_rows_of((const uint8_t*)prep)[m].ok) job.mxi = (const uint8_t*)prep;
  }
#if QO_X86_AVX2
  if (job.isa != QO_ISA_PORTABLE && M > QO_GEMV_MAX_M && !job.mxi) { /* A packed as run_gemm packs it */
    float* pack = qo_tls_grow(&tls_apack, &tls_apack_floats, (size_t)((M + 3) / 4 * 4 * (K / QO_LANES) * QO_LANES + 16));
    if (!pack) return QO_ERR_ALLOC;
    job.a_pack = qo_align64(pack);
    pack_a(A, M, K, (float*)job.a_pack);
  }
#endif
  rows_task(&job, n0, n1);
  return job.failed ? QO_ERR_ALLOC : QO_OK;
}

int qo_cpu_weight_rows_f32(int fmt, const float* A, int64_t M, int64_t N, int64_t K, const uint8_t* B,
                           const uint8_t* B_scale, float B_scale_2, const float* col_scale, int64_t col_scale_count,
                           int fp8_a_range, int fp8_nan_free, int64_t n0, int64_t n1, float* Y) {
  return weight_rows(fmt, A, NULL, M, N, K, B, B_scale, B_scale_2, col_scale, col_scale_count, fp8_a_range,
                     fp8_nan_free, n0, n1, Y);
}

int qo_cpu_fp8_half_range(const float* A, int64_t count, int64_t K) { return fp8_half_range(A, count, K); }

int qo_cpu_fp8_codes_nan_free(const uint8_t* B, int64_t count) {
  uint8_t any = 0;
  for (int64_t i = 0; i < count; ++i) any |= (uint8_t)((B[i] & 0x7F) == 0x7F);
  return !any;
}

void qo_cpu_set_fp8_weight_nan_free(int nan_free) { tls_fp8_nan_free = nan_free != 0; }
int qo_cpu_fp8_weight_nan_free(void) { return tls_fp8_nan_free; }

/* ---------------- MXFP4: A prepared once for many blocks of weight rows (qo_cpu_experts.c) ---------------- */
int64_t qo_cpu_mxfp4_prepared_floats(int64_t M, int64_t K) { return (mxi_bytes(M, K) + 63) / 64 * 16; }

void qo_cpu_mxfp4_prepare_a(const float* A, int64_t M, int64_t K, float* prepared) {
  mxi_prepare(A, M, K, (uint8_t*)prepared);
}

int qo_cpu_mxfp4_rows_f32(const float* A, const float* prepared, int64_t M, int64_t N, int64_t K, const uint8_t* B,
                          const uint8_t* B_scale, int64_t n0, int64_t n1, float* Y) {
  return weight_rows(QO_FMT_MXFP4, A, prepared, M, N, K, B, B_scale, 0.0f, NULL, 1, -1, 0, n0, n1, Y);
}
