/* A stand-alone copy of the exact 4-bit AVX2 GEMV step (custom_ops/src/qo_cpu_int4.c, gemv_avx2_chunk at M = 1:
 * 32 weights of one row a chunk, 4 accumulators) and variants with one part removed or reorganised, to find what
 * bounds it on a CPU. 128 rows x 4096 (g32; the weight, 256 KiB, in L2), one thread, cycles per chunk at the clock
 * measured by a chain of dependent adds (as benchmarks/x86_op_throughput.c does). Every variant's accumulators all
 * reach the printed sum, so no part is dead code.
 *
 *     cc -O3 -mavx2 -mfma -ffp-contract=off benchmarks/int4_avx2_chunk_ablation.c -o /tmp/i4abl && /tmp/i4abl
 *
 * Not a test and not run by CI; results are quoted in custom_ops/README.md ("The AVX2 path on an AVX2-only CPU" and
 * "The exact 4-bit GEMV on 128-bit registers on Zen 1, and two other decodes"). The variants without the multiplication, the shuffle or the
 * conversion compute other numbers: timings only. Two variants are whole other decodes:
 *   - "fma decode": the weight's float built from its bits with no conversion (0x3F00 | q as the top half of a float
 *     is 0.5 + q / 256), then W = fma(M, 256 s, -(128 + z) s). That is (q - z) * s exactly, the shipped value, when
 *     s has at most 16 significant bits (a bf16 or fp16 scale, as Quark exports them from bf16 / fp16 models;
 *     checked for every q, z and 200,000 such scales of each kind, signed zeros aside).
 *   - "int16 x 2 limbs": block floating point activations, two int16 limbs per element (31 bits against the
 *     chunk's largest), times (q - z) as int16 by vpmaddwd, summed exactly as integers, then converted and
 *     scaled per chunk: more accurate than fp32 but not the kernel's order, so other bits. */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NCH 128 /* chunks per row: K = 4096 */
#define ROWS 128
#define CALLS 250

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

typedef struct {
  __m256i take[4];   /* the shipped vpshufb controls: bytes 4q..4q+3 of each lane to the top byte of its dwords */
  __m256i takelo[4]; /* the same bytes to the low byte of the dwords (the conversion-free decode) */
  __m256i shift, m4, magic, c3f;
} consts;

typedef struct {
  consts k;
  const uint8_t* B;  /* ROWS x NCH x 16 bytes */
  const uint32_t* zb; /* per chunk: z in every byte (the shipped table) */
  const float* zf;    /* per chunk: 2^23 + z */
  const float* s;     /* per chunk: the scale */
  const float* a;     /* NCH x 32 activations */
  const float* s256;  /* per chunk: 256 s (the fma decode) */
  const float* c128;  /* per chunk: (128 + z) s (the fma decode) */
  const int* zi;      /* per chunk: z */
  const int16_t* a16; /* per chunk: the int16 limbs, [hi even | hi odd | lo even | lo odd] x 16 */
} input;

static float sum4(const __m256 acc[4]) {
  float o[8];
  _mm256_storeu_ps(o, _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  return o[0] + o[7];
}

/* chunk c's 16 bytes: low nibbles in the low lane, high nibbles in the high lane */
#define RAW_SRLV \
  const __m256i nib = _mm256_and_si256(_mm256_srlv_epi32(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(p + 16 * c))), k->shift), k->m4);
#define RAW_INSERT                                                   \
  const __m128i x = _mm_loadu_si128((const __m128i*)(p + 16 * c)); \
  const __m256i nib = _mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(x), _mm_srli_epi16(x, 4), 1), k->m4);
#define QZ_S                                                                   \
  const __m256i d = _mm256_sub_epi8(nib, _mm256_set1_epi32((int)in->zb[c])); \
  const __m256 sv = _mm256_broadcast_ss(in->s + c);
/* the shipped weight vector q: (q - z) * 2^24 converted, times s (s * 2^-24 in the kernel: same cost) */
#define W_SHIPPED _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_shuffle_epi8(d, k->take[q])), sv)

/* one row at a time, 4 accumulators: PREP once per chunk, then acc[q] = STEP for q < 4 (av: the activations) */
#define ROW_VARIANT(NAME, PREP, STEP)                                                                 \
  __attribute__((noinline)) static float NAME(const input* in) {                                      \
    const consts* k = &in->k; (void)k;                                                              \
    float out = 0;                                                                                    \
    for (int r = 0; r < ROWS; r++) {                                                                  \
      __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()}; \
      const uint8_t* p = in->B + (size_t)r * NCH * 16;                                                \
      (void)p;                                                                                        \
      for (int c = 0; c < NCH; c++) {                                                                 \
        PREP                                                                                          \
        for (int q = 0; q < 4; q++) {                                                                 \
          const __m256 av = _mm256_loadu_ps(in->a + 32 * c + 8 * q);                                  \
          (void)av;                                                                                   \
          acc[q] = STEP;                                                                              \
        }                                                                                             \
      }                                                                                               \
      out += sum4(acc);                                                                               \
    }                                                                                                 \
    return out;                                                                                       \
  }

ROW_VARIANT(shipped, RAW_SRLV QZ_S, _mm256_fmadd_ps(av, W_SHIPPED, acc[q]))
ROW_VARIANT(no_srlv, RAW_INSERT QZ_S, _mm256_fmadd_ps(av, W_SHIPPED, acc[q]))
ROW_VARIANT(no_conversion,
            RAW_INSERT const __m256 zv = _mm256_broadcast_ss(in->zf + c); const __m256 sv = _mm256_broadcast_ss(in->s + c);,
            _mm256_fmadd_ps(av,
                            _mm256_mul_ps(_mm256_sub_ps(_mm256_castsi256_ps(_mm256_or_si256(
                                                            _mm256_shuffle_epi8(nib, k->takelo[q]), k->magic)),
                                                        zv),
                                          sv),
                            acc[q]))
ROW_VARIANT(fma_only, const __m256 sv = _mm256_broadcast_ss(in->s + c);, _mm256_fmadd_ps(av, sv, acc[q]))
ROW_VARIANT(no_mul, RAW_SRLV QZ_S,
            _mm256_fmadd_ps(av, _mm256_cvtepi32_ps(_mm256_shuffle_epi8(d, k->take[q])), acc[q]); (void)sv)
ROW_VARIANT(no_shuffle, RAW_SRLV QZ_S,
            _mm256_fmadd_ps(av, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(d, k->take[q])), sv), acc[q]))
ROW_VARIANT(no_a_loads, RAW_SRLV QZ_S, _mm256_fmadd_ps(sv, W_SHIPPED, acc[q]))
ROW_VARIANT(shuffle_convert_add, RAW_SRLV QZ_S,
            _mm256_add_ps(_mm256_cvtepi32_ps(_mm256_shuffle_epi8(d, k->take[q])), acc[q]); (void)sv)

/* the shipped step on 128-bit registers: 8 accumulators (the low and the high halves of the 4 ymm ones); the AVX2
 * M = 1 GEMV's form on AMD Zen 1 / Zen+ since 2026-12-06 (qo_cpu_int4.c, gemv_avx2_chunk_x) */
__attribute__((noinline)) static float shipped_xmm(const input* in) {
  float out = 0;
  const __m128i m4 = _mm_set1_epi8(15);
  __m128i take[4];
  for (int q = 0; q < 4; q++) take[q] = _mm256_castsi256_si128(in->k.take[q]);
  for (int r = 0; r < ROWS; r++) {
    __m128 acc[8];
    for (int i = 0; i < 8; i++) acc[i] = _mm_setzero_ps();
    const uint8_t* p = in->B + (size_t)r * NCH * 16;
    for (int c = 0; c < NCH; c++) {
      const __m128i x = _mm_loadu_si128((const __m128i*)(p + 16 * c));
      const __m128i zv = _mm_set1_epi32((int)in->zb[c]);
      const __m128i dl = _mm_sub_epi8(_mm_and_si128(x, m4), zv);
      const __m128i dh = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(x, 4), m4), zv);
      const __m128 sv = _mm_broadcast_ss(in->s + c);
      for (int q = 0; q < 4; q++) {
        const __m128 wl = _mm_mul_ps(_mm_cvtepi32_ps(_mm_shuffle_epi8(dl, take[q])), sv);
        const __m128 wh = _mm_mul_ps(_mm_cvtepi32_ps(_mm_shuffle_epi8(dh, take[q])), sv);
        acc[2 * q] = _mm_fmadd_ps(_mm_loadu_ps(in->a + 32 * c + 8 * q), wl, acc[2 * q]);
        acc[2 * q + 1] = _mm_fmadd_ps(_mm_loadu_ps(in->a + 32 * c + 8 * q + 4), wh, acc[2 * q + 1]);
      }
    }
    __m128 t = _mm_add_ps(_mm_add_ps(_mm_add_ps(acc[0], acc[1]), _mm_add_ps(acc[2], acc[3])),
                          _mm_add_ps(_mm_add_ps(acc[4], acc[5]), _mm_add_ps(acc[6], acc[7])));
    float o[4];
    _mm_storeu_ps(o, t);
    out += o[0] + o[3];
  }
  return out;
}

/* the fma decode: vector q of the chunk is bytes 4q..4q+3 of each lane (the shipped order), as 0x3F00 | nibble in
 * the top half of a dword (0.5 + q / 256), then W = fma(M, 256 s, -(128 + z) s) */
#define UNPACK_M(NIB)                                                                                   \
  const __m256i wlo = _mm256_unpacklo_epi8(NIB, k->c3f), whi = _mm256_unpackhi_epi8(NIB, k->c3f);     \
  const __m256i zz = _mm256_setzero_si256();                                                            \
  __m256 M[4];                                                                                          \
  M[0] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zz, wlo));                                           \
  M[1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zz, wlo));                                           \
  M[2] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zz, whi));                                           \
  M[3] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zz, whi));                                           \
  const __m256 S = _mm256_broadcast_ss(in->s256 + c), C = _mm256_broadcast_ss(in->c128 + c);
ROW_VARIANT(fma_decode, RAW_SRLV UNPACK_M(nib), _mm256_fmadd_ps(av, _mm256_fmsub_ps(M[q], S, C), acc[q]))
ROW_VARIANT(fma_decode_insert, RAW_INSERT UNPACK_M(nib), _mm256_fmadd_ps(av, _mm256_fmsub_ps(M[q], S, C), acc[q]))

/* int16 (q - z) times the activations as two int16 limbs (vpmaddwd), exact integer sums per chunk, then
 * hi * 2^16 + lo converted and times the chunk's scale (the limbs' power of two folded in: timing only here) */
__attribute__((noinline)) static float bfp16x2(const input* in) {
  float out = 0;
  const __m256i m4w = _mm256_set1_epi16(15);
  for (int r = 0; r < ROWS; r++) {
    __m256 acc = _mm256_setzero_ps();
    const uint8_t* p = in->B + (size_t)r * NCH * 16;
    for (int c = 0; c < NCH; c++) {
      const __m256i w16 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(p + 16 * c)));
      const __m256i zw = _mm256_set1_epi16((short)in->zi[c]);
      const __m256i lo = _mm256_sub_epi16(_mm256_and_si256(w16, m4w), zw); /* even k */
      const __m256i hi = _mm256_sub_epi16(_mm256_srli_epi16(w16, 4), zw);  /* odd k */
      const __m256i* al = (const __m256i*)(in->a16 + 64 * c);
      const __m256i sh = _mm256_add_epi32(_mm256_madd_epi16(lo, _mm256_load_si256(al)),
                                          _mm256_madd_epi16(hi, _mm256_load_si256(al + 1)));
      const __m256i sl = _mm256_add_epi32(_mm256_madd_epi16(lo, _mm256_load_si256(al + 2)),
                                          _mm256_madd_epi16(hi, _mm256_load_si256(al + 3)));
      const __m256 t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sh), _mm256_set1_ps(65536.0f), _mm256_cvtepi32_ps(sl));
      acc = _mm256_fmadd_ps(t, _mm256_broadcast_ss(in->s + c), acc);
    }
    const __m256 a4[4] = {acc, _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    out += sum4(a4);
  }
  return out;
}

/* the shipped decode, software-pipelined one chunk ahead */
__attribute__((noinline)) static float pipelined(const input* in) {
  const consts* k = &in->k;
  float out = 0;
  for (int r = 0; r < ROWS; r++) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    const uint8_t* p = in->B + (size_t)r * NCH * 16;
    __m256 w[4], wn[4];
/* the weight vectors of chunk c into W */
#define DECODE(W)                                 \
  {                                               \
    RAW_SRLV QZ_S                                 \
    for (int q = 0; q < 4; q++) W[q] = W_SHIPPED; \
  }
    {
      const int c = 0;
      DECODE(w)
    }
    for (int c = 0; c < NCH; c++) {
      if (c + 1 < NCH) {
        const int next = c + 1;
        {
          const int c = next;
          DECODE(wn)
        }
      } else {
        for (int q = 0; q < 4; q++) wn[q] = _mm256_setzero_ps();
      }
      for (int q = 0; q < 4; q++) acc[q] = _mm256_fmadd_ps(_mm256_loadu_ps(in->a + 32 * c + 8 * q), w[q], acc[q]);
      memcpy(w, wn, sizeof w);
    }
#undef DECODE
    out += sum4(acc);
  }
  return out;
}

/* the shipped decode, two rows interleaved (independent decode streams; both rows use the same zero points and
 * scales here) */
__attribute__((noinline)) static float two_rows(const input* in) {
  const consts* k = &in->k;
  float out = 0;
  for (int r = 0; r < ROWS; r += 2) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    __m256 acc1[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    const uint8_t* p = in->B + (size_t)r * NCH * 16;
    const uint8_t* p1 = p + NCH * 16;
    for (int c = 0; c < NCH; c++) {
      RAW_SRLV QZ_S
      const __m256i d1 = _mm256_sub_epi8(
          _mm256_and_si256(_mm256_srlv_epi32(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(p1 + 16 * c))), k->shift), k->m4),
          _mm256_set1_epi32((int)in->zb[c]));
      for (int q = 0; q < 4; q++) {
        const __m256 av = _mm256_loadu_ps(in->a + 32 * c + 8 * q);
        acc[q] = _mm256_fmadd_ps(av, W_SHIPPED, acc[q]);
        acc1[q] = _mm256_fmadd_ps(av, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_shuffle_epi8(d1, k->take[q])), sv), acc1[q]);
      }
    }
    out += sum4(acc) + sum4(acc1);
  }
  return out;
}

static double clock_ghz(void) {
  double best = 0;
  for (int r = 0; r < 3; ++r) {
    unsigned long long x = 0;
    const long n = 50000000;
    const double t0 = now();
    for (long i = 0; i < n; ++i)
      __asm__ volatile("add $1,%0\n add $1,%0\n add $1,%0\n add $1,%0\n add $1,%0\n add $1,%0\n add $1,%0\n add $1,%0" : "+r"(x));
    const double g = 8.0 * n / (now() - t0) / 1e9;
    if (g > best) best = g;
  }
  return best;
}

int main(void) {
  input in;
  for (int q = 0; q < 4; q++) {
    int8_t t[32], u[32];
    for (int i = 0; i < 32; i++) {
      const int8_t byte = (int8_t)(4 * q + ((i & 15) >> 2));
      t[i] = (i & 3) == 3 ? byte : -128;
      u[i] = (i & 3) == 0 ? byte : -128;
    }
    memcpy(&in.k.take[q], t, 32);
    memcpy(&in.k.takelo[q], u, 32);
  }
  in.k.shift = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
  in.k.m4 = _mm256_set1_epi8(15);
  in.k.magic = _mm256_set1_epi32(0x4B000000);
  in.k.c3f = _mm256_set1_epi8(0x3F);
  uint8_t* B = aligned_alloc(64, ROWS * NCH * 16);
  uint32_t* zb = aligned_alloc(64, NCH * 4);
  float* zf = aligned_alloc(64, NCH * 4);
  float* s = aligned_alloc(64, NCH * 4);
  float* a = aligned_alloc(64, NCH * 32 * 4);
  for (int i = 0; i < ROWS * NCH * 16; i++) B[i] = (uint8_t)rand();
  for (int c = 0; c < NCH; c++) {
    const int z = rand() % 16;
    zb[c] = 0x01010101u * (uint32_t)z;
    zf[c] = 0x1p23f + (float)z;
    s[c] = 0.001f + (float)(rand() % 100) * 1e-4f;
  }
  for (int i = 0; i < NCH * 32; i++) a[i] = 1.0f / (float)(1 + i);
  float* s256 = aligned_alloc(64, NCH * 4);
  float* c128 = aligned_alloc(64, NCH * 4);
  int* zi = aligned_alloc(64, NCH * 4);
  int16_t* a16 = aligned_alloc(64, NCH * 64 * 2);
  for (int c = 0; c < NCH; c++) {
    zi[c] = (int)(zb[c] & 15);
    s256[c] = 256.0f * s[c];
    c128[c] = (128.0f + (float)zi[c]) * s[c];
  }
  for (int i = 0; i < NCH * 64; i++) a16[i] = (int16_t)(rand() - RAND_MAX / 2);
  in.B = B, in.zb = zb, in.zf = zf, in.s = s, in.a = a;
  in.s256 = s256, in.c128 = c128, in.zi = zi, in.a16 = a16;

  static const struct {
    const char* name;
    float (*fn)(const input*);
  } variants[] = {
      {"as shipped (256-bit)", shipped},
      {"as shipped on 128-bit registers (Zen 1 / Zen+)", shipped_xmm},
      {"fma decode (0x3F00 | q, then fmsub; no conversion)", fma_decode},
      {"fma decode, xmm shift + insert", fma_decode_insert},
      {"int16 x 2 limbs, vpmaddwd (other bits)", bfp16x2},
      {"no vpsrlvd (xmm shift + insert)", no_srlv},
      {"no vpsrlvd, no conversion (2^23 + q - (2^23 + z))", no_conversion},
      {"FMA and A loads only", fma_only},
      {"software-pipelined one chunk ahead", pipelined},
      {"two rows interleaved", two_rows},
      {"no multiplication by s", no_mul},
      {"no vpshufb", no_shuffle},
      {"no A loads", no_a_loads},
      {"vpshufb + conversion + add only", shuffle_convert_add},
  };
  const double ghz = clock_ghz();
  printf("clock: %.2f GHz (dependent adds)\n", ghz);
  for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
    float (*volatile fn)(const input*) = variants[v].fn; /* called through a volatile pointer: never hoisted */
    double best = 1e9;
    float sum = 0;
    for (int t = 0; t < 7; t++) {
      const double t0 = now();
      for (int i = 0; i < CALLS; i++) sum += fn(&in);
      const double d = now() - t0;
      if (d < best) best = d;
    }
    printf("%-52s %6.2f cycles/chunk (%g)\n", variants[v].name, best * ghz * 1e9 / ((double)CALLS * ROWS * NCH), sum);
  }
  return 0;
}
