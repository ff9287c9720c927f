"""OCP MXFP4 linears: fp4 e2m1 weights in blocks of 32 with e8m0 scales, optionally MXFP4 dynamic activations.

Checkpoint (real_quantized, quark_format.md): weight uint8 [out, in/2] (low nibble = even element),
weight_scale uint8 e8m0 [out, in/32]; no input tensors (activation scales are computed at run time).

Per execution provider (EPConfig.fp4_linear, overridable with --extra_options fp4_linear=...):
  compact        the CPU default (builder/compact_forms.py): com.quark_onnx MatMulMxfp4 on the checkpoint's bytes
                 (MXFP4), MatMulNvfp4 (NVFP4, nvfp4.py); + their ONNX-function fallbacks
  matmul_nbits8  com.microsoft MatMulNBits bits=8 block 32: u = 2*e2m1 + 128, scale = 2^(s-127) / 2 (lossless)
  native         com.quark_onnx MatMulMxfp4(A, B, B_scale) custom op + its ONNX-function fallback (CUDA)
  dq_fp8         DequantizeLinear(e2m1 coded as float8e4m3fn [K, N], blocked scale [K/32, N]) -> MatMul
  dq_int8        DequantizeLinear(int8 2*e2m1 [K, N], blocked scale/2) -> MatMul (MIGraphX: quant/fp4_int8_dq.py)
  dense          MatMul on the dequantized weight in the io dtype (exact in fp32; CPU: as fast as float weights,
                 8-bit MatMulNBits is exact only at accuracy_level 1, where it is ~17x slower, docs/fp4.md)
Activations: Quark's MXFP4 dynamic fake-quant emulated in front of the matmul (ops/mx_activation.py) unless
--extra_options mx_activations=skip.
The weight-emitter helpers here are shared with nvfp4.py.
"""
from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from ..errors import ConversionError
from ..ops.matmul_nbits import emit_matmul_nbits
from ..ops.mx_activation import (MX_SCALE_MODES, Fp4ActivationSpec, emit_fp4_activation_qdq,
                                 emit_mx_activation_fp4_qdq)
from . import fp4_codes
from .fp4_int8_dq import DESCRIBE as DQ_INT8_DESCRIBE
from .fp4_int8_dq import emit_weight_dq_int8
from .mx_gemm import DESCRIBE as MX_GEMM_DESCRIBE
from .mx_gemm import emit_mx_matmul, emit_weight_mx, mx_gemm_applies
from .base import LinearPlan, Scheme
from . import fp4_tiles

FP4_LINEAR_METHODS = ("compact", "compact_rows", "matmul_nbits8", "native", "dq_fp8", "dq_int8", "dense")
CUSTOM_OP_FORMS = {"mxfp4": {"compact": "MatMulMxfp4", "compact_rows": "MatMulMxfp4", "native": "MatMulMxfp4"},
                   "nvfp4": {"compact": "MatMulNvfp4", "compact_rows": "MatMulNvfp4"}}
MX_ACTIVATION_OPTIONS = ("emulate", "skip")
MXFP4_GROUP = 32


@dataclass
class Fp4Weight:
    codes: np.ndarray        # uint8 [N, K] e2m1 codes
    block_scale: np.ndarray  # float32 [N, K/group]
    group: int


def fail(ckpt, layer, message, field, value, accepted=None):
    raise ConversionError(message, file=ckpt.model_dir, layer=layer, field=field, value=value, accepted=accepted)


def expect_tensor(ckpt, name: str, shape, dtypes: tuple[str, ...]) -> None:
    if name not in ckpt:
        fail(ckpt, name, "tensor missing for an FP4 layer", "tensor", None)
    if tuple(ckpt.shape(name)) != tuple(shape):
        fail(ckpt, name, "tensor has the wrong shape for this layer's FP4 spec", "shape", list(ckpt.shape(name)),
             str(list(shape)))
    if ckpt.dtype(name) not in dtypes:
        fail(ckpt, name, "tensor has the wrong dtype for this layer's FP4 spec", "dtype", ckpt.dtype(name),
             ", ".join(dtypes))


def check_real_quantized(plan: LinearPlan, ckpt, group: int) -> None:
    k = plan.in_features
    if k % group:
        fail(ckpt, plan.name, f"in_features={k} is not a multiple of the FP4 block size", "weight.group_size", group)
    if ckpt.dtype(f"{plan.name}.weight") in ("F32", "F16", "BF16"):
        fail(ckpt, f"{plan.name}.weight", "fake_quantized FP4 exports are not supported; export real_quantized",
             "export.weight_format", "fake_quantized", "real_quantized")
    expect_tensor(ckpt, f"{plan.name}.weight", (plan.out_features, k // 2), ("U8",))


def fp4_linear_method(ctx) -> str:
    """The EP profile's FP4 form, with --extra_options fp4_linear applied and validated (convert.plan_model)."""
    return ctx.ep.fp4_linear


def emulate_activations(ctx) -> bool:
    return ctx.options.mx_activations == "emulate"  # validated in convert.check_options


def scales_in_io(ctx, plan: LinearPlan, w: Fp4Weight, factor: float = 1.0) -> np.ndarray:
    """block_scale * factor in the io dtype; refuse scales that vanish or overflow there (fp16: 2^-24..65504)."""
    s = (w.block_scale * np.float32(factor)).astype(np.float32)
    s_io = s.astype(ctx.io_np)
    used = np.add.reduceat((w.codes & 7) != 0, np.arange(0, w.codes.shape[1], w.group), axis=1) > 0
    bad = used & ((s_io.astype(np.float32) == 0) | ~np.isfinite(s_io.astype(np.float32)))
    if np.any(bad):
        raise ConversionError(f"FP4 block scales do not fit the {ctx.io} io dtype", layer=plan.name,
                              field="weight_scale", value=float(s[bad].flat[0]), accepted="-p fp32")
    return s_io


def accuracy_level(ctx) -> int:
    return ctx.options.accuracy_level if ctx.options.accuracy_level is not None else ctx.ep.fp4_accuracy_level


def emit_weight_matmul_nbits8(ctx, plan: LinearPlan, x: str, w: Fp4Weight) -> str:
    """Lossless 8-bit MatMulNBits: W = (u - 128) * scale with u = 2v + 128, scale = block_scale / 2."""
    u = (fp4_codes.E2M1_DOUBLED[w.codes].astype(np.int16) + 128).astype(np.uint8)
    scale = scales_in_io(ctx, plan, w, 0.5).astype(np.float32)
    return emit_matmul_nbits(ctx, plan.name, f"{plan.node_prefix}/MatMulNBits", x, u, scale, None, 8, w.group,
                             accuracy_level(ctx))


def emit_weight_dq_fp8(ctx, plan: LinearPlan, x: str, w: Fp4Weight) -> str:
    """DequantizeLinear(float8e4m3fn [K, N] holding the e2m1 values, blocked io-dtype scale [K/g, N]) -> MatMul."""
    g = ctx.graph
    codes_kn = np.ascontiguousarray(fp4_codes.E2M1_AS_E4M3FN_BYTE[w.codes].T).view(ml_dtypes.float8_e4m3fn)
    scale_kn = np.ascontiguousarray(scales_in_io(ctx, plan, w).T)
    wq = g.initializer(f"{plan.name}.weight_e2m1_as_e4m3.T", codes_kn)
    ws = g.initializer(f"{plan.name}.weight_block_scale.T", scale_kn)
    wt = g.op("DequantizeLinear", [wq, ws], f"{plan.node_prefix}/DequantizeLinear", axis=0, block_size=w.group)
    return g.op("MatMul", [x, wt], f"{plan.node_prefix}/MatMul")


def emit_weight_dense(ctx, plan: LinearPlan, x: str, w: Fp4Weight) -> str:
    """MatMul on W.T [K, N] = e2m1 * block scale (float32 product, then the io dtype)."""
    w_t = np.ascontiguousarray(fp4_codes.dequantize(w.codes, w.block_scale, w.group).T).astype(ctx.io_np)
    wt = ctx.graph.initializer(f"{plan.name}.weight_dequantized.T", w_t)
    return ctx.graph.op("MatMul", [x, wt], f"{plan.node_prefix}/MatMul")


def emit_fp4_weight(ctx, plan: LinearPlan, x: str, w: Fp4Weight, method: str) -> str:
    emitters = {"dq_fp8": emit_weight_dq_fp8, "dense": emit_weight_dense, "matmul_nbits8": emit_weight_matmul_nbits8,
                "dq_int8": emit_weight_dq_int8}
    return emitters[method](ctx, plan, x, w)


def fp4_custom_op(kind: str, ep) -> str | None:
    """The com.quark_onnx op of this FP4 kind on the EP's form, when custom_ops (its fallbacks) is importable."""
    op = CUSTOM_OP_FORMS[kind].get(ep.fp4_linear)
    if op is None:
        return None
    try:
        import custom_ops.functions  # noqa: F401
    except ImportError:
        return None
    return op


def emit_matmul_mxfp4_custom(ctx, plan: LinearPlan, x: str) -> str | None:
    """com.quark_onnx MatMulMxfp4 with its function fallback; None when custom_ops is not available."""
    try:
        from custom_ops.functions import DOMAIN, matmul_mxfp4_function
    except ImportError:
        return None
    g = ctx.graph
    g.add_function(matmul_mxfp4_function(g.opsets[""]), opset_version=1)
    b = g.initializer(f"{plan.name}.weight", np.asarray(ctx.ckpt.get(f"{plan.name}.weight"), dtype=np.uint8))
    bs = g.initializer(f"{plan.name}.weight_scale", _e8m0_bytes(ctx.ckpt, f"{plan.name}.weight_scale"))
    return g.op("MatMulMxfp4", [x, b, bs], f"{plan.node_prefix}/MatMulMxfp4", domain=DOMAIN,
                K=plan.in_features, N=plan.out_features)


def _e8m0_bytes(ckpt, name: str) -> np.ndarray:
    raw = np.asarray(ckpt.get(name))
    return raw.view(np.uint8) if raw.dtype != np.uint8 else raw


class Mxfp4Linear(Scheme):
    name = "mxfp4"

    @staticmethod
    def _is_mx_fp4(t) -> bool:
        return (t.dtype == "fp4" and t.qscheme == "per_group" and t.group_size == MXFP4_GROUP
                and t.scale_format == "e8m0" and t.ch_axis in (-1, 1, None))

    @classmethod
    def accepts(cls, spec) -> bool:
        if spec is None or len(spec.weight) != 1 or not cls._is_mx_fp4(spec.weight[0]):
            return False
        a = spec.input_tensors
        return not a or (len(a) == 1 and cls._is_mx_fp4(a[0]) and a[0].is_dynamic)

    @classmethod
    def check(cls, plan: LinearPlan, ckpt, ep) -> None:
        check_real_quantized(plan, ckpt, MXFP4_GROUP)
        expect_tensor(ckpt, f"{plan.name}.weight_scale", (plan.out_features, plan.in_features // MXFP4_GROUP),
                      ("U8", "F8_E8M0"))
        a = plan.spec.input_tensors
        mode = (a[0].scale_calculation_mode or "even") if a else "even"
        if mode not in MX_SCALE_MODES:
            fail(ckpt, plan.name, "unknown MX scale_calculation_mode", "input_tensors.scale_calculation_mode", mode,
                 ", ".join(MX_SCALE_MODES))
        if np.any(_e8m0_bytes(ckpt, f"{plan.name}.weight_scale") == fp4_codes.E8M0_NAN):
            fail(ckpt, f"{plan.name}.weight_scale", "e8m0 scale 255 (NaN) in the weight", "weight_scale", 255)

    @classmethod
    def load(cls, plan: LinearPlan, ckpt) -> Fp4Weight:
        codes = fp4_codes.unpack_fp4_codes(ckpt.get(f"{plan.name}.weight"))
        scale = fp4_codes.e8m0_scales(_e8m0_bytes(ckpt, f"{plan.name}.weight_scale"))
        return Fp4Weight(codes, scale, MXFP4_GROUP)

    # Quark's w_mxfp4_a_mxfp4: the graph puts A on the MXFP4 grid, which MatMulMxfp4 sums exactly (fp4_tiles.py)
    GRID_ACTIVATIONS = True

    @classmethod
    def tiles(cls, plan: LinearPlan, ep, io: str | None) -> bool:
        return fp4_tiles.tiles_apply(plan, ep, io, cls.GRID_ACTIVATIONS and bool(plan.spec.input_tensors))

    @classmethod
    def custom_op(cls, plan: LinearPlan, ep, io: str | None = None) -> str | None:
        """MatMulMxfp4 on the native and compact forms (MatMulMxfp4R16 where fp4_tiles applies; when custom_ops is
        importable), else None."""
        op = fp4_custom_op("mxfp4", ep)
        return fp4_tiles.TILE_OPS["mxfp4"] if op and cls.tiles(plan, ep, io) else op

    @classmethod
    def describe(cls, plan: LinearPlan, ep, io: str | None = None) -> str:
        if mx_gemm_applies(ep, plan) is None:
            return MX_GEMM_DESCRIBE
        act = " + MXFP4 dynamic activation emulation" if plan.spec.input_tensors else ""
        if cls.tiles(plan, ep, io):
            return fp4_tiles.describe("mxfp4", act)
        return {"matmul_nbits8": f"MatMulNBits bits=8 block_size=32 (lossless 2*e2m1+128){act}",
                "native": f"com.quark_onnx MatMulMxfp4 (+ function fallback){act}",
                "compact": f"com.quark_onnx MatMulMxfp4 on the checkpoint's bytes (compact CPU default, + function "
                           f"fallback){act}",
                "compact_rows": f"com.quark_onnx MatMulMxfp4 on the checkpoint's bytes in their order (+ function "
                                f"fallback){act}",
                "dq_fp8": f"DequantizeLinear(e2m1 as float8e4m3fn, block 32) -> MatMul{act}",
                "dq_int8": DQ_INT8_DESCRIBE.format(group=MXFP4_GROUP) + act,
                "dense": f"MatMul (dequantized MXFP4 weight){act}"}[ep.fp4_linear]

    @classmethod
    def emit(cls, ctx, plan: LinearPlan, x: str) -> str:
        a = plan.spec.input_tensors
        if mx_gemm_applies(ctx.ep, plan, ctx.options.mx_activations) is None:  # amd_arch=gfx950 (quant/mx_gemm.py)
            spec = Fp4ActivationSpec("mxfp4", MXFP4_GROUP, a[0].scale_calculation_mode or "even")
            xq = emit_mx_activation_fp4_qdq(ctx, x, spec, plan.node_prefix, plan.in_features)
            return emit_mx_matmul(ctx, plan, xq, emit_weight_mx(ctx, plan, cls.load(plan, ctx.ckpt)))
        if a and emulate_activations(ctx):
            spec = Fp4ActivationSpec("mxfp4", MXFP4_GROUP, a[0].scale_calculation_mode or "even")
            x = emit_fp4_activation_qdq(ctx, x, spec, plan.node_prefix)
        return cls.emit_weight(ctx, plan, x)

    @classmethod
    def emit_weight(cls, ctx, plan: LinearPlan, x: str) -> str:
        """x @ W in the EP's FP4 weight form (MatMulMxfp4 where chosen and importable, else the 8-bit re-encoding)."""
        method = fp4_linear_method(ctx)
        if method == "compact" and cls.tiles(plan, ctx.ep, ctx.io):
            y = fp4_tiles.emit_fp4_tiles(ctx, plan, x, "mxfp4")
            if y is not None:
                return y
        if method in ("native", "compact", "compact_rows"):
            y = emit_matmul_mxfp4_custom(ctx, plan, x)
            if y is not None:
                return y
            instead = "8-bit MatMulNBits" if method == "native" else "the dense fp32 weight"
            note = f"custom_ops package not importable: MXFP4 linears use {instead} instead of MatMulMxfp4"
            if note not in ctx.notes:
                ctx.notes.append(note)
            method = "matmul_nbits8" if method == "native" else "dense"
        return emit_fp4_weight(ctx, plan, x, cls.load(plan, ctx.ckpt), method)
