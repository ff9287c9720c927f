/* CPU kernel of com.quark_onnx GroupQueryAttentionFixedOrder: grouped-query attention with rotary embedding and a
 * KV cache, the inputs and semantics of com.microsoft GroupQueryAttention (separate q / k / v, do_rotary = 1,
 * rotary_interleaved = 0, no softcap, no sinks), but ONE summation order on every CPU: the same bits on the portable
 * path, AVX2 + FMA and AVX-512 machines, and for every thread count. ORT's CPU GroupQueryAttention sums the softmax
 * through MLAS in 16 lanes with AVX-512F and 8 with AVX2 (docs/real_model_numerics.md, "Which ORT ops differ by
 * instruction set"), so its logits differ between those CPUs (3.1e-5 on SmolLM2-135M); the explicit standard-op
 * subgraph that fixed that (builder/ops/fp8_attention.py) re-concatenates the whole cache every step.
 *
 * Semantics (what onnxruntime/contrib_ops/cpu/bert/gqa_attention_base.h and group_query_attention.cc do, read in
 * ORT's source): per batch b, total_b = seqlens_k[b] + 1; the past length is 0 on the first prompt
 * (S == total_sequence_length), else total_b - S; token s sits at position p = past_b + s, and its rotated key and
 * value are written to row p of present. Query s attends keys t in [lo, p], lo = max(0, p - local_window_size + 1)
 * when local_window_size > 0 (the window holds local_window_size keys, the query's own included: what ORT 1.32's
 * kernel computes, measured in tests/test_gqa_fixed_order_kernel.py, and transformers' sliding window), else 0. present's length is max(total_sequence_length, past's length); when present is not
 * past's buffer (no buffer sharing), rows [0, past_b) are copied from past and the rest are zero before the new rows.
 *
 * The arithmetic, float32 throughout (compiled with -ffp-contract=off; the SIMD path does the same operations):
 *   rotary (half split, R = cos_cache's width): o[i] = x[i] * c[i] - x[i + R] * s[i], o[i + R] = x[i + R] * c[i] +
 *       x[i] * s[i] (two roundings of the products, one of the sum); o[d] = x[d] for d >= 2R;
 *   score_t = dot(q, k_t) * scale, the dot in 8 lanes (lane j takes d = j (mod 8) in increasing d by fmaf from +0)
 *       folded as ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7));
 *   e_t = qo_exp(score_t - max) (our own exp: a fixed sequence of float32 operations, within 2 ulp of expf;
 *       0 below -87);
 *   sum = the e_t in 8 lanes (the i-th key of the window to lane i mod 8, plain additions in increasing i), folded
 *       as above; with sinks (GroupQueryAttentionFixedOrderSinks, gpt-oss) the max also takes the head's sink logit
 *       and the sum gets qo_exp(sink - max) added last: the sink is a last column of the softmax, dropped after;
 *   out_d = (sum over t of e_t * v_t[d] by fmaf in increasing t, from +0) / sum.
 * Work: first the cache rows (tasks over batch x kv head), then the queries (tasks over batch x head x blocks of
 * 16 queries), through qo_cpu_parallel_for (ORT's intra-op pool under ORT). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qo_cpu_simd.h"
#include "qo_fp_formats.h"
#include "qo_kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(QO_NO_CLONES) && \
    !defined(QO_PORTABLE_ONLY)
#define QA_X86 1
#include <immintrin.h>
#else
#define QA_X86 0
#endif

#define QA_QUERY_BLOCK 16 /* queries per task */
#define QA_EXP_MIN -87.0f /* exp below this: 0 (2^-126 and under; the window's largest term is 1) */

typedef struct {
  const float *q, *k, *v, *past_k, *past_v, *cos_cache, *sin_cache, *sink;
  float *present_k, *present_v, *out;
  const int64_t* past_len; /* [B] */
  int64_t B, S, H, Hkv, D, P, T, R, window, query_blocks;
  float scale;
  int shared, path;
  volatile int failed; /* a task could not grow its scratch buffer */
} qa_job;

/* ---------------- the arithmetic, portable ---------------- */
/* exp(x) for x <= 0: n = round(x / ln 2) (by the 1.5 * 2^23 addition), r = x - n ln 2 in two fmaf steps, the degree-7
 * Taylor polynomial of e^r (|r| <= 0.35: truncation 5e-9 relative) by fmaf, times 2^n (n >= -126: a normal). */
#define QA_LOG2E 1.44269502f
#define QA_LN2_HI 0.693145751953125f /* ln 2 to 15 bits: n * QA_LN2_HI is exact */
#define QA_LN2_LO 1.42860677e-06f
#define QA_ROUND 12582912.0f /* 1.5 * 2^23 */
static const float QA_EXP_C[8] = {1.0f, 1.0f, 0.5f, 1.66666672e-01f, 4.16666679e-02f, 8.33333377e-03f,
                                  1.38888892e-03f, 1.98412701e-04f}; /* 1 / i! */

static inline float qa_exp(float x) {
  if (!(x >= QA_EXP_MIN)) return 0.0f; /* NaN too */
  const float t = x * QA_LOG2E;
  const float n = (t + QA_ROUND) - QA_ROUND;
  float r = fmaf(n, -QA_LN2_HI, x);
  r = fmaf(n, -QA_LN2_LO, r);
  float p = QA_EXP_C[7];
  for (int i = 6; i >= 0; --i) p = fmaf(p, r, QA_EXP_C[i]);
  return p * qo_bits_to_f32((uint32_t)((int32_t)n + 127) << 23);
}

static inline float qa_dot(const float* a, const float* b, int64_t D) {
  float l[8] = {0};
  for (int64_t d = 0; d < D; ++d) l[d & 7] = fmaf(a[d], b[d], l[d & 7]);
  return qo_fold8(l);
}

/* o = x rotated to position row (cos / sin rows of R floats). */
static inline void qa_rotate(const float* x, const float* c, const float* s, int64_t R, int64_t D, float* o) {
  for (int64_t i = 0; i < R; ++i) {
    const float x1 = x[i], x2 = x[i + R];
    const float a = x1 * c[i], b = x2 * s[i], e = x2 * c[i], f = x1 * s[i];
    o[i] = a - b;
    o[i + R] = e + f;
  }
  for (int64_t d = 2 * R; d < D; ++d) o[d] = x[d];
}

/* The softmax's max with the head's sink logit (when the op has sinks), and its sum plus the sink's term: the sink is
 * one more column of every row, after the keys (transformers' gpt-oss attention). */
static inline float qa_max_sink(float m, const float* sink) { return sink && *sink > m ? *sink : m; }
static inline float qa_sum_sink(float sum, float m, const float* sink) { return sink ? sum + qa_exp(*sink - m) : sum; }

/* One query against keys lo..lo+n-1 of one kv head: the output row o[D]. e: n + 8 floats of scratch; sink: the
 * head's sink logit or NULL. */
static void qa_query_portable(const qa_job* j, const float* q, const float* K, const float* V, int64_t n,
                              const float* sink, float* e, float* o) {
  const int64_t D = j->D;
  float m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    e[i] = qa_dot(q, K + i * D, D) * j->scale;
    if (e[i] > m) m = e[i];
  }
  m = qa_max_sink(m, sink);
  float l[8] = {0};
  for (int64_t i = 0; i < n; ++i) {
    e[i] = qa_exp(e[i] - m);
    l[i & 7] = l[i & 7] + e[i];
  }
  const float sum = qa_sum_sink(qo_fold8(l), m, sink);
  for (int64_t d = 0; d < D; ++d) {
    float acc = 0.0f;
    for (int64_t i = 0; i < n; ++i) acc = fmaf(e[i], V[i * D + d], acc);
    o[d] = acc / sum;
  }
}

/* ---------------- AVX2 + FMA (the same operations, 8 at a time) ---------------- */
#if QA_X86
QO_TARGET_BEGIN("avx2,fma")

static inline __m256 qa_exp_avx2(__m256 x) {
  const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(QA_EXP_MIN), _CMP_GE_OQ);
  const __m256 round = _mm256_set1_ps(QA_ROUND);
  const __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(QA_LOG2E));
  const __m256 n = _mm256_sub_ps(_mm256_add_ps(t, round), round);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-QA_LN2_HI), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-QA_LN2_LO), r);
  __m256 p = _mm256_set1_ps(QA_EXP_C[7]);
  for (int i = 6; i >= 0; --i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(QA_EXP_C[i]));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), keep);
}

/* The fold of eight 8-lane accumulators at once, each exactly as qo_fold8 (lo + hi, then (s0 + s2) + (s1 + s3)):
 * r = [a0, a2, a4, a6 | a1, a3, a5, a7]. */
static inline __m256 qa_fold8x8_avx2(const __m256 a[8]) {
  __m256 w[4];
  for (int i = 0; i < 4; ++i)
    w[i] = _mm256_add_ps(_mm256_permute2f128_ps(a[2 * i], a[2 * i + 1], 0x20),
                         _mm256_permute2f128_ps(a[2 * i], a[2 * i + 1], 0x31)); /* [s(a_2i) | s(a_2i+1)] */
  __m256 z[2];
  for (int i = 0; i < 2; ++i) /* [t0, t1 of a_4i, t0, t1 of a_4i+2 | the same of a_4i+1, a_4i+3] */
    z[i] = _mm256_add_ps(_mm256_shuffle_ps(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm256_shuffle_ps(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm256_add_ps(_mm256_shuffle_ps(z[0], z[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm256_shuffle_ps(z[0], z[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* Scores of nq (1 or 2) queries q[] against keys 0..n-1 of K (rows of D, D % 8 == 0): e[u][t] = dot * scale, the dot
 * in qa_dot's order; 2 queries x 4 keys (or 1 x 8) per pass, their eight accumulators folded together. */
static void qa_scores_avx2(const float* const q[2], int nq, const float* K, int64_t n, int64_t D, float scale,
                           float* const e[2]) {
  const int keys = nq == 2 ? 4 : 8;
  const __m256 sv = _mm256_set1_ps(scale);
  int64_t t = 0;
  float r[8];
  for (; t + keys <= n; t += keys) {
    __m256 a[8];
    for (int u = 0; u < 8; ++u) a[u] = _mm256_setzero_ps();
    const float* k0 = K + t * D;
    if (nq == 2) {
      for (int64_t d = 0; d < D; d += 8) {
        const __m256 x0 = _mm256_loadu_ps(q[0] + d), x1 = _mm256_loadu_ps(q[1] + d);
        for (int u = 0; u < 4; ++u) {
          const __m256 kv = _mm256_loadu_ps(k0 + u * D + d);
          a[u] = _mm256_fmadd_ps(x0, kv, a[u]);
          a[4 + u] = _mm256_fmadd_ps(x1, kv, a[4 + u]);
        }
      }
    } else {
      for (int64_t d = 0; d < D; d += 8) {
        const __m256 x0 = _mm256_loadu_ps(q[0] + d);
        for (int u = 0; u < 8; ++u) a[u] = _mm256_fmadd_ps(x0, _mm256_loadu_ps(k0 + u * D + d), a[u]);
      }
    }
    _mm256_storeu_ps(r, _mm256_mul_ps(qa_fold8x8_avx2(a), sv)); /* [a0, a2, a4, a6 | a1, a3, a5, a7] */
    if (nq == 2) { /* a_u: query u / 4, key u % 4 */
      float* e0 = e[0] + t;
      float* e1 = e[1] + t;
      e0[0] = r[0], e0[2] = r[1], e1[0] = r[2], e1[2] = r[3], e0[1] = r[4], e0[3] = r[5], e1[1] = r[6], e1[3] = r[7];
    } else {
      float* e0 = e[0] + t;
      e0[0] = r[0], e0[2] = r[1], e0[4] = r[2], e0[6] = r[3], e0[1] = r[4], e0[3] = r[5], e0[5] = r[6], e0[7] = r[7];
    }
  }
  for (; t < n; ++t)
    for (int u = 0; u < nq; ++u) {
      __m256 a = _mm256_setzero_ps();
      for (int64_t d = 0; d < D; d += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q[u] + d), _mm256_loadu_ps(K + t * D + d), a);
      e[u][t] = qo_fold8_avx2(a) * scale;
    }
}

/* e[0..n) <- exp(e - max), returns their 8-lane sum (qa_query_portable's, the sink's term included). e has room for
 * n rounded up to 8. */
static float qa_softmax_avx2(float* e, int64_t n, const float* sink) {
  /* the max as the portable loop takes it: vmaxps returns its second operand (the running max) for a NaN */
  __m256 mx = _mm256_set1_ps(-INFINITY);
  int64_t i0 = 0;
  for (; i0 + 8 <= n; i0 += 8) mx = _mm256_max_ps(_mm256_loadu_ps(e + i0), mx);
  float lanes_max[8];
  _mm256_storeu_ps(lanes_max, mx);
  float m = -INFINITY;
  for (int i = 0; i < 8; ++i)
    if (lanes_max[i] > m) m = lanes_max[i];
  for (int64_t i = i0; i < n; ++i)
    if (e[i] > m) m = e[i];
  m = qa_max_sink(m, sink);
  const int64_t n8 = (n + 7) & ~(int64_t)7;
  for (int64_t i = n; i < n8; ++i) e[i] = -INFINITY; /* exp -> +0, which leaves a lane unchanged */
  const __m256 mv = _mm256_set1_ps(m);
  __m256 lanes = _mm256_setzero_ps();
  for (int64_t i = 0; i < n8; i += 8) {
    const __m256 x = qa_exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(e + i), mv));
    _mm256_storeu_ps(e + i, x);
    lanes = _mm256_add_ps(lanes, x);
  }
  return qa_sum_sink(qo_fold8_avx2(lanes), m, sink);
}

/* Keys [ta, tb) of one 8w-wide slice [d0, d0 + 8w) of nq (1 or 2) queries' value sums, accumulated into acc[u]
 * (memory, D floats a query): acc_u[d] += e_u[t - lo_u] * V[t][d] by fmaf in increasing t over the query's range
 * [lo_u, end_u). Two queries of one head (lo_0 <= lo_1 <= end_0 <= end_1): the keys only query 0 has first, then the
 * shared ones, then those only query 1 has, so each query's order is unchanged; w is a constant where this is
 * inlined (the accumulators stay in registers). */
static inline __attribute__((always_inline)) void qa_values_slice_avx2(
    const int nq, const int w, const float* const e[2], const int64_t lo[2], const int64_t end[2], const float* V,
    int64_t D, int64_t d0, int64_t ta, int64_t tb, float* const acc_mem[2]) {
  const int64_t mid0 = nq == 2 ? lo[1] : end[0], mid1 = end[0];
  __m256 acc[2][4];
  for (int u = 0; u < nq; ++u)
    for (int c = 0; c < w; ++c) acc[u][c] = _mm256_loadu_ps(acc_mem[u] + d0 + 8 * c);
  const int64_t a0 = ta > lo[0] ? ta : lo[0], a1 = tb < mid0 ? tb : mid0;
  for (int64_t t = a0; t < a1; ++t) {
    const __m256 p = _mm256_broadcast_ss(e[0] + (t - lo[0]));
    for (int c = 0; c < w; ++c) acc[0][c] = _mm256_fmadd_ps(p, _mm256_loadu_ps(V + t * D + d0 + 8 * c), acc[0][c]);
  }
  if (nq == 2) {
    const int64_t b0 = ta > mid0 ? ta : mid0, b1 = tb < mid1 ? tb : mid1;
    for (int64_t t = b0; t < b1; ++t) {
      const __m256 p0 = _mm256_broadcast_ss(e[0] + (t - lo[0])), p1 = _mm256_broadcast_ss(e[1] + (t - lo[1]));
      for (int c = 0; c < w; ++c) {
        const __m256 v = _mm256_loadu_ps(V + t * D + d0 + 8 * c);
        acc[0][c] = _mm256_fmadd_ps(p0, v, acc[0][c]);
        acc[1][c] = _mm256_fmadd_ps(p1, v, acc[1][c]);
      }
    }
    const int64_t c0 = ta > mid1 ? ta : mid1, c1 = tb < end[1] ? tb : end[1];
    for (int64_t t = c0; t < c1; ++t) {
      const __m256 p = _mm256_broadcast_ss(e[1] + (t - lo[1]));
      for (int c = 0; c < w; ++c) acc[1][c] = _mm256_fmadd_ps(p, _mm256_loadu_ps(V + t * D + d0 + 8 * c), acc[1][c]);
    }
  }
  for (int u = 0; u < nq; ++u)
    for (int c = 0; c < w; ++c) _mm256_storeu_ps(acc_mem[u] + d0 + 8 * c, acc[u][c]);
}

static void qa_values_avx2(int nq, const float* const e[2], const int64_t lo[2], const int64_t end[2], const float* V,
                           int64_t D, int64_t ta, int64_t tb, float* const acc[2]) {
  int64_t d0 = 0;
  for (; d0 + 32 <= D; d0 += 32) {
    if (nq == 2)
      qa_values_slice_avx2(2, 4, e, lo, end, V, D, d0, ta, tb, acc);
    else
      qa_values_slice_avx2(1, 4, e, lo, end, V, D, d0, ta, tb, acc);
  }
  for (; d0 < D; d0 += 8) qa_values_slice_avx2(nq, 1, e, lo, end, V, D, d0, ta, tb, acc);
}

/* The queries s0..s0+nb-1 of one head (D % 8 == 0; nb <= QA_QUERY_BLOCK), keys in tiles of about 16 KB of K (then of
 * V) so that a tile serves every query pair of the block from L1 (one pass over all keys per query pair read K and
 * V from L2 at 256 bytes a key for two queries: 26 against 21 cycles per (query, key) at 2048 tokens, H 9, D 64, one
 * core of an Intel Xeon). q: the rotated queries; lo / end: their
 * key ranges; scratch: nb rows of e, then nb rows of D accumulators (qa_scratch_floats). */
static void qa_block_avx2(const qa_job* j, int nb, float* const q[QA_QUERY_BLOCK], const int64_t lo[QA_QUERY_BLOCK],
                          const int64_t end[QA_QUERY_BLOCK], const float* K, const float* V, const float* sink,
                          float* scratch, float* const o[QA_QUERY_BLOCK]) {
  const int64_t D = j->D, first = lo[0], last = end[nb - 1], stride = ((last - first + 7) & ~(int64_t)7) + 8;
  const int64_t tile = 4096 / D > 8 ? 4096 / D : 8;
  float* acc = scratch + nb * stride;
  float* e[QA_QUERY_BLOCK];       /* e[u][t - lo_u]: query u's scores, then exps */
  for (int u = 0; u < nb; ++u) e[u] = scratch + u * stride + (lo[u] - first);
  for (int64_t ta = first; ta < last; ta += tile) { /* scores */
    const int64_t tb = ta + tile < last ? ta + tile : last;
    for (int u = 0; u < nb; u += 2) {
      const int nq = u + 1 < nb ? 2 : 1;
      const int64_t a = ta > lo[u] ? ta : lo[u], b = tb < end[u + nq - 1] ? tb : end[u + nq - 1];
      if (a >= b) continue;
      const float* const qs[2] = {q[u], q[u + nq - 1]};
      float* const out[2] = {e[u] + (a - lo[u]), e[u + nq - 1] + (a - lo[u + nq - 1])}; /* the union of the ranges */
      qa_scores_avx2(qs, nq, K + a * D, b - a, D, j->scale, out);
    }
  }
  float sum[QA_QUERY_BLOCK];
  for (int u = 0; u < nb; ++u) {
    sum[u] = qa_softmax_avx2(e[u], end[u] - lo[u], sink);
    memset(acc + u * D, 0, sizeof(float) * (size_t)D);
  }
  for (int64_t ta = first; ta < last; ta += tile) { /* value sums */
    const int64_t tb = ta + tile < last ? ta + tile : last;
    for (int u = 0; u < nb; u += 2) {
      const int nq = u + 1 < nb ? 2 : 1;
      const float* const ev[2] = {e[u], e[u + nq - 1]};
      const int64_t lv[2] = {lo[u], lo[u + nq - 1]}, ev_end[2] = {end[u], end[u + nq - 1]};
      float* const av[2] = {acc + u * D, acc + (u + nq - 1) * D};
      qa_values_avx2(nq, ev, lv, ev_end, V, D, ta, tb, av);
    }
  }
  for (int u = 0; u < nb; ++u) {
    const __m256 sv = _mm256_set1_ps(sum[u]);
    for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(o[u] + d, _mm256_div_ps(_mm256_loadu_ps(acc + u * D + d), sv));
  }
}

QO_TARGET_END
#endif

/* ---------------- tasks ---------------- */
/* Cache rows of (b, kv head): past copied when present is another buffer, the new rows rotated (keys) in. */
static void qa_cache_task(void* data, size_t index) {
  const qa_job* j = (const qa_job*)data;
  const int64_t b = (int64_t)index / j->Hkv, g = (int64_t)index % j->Hkv, D = j->D, S = j->S;
  const int64_t past = j->past_len[b];
  float* pk = j->present_k + (b * j->Hkv + g) * j->T * D;
  float* pv = j->present_v + (b * j->Hkv + g) * j->T * D;
  if (!j->shared) {
    if (past > 0) {
      memcpy(pk, j->past_k + (b * j->Hkv + g) * j->P * D, sizeof(float) * (size_t)(past * D));
      memcpy(pv, j->past_v + (b * j->Hkv + g) * j->P * D, sizeof(float) * (size_t)(past * D));
    }
    memset(pk + (past + S) * D, 0, sizeof(float) * (size_t)((j->T - past - S) * D));
    memset(pv + (past + S) * D, 0, sizeof(float) * (size_t)((j->T - past - S) * D));
  }
  for (int64_t s = 0; s < S; ++s) {
    const int64_t pos = past + s;
    const float* kin = j->k + ((b * S + s) * j->Hkv + g) * D;
    qa_rotate(kin, j->cos_cache + pos * j->R, j->sin_cache + pos * j->R, j->R, D, pk + pos * D);
    memcpy(pv + pos * D, j->v + ((b * S + s) * j->Hkv + g) * D, sizeof(float) * (size_t)D);
  }
}

static QO_THREAD_LOCAL float* tls_scratch = NULL;
static QO_THREAD_LOCAL size_t tls_scratch_floats = 0;

/* Scratch floats of a query task: nb rows of e (the block's key span rounded up, + 8), nb rows of D accumulators and
 * nb rotated queries. */
static size_t qa_scratch_floats(const qa_job* j) {
  return (size_t)(QA_QUERY_BLOCK * (j->T + QA_QUERY_BLOCK + 16) + 2 * QA_QUERY_BLOCK * j->D);
}

/* Queries of (b, head, block of QA_QUERY_BLOCK). */
static void qa_query_task(void* data, size_t index) {
  const qa_job* j = (const qa_job*)data;
  const int64_t blk = (int64_t)index % j->query_blocks, bh = (int64_t)index / j->query_blocks;
  const int64_t b = bh / j->H, h = bh % j->H, D = j->D, S = j->S;
  const int64_t g = h / (j->H / j->Hkv), past = j->past_len[b];
  float* scratch = qo_tls_grow(&tls_scratch, &tls_scratch_floats, qa_scratch_floats(j));
  if (!scratch) {
    ((qa_job*)data)->failed = 1;
    return;
  }
  const float* Kh = j->present_k + (b * j->Hkv + g) * j->T * D;
  const float* Vh = j->present_v + (b * j->Hkv + g) * j->T * D;
  const float* sink = j->sink ? j->sink + h : NULL;
  const int64_t s0 = blk * QA_QUERY_BLOCK, s1 = s0 + QA_QUERY_BLOCK < S ? s0 + QA_QUERY_BLOCK : S;
  const int nb = (int)(s1 - s0);
  float* q[QA_QUERY_BLOCK];
  float* o[QA_QUERY_BLOCK];
  int64_t lo[QA_QUERY_BLOCK], end[QA_QUERY_BLOCK];
  float* qbase = scratch + qa_scratch_floats(j) - (size_t)(QA_QUERY_BLOCK * D);
  for (int u = 0; u < nb; ++u) {
    const int64_t p = past + s0 + u;
    lo[u] = j->window > 0 && p >= j->window ? p - j->window + 1 : 0;
    end[u] = p + 1;
    q[u] = qbase + u * D;
    qa_rotate(j->q + ((b * S + s0 + u) * j->H + h) * D, j->cos_cache + p * j->R, j->sin_cache + p * j->R, j->R, D,
              q[u]);
    o[u] = j->out + ((b * S + s0 + u) * j->H + h) * D;
  }
#if QA_X86
  if (j->path != QO_ISA_PORTABLE) {
    qa_block_avx2(j, nb, q, lo, end, Kh, Vh, sink, scratch, o);
    return;
  }
#endif
  for (int u = 0; u < nb; ++u)
    qa_query_portable(j, q[u], Kh + lo[u] * D, Vh + lo[u] * D, end[u] - lo[u], sink, scratch, o[u]);
}

QO_API int qo_gqa_fixed_order_f32(const float* q, const float* k, const float* v, const float* past_k,
                                  const float* past_v, int64_t P, float* present_k, float* present_v, int64_t T,
                                  const int32_t* seqlens_k, int64_t total_sequence_length, const float* cos_cache,
                                  const float* sin_cache, int64_t max_positions, int64_t R, float* out, int64_t B,
                                  int64_t S, int64_t H, int64_t Hkv, int64_t D, float scale, int64_t local_window,
                                  const float* head_sink) {
  if (B < 0 || S < 0 || H <= 0 || Hkv <= 0 || H % Hkv != 0 || D <= 0 || R < 0 || 2 * R > D || P < 0 || T < 0)
    return QO_ERR_ARGUMENT;
  if (B == 0 || S == 0) return QO_OK;
  const int shared = present_k == past_k && present_v == past_v;
  if (!shared && (present_k == past_k || present_v == past_v)) return QO_ERR_ARGUMENT;
  int64_t* past_len = (int64_t*)malloc(sizeof(int64_t) * (size_t)B);
  if (!past_len) return QO_ERR_ALLOC;
  const int first_prompt = S == total_sequence_length;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t past = first_prompt ? 0 : (int64_t)seqlens_k[b] + 1 - S;
    if (past < 0 || past + S > T || (!shared && past > P) || (shared && T != P) || past + S > max_positions) {
      free(past_len);
      return QO_ERR_ARGUMENT;
    }
    past_len[b] = past;
  }
  qa_job job = {q, k, v, past_k, past_v, cos_cache, sin_cache, head_sink, present_k, present_v, out, past_len,
                B, S, H, Hkv, D, P, T, R, local_window, (S + QA_QUERY_BLOCK - 1) / QA_QUERY_BLOCK,
                scale == 0.0f ? 1.0f / sqrtf((float)D) : scale, shared, qo_cpu_isa(), 0};
  if (job.path != QO_ISA_PORTABLE && D % 8 != 0) job.path = QO_ISA_PORTABLE;
  int status = qo_cpu_parallel_for(qa_cache_task, (size_t)(B * Hkv), &job);
  if (status == QO_OK) status = qo_cpu_parallel_for(qa_query_task, (size_t)(B * H * job.query_blocks), &job);
  if (status == QO_OK && job.failed) status = QO_ERR_ALLOC;
  free(past_len);
  return status;
}
