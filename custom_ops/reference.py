"""Plain numpy reference implementations of the com.quark_onnx custom ops.

Written for clarity, not speed: every function decodes to float64 and multiplies with numpy, so the kernels and
the ONNX-function fallbacks can be checked against something that shares no code with them.
FP8 rounding comes from ml_dtypes (round half to even).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

MXFP4_BLOCK_SIZE = 32
E4M3FN_MAX = 448.0
DYNAMIC_SCALE_MIN = 1e-12

# OCP MX e2m1: bit 3 is the sign, bits 0-2 index these magnitudes.
E2M1_MAGNITUDES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float64)


def e2m1_code_to_float(codes: np.ndarray) -> np.ndarray:
    """4-bit e2m1 codes (values 0..15, any integer dtype) -> float64 values."""
    codes = np.asarray(codes).astype(np.int64)
    magnitude = E2M1_MAGNITUDES[codes & 0x7]
    return np.where(codes & 0x8, -magnitude, magnitude)


def unpack_fp4_low_nibble_first(packed: np.ndarray) -> np.ndarray:
    """uint8 [..., K/2] -> codes [..., K]; element 2j is the low nibble of byte j."""
    packed = np.asarray(packed, dtype=np.uint8)
    low = packed & 0x0F
    high = packed >> 4
    return np.stack([low, high], axis=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def e8m0_to_float(scales: np.ndarray) -> np.ndarray:
    """uint8 e8m0 exponents -> float64 2^(s-127); s == 255 is NaN."""
    s = np.asarray(scales, dtype=np.uint8).astype(np.float64)
    return np.where(s == 255, np.nan, np.exp2(s - 127.0))


def dequantize_mxfp4(b_packed: np.ndarray, b_scale: np.ndarray) -> np.ndarray:
    """B uint8 [N, K/2] + e8m0 scales [N, K/32] -> float64 weights [N, K]."""
    values = e2m1_code_to_float(unpack_fp4_low_nibble_first(b_packed))
    n, k = values.shape
    if b_scale.shape != (n, k // MXFP4_BLOCK_SIZE):
        raise ValueError(f"B_scale shape {b_scale.shape} does not match B [N={n}, K={k}] (want [N, K/32])")
    scale_per_element = np.repeat(e8m0_to_float(b_scale), MXFP4_BLOCK_SIZE, axis=1)
    # 0 * NaN must stay NaN (a NaN block poisons its output column), which numpy does.
    return values * scale_per_element


def matmul_mxfp4(a: np.ndarray, b_packed: np.ndarray, b_scale: np.ndarray) -> np.ndarray:
    """Y[..., N] = A[..., K] @ dequant(B).T, computed in float64, returned in A's dtype."""
    weight_nk = dequantize_mxfp4(b_packed, b_scale)
    with np.errstate(invalid="ignore", over="ignore"):
        y = a.astype(np.float64) @ weight_nk.T
    return y.astype(a.dtype)


def saturate_cast_e4m3fn(x: np.ndarray) -> np.ndarray:
    """float -> float8_e4m3fn, round half to even, clipped to +-448 (ONNX saturate=1). NaN stays NaN."""
    x = np.asarray(x, dtype=np.float32)
    return np.clip(x, -E4M3FN_MAX, E4M3FN_MAX).astype(ml_dtypes.float8_e4m3fn)


def quantize_dequantize_e4m3fn(x: np.ndarray, scale) -> np.ndarray:
    """QuantizeLinear(saturate=1) -> DequantizeLinear in float32, as ONNX defines it: q = sat(x / scale)."""
    x32 = np.asarray(x).astype(np.float32)
    scale32 = np.asarray(scale, dtype=np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = saturate_cast_e4m3fn(x32 / scale32)
        return q.astype(np.float32) * scale32


def _b_scale_column(b_scale, n: int) -> np.ndarray:
    scale = np.asarray(b_scale, dtype=np.float32)
    if scale.size == 1:
        return np.full((n, 1), scale.reshape(()), dtype=np.float64)
    if scale.shape != (n,):
        raise ValueError(f"B_scale shape {scale.shape}: want a scalar (per-tensor) or [N={n}] (per-channel)")
    return scale.astype(np.float64).reshape(n, 1)


def dequantize_fp8_weight(b_fp8: np.ndarray, b_scale) -> np.ndarray:
    """B float8_e4m3fn [N, K] times per-tensor or per-channel scale -> float64 [N, K]."""
    b = np.asarray(b_fp8)
    if b.dtype != ml_dtypes.float8_e4m3fn:
        b = b.view(ml_dtypes.float8_e4m3fn)
    return b.astype(np.float64) * _b_scale_column(b_scale, b.shape[0])


def matmul_fp8_w8a8(a: np.ndarray, b_fp8: np.ndarray, b_scale, a_scale) -> np.ndarray:
    """Y = QDQ_e4m3fn(A, A_scale) @ (B * B_scale).T, float64 accumulation, A's dtype out."""
    a_dq = quantize_dequantize_e4m3fn(a, a_scale).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        y = a_dq @ dequantize_fp8_weight(b_fp8, b_scale).T
    return y.astype(a.dtype)


def dynamic_row_scale(a: np.ndarray) -> np.ndarray:
    """Per-row activation scale, float32: max(max|row| / 448, 1e-12), shape [..., 1]."""
    amax = np.max(np.abs(np.asarray(a).astype(np.float32)), axis=-1, keepdims=True)
    return np.maximum(amax / np.float32(E4M3FN_MAX), np.float32(DYNAMIC_SCALE_MIN)).astype(np.float32)


def matmul_fp8_w8a8_dyn(a: np.ndarray, b_fp8: np.ndarray, b_scale) -> np.ndarray:
    """Like matmul_fp8_w8a8 with one activation scale per row (per token), computed on the fly."""
    a_dq = quantize_dequantize_e4m3fn(a, dynamic_row_scale(a)).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        y = a_dq @ dequantize_fp8_weight(b_fp8, b_scale).T
    return y.astype(a.dtype)


# ---- helpers to make test inputs (encoders, the inverse of the decoders above) ----

def pack_fp4_low_nibble_first(codes: np.ndarray) -> np.ndarray:
    """codes [..., K] (0..15) -> uint8 [..., K/2], element 2j in the low nibble."""
    codes = np.asarray(codes, dtype=np.uint8)
    return (codes[..., 0::2] & 0x0F) | ((codes[..., 1::2] & 0x0F) << 4)


def random_mxfp4_weight(rng: np.random.Generator, n: int, k: int, scale_exponent_range=(120, 130)):
    """Random packed MXFP4 weight [N, K/2] and e8m0 scales [N, K/32]."""
    codes = rng.integers(0, 16, size=(n, k), dtype=np.uint8)
    low, high = scale_exponent_range
    scales = rng.integers(low, high + 1, size=(n, k // MXFP4_BLOCK_SIZE), dtype=np.uint8)
    return pack_fp4_low_nibble_first(codes), scales


def bf16_bits_to_float(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) -> float32, exactly (the 16 bits are the top half of the float32)."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def matmul_bf16(a: np.ndarray, b_bits: np.ndarray) -> np.ndarray:
    """MatMulBf16: A [..., K] @ float(B [N, K]).T, summed in float64 (the kernels sum in float32)."""
    w = bf16_bits_to_float(b_bits).astype(np.float64)
    return (np.asarray(a, np.float64) @ w.T).astype(np.float32)


# ---- weight-only compact ops (docs/custom_op_contract.md): the activation emulation stays in standard ops before the node ----

NVFP4_BLOCK_SIZE = 16


def matmul_fp8(a: np.ndarray, b_fp8: np.ndarray, b_scale) -> np.ndarray:
    """MatMulFp8: A [..., K] @ (float(B e4m3fn [N, K]) * B_scale).T, B_scale scalar or [N]; float64 sums, A's dtype."""
    with np.errstate(invalid="ignore", over="ignore"):
        y = np.asarray(a).astype(np.float64) @ dequantize_fp8_weight(b_fp8, b_scale).T
    return y.astype(np.asarray(a).dtype)


def dequantize_int8_weight(b_int8: np.ndarray, b_scale) -> np.ndarray:
    """B int8 [N, K] times a per-tensor or per-channel scale -> float64 [N, K] (symmetric: no zero point)."""
    b = np.asarray(b_int8)
    if b.dtype != np.int8:
        raise ValueError(f"B must be int8, got {b.dtype}")
    return b.astype(np.float64) * _b_scale_column(b_scale, b.shape[0])


def matmul_int8(a: np.ndarray, b_int8: np.ndarray, b_scale) -> np.ndarray:
    """MatMulInt8: A [..., K] @ (float(B int8 [N, K]) * B_scale).T; float64 sums, A's dtype."""
    with np.errstate(invalid="ignore", over="ignore"):
        y = np.asarray(a).astype(np.float64) @ dequantize_int8_weight(b_int8, b_scale).T
    return y.astype(np.asarray(a).dtype)


def e4m3fn_bytes_to_float(scales: np.ndarray) -> np.ndarray:
    """float8_e4m3fn bytes (uint8 or float8 dtype) -> float64, decoded by ml_dtypes (0x7f/0xff are NaN)."""
    s = np.asarray(scales)
    if s.dtype != ml_dtypes.float8_e4m3fn:
        s = s.astype(np.uint8).view(ml_dtypes.float8_e4m3fn)
    return s.astype(np.float64)


def dequantize_nvfp4(b_packed: np.ndarray, b_scale, b_scale_2) -> np.ndarray:
    """B uint8 [N, K/2] + e4m3fn block scales [N, K/16] + fp32 scalar -> float32 weights [N, K].

    Quark's order (quark_format.md, NVFP4: W = fp4 * fp32(weight_scale_fp8) * weight_scale_2, checked against Quark's
    reload): the block scale e4m3 * scale_2 is rounded once to float32, then multiplied by the e2m1 value (exact:
    e2m1 has 2 significant bits, so that product is exact in float32 unless it underflows)."""
    values = e2m1_code_to_float(unpack_fp4_low_nibble_first(b_packed)).astype(np.float32)
    n, k = values.shape
    block = e4m3fn_bytes_to_float(b_scale).astype(np.float32)
    if block.shape != (n, k // NVFP4_BLOCK_SIZE):
        raise ValueError(f"B_scale shape {block.shape} does not match B [N={n}, K={k}] (want [N, K/16])")
    block_scale = (block * np.float32(np.asarray(b_scale_2, np.float32).reshape(()))).astype(np.float32)
    return (values * np.repeat(block_scale, NVFP4_BLOCK_SIZE, axis=1)).astype(np.float32)


def matmul_nvfp4(a: np.ndarray, b_packed: np.ndarray, b_scale, b_scale_2) -> np.ndarray:
    """MatMulNvfp4: A [..., K] @ dequantize_nvfp4(B).T, float64 sums, A's dtype."""
    w = dequantize_nvfp4(b_packed, b_scale, b_scale_2).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        y = np.asarray(a).astype(np.float64) @ w.T
    return y.astype(np.asarray(a).dtype)


def random_nvfp4_weight(rng: np.random.Generator, n: int, k: int):
    """Random packed NVFP4 weight [N, K/2], e4m3fn block-scale bytes [N, K/16] (positive, finite) and scale_2."""
    codes = rng.integers(0, 16, size=(n, k), dtype=np.uint8)
    scales = rng.uniform(0.02, 400.0, size=(n, k // NVFP4_BLOCK_SIZE)).astype(ml_dtypes.float8_e4m3fn)
    return pack_fp4_low_nibble_first(codes), scales.view(np.uint8), np.float32(rng.uniform(1e-4, 1e-2))
