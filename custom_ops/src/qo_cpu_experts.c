/* CPU kernels of the com.quark_onnx MatMulExperts* ops (the llama.cpp mul_mat_id idea): Y[t][s] = A[t] (or A[t][s])
 * @ W[ids[t][s]]^T for the k experts each token chose, each chosen expert's compact weight read in place from the
 * stacked [E, N, ...] tensor (the dense compact ops' layout per expert, qo_kernels.h), decoded in registers.
 *
 * Work: the T * k (token, slot) pairs are sorted by expert (counting sort, stable: token order within an expert);
 * each expert that was chosen runs once, with M = the number of pairs that chose it, its activation rows gathered
 * into one block (so at prefill an expert's weight is read once per call, not once per token: a token-sorted
 * grouped GEMM), through qo_cpu_weight_rows_f32: the dense kernels' own code and summation order. A row's result
 * does not depend on M or on the row block (qo_kernels.h), so each output equals the dense op on that expert bit for
 * bit. Tasks are (expert, block of weight rows): 16 rows when the expert has <= 4 rows of A (GEMV), 48 above (the
 * decoded-panel GEMM), run through ORT's intra-op pool when the ORT layer set it (qo_cpu_parallel_for).
 * 4-bit integer experts (QO_FMT_INT4, MatMulExpertsUint4 / Int4) go through qo_cpu_int4_rows_f32 instead (the
 * dense MatMulUint4 kernel's code and 32-lane order); its SIMD paths read A reordered for their lanes, prepared once
 * per expert, gathered from A itself (qo_cpu_int4_prepare_a; no sorted copy of A), in a parallel pass before the
 * tasks run (at accuracy_level 4, qo_cpu_int4a8_rows_f32: the activations quantized to int8 per block once per
 * expert, MatMulNBits / QMoE level 4's arithmetic). MXFP4 experts likewise check each expert's A rows for the MXFP4
 * grid once (qo_cpu_mxfp4_prepare_a) and run qo_cpu_mxfp4_rows_f32: the dense MatMulMxfp4's outputs. The results go back to the pairs' places in Y in a
 * third parallel pass. */
#include <stdlib.h>
#include <string.h>

#include "qo_cpu_simd.h"
#include "qo_kernels.h"

#define QO_EXPERT_GEMV_ROWS 16
#define QO_EXPERT_PANEL_ROWS 48
#define QO_EXPERT_TILE_ROWS 128 /* 16-row-tile FP4: 8 tiles, the dense kernel's GEMV step (8 streams, 8 FMA chains) */

typedef struct {
  int64_t expert, n0, n1;
} qo_expert_task;

typedef struct {
  int fmt;
  int64_t N, K;
  const uint8_t* B;
  int64_t b_bytes;        /* bytes of one expert's B */
  const uint8_t* B_scale; /* block scales (MXFP4 / NVFP4) */
  int64_t s_bytes;        /* bytes of one expert's block scales */
  const float* scale_2;   /* NVFP4: [E] */
  const float* col_scale; /* FP8 / INT8: [E] or [E, N] */
  int64_t col_count;      /* per expert: 1 or N */
  const float* scales;    /* INT4: group scales, s_count floats per expert */
  int64_t s_count;
  const uint8_t* zp;      /* INT4: zero points, zp_bytes per expert, or NULL (8) */
  int64_t zp_bytes, block;
  int i4_path;            /* INT4: qo_cpu_int4_path (or qo_cpu_int4a8_path), once per call */
  int a8;                 /* INT4: int8-quantized activations (accuracy_level 4, qo_cpu_int4_a8.c) */
  int fp8_a_range;        /* FP8: qo_cpu_fp8_half_range of the op's A, once per call (not once per block of rows) */
  int fp8_nan_free;       /* FP8: the caller's qo_cpu_fp8_weight_nan_free, read on the calling thread */
  float* a_prep;          /* INT4 / MXFP4: each expert's rows prepared for the SIMD paths (from prep_offset[e]) */
  int64_t* prep_offset;   /* [E] */
  const int64_t* offset;  /* [E + 1]: the expert's first row in a_rows / y_rows */
  const float* A;         /* the op's A */
  const int64_t* src;     /* [T * k]: row r of the sorted block is row src[r] of A */
  const int64_t* used;    /* the experts chosen at least once, ascending */
  const float* a_rows;    /* [T * k, K], sorted by expert; NULL where the kernel reads only a_prep (INT4 SIMD) */
  float* y_rows;          /* [T * k, N], sorted by expert */
  float* Y;
  const int64_t* order;   /* [T * k]: row r of y_rows is pair order[r] of Y */
  int64_t pairs;
  const qo_expert_task* tasks;
  volatile int failed;
} qo_experts_job;

static void expert_task(void* data, size_t index) {
  qo_experts_job* job = (qo_experts_job*)data;
  const qo_expert_task* t = &job->tasks[index];
  const int64_t e = t->expert, r0 = job->offset[e], M = job->offset[e + 1] - r0;
  if (job->fmt == QO_FMT_INT4 && job->a8) {
    const int status = qo_cpu_int4a8_rows_f32(job->i4_path, job->a_prep + job->prep_offset[e], M, job->N, job->K,
                                              job->B + e * job->b_bytes, job->scales + e * job->s_count,
                                              job->zp ? job->zp + e * job->zp_bytes : NULL, job->block, t->n0, t->n1,
                                              job->y_rows + r0 * job->N);
    if (status != QO_OK) job->failed = status;
    return;
  }
  if (job->fmt == QO_FMT_INT4) {
    const int status = qo_cpu_int4_rows_f32(
        job->i4_path, job->a_rows ? job->a_rows + r0 * job->K : NULL,
        job->a_prep ? job->a_prep + job->prep_offset[e] : NULL, M, job->N, job->K, job->B + e * job->b_bytes, job->scales + e * job->s_count, job->zp ? job->zp + e * job->zp_bytes : NULL,
        job->block, t->n0, t->n1, job->y_rows + r0 * job->N);
    if (status != QO_OK) job->failed = status;
    return;
  }
  if (job->fmt == QO_FMT_MXFP4_R16 || job->fmt == QO_FMT_NVFP4_R16) { /* 16-row tiles: qo_cpu_fp4_r16.c */
    const int status = qo_cpu_fp4_r16_rows_f32(
        job->fmt == QO_FMT_NVFP4_R16, job->a_rows + r0 * job->K, M, job->N, job->K, job->B + e * job->b_bytes,
        job->B_scale + e * job->s_bytes, job->scale_2 ? job->scale_2[e] : 1.0f, t->n0, t->n1, job->y_rows + r0 * job->N);
    if (status != QO_OK) job->failed = status;
    return;
  }
  if (job->fmt == QO_FMT_MXFP4) {
    const int status = qo_cpu_mxfp4_rows_f32(job->a_rows + r0 * job->K, job->a_prep + job->prep_offset[e], M, job->N,
                                             job->K, job->B + e * job->b_bytes, job->B_scale + e * job->s_bytes, t->n0,
                                             t->n1, job->y_rows + r0 * job->N);
    if (status != QO_OK) job->failed = status;
    return;
  }
  const int status = qo_cpu_weight_rows_f32(
      job->fmt, job->a_rows + r0 * job->K, M, job->N, job->K, job->B + e * job->b_bytes,
      job->B_scale ? job->B_scale + e * job->s_bytes : NULL, job->scale_2 ? job->scale_2[e] : 0.0f,
      job->col_scale ? job->col_scale + e * job->col_count : NULL, job->col_count, job->fp8_a_range,
      job->fp8_nan_free, t->n0, t->n1, job->y_rows + r0 * job->N);
  if (status != QO_OK) job->failed = status;
}

/* one chosen expert's rows of A prepared for its kernel (a task of the first parallel pass) */
static void prepare_task(void* data, size_t index) {
  qo_experts_job* job = (qo_experts_job*)data;
  const int64_t e = job->used[index], r0 = job->offset[e], m = job->offset[e + 1] - r0;
  if (job->fmt == QO_FMT_INT4 && job->a8)
    qo_cpu_int4a8_prepare_a(job->A, job->src + r0, m, job->K, job->block, job->a_prep + job->prep_offset[e]);
  else if (job->fmt == QO_FMT_INT4)
    qo_cpu_int4_prepare_a(job->i4_path, job->A, job->src + r0, m, job->K, job->block, job->a_prep + job->prep_offset[e]);
  else
    qo_cpu_mxfp4_prepare_a(job->a_rows + r0 * job->K, m, job->K, job->a_prep + job->prep_offset[e]);
}

#define QO_SCATTER_ROWS 16
/* the preparation and the scatter run on the calling thread below this many floats (decode: each parallel section
 * costs a wake-up of the pool, and on a busy machine a wait for a descheduled worker) */
#define QO_SERIAL_BELOW (1 << 18)
static void scatter_task(void* data, size_t index) { /* y_rows back to the pairs' places in Y */
  qo_experts_job* job = (qo_experts_job*)data;
  const int64_t N = job->N, r0 = (int64_t)index * QO_SCATTER_ROWS;
  for (int64_t r = r0; r < r0 + QO_SCATTER_ROWS && r < job->pairs; ++r)
    memcpy(job->Y + job->order[r] * N, job->y_rows + r * N, sizeof(float) * (size_t)N);
}

#ifndef QO_A8_TASK_BYTES
#define QO_A8_TASK_BYTES 65536
#endif
/* weight rows per task for an expert with m rows of A. The int8-activation kernel's tasks hold about `budget`
 * bytes of weight (QO_A8_TASK_BYTES, or the environment variable of that name, for benchmarks). Measured
 * (2026-12-05, Xeon, 2 threads): in an ORT session rows of 16, 64 KB and 1 MB ran the same; under OpenMP on a stack
 * larger than the L3, 256 KB-1 MB tasks streamed 20-21.5 GB/s against 17.2 at 64 KB. */
static int64_t task_rows(const qo_experts_job* job, int64_t m, int64_t budget) {
  if (job->fmt == QO_FMT_INT4 && job->a8) {
    const int64_t row_bytes = (job->b_bytes + 4 * job->s_count + job->zp_bytes) / (job->N > 0 ? job->N : 1);
    int64_t rows = budget / (row_bytes * (m > 4 ? m / 4 : 1) + 1);
    rows = rows < QO_EXPERT_GEMV_ROWS ? QO_EXPERT_GEMV_ROWS : (rows + 1) / 2 * 2;
    return rows;
  }
  if (job->fmt == QO_FMT_MXFP4_R16 || job->fmt == QO_FMT_NVFP4_R16) return QO_EXPERT_TILE_ROWS;
  return m <= 4 ? QO_EXPERT_GEMV_ROWS : QO_EXPERT_PANEL_ROWS;
}

/* a_slots: 1 (A [T, K], every slot reads its token's row) or k (A [T, k, K]). */
static int run_experts(qo_experts_job* job, const float* A, const int64_t* ids, float* Y, int64_t T, int64_t k,
                       int64_t a_slots, int64_t E) {
  const int64_t N = job->N, K = job->K, pairs = T * k;
  if (!A || !ids || !Y || !job->B || T < 0 || k <= 0 || E <= 0 || N < 0 || K <= 0 || (a_slots != 1 && a_slots != k))
    return QO_ERR_ARGUMENT;
  for (int64_t p = 0; p < pairs; ++p)
    if (ids[p] < 0 || ids[p] >= E) return QO_ERR_ARGUMENT;
  if (pairs == 0 || N == 0) return QO_OK;
  const int int4 = job->fmt == QO_FMT_INT4, prepared = int4 || job->fmt == QO_FMT_MXFP4;
  if (int4) job->i4_path = job->a8 ? qo_cpu_int4a8_path(job->block) : qo_cpu_int4_path(job->block);
  /* the INT4 SIMD paths (and every int8-activation path) read only the prepared rows, gathered from A itself: no
   * sorted copy of A */
  const int need_rows = !int4 || (!job->a8 && qo_cpu_int4_prepared_floats(job->i4_path, 1, K, job->block) == 0);
  int64_t* offset = (int64_t*)calloc((size_t)(E + 1), sizeof(int64_t));
  int64_t* order = (int64_t*)malloc(sizeof(int64_t) * (size_t)pairs);
  int64_t* src = (int64_t*)malloc(sizeof(int64_t) * (size_t)pairs);
  int64_t* fill = (int64_t*)malloc(sizeof(int64_t) * (size_t)E);
  int64_t* used = (int64_t*)malloc(sizeof(int64_t) * (size_t)E);
  float* a_rows = need_rows ? (float*)malloc(sizeof(float) * (size_t)(pairs * K)) : NULL;
  float* y_rows = (float*)malloc(sizeof(float) * (size_t)(pairs * N));
  qo_expert_task* tasks = NULL;
  int status = QO_ERR_ALLOC;
  int64_t* prep_offset = NULL;
  float* a_prep = NULL;
  int64_t n_used = 0;
  if (!offset || !order || !src || !fill || !used || (need_rows && !a_rows) || !y_rows) goto done;
  for (int64_t p = 0; p < pairs; ++p) ++offset[ids[p] + 1];
  for (int64_t e = 0; e < E; ++e) offset[e + 1] += offset[e];
  memcpy(fill, offset, sizeof(int64_t) * (size_t)E);
  for (int64_t p = 0; p < pairs; ++p) order[fill[ids[p]]++] = p; /* row r of the sorted block is pair order[r] */
  for (int64_t r = 0; r < pairs; ++r) src[r] = a_slots == 1 ? order[r] / k : order[r];
  if (a_rows)
    for (int64_t r = 0; r < pairs; ++r) memcpy(a_rows + r * K, A + src[r] * K, sizeof(float) * (size_t)K);
  for (int64_t e = 0; e < E; ++e)
    if (offset[e + 1] > offset[e]) used[n_used++] = e;
  job->A = A;
  job->src = src;
  job->used = used;
  job->offset = offset;
  job->a_rows = a_rows;
  job->y_rows = y_rows;
  job->Y = Y;
  job->order = order;
  job->pairs = pairs;
  job->failed = 0;
  /* every row of a_rows is a row of A; A has T or T * k rows (a_slots) */
  job->fp8_a_range = job->fmt == QO_FMT_FP8 ? qo_cpu_fp8_half_range(A, T * a_slots * K, K) : -1;
  job->fp8_nan_free = job->fmt == QO_FMT_FP8 && qo_cpu_fp8_weight_nan_free();
  if (prepared) { /* the kernel's A, prepared once per expert (not once per task), one task per expert */
    int64_t floats = 0;
    prep_offset = (int64_t*)malloc(sizeof(int64_t) * (size_t)E);
    if (!prep_offset) goto done;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t m = offset[e + 1] - offset[e];
      prep_offset[e] = floats;
      floats += !m ? 0 : int4 && job->a8 ? qo_cpu_int4a8_prepared_floats(m, K, job->block)
                     : int4 ? qo_cpu_int4_prepared_floats(job->i4_path, m, K, job->block)
                            : qo_cpu_mxfp4_prepared_floats(m, K);
    }
    if (floats) {
      a_prep = (float*)malloc(sizeof(float) * (size_t)floats + 64);
      if (!a_prep) goto done;
      /* each expert's rows start at a multiple of 32 floats, so all of them are aligned */
      job->a_prep = qo_align64(a_prep);
      job->prep_offset = prep_offset;
      if (pairs * K >= QO_SERIAL_BELOW) {
        status = qo_cpu_parallel_for(prepare_task, (size_t)n_used, job);
        if (status != QO_OK) goto done;
        status = QO_ERR_ALLOC;
      } else {
        for (int64_t i = 0; i < n_used; ++i) prepare_task(job, (size_t)i);
      }
    }
  }
  const char* env = getenv("QO_A8_TASK_BYTES"); /* read once per call */
  const int64_t task_bytes = env ? atoll(env) : QO_A8_TASK_BYTES;
  int64_t count = 0;
  for (int64_t i = 0; i < n_used; ++i) {
    const int64_t e = used[i], rows = task_rows(job, offset[e + 1] - offset[e], task_bytes);
    count += (N + rows - 1) / rows;
  }
  tasks = (qo_expert_task*)malloc(sizeof(qo_expert_task) * (size_t)count);
  if (!tasks) goto done;
  count = 0;
  for (int64_t i = 0; i < n_used; ++i) {
    const int64_t e = used[i], rows = task_rows(job, offset[e + 1] - offset[e], task_bytes);
    for (int64_t n0 = 0; n0 < N; n0 += rows) {
      tasks[count].expert = e;
      tasks[count].n0 = n0;
      tasks[count].n1 = n0 + rows < N ? n0 + rows : N;
      ++count;
    }
  }
  job->tasks = tasks;
  status = qo_cpu_parallel_for(expert_task, (size_t)count, job);
  if (status == QO_OK && job->failed) status = job->failed;
  const int64_t scatter_tasks = (pairs + QO_SCATTER_ROWS - 1) / QO_SCATTER_ROWS;
  if (status == QO_OK && pairs * N >= QO_SERIAL_BELOW)
    status = qo_cpu_parallel_for(scatter_task, (size_t)scatter_tasks, job);
  else if (status == QO_OK)
    for (int64_t i = 0; i < scatter_tasks; ++i) scatter_task(job, (size_t)i);
done:
  free(offset);
  free(order);
  free(src);
  free(fill);
  free(used);
  free(a_rows);
  free(y_rows);
  free(tasks);
  free(prep_offset);
  free(a_prep);
  return status;
}

static qo_experts_job job_of(int fmt, const void* B, int64_t b_bytes, const uint8_t* B_scale, int64_t s_bytes,
                             int64_t N, int64_t K) {
  qo_experts_job job;
  memset(&job, 0, sizeof job);
  job.fmt = fmt;
  job.N = N;
  job.K = K;
  job.B = (const uint8_t*)B;
  job.b_bytes = b_bytes;
  job.B_scale = B_scale;
  job.s_bytes = s_bytes;
  job.col_count = 1;
  return job;
}

int qo_matmul_experts_mxfp4_f32(const float* A, const int64_t* expert_ids, const uint8_t* B, const uint8_t* B_scale,
                                float* Y, int64_t T, int64_t k, int64_t a_slots, int64_t E, int64_t N, int64_t K) {
  if (K % 32 != 0 || !B_scale) return QO_ERR_ARGUMENT;
  qo_experts_job job = job_of(QO_FMT_MXFP4, B, N * K / 2, B_scale, N * K / 32, N, K);
  return run_experts(&job, A, expert_ids, Y, T, k, a_slots, E);
}

int qo_matmul_experts_nvfp4_f32(const float* A, const int64_t* expert_ids, const uint8_t* B, const uint8_t* B_scale,
                                const float* B_scale_2, float* Y, int64_t T, int64_t k, int64_t a_slots, int64_t E,
                                int64_t N, int64_t K) {
  if (K % 16 != 0 || !B_scale || !B_scale_2) return QO_ERR_ARGUMENT;
  qo_experts_job job = job_of(QO_FMT_NVFP4, B, N * K / 2, B_scale, N * K / 16, N, K);
  job.scale_2 = B_scale_2;
  return run_experts(&job, A, expert_ids, Y, T, k, a_slots, E);
}

/* The same experts with each expert's weight in 16-row tiles (qo_kernels.h, qo_matmul_mxfp4_r16_f32): B
 * [E, N/16, K/8, 64], B_scale [E, N/16, K/block, 16]; each output equals qo_matmul_*_r16_f32 on that expert. */
static int r16_experts(int nv, const float* A, const int64_t* ids, const uint8_t* B, const uint8_t* B_scale,
                       const float* B_scale_2, float* Y, int64_t T, int64_t k, int64_t a_slots, int64_t E, int64_t N,
                       int64_t K) {
  const int64_t block = nv ? 16 : 32;
  if (K % block != 0 || N % 16 != 0 || !B_scale || (nv && !B_scale_2)) return QO_ERR_ARGUMENT;
  qo_experts_job job = job_of(nv ? QO_FMT_NVFP4_R16 : QO_FMT_MXFP4_R16, B, N * K / 2, B_scale, N * K / block, N, K);
  job.scale_2 = nv ? B_scale_2 : NULL;
  return run_experts(&job, A, ids, Y, T, k, a_slots, E);
}

int qo_matmul_experts_mxfp4_r16_f32(const float* A, const int64_t* expert_ids, const uint8_t* B,
                                    const uint8_t* B_scale, float* Y, int64_t T, int64_t k, int64_t a_slots, int64_t E,
                                    int64_t N, int64_t K) {
  return r16_experts(0, A, expert_ids, B, B_scale, NULL, Y, T, k, a_slots, E, N, K);
}

int qo_matmul_experts_nvfp4_r16_f32(const float* A, const int64_t* expert_ids, const uint8_t* B,
                                    const uint8_t* B_scale, const float* B_scale_2, float* Y, int64_t T, int64_t k,
                                    int64_t a_slots, int64_t E, int64_t N, int64_t K) {
  return r16_experts(1, A, expert_ids, B, B_scale, B_scale_2, Y, T, k, a_slots, E, N, K);
}

static int scaled_experts(int fmt, const float* A, const int64_t* ids, const void* B, const float* B_scale,
                          int64_t b_scale_count, float* Y, int64_t T, int64_t k, int64_t a_slots, int64_t E, int64_t N,
                          int64_t K) {
  if (!B_scale || (b_scale_count != E && b_scale_count != E * N)) return QO_ERR_ARGUMENT;
  qo_experts_job job = job_of(fmt, B, N * K, NULL, 0, N, K);
  job.col_scale = B_scale;
  job.col_count = b_scale_count == E ? 1 : N;
  return run_experts(&job, A, ids, Y, T, k, a_slots, E);
}

int qo_matmul_experts_fp8_f32(const float* A, const int64_t* expert_ids, const uint8_t* B, const float* B_scale,
                              int64_t b_scale_count, float* Y, int64_t T, int64_t k, int64_t a_slots, int64_t E,
                              int64_t N, int64_t K) {
  return scaled_experts(QO_FMT_FP8, A, expert_ids, B, B_scale, b_scale_count, Y, T, k, a_slots, E, N, K);
}

int qo_matmul_experts_int8_f32(const float* A, const int64_t* expert_ids, const int8_t* B, const float* B_scale,
                               int64_t b_scale_count, float* Y, int64_t T, int64_t k, int64_t a_slots, int64_t E,
                               int64_t N, int64_t K) {
  return scaled_experts(QO_FMT_INT8, A, expert_ids, B, B_scale, b_scale_count, Y, T, k, a_slots, E, N, K);
}

static int int4_experts(int a8, const float* A, const int64_t* expert_ids, const uint8_t* B, const float* scales,
                        const uint8_t* zero_points, float* Y, int64_t T, int64_t k, int64_t a_slots, int64_t E,
                        int64_t N, int64_t K, int64_t block_size) {
  if (!scales || K <= 0 || block_size < 16 || (block_size & (block_size - 1))) return QO_ERR_ARGUMENT;
  const int64_t k_blocks = (K + block_size - 1) / block_size;
  qo_experts_job job = job_of(QO_FMT_INT4, B, N * k_blocks * block_size / 2, NULL, 0, N, K);
  job.scales = scales;
  job.s_count = N * k_blocks;
  job.zp = zero_points;
  job.zp_bytes = N * ((k_blocks + 1) / 2);
  job.block = block_size;
  job.a8 = a8;
  return run_experts(&job, A, expert_ids, Y, T, k, a_slots, E);
}

int qo_matmul_experts_int4_f32(const float* A, const int64_t* expert_ids, const uint8_t* B, const float* scales,
                               const uint8_t* zero_points, float* Y, int64_t T, int64_t k, int64_t a_slots, int64_t E,
                               int64_t N, int64_t K, int64_t block_size) {
  return int4_experts(0, A, expert_ids, B, scales, zero_points, Y, T, k, a_slots, E, N, K, block_size);
}

int qo_matmul_experts_int4_a8_f32(const float* A, const int64_t* expert_ids, const uint8_t* B, const float* scales,
                                  const uint8_t* zero_points, float* Y, int64_t T, int64_t k, int64_t a_slots,
                                  int64_t E, int64_t N, int64_t K, int64_t block_size) {
  return int4_experts(1, A, expert_ids, B, scales, zero_points, Y, T, k, a_slots, E, N, K, block_size);
}
