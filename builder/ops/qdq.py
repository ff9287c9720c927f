"""QuantizeLinear / DequantizeLinear building blocks for W8A8 linears, the FP8 KV cache and FP8 attention.

Static activation (one scale from the checkpoint):
    x ──► QuantizeLinear(s, zp: float8e4m3fn | int8 | uint8, saturate) ──► DequantizeLinear(s, zp) ──► x_qdq
Dynamic FP8 activation (per-tensor or per-token, scale = amax / 448 at run time, 0 -> fp32 eps like Quark):
    x ──► Abs ─► ReduceMax ─► Div 448 ─► (0 -> eps) = s
    x / s ──► QuantizeLinear(1.0, fp8) ──► DequantizeLinear(1.0) = u        (u * s is Quark's fake-quantized x)
Weights: the checkpoint's fp8/int8 [out, in] matrix transposed to [in, out], DequantizeLinear with a scalar or
per-axis (axis=1) scale, so MIGraphX's simplify_qdq can turn DQ(x)·DQ(w) into an FP8/INT8 GEMM.
On cpu with float32 io and the custom-op library, a static FP8 pair is one com.quark_onnx QuantizeDequantizeFp8 node
(fp8_qdq_op_applies: the same bits, one pass instead of two; ORT's float8 QuantizeLinear takes about 9 ns an element).
Where the EP profile says fp8_format="e4m3fnuz" (MIGraphX), every fp8 Q/DQ here is written in float8e4m3fnuz with
doubled scales instead (builder/ops/fnuz.py: the same numbers, in the only fp8 type MIGraphX's parser reads).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from . import fnuz

FP8_MAX = 448.0
FP32_EPS = float(np.finfo(np.float32).eps)
ZERO_DTYPES = {"fp8_e4m3": ml_dtypes.float8_e4m3fn, "int8": np.int8, "uint8": np.uint8}


def zero_point(qtype: str, value: int = 0) -> np.ndarray:
    return np.array(value, dtype=ZERO_DTYPES[qtype])


def quantize(ctx, x: str, scale: str, zp: str, name: str, axis: int | None = None) -> str:
    """QuantizeLinear; fp8 saturates (clip to +-448 then round-to-nearest-even, Quark's fake quantizer)."""
    return ctx.graph.op("QuantizeLinear", [x, scale, zp], f"{name}/QuantizeLinear", axis=axis)


def dequantize(ctx, q: str, scale: str, zp: str, name: str, axis: int | None = None) -> str:
    return ctx.graph.op("DequantizeLinear", [q, scale, zp], f"{name}/DequantizeLinear", axis=axis)


def fp8_qdq_op_applies(ctx) -> bool:
    """cpu, float32 io and a custom-op library with the QuantizeDequantizeFp8 kernel: a static FP8 Q/DQ pair becomes
    that one node (the same bits: custom_ops/src/qo_cpu_fp8_qdq.c; its ONNX function is the pair)."""
    from ..custom_ops_library import has_kernel
    return (ctx.ep.name == "cpu" and np.dtype(ctx.io_np) == np.float32
            and has_kernel(getattr(getattr(ctx, "options", None), "custom_ops_library", None), "QuantizeDequantizeFp8"))


def qdq_static(ctx, x: str, scale: float, qtype: str, name: str, zp_value: int = 0) -> str:
    """Fake-quantize x with a per-tensor checkpoint scale (and integer zero point)."""
    if qtype == "fp8_e4m3" and fnuz.applies(ctx):
        return fnuz.qdq_static(ctx, x, scale, name)
    g = ctx.graph
    if qtype == "fp8_e4m3" and fp8_qdq_op_applies(ctx):
        s = g.scalar(f"{name}/scale", scale, np.float32)
        return g.quark_op("QuantizeDequantizeFp8", [x, s], f"{name}/QuantizeDequantizeFp8")
    s = g.scalar(f"{name}/scale", scale, ctx.io_np)
    zp = g.initializer(f"{name}/zero_point", zero_point(qtype, zp_value))
    return dequantize(ctx, quantize(ctx, x, s, zp, name), s, zp, name)


def fp8_dynamic_unit(ctx, x: str, per_token: bool, name: str) -> tuple[str, str]:
    """Dynamic FP8: (u, s) with u = fp8(x / s) as floats and s = amax / 448 ([..., 1] per token, or scalar)."""
    g = ctx.graph
    ax = g.op("Abs", [x], f"{name}/Abs")
    if per_token:
        amax = g.op("ReduceMax", [ax, g.const_i64(f"{name}/axes", [-1])], f"{name}/ReduceMax", keepdims=1)
    else:
        amax = g.op("ReduceMax", [ax], f"{name}/ReduceMax", keepdims=0)
    s = g.op("Div", [amax, g.scalar(f"{name}/fp8_max", FP8_MAX, ctx.io_np)], f"{name}/Div_max")
    zero = g.op("Equal", [s, g.scalar(f"{name}/zero", 0.0, ctx.io_np)], f"{name}/Equal_zero")
    s = g.op("Where", [zero, g.scalar(f"{name}/eps", FP32_EPS, ctx.io_np), s], f"{name}/scale")
    xs = g.op("Div", [x, s], f"{name}/Div_scale")
    if fnuz.applies(ctx):
        return fnuz.unit_qdq(ctx, xs, name), s
    return fp8_unit_qdq(ctx, xs, name), s


def fp8_unit_qdq(ctx, xs: str, name: str) -> str:
    """fp8(xs) as floats: the unit-scale float8e4m3fn Q/DQ pair (saturating at +-448, round to nearest even), or on
    cpu with the library the one QuantizeDequantizeFp8 node with scale 1 (the same bits: xs / 1 is xs). For an
    activation already divided by its scale (dynamic FP8, the routed experts' per-expert scales); not fnuz."""
    g = ctx.graph
    if fp8_qdq_op_applies(ctx):
        one = g.scalar(f"{name}/unit_scale", 1.0, np.float32)
        return g.quark_op("QuantizeDequantizeFp8", [xs, one], f"{name}/QuantizeDequantizeFp8")
    one = g.scalar(f"{name}/unit_scale", 1.0, ctx.io_np)
    zp = g.initializer(f"{name}/zero_point", zero_point("fp8_e4m3"))
    return dequantize(ctx, quantize(ctx, xs, one, zp, name), one, zp, name)


def weight_dq(ctx, base: str, q_t: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, name: str) -> str:
    """DequantizeLinear of a transposed [in, out] quantized weight; scale scalar or [out] (axis=1)."""
    g = ctx.graph
    if q_t.dtype == ml_dtypes.float8_e4m3fn and fnuz.applies(ctx):
        q_t, scale = fnuz.weight_arrays(q_t, scale, base)
    w = g.initializer(f"{base}.weight.T.q", np.ascontiguousarray(q_t))
    per_axis = scale.size > 1
    s = g.initializer(f"{base}.weight_scale.dq", (scale.reshape(-1) if per_axis else scale.reshape(()))
                      .astype(ctx.io_np))
    if zp is None:
        zp = np.zeros(scale.shape, q_t.dtype)
    z = g.initializer(f"{base}.weight_zero_point.dq", (zp.reshape(-1) if per_axis else zp.reshape(()))
                      .astype(q_t.dtype))
    return dequantize(ctx, w, s, z, name, axis=1 if per_axis else None)
