"""Quark's dynamic FP4 activation fake-quantization (MXFP4 and NVFP4 input_tensors), as standard ONNX ops (opset 21).

Reproduces Quark 0.13's float32 path exactly (checked element for element against the frozen model's quantizers):

  MXFP4 (PerBlockMXObserver + even_round, quantization/utils.py):
      amax  = max |x| over each block of 32 along K
      E     = floor(log2 amax) + (mantissa(amax) >= 1.75)      ("even": round the block max up from 1.75 * 2^E)
      scale = 2^clamp(E - 2, -127, 127)                        (2 = emax of e2m1; amax 0 behaves as 2^-126)
  NVFP4 (two-level, SequentialQuantize [fp4 g16 dynamic, fp8_e4m3 per_tensor is_scale_quant]):
      s     = amax / 6 (0 -> float32 eps);  scale = e4m3(clip(s / input_scale_2, +-448)) * input_scale_2
      input_scale_2 = (calibration amax) / (6 * 448) is the static per-tensor scale *of the block scales*
      (vLLM's "global scale" is its reciprocal). A block whose scale rounds to 0 in e4m3 comes out all zero.
  then   y = e2m1_round_half_even(x / scale, saturating at +-6) * scale

    x ─► Cast f32 ─► Reshape [-1, G] ─► |.| ─► ReduceMax ─► block scale (above)
                          │                                    │
                          └──────────► Div ─► e2m1 RNE ─► Mul ◄┘ ─► Reshape(Shape(x)) ─► Cast io ─► y

e2m1 rounding without a float4 type: the grid step is 0.5 below 2, 1 below 4, 2 above; Round (half to even) of
y / step times step, clipped to +-6, equals Quark's fake_quantize_to_low_precision_fp(ebits=2, mbits=1).
The subgraph is emitted once per (input, scheme) and shared by the linears reading the same input (q/k/v, gate/up).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import ml_dtypes
import numpy as np
from onnx import TensorProto

from . import fnuz

FLOAT32_EPS = float(np.finfo(np.float32).eps)
E4M3_MAX = 448.0
E2M1_MAX = 6.0
MX_EMAX_E2M1 = 2
MX_SCALE_MODES = ("even", "floor", "ceil")
NVFP4_GROUP_SIZE = 16

_CACHE: "weakref.WeakKeyDictionary[object, dict]" = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Fp4ActivationSpec:
    kind: str                          # "mxfp4" | "nvfp4"
    group_size: int                    # 32 (MX) | 16 (NV)
    scale_mode: str = "even"           # MXFP4 scale_calculation_mode
    input_scale_2: float | None = None  # NVFP4 second-level (static) scale; None: block scales stay float32

    def key(self) -> tuple:
        s2 = None if self.input_scale_2 is None else np.float32(self.input_scale_2).tobytes()
        return (self.kind, self.group_size, self.scale_mode, s2)


_CONST_VALUES = {
    "half": 0.5, "one": 1.0, "two": 2.0, "four": 4.0, "quarter": 0.25, "one_75": 1.75,
    "e2m1_max": E2M1_MAX, "e2m1_min": -E2M1_MAX, "six": E2M1_MAX, "zero": 0.0, "eps": FLOAT32_EPS,
    "min_normal": 2.0 ** -126, "min_scale": 2.0 ** -127, "inv_ln2": 1.0 / np.log(2.0),
    "exp_lo": -126.0, "exp_hi": 127.0, "bias": 127.0, "e4m3_max": E4M3_MAX, "e4m3_min": -E4M3_MAX,
}


class _Consts:
    """Shared constant initializers, created on first use, once per graph."""

    def __init__(self, g):
        self.g, self.made = g, {}

    def __getitem__(self, key: str) -> str:
        if key not in self.made:
            if key == "neg_axis":
                value = np.array([-1], dtype=np.int64)
            elif key == "pow2":  # 2^(i-127) for i in 0..254: exact powers of two (index 0: the subnormal 2^-127)
                value = np.ldexp(np.float32(1), np.arange(255) - 127).astype(np.float32)
            elif key == "fp8_zero":
                value = np.zeros((), dtype=ml_dtypes.float8_e4m3fn)
            else:
                value = np.array(_CONST_VALUES[key], dtype=np.float32)
            self.made[key] = self.g.initializer(f"fp4_act.{key}", value)
        return self.made[key]


def _consts(g) -> _Consts:
    return _CACHE.setdefault(g, {"consts": _Consts(g), "qdq": {}})["consts"]


def fp4_act_op_applies(ctx, spec: Fp4ActivationSpec) -> bool:
    """MXFP4 with "even" block scales of 32 (Quark's mxfp4 templates), or NVFP4 blocks of 16 with a static
    input_scale_2; float32 io, cpu and a custom-op library with the QuantizeDequantizeMxfp4 / Nvfp4 kernel
    (custom_ops/src/qo_cpu_fp4_act.c: this module's subgraph bit for bit on blocks without a NaN, in one pass instead
    of about 30). The callers' inputs have a last axis of a multiple of the block (the FP4 linears' in_features,
    checked at plan time)."""
    if spec.kind == "mxfp4" and spec.group_size == 32 and spec.scale_mode == "even":
        return _act_op_ready(ctx, "QuantizeDequantizeMxfp4")
    if spec.kind == "nvfp4" and spec.group_size == NVFP4_GROUP_SIZE and spec.input_scale_2 is not None:
        return _act_op_ready(ctx, "QuantizeDequantizeNvfp4")
    return False


def _act_op_ready(ctx, op: str) -> bool:
    """cpu, float32 io and a custom-op library with op's kernel."""
    from ..custom_ops_library import has_kernel
    ep = getattr(ctx, "ep", None)  # the activation tests' contexts have no EP
    if ctx.io != "fp32" or ep is None or ep.name != "cpu":
        return False
    return has_kernel(getattr(getattr(ctx, "options", None), "custom_ops_library", None), op)


def emit_fp4_activation_qdq(ctx, x: str, spec: Fp4ActivationSpec, prefix: str) -> str:
    """x [..., K] in the io dtype -> Quark's fake-quantized x, same shape and dtype (cached per input)."""
    g = ctx.graph
    c = _consts(g)
    cache = _CACHE[g]["qdq"]
    key = (x, spec.key())
    if key in cache:
        return cache[key]
    p = f"{prefix}/{'MxFp4' if spec.kind == 'mxfp4' else 'NvFp4'}Act"
    if fp4_act_op_applies(ctx, spec):  # the subgraph below as one com.quark_onnx node, the same bits
        op = "QuantizeDequantizeMxfp4" if spec.kind == "mxfp4" else "QuantizeDequantizeNvfp4"
        inputs = [x] if spec.kind == "mxfp4" else \
            [x, g.initializer(f"{p}.input_scale_2", np.array(spec.input_scale_2, dtype=np.float32))]
        y = g.quark_op(op, inputs, f"{p}/{op}")
        cache[key] = y
        return y
    x32 = x if ctx.io == "fp32" else g.op("Cast", [x], f"{p}/CastF32", to=TensorProto.FLOAT)
    shape = g.op("Shape", [x], f"{p}/Shape")
    blocks = g.op("Reshape", [x32, g.const_i64(f"{p}.block_shape", [-1, spec.group_size])], f"{p}/ToBlocks")
    amax = g.op("ReduceMax", [g.op("Abs", [blocks], f"{p}/Abs"), c["neg_axis"]], f"{p}/BlockMax", keepdims=1)
    if spec.kind == "mxfp4":
        scale = _mx_block_scale(g, c, amax, spec.scale_mode, p)
        divisor = scale
    else:
        scale, divisor = _nv_block_scale(g, c, amax, spec.input_scale_2, p, fnuz.applies(ctx))
    scaled = g.op("Div", [blocks, divisor], f"{p}/DivScale")
    q = _e2m1_round(g, c, scaled, p)
    y = g.op("Mul", [q, scale], f"{p}/MulScale")
    y = g.op("Reshape", [y, shape], f"{p}/FromBlocks")
    if ctx.io != "fp32":
        y = g.op("Cast", [y], f"{p}/CastIo", to=ctx.io_type)
    cache[key] = y
    return y


def emit_mx_activation_fp4_qdq(ctx, x: str, spec: Fp4ActivationSpec, prefix: str, k: int) -> str:
    """x [..., K] in the io dtype -> Quark's MXFP4 fake-quantized x as a float4e2m1 Q/DQ pair, float32
    (amd_arch=gfx950, builder/quant/mx_gemm.py, whose MatMul runs in float32). The block scale is
    emit_fp4_activation_qdq's (_mx_block_scale), reshaped to [..., K/32]; then QuantizeLinear(x, scale, axis -1,
    block 32, output_dtype float4e2m1) and DequantizeLinear(., scale). The pair's e2m1 rounding replaces
    _e2m1_round (MIGraphX: op/builder/quantizelinear.cpp handle_fp4x2 -> pack_fp4, fp4_casts.hpp cast_to_fp4:
    nearest, ties to even, saturating at 6, the rounding _e2m1_round writes out). Opset 23; cached per input."""
    g = ctx.graph
    c = _consts(g)
    cache = _CACHE[g]["qdq"]
    key = (x, spec.key(), "fp4_qdq")
    if key in cache:
        return cache[key]
    p = f"{prefix}/MxFp4QdqAct"
    x32 = x if ctx.io == "fp32" else g.op("Cast", [x], f"{p}/CastF32", to=TensorProto.FLOAT)
    blocks = g.op("Reshape", [x32, g.const_i64(f"{p}.block_shape", [-1, spec.group_size])], f"{p}/ToBlocks")
    amax = g.op("ReduceMax", [g.op("Abs", [blocks], f"{p}/Abs"), c["neg_axis"]], f"{p}/BlockMax", keepdims=1)
    scale = _mx_block_scale(g, c, amax, spec.scale_mode, p)                     # [rows * K/32, 1]
    rows = g.op("Shape", [x], f"{p}/Rows", start=0, end=-1)
    scale_shape = g.op("Concat", [rows, g.const_i64(f"{p}.blocks", [k // spec.group_size])], f"{p}/ScaleShape",
                       axis=0)
    scale = g.op("Reshape", [scale, scale_shape], f"{p}/BlockScale")               # [..., K/32]
    q = g.op("QuantizeLinear", [x32, scale], f"{p}/ToFp4", axis=-1, block_size=spec.group_size,
             output_dtype=TensorProto.FLOAT4E2M1)
    y = g.op("DequantizeLinear", [q, scale], f"{p}/FromFp4", axis=-1, block_size=spec.group_size)
    cache[key] = y
    return y


def emit_nvfp4_activation_per_expert(ctx, x: str, input_scale_2: str, prefix: str) -> str:
    """Quark's NVFP4 activation fake-quantization with each chosen expert's own static input_scale_2 (routed MoE,
    builder/ops/routed_experts.py): x [..., K] in the io dtype, input_scale_2 a float32 tensor [..., 1] that
    broadcasts against x's rows (the experts' scales Gathered at the routing indices) -> [broadcast rows..., K].
    The math of emit_fp4_activation_qdq's NVFP4 branch, with the division by input_scale_2 written out:
    e4m3(clip(s / input_scale_2, +-448)) * input_scale_2, the unit-scale Q/DQ doing the e4m3 rounding (fnuz
    saturate + scale-2 Q/DQ where the EP profile says so)."""
    g = ctx.graph
    c = _consts(g)
    p = f"{prefix}/NvFp4Act"
    if _act_op_ready(ctx, "QuantizeDequantizeNvfp4"):
        # the subgraph below as one com.quark_onnx node, one scale per row (the same bits)
        return g.quark_op("QuantizeDequantizeNvfp4", [x, input_scale_2], f"{p}/QuantizeDequantizeNvfp4")
    x32 = x if ctx.io == "fp32" else g.op("Cast", [x], f"{p}/CastF32", to=TensorProto.FLOAT)
    k = g.op("Shape", [x], f"{p}/LastDim", start=-1)
    rows = g.op("Shape", [x], f"{p}/Rows", start=0, end=-1)
    block = g.const_i64(f"{p}.block", [NVFP4_GROUP_SIZE])
    n_blocks = g.op("Div", [k, block], f"{p}/BlockCount")
    blocks = g.op("Reshape", [x32, g.op("Concat", [rows, n_blocks, block], f"{p}/BlockShape", axis=0)],
                  f"{p}/ToBlocks")                                                    # [..., K/16, 16]
    amax = g.op("ReduceMax", [g.op("Abs", [blocks], f"{p}/Abs"), c["neg_axis"]], f"{p}/BlockMax", keepdims=1)
    s = g.op("Div", [amax, c["six"]], f"{p}/Div6")
    s = g.op("Where", [g.op("Equal", [s, c["zero"]], f"{p}/IsZero"), c["eps"], s], f"{p}/FillEps")
    s2 = g.op("Unsqueeze", [input_scale_2, c["neg_axis"]], f"{p}/ScaleRows")            # [..., 1, 1]
    ratio = g.op("Div", [s, s2], f"{p}/DivInputScale2")                              # [rows..., K/16, 1]
    if fnuz.applies(ctx):
        ratio = fnuz.saturate(g, ratio, c["e4m3_min"], c["e4m3_max"], f"{p}/ScaleFp8Max")
        u = fnuz.unit_qdq(ctx, ratio, f"{p}/ScaleE4m3", np.float32)
    else:
        one = c["one"]
        u = g.op("DequantizeLinear", [g.op("QuantizeLinear", [ratio, one, c["fp8_zero"]], f"{p}/ScaleToE4m3",
                                           saturate=1), one], f"{p}/ScaleFromE4m3")
    sq = g.op("Mul", [u, s2], f"{p}/MulInputScale2")
    den = g.op("Where", [g.op("Equal", [sq, c["zero"]], f"{p}/ScaleIsZero"), c["eps"], sq], f"{p}/SafeDivisor")
    y = g.op("Mul", [_e2m1_round(g, c, g.op("Div", [blocks, den], f"{p}/DivScale"), p), sq], f"{p}/MulScale")
    out_rows = g.op("Shape", [y], f"{p}/OutRows", start=0, end=-2)
    y = g.op("Reshape", [y, g.op("Concat", [out_rows, k], f"{p}/OutShape", axis=0)], f"{p}/FromBlocks")
    if ctx.io != "fp32":
        y = g.op("Cast", [y], f"{p}/CastIo", to=ctx.io_type)
    return y


def _mx_block_scale(g, c, amax: str, mode: str, p: str) -> str:
    """e8m0 block scale 2^(E - 2), E from the block max per scale_calculation_mode, as exact float32."""
    a = g.op("Max", [amax, c["min_normal"]], f"{p}/ClampMax")
    log2 = g.op("Mul", [g.op("Log", [a], f"{p}/Log"), c["inv_ln2"]], f"{p}/Log2")
    e_est = g.op("Clip", [g.op("Floor", [log2], f"{p}/Floor"), c["exp_lo"], c["exp_hi"]], f"{p}/ClipExp")
    idx = g.op("Cast", [g.op("Add", [e_est, c["bias"]], f"{p}/AddBias")], f"{p}/ExpIndex", to=TensorProto.INT64)
    pw = g.op("Gather", [c["pow2"], idx], f"{p}/Pow2")
    # float log2 can be one off next to a power of two: fix so that pw <= a < 2 pw exactly
    pw_lo = g.op("Mul", [pw, c["half"]], f"{p}/Pow2Half")
    pw = g.op("Where", [g.op("Less", [a, pw], f"{p}/TooHigh"), pw_lo, pw], f"{p}/FixHigh")
    pw_hi = g.op("Mul", [pw, c["two"]], f"{p}/Pow2Double")
    pw = g.op("Where", [g.op("GreaterOrEqual", [a, pw_hi], f"{p}/TooLow"), pw_hi, pw], f"{p}/FixLow")
    base = g.op("Mul", [pw, c["quarter"]], f"{p}/Pow2Div4")            # 2^(E0 - 2)
    if mode == "floor":
        scale = base
    else:
        if mode == "even":
            up = g.op("GreaterOrEqual", [a, g.op("Mul", [pw, c["one_75"]], f"{p}/Pow2x1.75")], f"{p}/RoundUp")
        else:  # ceil
            up = g.op("Greater", [a, pw], f"{p}/RoundUp")
        scale = g.op("Where", [up, g.op("Mul", [pw, c["half"]], f"{p}/Pow2Div2"), base], f"{p}/E8m0")
    return g.op("Max", [scale, c["min_scale"]], f"{p}/ClampScale")


def _nv_block_scale(g, c, amax: str, input_scale_2: float | None, p: str,
                    as_fnuz: bool = False) -> tuple[str, str]:
    """(scale to multiply back, divisor): amax/6 fake-quantized to e4m3 with the static input_scale_2
    (as_fnuz: written as Clip + float8e4m3fnuz Q/DQ with 2 * input_scale_2, builder/ops/fnuz.py)."""
    s = g.op("Div", [amax, c["six"]], f"{p}/Div6")
    s = g.op("Where", [g.op("Equal", [s, c["zero"]], f"{p}/IsZero"), c["eps"], s], f"{p}/FillEps")
    if input_scale_2 is None:
        return s, s
    if as_fnuz:
        sq = fnuz.scale_qdq(g, s, input_scale_2, np.float32, p)
    else:
        s2 = g.initializer(f"{p}.input_scale_2", np.array(input_scale_2, dtype=np.float32))
        sq = g.op("QuantizeLinear", [s, s2, c["fp8_zero"]], f"{p}/ScaleToE4m3", saturate=1)
        sq = g.op("DequantizeLinear", [sq, s2], f"{p}/ScaleFromE4m3")
    den = g.op("Where", [g.op("Equal", [sq, c["zero"]], f"{p}/ScaleIsZero"), c["eps"], sq], f"{p}/SafeDivisor")
    return sq, den


def _e2m1_round(g, c, y: str, p: str) -> str:
    """Round half to even onto the e2m1 grid {0, .5, 1, 1.5, 2, 3, 4, 6}, saturating at +-6."""
    mag = g.op("Abs", [y], f"{p}/AbsScaled")
    step = g.op("Where", [g.op("Less", [mag, c["four"]], f"{p}/Below4"), c["one"], c["two"]], f"{p}/Step24")
    step = g.op("Where", [g.op("Less", [mag, c["two"]], f"{p}/Below2"), c["half"], step], f"{p}/Step")
    q = g.op("Round", [g.op("Div", [y, step], f"{p}/DivStep")], f"{p}/RoundHalfEven")
    q = g.op("Mul", [q, step], f"{p}/MulStep")
    return g.op("Clip", [q, c["e2m1_min"], c["e2m1_max"]], f"{p}/Saturate")
