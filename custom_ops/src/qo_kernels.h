/* Plain-C ABI of the com.quark_onnx kernels. Row-major; A [M, K], Y [M, N]; weights [N, K] as the checkpoint stores
 * them (output channel major).
 *   MXFP4: B uint8 [N, K/2] (element 2j in the low nibble of byte j), B_scale uint8 e8m0 [N, K/32]; K % 32 == 0.
 *          W = e2m1 * 2^(s-127) (exact).
 *   NVFP4: B uint8 [N, K/2] e2m1 as MXFP4, B_scale float8 e4m3fn codes [N, K/16], B_scale_2 float32; K % 16 == 0.
 *          Multiplication order of Quark's NVFP4 dequantizer (builder/quant/fp4_codes.py nvfp4_block_scales, checked
 *          against Quark's frozen model): block_scale = fp32(e4m3(B_scale) * B_scale_2), rounded once, then
 *          W = e2m1 * block_scale, rounded once. The kernel computes it as (2 * e2m1) * (block_scale * 0.5), the same
 *          float32 number whenever block_scale * 0.5 is exact, i.e. unless block_scale is a float32 subnormal
 *          (< 2^-126) with its last bit set.
 *   FP8:   B float8 e4m3fn codes [N, K], B_scale float [1] or [N] (b_scale_count). Weight-only (qo_matmul_fp8):
 *          Y = (A @ f32(B)^T) * B_scale. W8A8: a_q = sat_e4m3fn(A / A_scale) with A_scale the static scale or a
 *          per-row max(max|row|/448, 1e-12) (dyn variant); Y = (a_q @ f32(B)^T) * (A_scale * B_scale).
 *          A / A_scale is a float32 division, as Quark's FP8 fake quantizer does (hw_emulation_interface.py,
 *          fake_quantize_fp8_per_tensor_with_scale / _per_channel_with_scale: `inputs / scale`); the x * fp32(1/s)
 *          form belongs to Quark's INT8 quantizer (torch.fake_quantize_per_tensor_affine), not to FP8.
 *   INT8:  B int8 [N, K], B_scale float [1] or [N]: Y = (A @ f32(B)^T) * B_scale (weight-only; an INT8 W8A8
 *          scheme's activation Q/DQ stays in standard ops before the node).
 *   BF16:  B bfloat16 bit patterns [N, K] (an lm_head as the checkpoint stores it); Y = A @ float(B).T.
 * Summation (every CPU kernel, every ISA, every M, every thread count: the same bits): per output, 8 float32 lanes,
 * lane j accumulates k = 8i + j in increasing i by fmaf (one rounding per step) from +0, the K % 8 tail elements go
 * to lanes 0.. as their last step, the lanes fold as ((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7)), then one multiplication
 * by the output's scale (row scale * column scale). Decoded weights are exact, so nothing else rounds. Details in
 * qo_cpu_kernels.c. MXFP4 rows of A that are on the MXFP4 grid (what a w_mxfp4_a_mxfp4 graph feeds) take exact
 * per-block integer dot products and their own 16-lane order instead (qo_cpu_kernels.c, "MXFP4 with A on the MXFP4
 * grid"): again the same bits on every path, M and thread count. A caller that set the MXCSR DAZ bit gets the portable path (same bits, slower): the
 * in-register route for subnormal e4m3 codes relies on denormal inputs being honoured.
 * fp16 tensors are passed as uint16_t bit patterns (A widened exactly, Y rounded to nearest even).
 * Return 0 on success, QO_ERR_* otherwise. */
#ifndef QO_KERNELS_H
#define QO_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define QO_API __declspec(dllexport)
#else
#define QO_API __attribute__((visibility("default")))
#endif

#define QO_ABI_VERSION 1
#define QO_OK 0
#define QO_ERR_ARGUMENT 1
#define QO_ERR_ALLOC 2
#define QO_ERR_DEVICE 3

QO_API int qo_abi_version(void);

/* ---- CPU (host pointers) ---- */
QO_API int qo_matmul_mxfp4_f32(const float* A, const uint8_t* B, const uint8_t* B_scale, float* Y,
                               int64_t M, int64_t N, int64_t K);
QO_API int qo_matmul_mxfp4_f16(const uint16_t* A, const uint8_t* B, const uint8_t* B_scale, uint16_t* Y,
                               int64_t M, int64_t N, int64_t K);
QO_API int qo_matmul_fp8_w8a8_f32(const float* A, const uint8_t* B, const float* B_scale, int64_t b_scale_count,
                                  float A_scale, float* Y, int64_t M, int64_t N, int64_t K);
QO_API int qo_matmul_fp8_w8a8_f16(const uint16_t* A, const uint8_t* B, const float* B_scale, int64_t b_scale_count,
                                  float A_scale, uint16_t* Y, int64_t M, int64_t N, int64_t K);
QO_API int qo_matmul_fp8_w8a8_dyn_f32(const float* A, const uint8_t* B, const float* B_scale,
                                      int64_t b_scale_count, float* Y, int64_t M, int64_t N, int64_t K);
QO_API int qo_matmul_fp8_w8a8_dyn_f16(const uint16_t* A, const uint8_t* B, const float* B_scale,
                                      int64_t b_scale_count, uint16_t* Y, int64_t M, int64_t N, int64_t K);
QO_API int qo_matmul_fp8_f32(const float* A, const uint8_t* B, const float* B_scale, int64_t b_scale_count, float* Y,
                             int64_t M, int64_t N, int64_t K);
QO_API int qo_matmul_fp8_f16(const uint16_t* A, const uint8_t* B, const float* B_scale, int64_t b_scale_count,
                             uint16_t* Y, int64_t M, int64_t N, int64_t K);
QO_API int qo_matmul_int8_f32(const float* A, const int8_t* B, const float* B_scale, int64_t b_scale_count, float* Y,
                              int64_t M, int64_t N, int64_t K);
QO_API int qo_matmul_int8_f16(const uint16_t* A, const int8_t* B, const float* B_scale, int64_t b_scale_count,
                              uint16_t* Y, int64_t M, int64_t N, int64_t K);
/* INT8 W8A8 (qo_cpu_int8_w8a8.c, which documents it): A quantized inside with Quark's int8 fake quantizer
 * (q = clamp(round_half_even(A * fp32(1/A_scale)), -128, 127)), the exact integer sum P = q @ B^T, then
 * Y = fp32(fp32(fp32(P) * A_scale) * B_scale); K <= 2^24. The same bits on every path. */
QO_API int qo_matmul_int8_w8a8_f32(const float* A, const int8_t* B, const float* B_scale, int64_t b_scale_count,
                                   float A_scale, float* Y, int64_t M, int64_t N, int64_t K);
QO_API int qo_matmul_int8_w8a8_f16(const uint16_t* A, const int8_t* B, const float* B_scale, int64_t b_scale_count,
                                   float A_scale, uint16_t* Y, int64_t M, int64_t N, int64_t K);
QO_API int qo_matmul_nvfp4_f32(const float* A, const uint8_t* B, const uint8_t* B_scale, float B_scale_2, float* Y,
                               int64_t M, int64_t N, int64_t K);
QO_API int qo_matmul_nvfp4_f16(const uint16_t* A, const uint8_t* B, const uint8_t* B_scale, float B_scale_2,
                               uint16_t* Y, int64_t M, int64_t N, int64_t K);
/* INT4 / UINT4 per group (qo_cpu_int4.c, which documents the layout and the summation order): B uint8
 * [N, ceil(K/block), block/2] (MatMulNBits' layout, even k in the low nibble), scales float [N, ceil(K/block)],
 * zero_points uint8 [N, ceil(ceil(K/block)/2)] packed uint4 or NULL (8); W = ((float)q - (float)z) * scale, rounded
 * once (Quark's dequantization); block a power of two >= 16. */
QO_API int qo_matmul_int4_f32(const float* A, const uint8_t* B, const float* scales, const uint8_t* zero_points,
                              float* Y, int64_t M, int64_t N, int64_t K, int64_t block_size);
QO_API int qo_matmul_int4_f16(const uint16_t* A, const uint8_t* B, const float* scales, const uint8_t* zero_points,
                              uint16_t* Y, int64_t M, int64_t N, int64_t K, int64_t block_size);
/* The same weight times int8-quantized activations: onnxruntime's MatMulNBits / QMoE accuracy_level 4 arithmetic
 * (MLAS CompInt8: per block, qa = round(a * 127 / amax), exact integer dots), in one float order on every CPU
 * (qo_cpu_int4_a8.c). Equal to MatMulNBits accuracy_level 4 up to float summation order. */
QO_API int qo_matmul_int4_a8_f32(const float* A, const uint8_t* B, const float* scales, const uint8_t* zero_points,
                                 float* Y, int64_t M, int64_t N, int64_t K, int64_t block_size);
/* MXFP4 / NVFP4 with the weight in 16-row tiles (qo_cpu_fp4_r16.c): the checkpoint's bytes, reordered. N % 16 == 0.
 *   B uint8 [N/16, K/8, 64]: byte 4r + i of chunk c of tile t is byte 4c + i of row 16t + r of the checkpoint's
 *     [N, K/2] (the codes of k = 8c .. 8c+7, even k in the low nibble);
 *   B_scale uint8 [N/16, K/block, 16]: the scale code of row 16t + r, block b at [t, b, r] (MXFP4 e8m0, block 32,
 *     K % 32 == 0; NVFP4 e4m3fn, block 16, K % 16 == 0, with B_scale_2).
 * Arithmetic: W = fp32(e2m1 * S) with S = 2^(e-127) (MXFP4, exact) or fp32(e4m3(code) * B_scale_2) (NVFP4: Quark's
 * order, as qo_matmul_nvfp4_f32), y = fmaf chain over k = 0 .. K-1 in increasing k from +0, nothing after; the same
 * bits on every path, M and thread count (not the 8-lane order of the checkpoint-layout kernels above). */
QO_API int qo_matmul_mxfp4_r16_f32(const float* A, const uint8_t* B, const uint8_t* B_scale, float* Y, int64_t M,
                                   int64_t N, int64_t K);
QO_API int qo_matmul_nvfp4_r16_f32(const float* A, const uint8_t* B, const uint8_t* B_scale, float B_scale_2,
                                   float* Y, int64_t M, int64_t N, int64_t K);
QO_API int qo_matmul_bf16_f32(const float* A, const uint16_t* B, float* Y, int64_t M, int64_t N, int64_t K);

/* ---- QuantizeDequantizeFp8 (qo_cpu_fp8_qdq.c): Y = DequantizeLinear(QuantizeLinear(X, scale, float8e4m3fn,
 * saturate = 1), scale), the static per-tensor FP8 activation fake quantization, n elements; the same bits as ONNX
 * Runtime's pair. ---- */
QO_API int qo_qdq_fp8_f32(const float* X, float scale, float* Y, int64_t n);

/* ---- QuantizeDequantizeMxfp4 (qo_cpu_fp4_act.c): Quark's dynamic MXFP4 activation fake quantization per block
 * of 32 (n a multiple of 32), the block scale by mode; builder/ops/mx_activation.py's subgraph bit for bit on
 * finite blocks, a non-finite block all NaN. ---- */
#define QO_MX_SCALE_EVEN 0
#define QO_MX_SCALE_FLOOR 1
#define QO_MX_SCALE_CEIL 2
QO_API int qo_qdq_mxfp4_act_f32(const float* X, float* Y, int64_t n, int mode);
/* QuantizeDequantizeNvfp4: Quark's dynamic NVFP4 activation fake quantization per block of 16 (n a multiple of 16)
 * with the static input_scale_2; the subgraph's bits on blocks without a NaN, a NaN block all NaN. */
QO_API int qo_qdq_nvfp4_act_f32(const float* X, float input_scale_2, float* Y, int64_t n);
/* the same by rows, each with its own input_scale_2 (routed experts: each chosen expert's scale): row r of Y [rows,
 * K] is row x_rows[r] of X fake-quantized with input_scale_2[s_rows[r]] (K a multiple of 16). */
QO_API int qo_qdq_nvfp4_act_rows_f32(const float* X, const int64_t* x_rows, const float* input_scale_2,
                                     const int64_t* s_rows, float* Y, int64_t rows, int64_t K);
QO_API int qo_matmul_bf16_f16(const uint16_t* A, const uint16_t* B, uint16_t* Y, int64_t M, int64_t N, int64_t K);

/* Routed experts (MatMulExperts* ops, qo_cpu_experts.c): Y [T, k, N] float32, Y[t][s] = A_row(t, s) @ W_e^T with
 * e = expert_ids[t][s] (int64 [T, k], each in [0, E)); A_row(t, s) = A[t] (a_slots 1: A [T, K]) or A[t][s]
 * (a_slots k: A [T, k, K]). W_e is expert e of a stack [E, N, ...] whose every expert has the dense op's layout and
 * arithmetic above: MXFP4 B [E, N, K/2] + B_scale [E, N, K/32]; NVFP4 B [E, N, K/2] + B_scale [E, N, K/16] +
 * B_scale_2 [E]; FP8 / INT8 B [E, N, K] + B_scale [E] (per tensor) or [E, N] (b_scale_count E or E * N). Each output
 * equals the dense op's on that expert bit for bit. */
QO_API int qo_matmul_experts_mxfp4_f32(const float* A, const int64_t* expert_ids, const uint8_t* B,
                                       const uint8_t* B_scale, float* Y, int64_t T, int64_t k, int64_t a_slots,
                                       int64_t E, int64_t N, int64_t K);
QO_API int qo_matmul_experts_nvfp4_f32(const float* A, const int64_t* expert_ids, const uint8_t* B,
                                       const uint8_t* B_scale, const float* B_scale_2, float* Y, int64_t T, int64_t k,
                                       int64_t a_slots, int64_t E, int64_t N, int64_t K);
QO_API int qo_matmul_experts_fp8_f32(const float* A, const int64_t* expert_ids, const uint8_t* B, const float* B_scale,
                                     int64_t b_scale_count, float* Y, int64_t T, int64_t k, int64_t a_slots, int64_t E,
                                     int64_t N, int64_t K);
QO_API int qo_matmul_experts_int8_f32(const float* A, const int64_t* expert_ids, const int8_t* B, const float* B_scale,
                                      int64_t b_scale_count, float* Y, int64_t T, int64_t k, int64_t a_slots, int64_t E,
                                      int64_t N, int64_t K);
/* FP4 experts with each expert's weight in 16-row tiles (MatMulExpertsMxfp4R16 / MatMulExpertsNvfp4R16): B uint8
 * [E, N/16, K/8, 64], B_scale [E, N/16, K/block, 16] (each expert in qo_matmul_*_r16_f32's layout), NVFP4 B_scale_2
 * [E]; N % 16 == 0. Each output equals qo_matmul_*_r16_f32 on that expert bit for bit. */
QO_API int qo_matmul_experts_mxfp4_r16_f32(const float* A, const int64_t* expert_ids, const uint8_t* B,
                                           const uint8_t* B_scale, float* Y, int64_t T, int64_t k, int64_t a_slots,
                                           int64_t E, int64_t N, int64_t K);
QO_API int qo_matmul_experts_nvfp4_r16_f32(const float* A, const int64_t* expert_ids, const uint8_t* B,
                                           const uint8_t* B_scale, const float* B_scale_2, float* Y, int64_t T,
                                           int64_t k, int64_t a_slots, int64_t E, int64_t N, int64_t K);
/* 4-bit integer experts (MatMulExpertsUint4 / MatMulExpertsInt4): B uint8 [E, N, ceil(K/block), block/2], scales
 * float [E, N, ceil(K/block)], zero_points uint8 [E, N, ceil(ceil(K/block)/2)] or NULL (8): each expert in
 * qo_matmul_int4_f32's layout and arithmetic (its 32-lane order, not the 8-lane one above). */
QO_API int qo_matmul_experts_int4_f32(const float* A, const int64_t* expert_ids, const uint8_t* B, const float* scales,
                                      const uint8_t* zero_points, float* Y, int64_t T, int64_t k, int64_t a_slots,
                                      int64_t E, int64_t N, int64_t K, int64_t block_size);
/* The same experts times int8-quantized activations (accuracy_level 4: qo_matmul_int4_a8_f32's arithmetic). */
QO_API int qo_matmul_experts_int4_a8_f32(const float* A, const int64_t* expert_ids, const uint8_t* B,
                                         const float* scales, const uint8_t* zero_points, float* Y, int64_t T,
                                         int64_t k, int64_t a_slots, int64_t E, int64_t N, int64_t K,
                                         int64_t block_size);

/* Grouped-query attention with rotary embedding and a KV cache, one summation order on every CPU (com.quark_onnx
 * GroupQueryAttentionFixedOrder; semantics and arithmetic in qo_cpu_attention.c). q [B, S, H*D], k / v [B, S, Hkv*D],
 * past_k / past_v [B, Hkv, P, D], present_k / present_v [B, Hkv, T, D] (the past buffers themselves when the
 * caller shares them: then T == P), seqlens_k int32 [B] (total length - 1), cos / sin [max_positions, R] (rotary
 * on the first 2R dims, half split), out [B, S, H*D]; scale 0: 1/sqrt(D); local_window <= 0: none; head_sink: each
 * head's sink logit (one more softmax column, dropped after; GroupQueryAttentionFixedOrderSinks) or NULL. */
QO_API int qo_gqa_fixed_order_f32(const float* q, const float* k, const float* v, const float* past_k,
                                  const float* past_v, int64_t P, float* present_k, float* present_v, int64_t T,
                                  const int32_t* seqlens_k, int64_t total_sequence_length, const float* cos_cache,
                                  const float* sin_cache, int64_t max_positions, int64_t R, float* out, int64_t B,
                                  int64_t S, int64_t H, int64_t Hkv, int64_t D, float scale, int64_t local_window,
                                  const float* head_sink /* [H] or NULL */);

/* ---- CPU parallel loop (not exported: for the ORT layer in the same library). By default the CPU kernels split
 * their work with OpenMP; a runner set on the calling thread replaces that, e.g. with ORT's intra-op thread pool
 * (KernelContext_ParallelFor), so that ORT's and OpenMP's threads never compete for the same cores. run() calls
 * task(data, i) for every i in [0, total) and returns QO_OK once all returned. NULL restores OpenMP. ---- */
typedef void (*qo_task_fn)(void* data, size_t index);
typedef struct {
  int (*run)(void* context, qo_task_fn task, size_t total, void* data);
  void* context;
} qo_parallel_runner;
void qo_cpu_set_parallel_runner(const qo_parallel_runner* runner);
/* The runner's loop (or OpenMP's without one) for other CPU sources of the library. */
int qo_cpu_parallel_for(qo_task_fn task, size_t total, void* data);

/* ---- CPU, internal (not exported; for qo_cpu_experts.c): weight rows [n0, n1) of ONE compact weight for M activation
 * rows A [M, K], on the calling thread, with the qo_matmul_* kernels' summation order (so each output equals theirs
 * bit for bit); Y [M, N] row-major, only columns n0..n1-1 written. B / B_scale as the dense ops take them; B_scale_2:
 * NVFP4's global scale; col_scale [col_scale_count] (1 or N, FP8/INT8) or NULL. ---- */
enum { QO_FMT_FP8 = 0, QO_FMT_INT8 = 1, QO_FMT_MXFP4 = 3, QO_FMT_NVFP4 = 4, QO_FMT_INT4 = 5 };
int qo_cpu_weight_rows_f32(int fmt, const float* A, int64_t M, int64_t N, int64_t K, const uint8_t* B,
                           const uint8_t* B_scale, float B_scale_2, const float* col_scale, int64_t col_scale_count,
                           int fp8_a_range, int fp8_nan_free, int64_t n0, int64_t n1, float* Y);
/* FP8: whether A's count elements (rows of K) let the AVX2 GEMV take its fp16 route (qo_cpu_kernels.c,
 * fp8_half_range). A caller running many blocks of weight rows on the same activations checks them once and passes
 * the answer as fp8_a_range (1 / 0) instead of -1 (checked in every call); the outputs are the same either way. */
int qo_cpu_fp8_half_range(const float* A, int64_t count, int64_t K);
/* FP8 weights known to hold no NaN code (e4m3fn 0x7F / 0xFF). The ORT layer scans a constant weight once, when the
 * kernel is created (qo_cpu_fp8_codes_nan_free: 1 when none of count bytes is a NaN code), and sets the answer on the
 * calling thread for the duration of each call (qo_cpu_set_fp8_weight_nan_free; 0, the default, again after). With
 * 1 the AVX2 FP8 GEMV's fp16 route skips its running test for NaN codes (avx_fp8_half_steps); the outputs are the
 * same either way for such a weight. fp8_nan_free of qo_cpu_weight_rows_f32: the same, passed by its caller. */
int qo_cpu_fp8_codes_nan_free(const uint8_t* B, int64_t count);
void qo_cpu_set_fp8_weight_nan_free(int nan_free);
int qo_cpu_fp8_weight_nan_free(void);
/* The 16-row-tile FP4 kernel (qo_cpu_fp4_r16.c) on tiles [n0 / 16, n1 / 16) of one weight, on the calling thread: the
 * outputs of qo_matmul_{mxfp4,nvfp4}_r16_f32 bit for bit (nv: NVFP4, else MXFP4; n0 and n1 multiples of 16). */
enum { QO_FMT_MXFP4_R16 = 6, QO_FMT_NVFP4_R16 = 7 };
int qo_cpu_fp4_r16_rows_f32(int nv, const float* A, int64_t M, int64_t N, int64_t K, const uint8_t* B,
                            const uint8_t* B_scale, float B_scale_2, int64_t n0, int64_t n1, float* Y);
/* MXFP4 with A prepared once (qo_cpu_kernels.c's block-integer path checks each A row for the MXFP4 grid):
 * qo_cpu_mxfp4_prepared_floats(M, K) floats written by qo_cpu_mxfp4_prepare_a, then any number of
 * qo_cpu_mxfp4_rows_f32 calls on those rows: the same outputs as qo_cpu_weight_rows_f32(QO_FMT_MXFP4, ...). */
int64_t qo_cpu_mxfp4_prepared_floats(int64_t M, int64_t K);
void qo_cpu_mxfp4_prepare_a(const float* A, int64_t M, int64_t K, float* prepared);
int qo_cpu_mxfp4_rows_f32(const float* A, const float* prepared, int64_t M, int64_t N, int64_t K, const uint8_t* B,
                          const uint8_t* B_scale, int64_t n0, int64_t n1, float* Y);
/* The same for a 4-bit weight (qo_cpu_int4.c; QO_FMT_INT4 is not a qo_cpu_weight_rows_f32 format): B / scales /
 * zero_points as qo_matmul_int4_f32 takes them. `path`: qo_cpu_int4_path(block), read once per call of the op
 * (QO_CPU_KERNELS and QO_AVX2_HALVES are read there, not once per task) and passed to the three others. Its SIMD paths read A prepared
 * once per A (the rows reordered for their lanes): qo_cpu_int4_prepared_floats floats (0: the path reads A itself,
 * A [M, K] then, and prepared may be NULL; otherwise A may be NULL), written by qo_cpu_int4_prepare_a from the rows
 * A + rows[m] * K (rows NULL: A + m * K). */
int qo_cpu_int4_path(int64_t block_size);
int64_t qo_cpu_int4_prepared_floats(int path, int64_t M, int64_t K, int64_t block_size);
void qo_cpu_int4_prepare_a(int path, const float* A, const int64_t* rows, int64_t M, int64_t K, int64_t block_size,
                           float* prepared);
int qo_cpu_int4_rows_f32(int path, const float* A, const float* prepared, int64_t M, int64_t N, int64_t K,
                         const uint8_t* B, const float* scales, const uint8_t* zero_points, int64_t block_size,
                         int64_t n0, int64_t n1, float* Y);
/* The int8-activation form of the same (qo_cpu_int4_a8.c): qo_cpu_int4a8_path(block) once per call, A prepared
 * (qo_cpu_int4a8_prepared_floats floats, 64-byte aligned; each row's share is a multiple of 16 floats) by
 * qo_cpu_int4a8_prepare_a from the rows A + rows[m] * K (rows NULL: A + m * K), then any blocks of weight rows. */
int qo_cpu_int4a8_path(int64_t block_size);
int64_t qo_cpu_int4a8_prepared_floats(int64_t M, int64_t K, int64_t block_size);
void qo_cpu_int4a8_prepare_a(const float* A, const int64_t* rows, int64_t M, int64_t K, int64_t block_size,
                             float* prepared);
int qo_cpu_int4a8_rows_f32(int path, const float* prepared, int64_t M, int64_t N, int64_t K, const uint8_t* B,
                           const float* scales, const uint8_t* zero_points, int64_t block_size, int64_t n0, int64_t n1,
                           float* Y);

/* ---- GPU (CUDA or HIP, whichever the library was built for; all pointers are device pointers, `stream` is a
 * cudaStream_t / hipStream_t or NULL). A_scale is a device pointer to one float. The dyn variant needs a device
 * workspace of M floats (row_scale_workspace) and writes the per-row scales there. Launch is asynchronous. ---- */
QO_API const char* qo_gpu_backend(void);
/* Stream-ordered device scratch memory (cudaMallocAsync; plain hipMalloc on HIP). NULL on failure. */
QO_API void* qo_gpu_workspace_alloc(int64_t bytes, void* stream);
QO_API void qo_gpu_workspace_free(void* p, void* stream);
QO_API int qo_gpu_matmul_mxfp4_f32(const float* A, const uint8_t* B, const uint8_t* B_scale, float* Y,
                                   int64_t M, int64_t N, int64_t K, void* stream);
QO_API int qo_gpu_matmul_mxfp4_f16(const uint16_t* A, const uint8_t* B, const uint8_t* B_scale, uint16_t* Y,
                                   int64_t M, int64_t N, int64_t K, void* stream);
QO_API int qo_gpu_matmul_fp8_w8a8_f32(const float* A, const uint8_t* B, const float* B_scale, int64_t b_scale_count,
                                      const float* A_scale, float* Y, int64_t M, int64_t N, int64_t K, void* stream);
QO_API int qo_gpu_matmul_fp8_w8a8_f16(const uint16_t* A, const uint8_t* B, const float* B_scale,
                                      int64_t b_scale_count, const float* A_scale, uint16_t* Y,
                                      int64_t M, int64_t N, int64_t K, void* stream);
QO_API int qo_gpu_matmul_fp8_w8a8_dyn_f32(const float* A, const uint8_t* B, const float* B_scale,
                                          int64_t b_scale_count, float* row_scale_workspace, float* Y,
                                          int64_t M, int64_t N, int64_t K, void* stream);
QO_API int qo_gpu_matmul_fp8_w8a8_dyn_f16(const uint16_t* A, const uint8_t* B, const float* B_scale,
                                          int64_t b_scale_count, float* row_scale_workspace, uint16_t* Y,
                                          int64_t M, int64_t N, int64_t K, void* stream);
/* Weight-only formats (issue #22's ops; the GPU twins of the CPU kernels, same arguments plus the stream):
 *   FP8:   B float8 e4m3fn codes [N, K], B_scale float [1] or [N]: Y = A @ (float(B) * B_scale)^T.
 *   INT8:  B int8 [N, K], B_scale float [1] or [N]: Y = A @ (float(B) * B_scale)^T.
 *   NVFP4: B uint8 [N, K/2] e2m1 (element 2j = low nibble of byte j), B_scale float8 e4m3fn [N, K/16] (device),
 *          B_scale_2 float (a host value); K % 16 == 0. W = e2m1 * (float32(B_scale) * B_scale_2): the block scale
 *          times the global scale is rounded to float32 first, then multiplies the element. That is the order of
 *          Quark's own dequantizer (amd-quark 0.13, quark/torch/export/nn/modules/realquantizer.py,
 *          SequentialRealQuantizer.forward, real_quantized branch: the fp8 scale stage dequantizes the block scale,
 *          `scale * weight_scale_2` in float32 (hw_emulation_interface.py dequantize_fp8_per_tensor_with_scale),
 *          then the fp4 stage computes `codes * scale` (dequantize_fp4_fp6_per_group)).
 *   BF16:  B bfloat16 bit patterns [N, K]: Y = A @ float(B)^T (GPU: no fixed summation order across devices).
 * The per-tensor / per-channel B_scale multiplies the float32 sum (epilogue); block scales multiply on decode. */
QO_API int qo_gpu_matmul_fp8_f32(const float* A, const uint8_t* B, const float* B_scale, int64_t b_scale_count,
                                 float* Y, int64_t M, int64_t N, int64_t K, void* stream);
QO_API int qo_gpu_matmul_fp8_f16(const uint16_t* A, const uint8_t* B, const float* B_scale, int64_t b_scale_count,
                                 uint16_t* Y, int64_t M, int64_t N, int64_t K, void* stream);
QO_API int qo_gpu_matmul_int8_f32(const float* A, const int8_t* B, const float* B_scale, int64_t b_scale_count,
                                  float* Y, int64_t M, int64_t N, int64_t K, void* stream);
QO_API int qo_gpu_matmul_int8_f16(const uint16_t* A, const int8_t* B, const float* B_scale, int64_t b_scale_count,
                                  uint16_t* Y, int64_t M, int64_t N, int64_t K, void* stream);
QO_API int qo_gpu_matmul_nvfp4_f32(const float* A, const uint8_t* B, const uint8_t* B_scale, float B_scale_2,
                                   float* Y, int64_t M, int64_t N, int64_t K, void* stream);
QO_API int qo_gpu_matmul_nvfp4_f16(const uint16_t* A, const uint8_t* B, const uint8_t* B_scale, float B_scale_2,
                                   uint16_t* Y, int64_t M, int64_t N, int64_t K, void* stream);
QO_API int qo_gpu_matmul_bf16_f32(const float* A, const uint16_t* B, float* Y, int64_t M, int64_t N, int64_t K,
                                  void* stream);
QO_API int qo_gpu_matmul_bf16_f16(const uint16_t* A, const uint16_t* B, uint16_t* Y, int64_t M, int64_t N, int64_t K,
                                  void* stream);

#ifdef __cplusplus
}
#endif

#endif /* QO_KERNELS_H */
