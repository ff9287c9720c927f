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
 *       as above;
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
  const float *q, *k, *v, *past_k, *past_v, *cos_cache, *sin_cache;
  float *present_k, *present_v, *out;
  const int64_t* past_len; /* [B] */
  int64_t B, S, H, Hkv, D, P, T, R, window, query_blocks;
  float scale;
  int shared, path;
  volatile int failed; /* a task could not grow its scratch buffer */
} qa_job;

/* ---------------- the arithmetic, portable ---------------- */
static inline float qa_fold8(const float l[8]) {
  const float s0 = l[0] + l[4], s1 = l[1] + l[5], s2 = l[2] + l[6], s3 = l[3] + l[7];
  return (s0 + s2) + (s1 + s3);
}

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
  return qa_fold8(l);
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

/* One query against keys lo..lo+n-1 of one kv head: the output row o[D]. e: n + 8 floats of scratch. */
static void qa_query_portable(const qa_job* j, const float* q, const float* K, const float* V, int64_t n, float* e,
                              float* o) {
  const int64_t D = j->D;
  float m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    e[i] = qa_dot(q, K + i * D, D) * j->scale;
    if (e[i] > m) m = e[i];
  }
  float l[8] = {0};
  for (int64_t i = 0; i < n; ++i) {
    e[i] = qa_exp(e[i] - m);
    l[i & 7] = l[i & 7] + e[i];
  }
  const float sum = qa_fold8(l);
  for (int64_t d = 0; d < D; ++d) {
    float acc = 0.0f;
    for (int64_t i = 0; i < n; ++i) acc = fmaf(e[i], V[i * D + d], acc);
    o[d] = acc / sum;
  }
}

/* ---------------- AVX2 + FMA (the same operations, 8 at a time) ---------------- */
#if QA_X86
QO_TARGET_BEGIN("avx2,fma")

static inline float qa_fold8_avx2(__m256 x) { /* (s0 + s2) + (s1 + s3), s_i = l_i + l_(i+4) */
  __m128 v = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  v = _mm_add_ps(v, _mm_movehl_ps(v, v));
  return _mm_cvtss_f32(_mm_add_ss(v, _mm_shuffle_ps(v, v, 1)));
}

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

/* D % 8 == 0 */
static void qa_query_avx2(const qa_job* j, const float* q, const float* K, const float* V, int64_t n, float* e,
                          float* o) {
  const int64_t D = j->D;
  float m = -INFINITY;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) { /* four keys per pass over q */
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    const float* k0 = K + i * D;
    for (int64_t d = 0; d < D; d += 8) {
      const __m256 x = _mm256_loadu_ps(q + d);
      a0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k0 + d), a0);
      a1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k0 + D + d), a1);
      a2 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k0 + 2 * D + d), a2);
      a3 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k0 + 3 * D + d), a3);
    }
    const float s[4] = {qa_fold8_avx2(a0), qa_fold8_avx2(a1), qa_fold8_avx2(a2), qa_fold8_avx2(a3)};
    for (int u = 0; u < 4; ++u) {
      e[i + u] = s[u] * j->scale;
      if (e[i + u] > m) m = e[i + u];
    }
  }
  for (; i < n; ++i) {
    __m256 a = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(K + i * D + d), a);
    e[i] = qa_fold8_avx2(a) * j->scale;
    if (e[i] > m) m = e[i];
  }
  /* exps and their 8-lane sum; the tail padded with -inf, whose exp is +0 (which leaves a lane unchanged) */
  const int64_t n8 = (n + 7) & ~(int64_t)7;
  for (i = n; i < n8; ++i) e[i] = -INFINITY;
  const __m256 mv = _mm256_set1_ps(m);
  __m256 lanes = _mm256_setzero_ps();
  for (i = 0; i < n8; i += 8) {
    const __m256 x = qa_exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(e + i), mv));
    _mm256_storeu_ps(e + i, x);
    lanes = _mm256_add_ps(lanes, x);
  }
  const __m256 sum = _mm256_set1_ps(qa_fold8_avx2(lanes));
  for (int64_t d0 = 0; d0 < D; d0 += 32) { /* 32 output lanes per pass over the keys */
    const int64_t w = D - d0 < 32 ? D - d0 : 32;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (i = 0; i < n; ++i) {
      const __m256 p = _mm256_broadcast_ss(e + i);
      const float* vr = V + i * D + d0;
      for (int c = 0; c < w / 8; ++c) acc[c] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vr + 8 * c), acc[c]);
    }
    for (int c = 0; c < w / 8; ++c) _mm256_storeu_ps(o + d0 + 8 * c, _mm256_div_ps(acc[c], sum));
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

/* Queries of (b, head, block of QA_QUERY_BLOCK). */
static void qa_query_task(void* data, size_t index) {
  const qa_job* j = (const qa_job*)data;
  const int64_t blk = (int64_t)index % j->query_blocks, bh = (int64_t)index / j->query_blocks;
  const int64_t b = bh / j->H, h = bh % j->H, D = j->D, S = j->S;
  const int64_t g = h / (j->H / j->Hkv), past = j->past_len[b];
  float* scratch = qo_tls_grow(&tls_scratch, &tls_scratch_floats, (size_t)(j->T + 8 + D));
  if (!scratch) {
    ((qa_job*)data)->failed = 1;
    return;
  }
  float* e = scratch;
  float* qr = scratch + j->T + 8;
  const float* Kh = j->present_k + (b * j->Hkv + g) * j->T * D;
  const float* Vh = j->present_v + (b * j->Hkv + g) * j->T * D;
  const int64_t s1 = (blk + 1) * QA_QUERY_BLOCK < S ? (blk + 1) * QA_QUERY_BLOCK : S;
  for (int64_t s = blk * QA_QUERY_BLOCK; s < s1; ++s) {
    const int64_t p = past + s;
    const int64_t lo = j->window > 0 && p >= j->window ? p - j->window + 1 : 0;
    qa_rotate(j->q + ((b * S + s) * j->H + h) * D, j->cos_cache + p * j->R, j->sin_cache + p * j->R, j->R, D, qr);
    float* o = j->out + ((b * S + s) * j->H + h) * D;
#if QA_X86
    if (j->path != QO_ISA_PORTABLE) {
      qa_query_avx2(j, qr, Kh + lo * D, Vh + lo * D, p - lo + 1, e, o);
      continue;
    }
#endif
    qa_query_portable(j, qr, Kh + lo * D, Vh + lo * D, p - lo + 1, e, o);
  }
}

QO_API int qo_gqa_fixed_order_f32(const float* q, const float* k, const float* v, const float* past_k,
                                  const float* past_v, int64_t P, float* present_k, float* present_v, int64_t T,
                                  const int32_t* seqlens_k, int64_t total_sequence_length, const float* cos_cache,
                                  const float* sin_cache, int64_t max_positions, int64_t R, float* out, int64_t B,
                                  int64_t S, int64_t H, int64_t Hkv, int64_t D, float scale, int64_t local_window) {
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
  qa_job job = {q, k, v, past_k, past_v, cos_cache, sin_cache, present_k, present_v, out, past_len, B, S, H, Hkv, D,
                P, T, R, local_window, (S + QA_QUERY_BLOCK - 1) / QA_QUERY_BLOCK,
                scale == 0.0f ? 1.0f / sqrtf((float)D) : scale, shared, qo_cpu_isa(), 0};
  if (job.path != QO_ISA_PORTABLE && D % 8 != 0) job.path = QO_ISA_PORTABLE;
  int status = qo_cpu_parallel_for(qa_cache_task, (size_t)(B * Hkv), &job);
  if (status == QO_OK) status = qo_cpu_parallel_for(qa_query_task, (size_t)(B * H * job.query_blocks), &job);
  if (status == QO_OK && job.failed) status = QO_ERR_ALLOC;
  free(past_len);
  return status;
}
