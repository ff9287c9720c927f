"""FP8 as float8e4m3fnuz: the only fp8 element type MIGraphX's ONNX parser reads (EPConfig.fp8_format "e4m3fnuz").

Why (AMDMIGraphX src/onnx/onnx_parser.cpp, commit f729a52):
  get_type()         maps 18 (FLOAT8E4M3FNUZ) to fp8e4m3fnuz_type and throws "Prototensor data type N not supported"
                     for 17 (FLOAT8E4M3FN), 19 (FLOAT8E5M2), 20 (FLOAT8E5M2FNUZ); initializers, graph inputs and
                     outputs, Cast `to` and QuantizeLinear `output_dtype` all go through it.
Same bits, half the value: e4m3fnuz has exponent bias 8, e4m3fn bias 7, so every finite e4m3fn byte b (normal or
subnormal) read as e4m3fnuz is value(b) / 2, and the e4m3fn grid scaled by 1/2 is the e4m3fnuz grid below 224.
Hence, for any scale s:
    Quark:  fp8_e4m3fn(clip(x / s, +-448)) * s   ==   fp8_e4m3fnuz(clip(x, +-448 s) / (2 s)) * (2 s)
The explicit clip (Min/Max, see saturate) is needed: QuantizeLinear saturates to the *target* type's max, 240 for
e4m3fnuz (ORT's kernel and MIGraphX's op::quantizelinear::compute, which clamps to
numeric_limits<quant_type>::max()), and 240 = 480 in e4m3fn terms is not on Quark's grid. Byte 0x80 is -0 in e4m3fn and NaN in e4m3fnuz: weights map it to 0x00;
QuantizeLinear never writes it (FNUZ has no -0, -0.0 quantizes to 0x00 in ORT). e4m3fn's NaN bytes 0x7F/0xFF
would become 240/-240: a weight holding them is refused.
What MIGraphX does with it on the GPU (src/targets/gpu/eliminate_data_type_for_gpu.cpp for_fp8fnuz, device_name.cpp):
dot/quant_dot in fp8e4m3fnuz run natively only where gfx_has_fp8fnuz_intrinsics() (gfx94x: MI300); elsewhere
(gfx950 MI350, gfx12, gfx90a) eliminate_data_type computes them in float: same numbers, no fp8 speed.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from ..errors import ConversionError

FNUZ = "e4m3fnuz"
FP8_MAX = 448.0            # Quark's e4m3fn saturation bound, in e4m3fn units
SCALE_FACTOR = 2.0         # e4m3fnuz scale = 2 * e4m3fn scale
NEG_ZERO, FN_NAN = 0x80, (0x7F, 0xFF)


def applies(ctx_or_ep) -> bool:
    ep = getattr(ctx_or_ep, "ep", ctx_or_ep)
    return getattr(ep, "fp8_format", "e4m3fn") == FNUZ


def fn_to_fnuz_bytes(q: np.ndarray, name: str = "") -> np.ndarray:
    """float8_e4m3fn array -> float8_e4m3fnuz array with the same bytes (value / 2); -0 -> +0; NaN refused."""
    b = np.ascontiguousarray(q).view(np.uint8)
    if np.isin(b, FN_NAN).any():
        raise ConversionError("float8_e4m3fn weight holds NaN (byte 0x7F/0xFF)", layer=name, field="weight",
                              value="NaN")
    b = np.where(b == NEG_ZERO, np.uint8(0), b).astype(np.uint8)
    return b.view(ml_dtypes.float8_e4m3fnuz)


def zero_point() -> np.ndarray:
    return np.zeros((), dtype=ml_dtypes.float8_e4m3fnuz)


def saturate(g, x: str, lo: str, hi: str, name: str) -> str:
    """Max(Min(x, hi), lo): Clip's numbers. Not Clip: onnxruntime's ClipQuantFusion (qdq_transformer/
    clip_quantizelinear.cc GetQConstantLowerUpper) throws on a Clip -> QuantizeLinear whose zero point is
    float8e4m3fnuz ("Unexpected data type for QuantizeLinear input y_zero_point of 18", measured on ORT 1.32)."""
    return g.op("Max", [g.op("Min", [x, hi], f"{name}/Min"), lo], f"{name}/Max")


def qdq_static(ctx, x: str, scale: float, name: str) -> str:
    """Quark's fp8_e4m3fn fake-quantization with a per-tensor scale, as Clip + e4m3fnuz Q/DQ with scale 2 s."""
    g = ctx.graph
    bound = float(np.float32(FP8_MAX) * np.float32(scale))
    lo, hi = g.scalar(f"{name}/clip_lo", -bound, ctx.io_np), g.scalar(f"{name}/clip_hi", bound, ctx.io_np)
    x = saturate(g, x, lo, hi, f"{name}/fp8_max")
    s = g.scalar(f"{name}/scale_fnuz", float(np.float32(scale) * np.float32(SCALE_FACTOR)), ctx.io_np)
    zp = g.initializer(f"{name}/zero_point_fnuz", zero_point())
    q = g.op("QuantizeLinear", [x, s, zp], f"{name}/QuantizeLinear")
    return g.op("DequantizeLinear", [q, s, zp], f"{name}/DequantizeLinear")


def unit_qdq(ctx, xs: str, name: str, dtype=None) -> str:
    """fp8_e4m3fn(xs) for |xs| <= 448 (dynamic activations, already divided by amax / 448): scale 2 in fnuz.
    No Clip: |xs| exceeds 448 by rounding of s only (< 1 ulp), which rounds back to 448 (224 in fnuz).
    dtype: xs's numpy dtype when it is not the io dtype."""
    g = ctx.graph
    two = g.scalar(f"{name}/unit_scale_fnuz", SCALE_FACTOR, dtype or ctx.io_np)
    zp = g.initializer(f"{name}/zero_point_fnuz", zero_point())
    q = g.op("QuantizeLinear", [xs, two, zp], f"{name}/QuantizeLinear")
    return g.op("DequantizeLinear", [q, two, zp], f"{name}/DequantizeLinear")


def scale_qdq(g, s: str, s2: float, io_np, name: str) -> str:
    """e4m3fn(clip(s / s2, +-448)) * s2 for a float tensor s (NVFP4 activation block scales, input_scale_2)."""
    bound = float(np.float32(FP8_MAX) * np.float32(s2))
    hi = g.initializer(f"{name}.fp8_max_fnuz", np.array(bound, dtype=io_np))
    lo = g.initializer(f"{name}.fp8_min_fnuz", np.array(-bound, dtype=io_np))
    s = saturate(g, s, lo, hi, f"{name}/ScaleFp8Max")
    s2x2 = g.initializer(f"{name}.input_scale_2_fnuz", np.array(np.float32(s2) * np.float32(SCALE_FACTOR),
                                                                 dtype=io_np))
    zp = g.initializer(f"{name}.zero_point_fnuz", zero_point())
    q = g.op("QuantizeLinear", [s, s2x2, zp], f"{name}/ScaleToE4m3Fnuz")
    return g.op("DequantizeLinear", [q, s2x2, zp], f"{name}/ScaleFromE4m3Fnuz")


def weight_arrays(q_t: np.ndarray, scale: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(e4m3fnuz weight, doubled scale) for an e4m3fn weight and its float scale: DQ gives the same values."""
    return fn_to_fnuz_bytes(q_t, name), (np.asarray(scale, np.float32) * np.float32(SCALE_FACTOR))
