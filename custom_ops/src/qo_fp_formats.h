/* Bit-exact conversions between float32 and the small formats the kernels read or write.
 * Plain C99, usable from host C/C++ and from CUDA/HIP device code (QO_HD). Rounding: round half to even. */
#ifndef QO_FP_FORMATS_H
#define QO_FP_FORMATS_H

#include <stdint.h>
#include <string.h>
#include <math.h>

/* static: each translation unit gets its own copy, so several units can include this header and link together.
 * HIP-CPU defines __HIPCC__ but its __forceinline__ is empty without NDEBUG (hip_defines.h), so there the
 * functions are plain host `static inline`. */
#if defined(__HIP_CPU_RT__)
#define QO_HD static inline
#elif defined(__CUDACC__) || defined(__HIPCC__)
#define QO_HD static __host__ __device__ __forceinline__
#else
#define QO_HD static inline
#endif

QO_HD float qo_bits_to_f32(uint32_t bits) {
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

QO_HD uint32_t qo_f32_to_bits(float f) {
  uint32_t bits;
  memcpy(&bits, &f, sizeof bits);
  return bits;
}

/* ---- IEEE half (stored as uint16_t so no compiler half type is needed) ---- */
QO_HD float qo_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1Fu;
  uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0x1Fu) return qo_bits_to_f32(sign | 0x7F800000u | (mantissa << 13));  /* inf / NaN */
  if (exponent == 0) {                                                                    /* zero / subnormal */
    float magnitude = (float)mantissa * 5.9604644775390625e-08f;                          /* m * 2^-24, exact */
    return sign ? -magnitude : magnitude;
  }
  return qo_bits_to_f32(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

QO_HD uint16_t qo_f32_to_f16(float f) {
  uint32_t x = qo_f32_to_bits(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  x &= 0x7FFFFFFFu;
  if (x > 0x7F800000u) return (uint16_t)(sign | 0x7E00u);  /* NaN */
  if (x >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u); /* >= 65520 (and inf) -> inf */
  if (x < 0x38800000u) {                                   /* below 2^-14: half subnormal, units of 2^-24 */
    float units = qo_bits_to_f32(x) * 16777216.0f;         /* exact power-of-two scaling */
    return (uint16_t)(sign | (uint16_t)rintf(units));      /* 1024 encodes the smallest normal: correct */
  }
  uint32_t rounded = x + 0xFFFu + ((x >> 13) & 1u);
  return (uint16_t)(sign | (uint16_t)((rounded - (112u << 23)) >> 13));
}

/* ---- OCP float8 e4m3fn: bias 7, no inf, 0x7F/0xFF NaN, max 448 ---- */
QO_HD float qo_e4m3fn_to_f32(uint8_t code) {
  uint32_t sign = (uint32_t)(code & 0x80u) << 24;
  uint32_t exponent = (code >> 3) & 0xFu;
  uint32_t mantissa = code & 0x7u;
  if ((code & 0x7Fu) == 0x7Fu) return qo_bits_to_f32(sign | 0x7FC00000u);
  if (exponent == 0) {
    float magnitude = (float)mantissa * 0.001953125f; /* m * 2^-9 */
    return sign ? -magnitude : magnitude;
  }
  return qo_bits_to_f32(sign | ((exponent + 120u) << 23) | (mantissa << 20));
}

/* Saturating cast (ONNX saturate=1): |x| >= 448 -> 448, inf -> 448, NaN -> NaN, round half to even. */
QO_HD uint8_t qo_f32_to_e4m3fn_sat(float f) {
  uint32_t x = qo_f32_to_bits(f);
  uint8_t sign = (uint8_t)((x >> 24) & 0x80u);
  x &= 0x7FFFFFFFu;
  if (x > 0x7F800000u) return (uint8_t)(sign | 0x7Fu);
  if (x >= 0x43E00000u) return (uint8_t)(sign | 0x7Eu);   /* >= 448 */
  if (x < 0x3C800000u) {                                  /* below 2^-6: subnormal, units of 2^-9 */
    float units = qo_bits_to_f32(x) * 512.0f;
    return (uint8_t)(sign | (uint8_t)rintf(units));       /* 8 encodes 2^-6, the smallest normal */
  }
  uint32_t rounded = x + 0x7FFFFu + ((x >> 20) & 1u);
  uint32_t code = ((rounded >> 23) - 120u) << 3 | ((rounded >> 20) & 0x7u);
  if (code > 0x7Eu) code = 0x7Eu;
  return (uint8_t)(sign | code);
}

/* ONNX's DequantizeLinear(QuantizeLinear(x, s, float8e4m3fn, saturate=1), s): x / s rounded to e4m3fn, times s. */
QO_HD float qo_e4m3fn_qdq(float x, float s) { return qo_e4m3fn_to_f32(qo_f32_to_e4m3fn_sat(x / s)) * s; }

/* ---- OCP MX: e2m1 element codes and e8m0 block scales ---- */
QO_HD float qo_e2m1_to_f32(uint8_t code) {
  /* magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6 = (code & 7) decoded as e2m1 with bias 1 */
  uint32_t exponent = (code >> 1) & 0x3u;
  uint32_t mantissa = code & 0x1u;
  float magnitude = exponent == 0 ? 0.5f * (float)mantissa
                                  : qo_bits_to_f32(((exponent + 126u) << 23) | (mantissa << 22));
  return (code & 0x8u) ? -magnitude : magnitude;
}

QO_HD float qo_e8m0_to_f32(uint8_t s) {
  if (s == 255) return qo_bits_to_f32(0x7FC00000u);
  if (s == 0) return qo_bits_to_f32(0x00400000u);         /* 2^-127, a float32 subnormal */
  return qo_bits_to_f32((uint32_t)s << 23);
}

#endif /* QO_FP_FORMATS_H */
