"""OCP e2m1 (FP4) codes and their scales, decoded from Quark's layout (quark_format.md, MXFP4 / NVFP4 rows).

Quark `Pack_fp4`: weight uint8 [out, in/2], byte j of a row holds element 2j in the low nibble and 2j+1 in the high
nibble. A 4-bit code is sign (bit 3) + magnitude index (bits 0-2) into E2M1_MAGNITUDES.
Scales: MXFP4 e8m0 uint8 [out, in/32] = 2^(s-127) (255 is NaN); NVFP4 float8_e4m3fn [out, in/16] times the fp32
per-tensor weight_scale_2.

Re-encodings used by the schemes (all exact):
  doubled integer  2*e2m1 in {0, +-1, +-2, +-3, +-4, +-6, +-8, +-12}  -> 8-bit MatMulNBits u = 2v + 128, scale / 2
  e4m3fn byte      every e2m1 value is a float8_e4m3fn value          -> DequantizeLinear(float8e4m3fn, blocked)
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

E2M1_MAGNITUDES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)
E2M1_VALUES = np.concatenate([E2M1_MAGNITUDES, -E2M1_MAGNITUDES])          # indexed by the 4-bit code
E2M1_DOUBLED = (2 * E2M1_VALUES).astype(np.int8)                            # exact integers in [-12, 12]
E2M1_AS_E4M3FN_BYTE = E2M1_VALUES.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
E8M0_NAN = 255
E8M0_BIAS = 127


def unpack_fp4_codes(packed: np.ndarray) -> np.ndarray:
    """uint8 [..., K/2] -> uint8 codes [..., K], element 2j from the low nibble of byte j."""
    packed = np.asarray(packed, dtype=np.uint8)
    codes = np.stack([packed & 0x0F, packed >> 4], axis=-1)
    return codes.reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def pack_fp4_codes(codes: np.ndarray) -> np.ndarray:
    """uint8 codes [..., K] (K even) -> uint8 [..., K/2], low nibble first (inverse of unpack_fp4_codes)."""
    codes = np.asarray(codes, dtype=np.uint8)
    pairs = codes.reshape(*codes.shape[:-1], -1, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).astype(np.uint8)


def e2m1_values(codes: np.ndarray) -> np.ndarray:
    return E2M1_VALUES[codes]


def e8m0_scales(e8m0: np.ndarray) -> np.ndarray:
    """uint8 e8m0 -> float32 2^(s-127) (2^-127 is a float32 subnormal, still exact); 255 -> NaN."""
    s = np.asarray(e8m0, dtype=np.uint8)
    with np.errstate(over="ignore"):  # 255 -> 2^128 = inf, replaced by NaN below
        out = np.ldexp(np.float32(1.0), s.astype(np.int32) - E8M0_BIAS).astype(np.float32)
    return np.where(s == E8M0_NAN, np.float32(np.nan), out).astype(np.float32)


def nvfp4_block_scales(weight_scale_e4m3: np.ndarray, weight_scale_2: float) -> np.ndarray:
    """float32 per-block scale e4m3 * weight_scale_2, rounded once in float32 as Quark's frozen model does."""
    s = np.asarray(weight_scale_e4m3)
    if s.dtype != ml_dtypes.float8_e4m3fn:
        s = s.view(ml_dtypes.float8_e4m3fn)
    return (s.astype(np.float32) * np.float32(weight_scale_2)).astype(np.float32)


def dequantize(codes: np.ndarray, block_scale: np.ndarray, group: int) -> np.ndarray:
    """float32 [N, K] = e2m1(codes) * block_scale repeated over `group` consecutive K."""
    return (e2m1_values(codes) * np.repeat(block_scale, group, axis=-1)).astype(np.float32)
