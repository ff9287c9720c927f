"""Routed mixture of experts in standard ONNX ops ("gather" form): every EP runs it, and a decoded token reads only
the k chosen experts' weights.

Each expert projection (gate, up, down; gpt-oss gate_up, down) of a layer becomes one stack of E experts in the
scheme's own compact encoding, laid out [E, K, N] (in x out, so no transpose at run time):
    int4/uint4 : codes u8 [E, K, N/2] (two unsigned nibbles per byte: low = column j, high = column j + N/2), zero
                 points u8 and fp32 scales [E, G, 1, N] (G groups of g along K; per-channel: G = 1)
    int8/uint8 : int8/uint8 [E, K, N], zero points and fp32 scales [E, G, 1, N]
    MXFP4      : e2m1 codes u8 [E, K, N/2] (nibbles as for 4-bit), e8m0 scale bytes u8 [E, K/32, 1, N]
    NVFP4      : e2m1 codes as MXFP4, e4m3fn block scale bytes u8 [E, K/16, 1, N], fp32 weight_scale_2 [E, 1, 1, 1]
    INT8 W8A8  : int8/uint8 [E, K, N], zero points and fp32 scales [E, 1, 1, N] (per channel) or [E, 1, 1, 1]
    FP8 e4m3   : weight bytes u8 [E, K, N], fp32 scale [E, 1, 1] (per tensor) or [E, 1, N] (per channel)
    float      : the io dtype [E, K, N] (experts Quark left float)
    biases     : [E, 1, N] in the io dtype; static input quantization parameters [E, 1, 1] fp32 (InputQuant)
Decoding is exact fp32 arithmetic on the gathered bytes (_decode): nibbles by floor(b / 16), e2m1 values by a
piecewise-linear formula, Gather(2^(b-127) [256], e8m0 byte) for the MX scales, Gather(e4m3fn values [256], byte) for
FP8 and the NVFP4 block scales (times weight_scale_2: one fp32 product, Quark's order); then (q - zp) * s per group or
value * scale: the same fp32 products Quark's dequantizers compute.

    x ─► router ─► TopK ─► idx [T, k], weights [T, k] (and the dense [T, E] routing weights)
    If (T <= max_tokens):                                                          (T = batch * sequence tokens)
      routed: Gather(stack, idx) ─► decode ─► W [T, k, K, N] ; x [T, 1, 1, K] ─(input act. quant)─► MatMul
              ─► [T, k, 1, N] ─► activation ─(down input act. quant)─► MatMul(Gather(down, idx)) ─► [T, k, 1, H]
              ─► · weights ─► ReduceSum over k
      else:   the same per chunk of C experts, every token: W [C, K, N], x [T, K] ─► [C, T, N] ... ─► [C, T, H]
              ─► · dense routing weights (0 off the chosen k) ─► ReduceSum over experts, summed over chunks
In-expert activation quantization is Quark's, per chosen expert: dynamic MXFP4 on each projection's input
(ops/mx_activation.py; the gate/up input is the same x for every expert, emulated once before the If); with the
chosen expert's own static parameters Gathered from [E] stacks (InputQuant, _input_quant):
  FP8   x_q = fp8(clip(x / s_e, +-448)) * s_e (written as x / s_e ─ unit-scale Q/DQ ─ * s_e, the same float division
        QuantizeLinear does; float8e4m3fnuz with scale 2 where the EP profile says so, builder/ops/fnuz.py)
  NVFP4 dynamic e2m1 blocks of 16 whose block scales are e4m3-quantized with the expert's input_scale_2
        (mx_activation.emit_nvfp4_activation_per_expert; the dense form's arithmetic; on cpu with the library one
        com.quark_onnx QuantizeDequantizeNvfp4 node with a scale per row)
  INT8  x_q = (clip(round(x * r_e) + z_e, qmin, qmax) - z_e) * s_e, r_e = fp32(1 / s_e) (torch's
        fake_quantize_per_tensor_affine, as the dense Int8W8A8 form: quant/int8_w8a8.py)
The gate/up input then differs per chosen expert: one row per slot.
amd_arch=gfx950 (-e rocm / -e migraphx, MXFP4 experts with MXFP4 activations, K > 32: Stack.mx_gemm): the projection's
MatMul takes float32 operands that are both DequantizeLinear(QuantizeLinear(., blocked e8m0 scale, float4e2m1)): the
activation through Quark's even block scale (ops/mx_activation.py emit_mx_activation_fp4_qdq), the gathered e2m1
values with unit scale, dequantized with the gathered block scales (quant/mx_gemm.py emit_routed_weight_mx), which
MIGraphX's simplify_qdq turns into a batched 4-input quant_dot on gfx950 (docs/amd_generations.md).

Why an If: the routed branch materialises T * k decoded expert matrices, which is k/E of the stack per token at
decode (T = 1) but T * k / E stacks for a prefill of T tokens; past T = E / k it decodes more than every expert once
(the default max_tokens), so prefill takes the per-chunk dense branch, which decodes each expert once per call.
MIGraphX reads If (AMDMIGraphX src/onnx/parse_if.cpp, commit f729a52: a condition it can evaluate at parse time,
as one computed from static input shapes, inlines the chosen branch; otherwise an `if` op with both submodules,
whose output shapes must agree: both are [T, H] here). The dense branch takes its expert indices from a run-time
zero (Min(ReduceMin(idx), 0) + range) so that no optimizer folds the decoded stack into an fp32 constant (MIGraphX
rewrites Mul(x, 0) to the literal 0: simplify_algebra.cpp find_zero_ops).
"""
from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper

from ..compact_forms import COMPACT
from ..quant.float_linear import FloatLinear
from ..quant.fp8_w8a8 import Fp8W8A8, activation_mode, scalar_scale
from ..quant.int8_w8a8 import INT_DTYPES, Int8W8A8
from ..quant.int_packing import pack_uint_lowfirst
from ..quant.int_weight_only import BITS, IntWeightOnly
from ..quant.mxfp4 import MXFP4_GROUP, Mxfp4Linear, _e8m0_bytes, emulate_activations, scales_in_io
from ..quant.mxfp4_fp8 import Mxfp4Fp8Linear
from ..quant.nvfp4 import NVFP4_GROUP, Nvfp4Linear
from ..quant import fp4_codes
from ..quant.mx_gemm import emit_routed_weight_mx, routed_mx_applies
from . import fnuz
from .matmul_nbits import block_size_for
from .qdq import fp8_unit_qdq
from .mx_activation import (Fp4ActivationSpec, emit_fp4_activation_qdq, emit_mx_activation_fp4_qdq,
                            emit_nvfp4_activation_per_expert)

CHUNK_BYTES = 256 << 20  # dense branch: fp32 bytes of one chunk's decoded projection (bounds its transient memory)
FP8_MAX = 448.0


@dataclass
class Stack:
    """One expert projection of one layer, stacked over the E experts (module docstring)."""
    kind: str                  # int4 | int8 | mxfp4 | fp8 | float
    k: int
    n: int
    groups: int
    data: str
    scale: str | None = None
    zero: str | None = None
    bias: str | None = None
    mx_mode: str | None = None         # dynamic MXFP4 input quantization (scale_calculation_mode)
    input_quant: "InputQuant | None" = None
    scale_2: str | None = None         # NVFP4 weight_scale_2 [E, 1, 1, 1]
    mx_gemm: bool = False              # amd_arch=gfx950: float4e2m1 Q/DQ on both MatMul operands (quant/mx_gemm.py)


@dataclass
class InputQuant:
    """Quark's input quantization of one projection with each expert's own static parameters, stacked over the
    experts ([E, 1, 1] in the standard-op form, [E, 1] in the op form) and Gathered at the routing indices."""
    kind: str                      # fp8 | nvfp4 | int8
    scale: str                     # fp8, int8: input_scale; nvfp4: input_scale_2 (of the e4m3 block scales)
    inv_scale: str | None = None   # int8: fp32(1 / input_scale)
    zero: str | None = None        # int8: the zero point, as float
    qtype: str | None = None       # int8: int8 | uint8


INPUT_ROLES = {"in_scale": "scale", "in_inv": "inv_scale", "in_zero": "zero"}


def _input_quant_arrays(ctx, plan, shape: tuple) -> dict[str, np.ndarray]:
    """One expert's static input quantization parameters (roles of INPUT_ROLES), each of `shape`."""
    scheme, spec, name = plan.scheme, plan.spec, plan.name
    full = lambda v: np.full(shape, v, np.float32)  # noqa: E731
    if scheme is Mxfp4Fp8Linear or (scheme is Fp8W8A8 and activation_mode(spec) == "static"):
        return {"in_scale": full(scalar_scale(ctx.ckpt, f"{name}.input_scale"))}
    if scheme is Nvfp4Linear and spec.input_tensors and emulate_activations(ctx):
        return {"in_scale": full(ctx.ckpt.get_f32(f"{name}.input_scale_2"))}
    if scheme is Int8W8A8:
        a = spec.input_tensors[0]
        s = np.float32(ctx.ckpt.get_scale(f"{name}.input_scale").reshape(()))
        zp = Int8W8A8._zp(ctx.ckpt, f"{name}.input_zero_point", a.dtype, 1).reshape(())
        return {"in_scale": full(s), "in_inv": full(np.float32(1.0) / s), "in_zero": full(float(zp))}
    return {}


def _input_quant_of(plan, names: dict[str, str]) -> InputQuant | None:
    if "in_scale" not in names:
        return None
    scheme = plan.scheme
    kind = "nvfp4" if scheme is Nvfp4Linear else "int8" if scheme is Int8W8A8 else "fp8"
    qtype = plan.spec.input_tensors[0].dtype if kind == "int8" else None
    return InputQuant(kind, names["in_scale"], names.get("in_inv"), names.get("in_zero"), qtype)


def _int8_w8a8_weight(ctx, plan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q [N, K] int8|uint8, scale fp32 [1] or [N], zero point [1] or [N] in q's dtype), as Int8W8A8.emit reads
    them (a per-channel spec with one stored scale: repeated)."""
    ckpt, base, w = ctx.ckpt, plan.name, plan.spec.weight[0]
    q = np.asarray(ckpt.get(f"{base}.weight"))
    scale = np.asarray(ckpt.get_scale(f"{base}.weight_scale"), np.float32).reshape(-1)
    zp = Int8W8A8._zp(ckpt, f"{base}.weight_zero_point", w.dtype, scale.size)
    if w.qscheme == "per_channel" and scale.size == 1:
        scale, zp = np.repeat(scale, plan.out_features), np.repeat(zp, plan.out_features)
    return q.astype(INT_DTYPES[w.dtype]), scale, zp


def stack_key(plan):
    """The format every expert of one projection must share to be stacked; None: this form cannot hold it."""
    scheme, spec = plan.scheme, plan.spec
    if scheme is FloatLinear:
        return ("float",)
    if scheme is IntWeightOnly:
        w = spec.weight[0]
        if BITS[w.dtype] == 4 and plan.out_features % 2:
            return None
        return ("int", w.dtype, w.qscheme, w.group_size)
    if scheme is Mxfp4Linear:
        if plan.out_features % 2:
            return None
        a = spec.input_tensors
        return ("mxfp4", (a[0].scale_calculation_mode or "even") if a else None)
    if scheme is Mxfp4Fp8Linear:
        return ("mxfp4_fp8",) if plan.out_features % 2 == 0 else None
    if scheme is Nvfp4Linear:
        return ("nvfp4", bool(spec.input_tensors)) if plan.out_features % 2 == 0 else None
    if scheme is Int8W8A8:
        w, a = spec.weight[0], spec.input_tensors[0]
        return ("int8_w8a8", w.dtype, w.qscheme, a.dtype)
    if scheme is Fp8W8A8:
        mode = activation_mode(spec)
        if mode not in ("none", "static") or spec.output_tensors:
            return None  # dynamic activations: Quark's scale would span the tokens routed to an expert
        return ("fp8", mode, spec.weight[0].qscheme)
    return None


def applies(experts: list[tuple]) -> bool:
    """Every projection position has one stackable format across the experts (and one shape)."""
    return why_not(experts) is None


_FP8_MODE_WORDS = {"dynamic_tensor": "dynamic per-tensor", "dynamic_token": "dynamic per-token"}


def _unstackable(plan) -> str:
    """Why stack_key(plan) is None, in words (for `inspect`)."""
    scheme, spec = plan.scheme, plan.spec
    if scheme in (IntWeightOnly, Mxfp4Linear, Mxfp4Fp8Linear, Nvfp4Linear) and plan.out_features % 2:
        return f"an odd output width ({plan.out_features}) of its 4-bit packed weight"
    if scheme is Fp8W8A8:
        if spec.output_tensors:
            return "FP8 output quantization"
        return f"{_FP8_MODE_WORDS.get(activation_mode(spec), activation_mode(spec))} FP8 activations"
    return f"its scheme ({getattr(scheme, 'name', scheme.__name__)}), which the stacked form does not hold"


def why_not(experts: list[tuple]) -> str | None:
    """None when `applies`; else one line naming the first projection whose experts do not stack, and why."""
    for j in range(len(experts[0])):
        keys = {}
        for e in experts:
            keys.setdefault((stack_key(e[j]), e[j].in_features, e[j].out_features), e[j])
        if len(keys) == 1 and next(iter(keys))[0] is not None:
            continue
        bad = next((p for k, p in keys.items() if k[0] is None), None)
        if bad is not None:
            return f"{bad.name}: {_unstackable(bad)}"
        (k0, p0), (k1, p1) = list(keys.items())[:2]
        what = "shape" if k0[0] == k1[0] else "quantization"
        return f"{p0.name} and {p1.name} differ in {what} ({_describe_key(k0)} vs {_describe_key(k1)})"
    return None


def _describe_key(key) -> str:
    fmt, k, n = key
    return f"{'/'.join(str(x) for x in fmt if x is not None)} [{n}, {k}]"


# ---- lookup tables (one per graph) ------------------------------------------------------------------------------

def _lut(g, kind: str) -> str:
    name = f"moe_routed.lut.{kind}"
    if g.has(name):
        return name
    b = np.arange(256, dtype=np.uint8)
    if kind == "e8m0":              # e8m0 byte -> 2^(b - 127)
        table = np.full(256, np.nan, np.float32)  # 255: NaN (refused in weights by Mxfp4Linear.check)
        table[:255] = np.ldexp(np.float32(1), np.arange(255) - fp4_codes.E8M0_BIAS).astype(np.float32)
    elif kind == "e4m3fn":
        table = b.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    else:
        raise ValueError(kind)
    return g.initializer(name, table)


def _pack_halves(u: np.ndarray) -> np.ndarray:
    """[K, N] values 0..15 -> [K, N/2] bytes: low nibble = column j, high nibble = column j + N/2 (so that the
    unpacked halves join with one Concat of contiguous blocks)."""
    u = u.astype(np.uint8)
    half = u.shape[1] // 2
    return (u[:, :half] | (u[:, half:] << 4)).astype(np.uint8)


# ---- stacks -----------------------------------------------------------------------------------------------------

def _expert_arrays(ctx, plan) -> dict[str, np.ndarray]:
    """One expert's tensors in the stack layout (module docstring), without the leading E axis."""
    scheme, k, n = plan.scheme, plan.in_features, plan.out_features
    if scheme is FloatLinear:
        w = ctx.float_weight(plan.weight_name or f"{plan.name}.weight")
        return {"data": np.ascontiguousarray(np.asarray(w).T)}
    if scheme is IntWeightOnly:
        iw = IntWeightOnly.load(plan, ctx.ckpt, ctx.quant.export.pack_method)
        groups = k // iw.group_size
        scale = iw.scale.T.reshape(groups, 1, n).astype(np.float32)
        if iw.bits == 4:
            u, zpu = iw.to_unsigned()
            return {"data": _pack_halves(u.T), "zero": zpu.T.reshape(groups, 1, n), "scale": scale}
        dtype = np.int8 if iw.signed else np.uint8
        return {"data": np.ascontiguousarray(iw.q.T).astype(dtype), "zero": iw.zp.T.reshape(groups, 1, n)
                .astype(dtype), "scale": scale}
    out = _input_quant_arrays(ctx, plan, (1, 1))
    if scheme in (Mxfp4Linear, Mxfp4Fp8Linear):
        w = Mxfp4Linear.load(plan, ctx.ckpt)
        if ctx.io != "fp32":
            scales_in_io(ctx, plan, w)  # refuses scales that vanish or overflow in fp16/bf16, as the dense form
        return {**out, "data": _pack_halves(w.codes.T),
                "scale": np.ascontiguousarray(_e8m0_bytes(ctx.ckpt, f"{plan.name}.weight_scale").T)
                .reshape(k // MXFP4_GROUP, 1, n)}
    if scheme is Nvfp4Linear:
        codes = fp4_codes.unpack_fp4_codes(ctx.ckpt.get(f"{plan.name}.weight"))
        block = np.asarray(ctx.ckpt.get(f"{plan.name}.weight_scale")).view(np.uint8)        # e4m3fn bytes [N, K/16]
        return {**out, "data": _pack_halves(codes.T),
                "scale": np.ascontiguousarray(block.T).reshape(k // NVFP4_GROUP, 1, n),
                "scale_2": np.full((1, 1, 1), ctx.ckpt.get_f32(f"{plan.name}.weight_scale_2"), np.float32)}
    if scheme is Fp8W8A8:
        q, scale = Fp8W8A8.load(plan, ctx.ckpt)
        return {**out, "data": np.ascontiguousarray(np.asarray(q).view(np.uint8).T),
                "scale": scale.reshape(1, -1).astype(np.float32)}  # [1, 1] or [1, N]
    if scheme is Int8W8A8:
        q, scale, zp = _int8_w8a8_weight(ctx, plan)
        return {**out, "data": np.ascontiguousarray(q.T), "zero": zp.reshape(1, 1, -1),
                "scale": scale.reshape(1, 1, -1)}  # [1, 1, N] or [1, 1, 1]
    raise AssertionError(scheme)


def _stream_stack(ctx, plans: list, data_name: str, arrays_of, bias_shape: tuple) -> tuple[str, dict, dict]:
    """Every expert's arrays_of(ctx, plan) (plans in expert order): the "data" arrays streamed to the data file as
    one [E, ...] initializer named data_name, one expert at a time; the other (small) roles and the biases
    (reshaped to bias_shape) collected per role. Returns (data initializer, {role: [per-expert arrays]}, the first
    expert's arrays)."""
    small: dict[str, list[np.ndarray]] = {}
    head = arrays_of(ctx, plans[0])

    def weights():
        for e, p in enumerate(plans):
            arrays = head if e == 0 else arrays_of(ctx, p)
            for role, arr in arrays.items():
                if role != "data":
                    small.setdefault(role, []).append(arr)
            parts = p if isinstance(p, tuple) else (p,)  # (gate, up) pairs have no biases (fuses_gate_up)
            if not isinstance(p, tuple) and p.has_bias:
                small.setdefault("bias", []).append(ctx.float_weight(f"{p.name}.bias").reshape(bias_shape))
            if ctx.progress:
                for q in parts:
                    ctx.progress(q)
            yield arrays["data"]

    data = head["data"]
    return ctx.graph.stream(data_name, data.dtype, (len(plans), *data.shape), weights()), small, head


def build_stack(ctx, plans: list, name: str) -> Stack:
    """Stack one projection of every expert (plans in expert order) into initializers named `name`.*. The big
    weight tensor is streamed to the data file one expert at a time; scales, zero points and biases are small."""
    g, first = ctx.graph, plans[0]
    key = stack_key(first)
    data, small, head = _stream_stack(ctx, plans, f"{name}.routed.data", _expert_arrays, (1, -1))
    names = {"data": data}
    names.update({role: g.initializer(f"{name}.routed.{role}", np.stack(arrs)) for role, arrs in small.items()})
    kind = {"float": "float", "mxfp4": "mxfp4", "mxfp4_fp8": "mxfp4", "fp8": "fp8", "nvfp4": "nvfp4",
            "int8_w8a8": "int8"}.get(key[0])
    if key[0] == "int":
        kind = "int4" if BITS[key[1]] == 4 else "int8"
    groups = int(head["scale"].shape[0]) if kind in ("int4", "int8", "mxfp4", "nvfp4") else 1
    mx_mode = _mx_mode(ctx, key)
    return Stack(kind, first.in_features, first.out_features, groups, names["data"], names.get("scale"),
                 names.get("zero"), names.get("bias"), mx_mode, _input_quant_of(first, names),
                 names.get("scale_2"), stack_takes_mx(ctx, first))


def stack_takes_mx(ctx, plan) -> bool:
    """amd_arch=gfx950: this projection's MXFP4 experts with MXFP4 activations take the MX GEMM form
    (quant/mx_gemm.py routed_mx_applies; the activation emulated, more than one block along K)."""
    key = stack_key(plan)
    return (key is not None and key[0] == "mxfp4" and _mx_mode(ctx, key) is not None
            and routed_mx_applies(ctx.ep, plan, ctx.options.mx_activations) is None)


def _activation(ctx, st: Stack, x: str, p: str) -> str:
    """Quark's dynamic MXFP4 input quantization of a stack's input x [..., K]: the float Round emulation (io dtype),
    or on an MX stack the float4e2m1 Q/DQ pair (float32, ops/mx_activation.py emit_mx_activation_fp4_qdq)."""
    spec = Fp4ActivationSpec("mxfp4", MXFP4_GROUP, st.mx_mode)
    if st.mx_gemm:
        return emit_mx_activation_fp4_qdq(ctx, x, spec, p, st.k)
    return emit_fp4_activation_qdq(ctx, x, spec, p)


def _mx_mode(ctx, key) -> str | None:
    """The dynamic MXFP4 input quantization's scale mode of a stack, or None."""
    return key[1] if key[0] == "mxfp4" and emulate_activations(ctx) else None


# ---- decoding a gathered stack ----------------------------------------------------------------------------------

def _decode(ctx, st: Stack, idx: str, nb: int, p: str) -> str:
    """Gather(stack, idx) -> the chosen experts' weights [..., K, N] in the io dtype; nb: rank of idx.
    Elementwise arithmetic on the gathered bytes (ONNX Runtime's CPU Gather is slow for table lookups of single
    elements; Cast / Floor / Mul / Sub / Relu are vectorized everywhere), every step exact in fp32:
      4-bit byte b: hi = floor(b / 16), lo = b - 16 hi; Concat(lo, hi) restores the [K, N] codes
      e2m1 code c: s = floor(c / 8), m = c - 8 s; |v| = m/2 + relu(m - 4)/2 + relu(m - 6)  (0, .5, 1, 1.5, 2, 3, 4, 6);
                   v = |v| (1 - 2 s)
      then (q - zp) * scale per group along K (integers), v * 2^(e - 127) (MXFP4), e4m3 value * scale (FP8).
    An MX stack (amd_arch=gfx950) stops at the e2m1 values and the e8m0 scales: quant/mx_gemm.py
    emit_routed_weight_mx makes them the float4e2m1 Q/DQ operand, float32."""
    g = ctx.graph
    keep = [0] * nb

    def gather(tensor, tag):
        return g.op("Gather", [tensor, idx], f"{p}/Gather{tag}", axis=0)

    def const(tag, value):
        name = f"moe_routed.const.{tag}"
        return name if g.has(name) else g.scalar(name, value, np.float32)

    raw = gather(st.data, "Weight")
    if st.kind == "float":
        return raw
    if st.kind == "fp8":
        codes = g.op("Cast", [raw], f"{p}/CodesToInt", to=TensorProto.INT32)
        w = g.op("Mul", [g.op("Gather", [_lut(g, "e4m3fn"), codes], f"{p}/E4m3", axis=0),
                         gather(st.scale, "Scale")], f"{p}/MulScale")
    else:
        w = g.op("Cast", [raw], f"{p}/ToFloat", to=TensorProto.FLOAT)
        if st.kind in ("int4", "mxfp4", "nvfp4"):
            hi = g.op("Floor", [g.op("Mul", [w, const("sixteenth", 0.0625)], f"{p}/Div16")], f"{p}/High")
            lo = g.op("Sub", [w, g.op("Mul", [hi, const("sixteen", 16.0)], f"{p}/High16")], f"{p}/Low")
            w = g.op("Concat", [lo, hi], f"{p}/Codes", axis=-1)                    # [..., K, N]
        if st.kind in ("mxfp4", "nvfp4"):
            sign = g.op("Floor", [g.op("Mul", [w, const("eighth", 0.125)], f"{p}/Div8")], f"{p}/Sign")
            m = g.op("Sub", [w, g.op("Mul", [sign, const("eight", 8.0)], f"{p}/Sign8")], f"{p}/Magnitude")
            half = const("half", 0.5)
            v = g.op("Mul", [m, half], f"{p}/HalfM")
            v = g.op("Add", [v, g.op("Mul", [g.op("Relu", [g.op("Sub", [m, const("four", 4.0)], f"{p}/M4")],
                                                  f"{p}/Relu4"), half], f"{p}/HalfRelu4")], f"{p}/Add4")
            v = g.op("Add", [v, g.op("Relu", [g.op("Sub", [m, const("six", 6.0)], f"{p}/M6")], f"{p}/Relu6")],
                     f"{p}/Add6")
            sgn = g.op("Sub", [const("one", 1.0), g.op("Mul", [sign, const("two", 2.0)], f"{p}/Sign2")],
                       f"{p}/SignFactor")
            w = g.op("Mul", [v, sgn], f"{p}/E2m1")
        if st.mx_gemm:  # [..., G, 1, N] e8m0 bytes -> float32 [..., G, N] -> Q/DQ (quant/mx_gemm.py)
            scale = g.op("Gather", [_lut(g, "e8m0"), g.op("Cast", [gather(st.scale, "Scale")], f"{p}/ScaleToInt",
                                                          to=TensorProto.INT32)], f"{p}/E8m0", axis=0)
            scale = g.op("Reshape", [scale, g.const_i64(f"{p}/scale_shape", keep + [st.groups, st.n])],
                         f"{p}/BlockScale")
            return emit_routed_weight_mx(ctx, w, scale, nb, p)
        grouped = g.op("Reshape", [w, g.const_i64(f"{p}/group_shape", keep + [st.groups, st.k // st.groups, st.n])],
                       f"{p}/Groups")
        scale = gather(st.scale, "Scale")                                          # [..., G, 1, N]
        if st.kind == "mxfp4":
            scale = g.op("Gather", [_lut(g, "e8m0"), g.op("Cast", [scale], f"{p}/ScaleToInt", to=TensorProto.INT32)],
                         f"{p}/E8m0", axis=0)
        elif st.kind == "nvfp4":  # fp32(e4m3 block scale) * weight_scale_2, rounded once (fp4_codes.nvfp4_block_scales)
            scale = g.op("Gather", [_lut(g, "e4m3fn"), g.op("Cast", [scale], f"{p}/ScaleToInt",
                                                            to=TensorProto.INT32)], f"{p}/E4m3Scale", axis=0)
            scale = g.op("Mul", [scale, gather(st.scale_2, "Scale2")], f"{p}/MulScale2")
        else:
            zp = g.op("Cast", [gather(st.zero, "Zero")], f"{p}/ZeroToFloat", to=TensorProto.FLOAT)
            grouped = g.op("Sub", [grouped, zp], f"{p}/SubZero")
        w = g.op("Reshape", [g.op("Mul", [grouped, scale], f"{p}/MulScale"),
                             g.const_i64(f"{p}/kn_shape", keep + [st.k, st.n])], f"{p}/Dequantized")
    if ctx.io != "fp32":
        w = g.op("Cast", [w], f"{p}/CastIo", to=ctx.io_type)
    return w


def _input_quant(ctx, q: InputQuant, x: str, idx: str, p: str) -> str:
    """Quark's static input quantization with each chosen expert's own parameters (InputQuant), broadcast over x:
    x [..., K] against the Gathered [idx..., 1 (, 1)] parameters (module docstring)."""
    g = ctx.graph

    def gathered(tensor, tag, io=True):
        v = g.op("Gather", [tensor, idx], f"{p}/Gather{tag}", axis=0)
        return g.op("Cast", [v], f"{p}/{tag}Io", to=ctx.io_type) if io and ctx.io != "fp32" else v

    if q.kind == "nvfp4":
        return emit_nvfp4_activation_per_expert(ctx, x, gathered(q.scale, "InputScale2", io=False), p)
    s = gathered(q.scale, "InputScale")
    if q.kind == "int8":
        info = np.iinfo(INT_DTYPES[q.qtype])
        zp = gathered(q.zero, "InputZero")
        lo = g.scalar(f"{p}/int_min", float(info.min), ctx.io_np)
        hi = g.scalar(f"{p}/int_max", float(info.max), ctx.io_np)
        r = g.op("Round", [g.op("Mul", [x, gathered(q.inv_scale, "InputScaleReciprocal")], f"{p}/MulReciprocal")],
                 f"{p}/Round")
        codes = g.op("Clip", [g.op("Add", [r, zp], f"{p}/AddZero"), lo, hi], f"{p}/Saturate")
        return g.op("Mul", [g.op("Sub", [codes, zp], f"{p}/SubZero"), s], f"{p}/MulInputScale")
    xs = g.op("Div", [x, s], f"{p}/DivInputScale")
    if fnuz.applies(ctx):
        hi = g.scalar(f"{p}/fp8_max", FP8_MAX, ctx.io_np)
        lo = g.scalar(f"{p}/fp8_min", -FP8_MAX, ctx.io_np)
        u = fnuz.unit_qdq(ctx, fnuz.saturate(g, xs, lo, hi, f"{p}/Saturate"), f"{p}/input_quant")
    else:  # QuantizeLinear saturates float8e4m3fn at +-448, rounding to nearest even (one node with the library)
        u = fp8_unit_qdq(ctx, xs, f"{p}/input_quant")
    return g.op("Mul", [u, s], f"{p}/MulInputScale")


def _project(ctx, st: Stack, x: str, idx: str, nb: int, p: str, mx_done: bool = False) -> str:
    """x [..., K] (broadcast against the chosen experts) -> x_q @ W (+ bias) for the experts in idx."""
    g = ctx.graph
    if st.mx_mode is not None and not mx_done:
        x = _activation(ctx, st, x, p)
    if st.input_quant is not None:
        x = _input_quant(ctx, st.input_quant, x, idx, p)
    y = g.op("MatMul", [x, _decode(ctx, st, idx, nb, f"{p}/weight")], f"{p}/MatMul")
    if st.mx_gemm and ctx.io != "fp32":  # both operands float32 (quant/mx_gemm.py emit_mx_matmul: why)
        y = g.op("Cast", [y], f"{p}/CastIo", to=ctx.io_type)
    if st.bias is not None:
        y = g.op("Add", [y, g.op("Gather", [st.bias, idx], f"{p}/GatherBias", axis=0)], f"{p}/BiasAdd")
    return y


# ---- the block --------------------------------------------------------------------------------------------------

@dataclass
class Routing:
    """Main-graph values: idx [T, k] int64, weights [T, k] and dense [T, E] in the io dtype."""
    idx: str
    weights: str
    dense: str


def routing_from_topk(ctx, top_idx: str, top_w: str, dense: str, top_k: int, num_experts: int, name: str,
                      prefix: str) -> Routing:
    """[B, S, k] / [B, S, E] router outputs -> token rows, weights in the io dtype."""
    g = ctx.graph
    rows_k = g.const_i64(f"{name}.routed.rows_k", [-1, top_k])
    rows_e = g.const_i64(f"{name}.routed.rows_e", [-1, num_experts])
    if ctx.io != "fp32":
        top_w = g.op("Cast", [top_w], f"{prefix}/router/TopWeightsIo", to=ctx.io_type)
    return Routing(g.op("Reshape", [top_idx, rows_k], f"{prefix}/router/IdxRows"),
                   g.op("Reshape", [top_w, rows_k], f"{prefix}/router/WeightRows"),
                   g.op("Reshape", [dense, rows_e], f"{prefix}/router/DenseRows"))


def routing_from_dense(ctx, dense: str, top_k: int, num_experts: int, name: str, prefix: str) -> Routing:
    """Dense weights [B, S, E] that are 0 exactly off the chosen k (and > 0 on them) -> Routing (their TopK is the
    router's choice: DeepSeek's grouped router, builder/ops/grouped_topk_router.py)."""
    g = ctx.graph
    vals, idx = g.node("TopK", [dense, g.const_i64(f"{name}.routed.top_k", [top_k])], f"{prefix}/router/Chosen",
                       outputs=2, axis=-1, largest=1, sorted=1)
    rows_k = g.const_i64(f"{name}.routed.rows_k", [-1, top_k])
    rows_e = g.const_i64(f"{name}.routed.rows_e", [-1, num_experts])
    return Routing(g.op("Reshape", [idx, rows_k], f"{prefix}/router/IdxRows"),
                   g.op("Reshape", [vals, rows_k], f"{prefix}/router/WeightRows"),
                   g.op("Reshape", [dense, rows_e], f"{prefix}/router/DenseRows"))


def silu_activation(ctx, ys: list[str], p: str) -> str:
    g = ctx.graph
    gate, up = ys
    return g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate], f"{p}/act/Sigmoid")], f"{p}/act/Silu"), up],
                f"{p}/act/Mul")


def _expert_mlp(ctx, first: list[Stack], down: Stack, xs: list[str], idx: str, nb: int, activation, p: str,
                mx_done: bool) -> str:
    ys = [_project(ctx, st, x, idx, nb, f"{p}/{j}", mx_done) for j, (st, x) in enumerate(zip(first, xs))]
    return _project(ctx, down, activation(ctx, ys, p), idx, nb, f"{p}/down")


def max_routed_tokens(ctx, num_experts: int, top_k: int) -> int:
    given = ctx.options.extra.get("moe_routed_tokens")
    return int(given) if given is not None else max(1, num_experts // top_k)


def emit_routed_experts(ctx, x: str, routing: Routing, experts: list[tuple], activation, top_k: int, name: str,
                        prefix: str) -> str:
    """x [B, S, H] -> the routed experts' weighted sum [B, S, H] (module docstring). experts: tuples of plans,
    the last one the down projection; activation(ctx, [outputs of the first ones], prefix) -> its input."""
    if experts_op_applies(ctx, experts):
        return emit_experts_op(ctx, x, routing, experts, activation, name, prefix)
    g = ctx.graph
    e_count = len(experts)
    hidden = experts[0][0].in_features
    stacks = [build_stack(ctx, [e[j] for e in experts], f"{name}.experts.{j}") for j in range(len(experts[0]))]
    first, down = stacks[:-1], stacks[-1]
    xt = g.op("Reshape", [x, g.const_i64(f"{name}.routed.token_rows", [-1, hidden])], f"{prefix}/routed/Tokens")
    # the same dynamic MXFP4 activation of x for every expert: once, outside the If (its cache must not hand a
    # value made in one branch to the other)
    xs = [_activation(ctx, st, xt, f"{prefix}/routed") if st.mx_mode is not None else xt for st in first]
    idx = routing.idx

    # routed branch: [T, k] experts per token
    start = len(g.nodes)
    p = f"{prefix}/routed"
    col = g.const_i64(f"{name}.routed.row_shape", [-1, 1, 1, hidden])
    xr = [g.op("Reshape", [xi, col], f"{p}/Rows{j}") for j, xi in enumerate(xs)]
    y = _expert_mlp(ctx, first, down, xr, idx, 2, activation, p, mx_done=True)  # [T, k, 1, H]
    w = g.op("Unsqueeze", [routing.weights, g.const_i64(f"{name}.routed.w_axes", [2, 3])], f"{p}/WeightCols")
    y = g.op("ReduceSum", [g.op("Mul", [y, w], f"{p}/Weighted"), g.const_i64(f"{name}.routed.k_axis", [1])],
             f"{p}/SumChosen", keepdims=0)                                          # [T, 1, H]
    routed_out = g.op("Reshape", [y, g.const_i64(f"{name}.routed.out_rows", [-1, hidden])], f"{p}/Out")
    routed_nodes = g.nodes[start:]
    del g.nodes[start:]

    # dense branch: chunks of C experts, every token
    start = len(g.nodes)
    p = f"{prefix}/all_experts"
    widest = max(st.k * st.n for st in stacks)
    chunk = int(max(1, min(e_count, CHUNK_BYTES // (4 * widest))))
    # 0 at run time (TopK indices are >= 0) that no optimizer can prove to be 0: not Mul(., 0), which MIGraphX's
    # simplify_algebra replaces by the literal (src/simplify_algebra.cpp find_zero_ops, commit f729a52), after which
    # propagate_constant would fold every decoded expert into an fp32 literal of the GPU program
    zero = g.op("Min", [g.op("ReduceMin", [idx], f"{p}/IdxMin", keepdims=0),
                        g.scalar(f"{name}.routed.zero_i64", 0, np.int64)], f"{p}/RunTimeZero")
    outs = []
    last_axis = g.const_i64(f"{name}.routed.last_axis", [-1])
    e_axis = g.const_i64(f"{name}.routed.e_axis", [0])
    for c0 in range(0, e_count, chunk):
        c1 = min(e_count, c0 + chunk)
        q = f"{p}/chunk{c0}"
        ids = g.op("Add", [g.const_i64(f"{name}.routed.chunk{c0}", list(range(c0, c1))), zero], f"{q}/Experts")
        y = _expert_mlp(ctx, first, down, xs, ids, 1, activation, q, mx_done=True)  # [C, T, H]
        wc = g.op("Gather", [routing.dense, ids], f"{q}/GatherWeights", axis=1)      # [T, C]
        wc = g.op("Unsqueeze", [g.op("Transpose", [wc], f"{q}/WeightsT", perm=[1, 0]),
                                last_axis], f"{q}/WeightCols")
        outs.append(g.op("ReduceSum", [g.op("Mul", [y, wc], f"{q}/Weighted"), e_axis], f"{q}/SumExperts",
                         keepdims=0))
    dense_out = outs[0] if len(outs) == 1 else g.op("Sum", outs, f"{p}/SumChunks")
    dense_nodes = g.nodes[start:]
    del g.nodes[start:]

    tokens = g.op("Shape", [xt], f"{prefix}/routed/TokenCount", start=0, end=1)
    limit = g.const_i64(f"{name}.routed.max_tokens", [max_routed_tokens(ctx, e_count, top_k)])
    cond = g.op("LessOrEqual", [tokens, limit], f"{prefix}/routed/FewTokens")
    out_info = lambda v: helper.make_tensor_value_info(v, ctx.io_type, None)  # noqa: E731
    then_g = helper.make_graph(routed_nodes, f"{name}.routed", [], [out_info(routed_out)])
    else_g = helper.make_graph(dense_nodes, f"{name}.all_experts", [], [out_info(dense_out)])
    y = g.op("If", [cond], f"{prefix}/routed/If", then_branch=then_g, else_branch=else_g)
    return g.op("Reshape", [y, g.op("Shape", [x], f"{prefix}/routed/InShape")], f"{prefix}/routed/OutShape")


# ---- the CPU form: com.quark_onnx MatMulExperts* (custom_ops/src/qo_cpu_experts.c) ----------------------------------
# On -e cpu with the custom-op library (the compact-forms mechanism, builder/compact_forms.py, found or built it for
# the layers' MatMulMxfp4 / MatMulNvfp4 / MatMulFp8 / MatMulInt8), each expert projection is one node that reads the
# k chosen experts' compact weights in place from a stack [E, N, ...] in the dense op's own layout (the checkpoint's
# bytes: MXFP4 e2m1 [E, N, K/2] + e8m0 [E, N, K/32]; NVFP4 e2m1 [E, N, K/2] + e4m3fn [E, N, K/16] + weight_scale_2
# [E]; FP8 e4m3fn / INT8 int8 [E, N, K] + scale [E] or [E, N]), decodes them in registers and sums in the dense
# kernels' fixed order (each output equals the dense op on that expert bit for bit). Quark's in-expert activation
# quantization stays in standard ops in front of each node: dynamic MXFP4 on each projection's input (per row of 32,
# so the same before or after the routing), or the chosen expert's own static parameters (InputQuant: FP8 input
# scale, NVFP4 input_scale_2, INT8 scale and zero point; Gather of [E, 1] stacks: the gate/up input becomes
# [T, k, H], one row per slot). INT8 W8A8 experts take the op only with zero weight zero points (MatMulInt8 has
# none). The kernel groups the (token,
# slot) pairs by expert, so a prefill reads each chosen expert once (a token-sorted grouped GEMM): no If and no
# every-expert branch (docs/moe.md, "CPU decode speed"). Without the library the nodes' ONNX functions run the
# routed standard-op form (Gather of the chosen experts, decode, batched MatMul).
# (the dense FP4 layers' ops include their 16-row-tile forms, builder/quant/fp4_tiles.py; the experts' stacks keep the
# checkpoint's layout)
EXPERTS_OPS = {"mxfp4": ("MatMulExpertsMxfp4", "MatMulMxfp4", "MatMulMxfp4R16"),
               "mxfp4_fp8": ("MatMulExpertsMxfp4", "MatMulMxfp4", "MatMulMxfp4R16"),
               "fp8": ("MatMulExpertsFp8", "MatMulFp8"), "nvfp4": ("MatMulExpertsNvfp4", "MatMulNvfp4", "MatMulNvfp4R16"),
               "int8_w8a8": ("MatMulExpertsInt8", "MatMulInt8", "MatMulInt8W8A8")}  # experts op, the dense layers' ops


def experts_op_applies(ctx, experts: list[tuple]) -> bool:
    """cpu, fp32 io, --extra_options moe=routed (the default), the library given or found with the ops' kernels, and
    every projection's experts in a scheme whose dense layers take the matching compact op."""
    from ..custom_ops_library import OP_SYMBOLS, exported_kernels
    from .moe import moe_form
    lib = ctx.options.custom_ops_library
    if ctx.ep.name != "cpu" or ctx.io != "fp32" or not lib or moe_form(ctx) != "routed" or not applies(experts):
        return False
    symbols = exported_kernels(str(lib))
    for j in range(len(experts[0])):
        plan = experts[0][j]
        key = stack_key(plan)
        if key and key[0] == "int":
            if not _int4_experts_op(ctx, plan, symbols):
                return False
            continue
        ops = EXPERTS_OPS.get(key[0]) if key else None
        if ops is None or OP_SYMBOLS.get(ops[0]) not in symbols:
            return False
        if getattr(plan.scheme, "custom_op", lambda *_: None)(plan, ctx.ep, ctx.io) not in ops[1:]:
            return False
    return not _int8_zero_points(ctx, experts)


def int4_experts_level(ctx) -> int:
    """MatMulExpertsUint4 / Int4's accuracy_level, the dense 4-bit linears' arithmetic: 1 (Quark's exact fp32
    product) where those run the exact MatMulUint4 / Int4 (the cpu default with the library), 4 (int8 activations,
    QMoE / MatMulNBits level 4's arithmetic) where they run MatMulNBits at level 4 (an explicit accuracy_level=4,
    or int4_linear=matmul_nbits)."""
    level = ctx.options.accuracy_level
    if level is None:
        level = 1 if ctx.ep.int4_linear == COMPACT else ctx.ep.default_accuracy_level(4)
    return 4 if level == 4 else 1


def _int4_experts_op(ctx, plan, symbols) -> bool:
    """4-bit integer experts take MatMulExpertsUint4 / MatMulExpertsInt4 with int4_experts=compact (the cpu default
    with the library, ops/moe.py) and a library that has the kernel of their accuracy_level."""
    from ..custom_ops_library import INT4_EXPERTS_A8_SYMBOL, OP_SYMBOLS
    from .moe import int4_experts_form
    symbol = INT4_EXPERTS_A8_SYMBOL if int4_experts_level(ctx) == 4 else OP_SYMBOLS["MatMulExpertsUint4"]
    return int4_experts_form(ctx) == "compact" and BITS[plan.spec.weight[0].dtype] == 4 and symbol in symbols


def _int8_zero_points(ctx, experts: list[tuple]) -> bool:
    """An INT8 W8A8 expert whose checkpoint has a nonzero weight zero point though its config says symmetric
    (MatMulInt8 has none; the dense form then takes the fp32 weight, the routed form the standard ops). Without a
    checkpoint (the plan-time note) assumed not."""
    ckpt = getattr(ctx, "ckpt", None)
    if ckpt is None:
        return False
    return any(p.scheme is Int8W8A8 and np.any(_int8_w8a8_weight(ctx, p)[2] != 0) for e in experts for p in e)


@dataclass
class OpStack:
    op: str
    data: str
    scale: str
    bias: str | None
    mx_mode: str | None
    input_quant: InputQuant | None  # parameters [E, 1]
    scale_2: str | None = None      # NVFP4 weight_scale_2 [E]; 4-bit integer: zero_points (the op's 5th input)


def _op_expert_arrays(ctx, plan) -> dict[str, np.ndarray]:
    """One expert's tensors in the dense compact op's layout (the checkpoint's bytes)."""
    out = _input_quant_arrays(ctx, plan, (1,))
    ckpt, name = ctx.ckpt, plan.name
    if plan.scheme in (Mxfp4Linear, Mxfp4Fp8Linear):
        return {**out, "data": np.asarray(ckpt.get(f"{name}.weight"), dtype=np.uint8),
                "scale": _e8m0_bytes(ckpt, f"{name}.weight_scale")}
    if plan.scheme is Nvfp4Linear:
        ws = np.asarray(ckpt.get(f"{name}.weight_scale"))
        return {**out, "data": np.asarray(ckpt.get(f"{name}.weight"), dtype=np.uint8),
                "scale": ws if ws.dtype == ml_dtypes.float8_e4m3fn else ws.view(ml_dtypes.float8_e4m3fn),
                "scale_2": np.float32(ckpt.get_f32(f"{name}.weight_scale_2")).reshape(())}
    if plan.scheme is IntWeightOnly:  # 4-bit (experts_op_applies): MatMulNBits' B / scales / zero points
        iw = IntWeightOnly.load(plan, ctx.ckpt, ctx.quant.export.pack_method)
        u, zp = iw.to_unsigned()
        n, k = u.shape
        bs = block_size_for(iw.group_size, k, name)
        rep = iw.group_size // bs if iw.group_size != k else -(-k // bs)
        k_blocks = -(-k // bs)
        if k_blocks * bs != k:
            u = np.concatenate([u, np.zeros((n, k_blocks * bs - k), np.uint8)], axis=1)
        return {**out, "data": pack_uint_lowfirst(u.reshape(n, k_blocks, bs), 4),
                "scale": np.ascontiguousarray(np.repeat(iw.scale, rep, axis=1)[:, :k_blocks], np.float32),
                "zero_points": np.repeat(zp, rep, axis=1)[:, :k_blocks].astype(np.uint8)}   # unpacked: see below
    if plan.scheme is Int8W8A8:
        q, scale, _ = _int8_w8a8_weight(ctx, plan)  # zero points: 0 (experts_op_applies)
        return {**out, "data": np.ascontiguousarray(q, dtype=np.int8), "scale": scale}   # [N] or [1]
    q, scale = Fp8W8A8.load(plan, ctx.ckpt)
    return {**out, "data": np.ascontiguousarray(q), "scale": np.asarray(scale, np.float32).reshape(-1)}  # [N] or [1]


def _pair_arrays(ctx, pair: tuple) -> dict[str, np.ndarray]:
    """One expert's gate and up projections as one weight: their arrays stacked along N (gate rows first); the static
    input quantization parameters, equal for the two (fuses_gate_up), once."""
    gate, up = (_op_expert_arrays(ctx, p) for p in pair)
    if stack_key(pair[0])[0] in PER_TENSOR_SCALE_KEYS:  # FP8 / INT8 column scales: a per-tensor one on each of its rows
        gate["scale"], up["scale"] = (np.broadcast_to(a["scale"], (a["data"].shape[0],)) for a in (gate, up))
    return {role: gate[role] if role in INPUT_ROLES else np.concatenate([gate[role], up[role]], axis=0)
            for role in gate}


# gate and up of every expert as one [E, 2N, ...] stack (one node, one activation preparation; each output row is the
# same as from its own node: the kernels' rows do not depend on N): the formats whose per-expert arrays are all per
# row. FP8 and INT8 W8A8 stacks take their per-tensor weight scale as a column scale on each of the projection's rows
# ([E, 2N]: the kernels multiply each output by its column's scale after the dot product, one scale or N the same
# way, custom_ops/src/qo_cpu_experts.c scaled_experts). Static input quantization (mxfp4_fp8, FP8, INT8) fuses where
# each expert's gate and up have the same parameters: then both quantize the same x to the same values. amd-quark's
# exports have them equal (its observers see the same input; every Qwen3-MoE / Mixtral FP8, INT8 and MXFP4 + FP8
# fixture of tests/quark_factory.py)
PER_TENSOR_SCALE_KEYS = ("fp8", "int8_w8a8")
FUSED_GATE_UP_KEYS = ("int", "mxfp4", "mxfp4_fp8", *PER_TENSOR_SCALE_KEYS)


def fuses_gate_up(ctx, experts: list[tuple]) -> bool:
    """(gate, up, down) experts whose gate and up stack together (FUSED_GATE_UP_KEYS, the same format and width, the
    same static input quantization parameters: read from ctx.ckpt)."""
    if len(experts[0]) != 3:
        return False
    for gate, up, _ in experts:
        key = stack_key(gate)
        if (not key or key[0] not in FUSED_GATE_UP_KEYS or stack_key(up) != key or gate.has_bias or up.has_bias
                or gate.in_features != up.in_features or gate.out_features != up.out_features):
            return False
        a, b = (_input_quant_arrays(ctx, p, (1,)) for p in (gate, up))
        if a.keys() != b.keys() or any(not np.array_equal(a[r], b[r]) for r in a):
            return False
    return True


TILED_EXPERTS_OPS = {"mxfp4": "MatMulExpertsMxfp4R16", "mxfp4_fp8": "MatMulExpertsMxfp4R16",
                     "nvfp4": "MatMulExpertsNvfp4R16"}


def _tiled_experts_op(ctx, key, first) -> str | None:
    """The 16-row-tile experts op for a stack (builder/quant/fp4_tiles.py's rule: the cpu compact FP4 form, N % 16 == 0,
    MXFP4 only where the graph does not put A on the MXFP4 grid; and the library's kernel), else None."""
    from ..custom_ops_library import has_kernel
    op = TILED_EXPERTS_OPS.get(key[0])
    if (op is None or ctx.ep.fp4_linear != COMPACT or first.out_features % 16 or _mx_mode(ctx, key) is not None
            or not has_kernel(ctx.options.custom_ops_library, op)):
        return None
    return op


def _stack_op(ctx, key, first) -> str | None:
    """The experts op of a stack of this format (the tiles where they apply); None for 4-bit integer stacks, which
    take MatMulExpertsUint4, or MatMulExpertsInt4 where every zero point is 8."""
    return _tiled_experts_op(ctx, key, first) or (EXPERTS_OPS[key[0]][0] if key[0] != "int" else None)


def _tiled_arrays(arrays_of):
    """arrays_of with the FP4 data and block scales in 16-row tiles (custom_ops/fp4_r16.py pack, per expert)."""
    from custom_ops import fp4_r16

    def tiled(ctx, plan) -> dict[str, np.ndarray]:
        out = arrays_of(ctx, plan)
        scale = out["scale"]
        data, tiles = fp4_r16.pack(out["data"], scale.view(np.uint8))
        return {**out, "data": data, "scale": tiles.view(scale.dtype)}
    return tiled


def build_op_stack(ctx, plans: list, name: str) -> OpStack:
    """plans: one projection's plan per expert, or (gate, up) pairs (fuses_gate_up) stacked as one [E, 2N, ...]."""
    g = ctx.graph
    pairs = isinstance(plans[0], tuple)
    first = plans[0][0] if pairs else plans[0]
    key = stack_key(first)
    op = _stack_op(ctx, key, first)
    arrays_of = _pair_arrays if pairs else _op_expert_arrays
    data, small, _head = _stream_stack(ctx, plans, f"{name}.experts_op.data",
                                       _tiled_arrays(arrays_of) if op in TILED_EXPERTS_OPS.values() else arrays_of,
                                       (-1,))
    names = {"data": data}
    for role, arrs in small.items():
        arr = np.stack(arrs)
        if role == "scale" and key[0] in ("fp8", "int8_w8a8") and arr.shape[1] == 1:
            arr = arr.reshape(-1)  # per-tensor: [E]
        if role == "zero_points":  # 4-bit: every zero point 8 (a symmetric int4 weight): MatMulExpertsInt4
            op = "MatMulExpertsInt4" if np.all(arr == 8) else "MatMulExpertsUint4"
            if op == "MatMulExpertsInt4":
                continue
            arr = pack_uint_lowfirst(arr, 4)                                   # [E, N, ceil(k_blocks / 2)]
        names[role] = g.initializer(f"{name}.experts_op.{role}", arr)
    return OpStack(op, names["data"], names["scale"], names.get("bias"), _mx_mode(ctx, key),
                   _input_quant_of(first, names), names.get("scale_2") or names.get("zero_points"))


def _op_project(ctx, st: OpStack, x: str, idx: str, p: str, mx_done: bool) -> str:
    """x [T, K] or [T, k, K] -> [T, k, N] for the experts in idx [T, k]."""
    g = ctx.graph
    if st.mx_mode is not None and not mx_done:
        x = emit_fp4_activation_qdq(ctx, x, Fp4ActivationSpec("mxfp4", MXFP4_GROUP, st.mx_mode), p)
    if st.input_quant is not None:  # x [T, 1 | k, K] -> [T, k, K]
        x = _input_quant(ctx, st.input_quant, x, idx, p)
    scale_2 = [st.scale_2] if st.scale_2 is not None else []
    attrs = {}
    if st.op in ("MatMulExpertsUint4", "MatMulExpertsInt4"):
        attrs["accuracy_level"] = int4_experts_level(ctx)
    y = g.quark_op(st.op, [x, idx, st.data, st.scale, *scale_2], f"{p}/{st.op}", **attrs)
    if st.bias is not None:
        y = g.op("Add", [y, g.op("Gather", [st.bias, idx], f"{p}/GatherBias", axis=0)], f"{p}/BiasAdd")
    return y


def planned_experts_ops(ctx, experts: list[tuple]) -> tuple[list[str], dict[str, str]]:
    """For `inspect`, before anything is written (ctx: ep, options, io and the checkpoint, whose input scales decide
    the gate / up fusion): the ops emit_experts_op writes for one block (one entry per node) and {linear name: its
    form}. 4-bit integer stacks: MatMulExpertsInt4 for int4 weights, else MatMulExpertsUint4 (the graph takes Int4
    there too where every zero point is 8, known only when the weights are read)."""
    fused = fuses_gate_up(ctx, experts)
    groups = [[e[0] for e in experts] + [e[1] for e in experts], [e[2] for e in experts]] if fused else \
        [[e[j] for e in experts] for j in range(len(experts[0]))]
    ops, forms = [], {}
    for plans in groups:
        first = plans[0]
        key = stack_key(first)
        signed = key[0] == "int" and key[1] == "int4"  # stored as q + 8: every zero point 8
        op = _stack_op(ctx, key, first) or ("MatMulExpertsInt4" if signed else "MatMulExpertsUint4")
        tiled = op in TILED_EXPERTS_OPS.values()
        ops.append(op)
        how = [f"this expert's rows of the layer's [E, N, ...] stack{' in 16-row tiles' if tiled else ''}",
               "the k chosen experts read in place"]
        if key[0] == "int":
            how.append(f"accuracy_level {int4_experts_level(ctx)}"
                       + ("" if signed else "; MatMulExpertsInt4 if every zero point is 8"))
        if fused and first in (experts[0][0], experts[0][1]):
            how.append("gate and up one node")
        form = f"routed expert: com.quark_onnx {op} ({'; '.join(how)}; ONNX-function fallback)"
        forms.update({p.name: form for p in plans})
    return ops, forms


def emit_experts_op(ctx, x: str, routing: Routing, experts: list[tuple], activation, name: str, prefix: str) -> str:
    """x [B, S, H] -> the routed experts' weighted sum [B, S, H] through MatMulExperts* (see above)."""
    g = ctx.graph
    hidden = experts[0][0].in_features
    fused = fuses_gate_up(ctx, experts)
    if fused:
        stacks = [build_op_stack(ctx, [(e[0], e[1]) for e in experts], f"{name}.experts.gate_up"),
                  build_op_stack(ctx, [e[2] for e in experts], f"{name}.experts.2")]
    else:
        stacks = [build_op_stack(ctx, [e[j] for e in experts], f"{name}.experts.{j}") for j in range(len(experts[0]))]
    first, down = stacks[:-1], stacks[-1]
    p = f"{prefix}/experts"
    xt = g.op("Reshape", [x, g.const_i64(f"{name}.experts_op.token_rows", [-1, hidden])], f"{p}/Tokens")
    idx = routing.idx
    ys = []
    slot_axis = g.const_i64(f"{name}.experts_op.slot_axis", [1])
    for j, st in enumerate(first):
        xj = xt
        if st.mx_mode is not None:
            xj = emit_fp4_activation_qdq(ctx, xt, Fp4ActivationSpec("mxfp4", MXFP4_GROUP, st.mx_mode), p)
        if st.input_quant is not None:
            xj = g.op("Unsqueeze", [xj, slot_axis], f"{p}/{j}/SlotAxis")
        ys.append(_op_project(ctx, st, xj, idx, f"{p}/{'gate_up' if fused else j}", mx_done=True))
    if fused:  # [T, k, 2N] -> gate, up
        n = experts[0][0].out_features
        ys = g.node("Split", [ys[0], g.const_i64(f"{name}.experts_op.gate_up_split", [n, n])], f"{p}/GateUpSplit",
                    outputs=2, axis=-1)
    y = _op_project(ctx, down, activation(ctx, list(ys), p), idx, f"{p}/down", mx_done=False)    # [T, k, H]
    w = g.op("Unsqueeze", [routing.weights, g.const_i64(f"{name}.experts_op.w_axis", [2])], f"{p}/WeightCols")
    y = g.op("ReduceSum", [g.op("Mul", [y, w], f"{p}/Weighted"), g.const_i64(f"{name}.experts_op.k_axis", [1])],
             f"{p}/SumChosen", keepdims=0)                                              # [T, H]
    return g.op("Reshape", [y, g.op("Shape", [x], f"{p}/InShape")], f"{p}/OutShape")


def gathered_bytes_per_token(model: onnx.ModelProto) -> dict[str, int]:
    """{If node name: bytes of the initializers its routed (then) branch Gathers per token}: for each Gather whose
    data is a stacked [E, ...] initializer and whose indices are the routing rows [T, k], k/E of its bytes."""
    sizes = {t.name: (list(t.dims), onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize)
             for t in model.graph.initializer}
    out = {}
    for node in model.graph.node:
        if node.op_type != "If":
            continue
        then_g = next(a.g for a in node.attribute if a.name == "then_branch")
        total = 0.0
        for n in then_g.node:
            if n.op_type == "Gather" and n.input[0] in sizes and ".routed." in n.input[0]:
                dims, item = sizes[n.input[0]]
                k = _k_of(model, n.input[1])
                total += int(np.prod(dims, dtype=np.int64)) * item * k / dims[0]
        out[node.name] = int(round(total))
    return out


def _k_of(model: onnx.ModelProto, idx: str) -> int:
    """k of the routing rows value `idx` (Reshape(top_idx, [-1, k]))."""
    consts = {t.name: t for t in model.graph.initializer}
    for n in model.graph.node:
        if n.output and n.output[0] == idx and n.op_type == "Reshape":
            return int(onnx.numpy_helper.to_array(consts[n.input[1]])[-1])
    raise KeyError(idx)
