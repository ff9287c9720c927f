/* The prefill kernel of MatMulUint4 / MatMulInt4 (qo_cpu_int4_panel.c), called by qo_cpu_int4.c for M above its
 * GEMV rows. Internal to the library. */
#ifndef QO_CPU_INT4_PANEL_H
#define QO_CPU_INT4_PANEL_H

#include <stdint.h>

enum { I4_PORTABLE = 0, I4_AVX2 = 1, I4_AVX512 = 2 };

/* one 4-bit weight in MatMulNBits' bytes (qo_cpu_int4.c's header comment) */
typedef struct {
  const uint8_t* B;
  const float* scales;
  const uint8_t* zp; /* NULL: 8 */
  int64_t N, K, Kc;  /* Kc: K rounded up to the block (a multiple of 32 on the SIMD paths) */
  int64_t block, k_blocks, row_bytes, zp_row_bytes;
} i4_weight;

/* weight rows per panel: a task's rows are a multiple of it, but for the weight's last */
#define I4_PANEL_N 32

/* M activation rows (row m at A + (src ? src[m] : m) * K) in the panel kernel's layout, M * Kc floats: per tile of
 * qo_i4_panel_mr(path) rows (the last tile the rest), [k mod 32][k / 32][row of the tile], zero past K. */
void qo_i4_panel_pack_a(int path, const float* A, const int64_t* src, int64_t M, int64_t K, int64_t Kc, float* out);
/* the same, one tile (t < qo_i4_panel_tiles(path, M)) at a time: for a parallel pack */
int64_t qo_i4_panel_tiles(int path, int64_t M);
void qo_i4_panel_pack_tile(int path, const float* A, const int64_t* src, int64_t M, int64_t K, int64_t Kc,
                           int64_t tile, float* out);

/* Y[m * ldy + n] for n in [n0, n1) and every m < M, from A packed by qo_i4_panel_pack_a; 0, or QO_ERR_ALLOC when
 * the thread's panel buffer cannot be had. path: I4_AVX2 or I4_AVX512. */
int qo_i4_panel_rows(int path, const i4_weight* w, const float* packed_a, int64_t M, int64_t n0, int64_t n1,
                     float* Y, int64_t ldy);

#endif
