"""MXFP4 weights with static per-tensor FP8 e4m3 activations: Quark's `mxfp4_fp8` template scheme (the
"w-mxfp4-a-fp8" exports, e.g. amd/gpt-oss-120b-w-mxfp4-a-fp8).

Checkpoint: the MXFP4 weight tensors of builder/quant/mxfp4.py (weight uint8 [out, in/2], weight_scale e8m0
[out, in/32]) plus input_scale [] (fp32). Quark's numerics: x_q = fp8(clip(x / s_x, +-448)) * s_x, then the matmul
with the dequantized MXFP4 weight.

Emitted: QuantizeLinear/DequantizeLinear(float8e4m3fn, s_x) in front of the MXFP4 weight form of the EP profile
(EPConfig.fp4_linear: MatMulMxfp4 on the checkpoint's bytes on CPU (dense fp32 weight without the library), MatMulMxfp4 or 8-bit MatMulNBits on CUDA, fp8-coded
DequantizeLinear on MIGraphX).
"""
from __future__ import annotations

from dataclasses import replace

from ..ops.qdq import qdq_static
from .base import LinearPlan
from .fp8_w8a8 import scalar_scale
from . import fp4_tiles
from .mxfp4 import Mxfp4Linear, fail


class Mxfp4Fp8Linear(Mxfp4Linear):
    name = "mxfp4-fp8"

    @classmethod
    def accepts(cls, spec) -> bool:
        if spec is None or len(spec.weight) != 1 or not cls._is_mx_fp4(spec.weight[0]):
            return False
        a = spec.input_tensors
        return (len(a) == 1 and a[0].dtype == "fp8_e4m3" and a[0].qscheme == "per_tensor" and not a[0].is_dynamic
                and a[0].symmetric is not False)

    @classmethod
    def check(cls, plan: LinearPlan, ckpt, ep) -> None:
        weight_only = replace(plan, spec=replace(plan.spec, input_tensors=()))
        Mxfp4Linear.check(weight_only, ckpt, ep)  # the weight side, as for MXFP4 without activations
        if f"{plan.name}.input_scale" not in ckpt:
            fail(ckpt, f"{plan.name}.input_scale", "static FP8 activations configured but input_scale missing",
                 "input_tensors.dtype", "fp8_e4m3")
        scalar_scale(ckpt, f"{plan.name}.input_scale")  # one positive finite value

    GRID_ACTIVATIONS = False  # FP8 activations: float A, the tiled form applies (fp4_tiles.py)

    @classmethod
    def describe(cls, plan: LinearPlan, ep, io: str | None = None) -> str:
        if cls.tiles(plan, ep, io):
            return fp4_tiles.describe("mxfp4") + " + FP8 static activation Q/DQ"
        what = {"matmul_nbits8": "MatMulNBits bits=8 block_size=32 (lossless 2*e2m1+128)",
                "native": "com.quark_onnx MatMulMxfp4 (+ function fallback)",
                "compact": "com.quark_onnx MatMulMxfp4 on the checkpoint's bytes (compact CPU default, + function "
                           "fallback)",
                "compact_rows": "com.quark_onnx MatMulMxfp4 on the checkpoint's bytes in their order (+ function "
                                "fallback)",
                "dq_fp8": "DequantizeLinear(e2m1 as float8e4m3fn, block 32) -> MatMul",
                "dense": "MatMul (dequantized MXFP4 weight)"}[ep.fp4_linear]
        return f"{what} + FP8 static activation Q/DQ"

    @classmethod
    def emit(cls, ctx, plan: LinearPlan, x: str) -> str:
        x = qdq_static(ctx, x, scalar_scale(ctx.ckpt, f"{plan.name}.input_scale"), "fp8_e4m3",
                       f"{plan.node_prefix}/input_quant")
        return cls.emit_weight(ctx, plan, x)
