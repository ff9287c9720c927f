"""NVFP4 linears: fp4 e2m1 weights in blocks of 16 with float8_e4m3fn block scales and an fp32 second-level scale.

Config: weight = [fp4 per_group g16 scale_format float32, fp8_e4m3 per_tensor is_scale_quant]; input_tensors the
same pair with the fp4 stage dynamic (or absent: weight-only).
Checkpoint (quark_format.md): weight uint8 [out, in/2]; weight_scale float8_e4m3fn [out, in/16];
weight_scale_2 float32 [] (= amax(W) / (6 * 448)); input_scale_2 float32 [] (static, from calibration).
W = e2m1 * float32(weight_scale) * weight_scale_2 (the block scale product is rounded once in float32, as Quark does).

Per execution provider (EPConfig.fp4_linear, --extra_options fp4_linear=...):
  compact        com.quark_onnx MatMulNvfp4(A, B uint8 [N, K/2], e4m3fn [N, K/16], weight_scale_2): the checkpoint's
                 bytes, CPU default (builder/compact_forms.py)
  matmul_nbits8  MatMulNBits bits=8 block 16: u = 2*e2m1 + 128, scale = e4m3 * weight_scale_2 / 2
  native         com.microsoft MatMulBlockQuantizedFp4Weight (CUDA, fp16/bf16 io only; fp32 io -> matmul_nbits8)
  dq_fp8         DequantizeLinear(e2m1 coded as float8e4m3fn [K, N], blocked scale [K/16, N]) -> MatMul
  dq_int8        DequantizeLinear(int8 2*e2m1 [K, N], blocked scale/2) -> MatMul (MIGraphX: quant/fp4_int8_dq.py)
  dense          MatMul on the dequantized weight (see mxfp4.py)
Activations: ops/mx_activation.py, with input_scale_2 as the static scale of the e4m3 activation block scales.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from ..ops.mx_activation import Fp4ActivationSpec, emit_fp4_activation_qdq
from . import fp4_codes
from .fp4_int8_dq import DESCRIBE as DQ_INT8_DESCRIBE
from .base import LinearPlan, Scheme
from . import fp4_tiles
from .mxfp4 import (Fp4Weight, check_real_quantized, emit_fp4_weight, emulate_activations, expect_tensor, fail,
                    fp4_custom_op, fp4_linear_method)

NVFP4_GROUP = 16
CONTRIB_IO = ("fp16", "bf16")


def _is_nv_pair(slot, dynamic_first: bool | None) -> bool:
    if len(slot) != 2:
        return False
    fp4, fp8 = slot
    ok_fp4 = (fp4.dtype == "fp4" and fp4.qscheme == "per_group" and fp4.group_size == NVFP4_GROUP
              and fp4.scale_format in ("float32", None) and fp4.ch_axis in (-1, 1, None)
              and not fp4.is_scale_quant)
    ok_fp8 = fp8.dtype == "fp8_e4m3" and fp8.qscheme == "per_tensor" and fp8.is_scale_quant and not fp8.is_dynamic
    return ok_fp4 and ok_fp8 and (dynamic_first is None or fp4.is_dynamic == dynamic_first)


class Nvfp4Linear(Scheme):
    name = "nvfp4"

    @classmethod
    def accepts(cls, spec) -> bool:
        if spec is None or not _is_nv_pair(spec.weight, False):
            return False
        return not spec.input_tensors or _is_nv_pair(spec.input_tensors, True)

    @classmethod
    def check(cls, plan: LinearPlan, ckpt, ep) -> None:
        check_real_quantized(plan, ckpt, NVFP4_GROUP)
        n, k = plan.out_features, plan.in_features
        expect_tensor(ckpt, f"{plan.name}.weight_scale", (n, k // NVFP4_GROUP), ("F8_E4M3",))
        expect_tensor(ckpt, f"{plan.name}.weight_scale_2", (), ("F32",))
        if plan.spec.input_tensors:
            expect_tensor(ckpt, f"{plan.name}.input_scale_2", (), ("F32",))
            s2 = float(ckpt.get_f32(f"{plan.name}.input_scale_2"))
            if not np.isfinite(s2) or s2 <= 0:
                fail(ckpt, f"{plan.name}.input_scale_2", "input_scale_2 must be a positive number", "value", s2)

    @classmethod
    def load(cls, plan: LinearPlan, ckpt) -> Fp4Weight:
        codes = fp4_codes.unpack_fp4_codes(ckpt.get(f"{plan.name}.weight"))
        s2 = float(ckpt.get_f32(f"{plan.name}.weight_scale_2"))
        scale = fp4_codes.nvfp4_block_scales(np.asarray(ckpt.get(f"{plan.name}.weight_scale")), s2)
        return Fp4Weight(codes, scale, NVFP4_GROUP)

    @classmethod
    def describe(cls, plan: LinearPlan, ep, io: str | None = None) -> str:
        act = " + NVFP4 activation emulation (input_scale_2)" if plan.spec.input_tensors else ""
        if fp4_tiles.tiles_apply(plan, ep, io):
            return fp4_tiles.describe("nvfp4", act)
        return {"matmul_nbits8": f"MatMulNBits bits=8 block_size=16 (lossless 2*e2m1+128){act}",
                "native": f"com.microsoft MatMulBlockQuantizedFp4Weight (fp16/bf16 io){act}",
                "compact": f"com.quark_onnx MatMulNvfp4 on the checkpoint's bytes (compact CPU default, + function "
                           f"fallback){act}",
                "compact_rows": f"com.quark_onnx MatMulNvfp4 on the checkpoint's bytes in their order (+ function "
                                f"fallback){act}",
                "dq_fp8": f"DequantizeLinear(e2m1 as float8e4m3fn, block 16) -> MatMul{act}",
                "dq_int8": DQ_INT8_DESCRIBE.format(group=NVFP4_GROUP) + act,
                "dense": f"MatMul (dequantized NVFP4 weight){act}"}[ep.fp4_linear]

    @classmethod
    def emit(cls, ctx, plan: LinearPlan, x: str) -> str:
        if plan.spec.input_tensors and emulate_activations(ctx):
            s2 = float(ctx.ckpt.get_f32(f"{plan.name}.input_scale_2"))
            x = emit_fp4_activation_qdq(ctx, x, Fp4ActivationSpec("nvfp4", NVFP4_GROUP, input_scale_2=s2),
                                        plan.node_prefix)
        method = fp4_linear_method(ctx)
        if method in ("compact", "compact_rows"):
            if fp4_custom_op("nvfp4", ctx.ep) and fp4_tiles.tiles_apply(plan, ctx.ep, ctx.io):
                return fp4_tiles.emit_fp4_tiles(ctx, plan, x, "nvfp4")
            if fp4_custom_op("nvfp4", ctx.ep):
                return cls._emit_matmul_nvfp4(ctx, plan, x)
            method = "dense"
        if method == "native":
            if ctx.io in CONTRIB_IO:
                return cls._emit_contrib(ctx, plan, x)
            note = f"MatMulBlockQuantizedFp4Weight takes fp16/bf16 only: NVFP4 linears use 8-bit MatMulNBits ({ctx.io})"
            if note not in ctx.notes:
                ctx.notes.append(note)
            method = "matmul_nbits8"
        return emit_fp4_weight(ctx, plan, x, cls.load(plan, ctx.ckpt), method)

    @classmethod
    def custom_op(cls, plan: LinearPlan, ep, io: str | None = None) -> str | None:
        op = fp4_custom_op("nvfp4", ep)
        return fp4_tiles.TILE_OPS["nvfp4"] if op and fp4_tiles.tiles_apply(plan, ep, io) else op

    @staticmethod
    def _emit_matmul_nvfp4(ctx, plan: LinearPlan, x: str) -> str:
        """com.quark_onnx MatMulNvfp4(A, B uint8 [N, K/2], B_scale e4m3fn [N, K/16], B_scale_2 f32 []) + function."""
        from custom_ops.functions import DOMAIN, FUNCTIONS

        g, ckpt, name = ctx.graph, ctx.ckpt, plan.name
        g.add_function(FUNCTIONS["MatMulNvfp4"](g.opsets[""]), opset_version=1)
        b = g.initializer(f"{name}.weight", np.asarray(ckpt.get(f"{name}.weight"), dtype=np.uint8))
        ws = np.asarray(ckpt.get(f"{name}.weight_scale"))
        ws = g.initializer(f"{name}.weight_scale", ws if ws.dtype == ml_dtypes.float8_e4m3fn
                           else ws.view(ml_dtypes.float8_e4m3fn))
        ws2 = g.initializer(f"{name}.weight_scale_2",
                            np.asarray(ckpt.get_f32(f"{name}.weight_scale_2"), dtype=np.float32).reshape(()))
        return g.op("MatMulNvfp4", [x, b, ws, ws2], f"{plan.node_prefix}/MatMulNvfp4", domain=DOMAIN,
                    K=plan.in_features, N=plan.out_features)

    @staticmethod
    def _emit_contrib(ctx, plan: LinearPlan, x: str) -> str:
        """MatMulBlockQuantizedFp4Weight(A, B uint8 [N, K/2], weight_scale e4m3 bytes [N, K/16], weight_scale_2)."""
        g, ckpt, name = ctx.graph, ctx.ckpt, plan.name
        b = g.initializer(f"{name}.weight", np.asarray(ckpt.get(f"{name}.weight"), dtype=np.uint8))
        ws = g.initializer(f"{name}.weight_scale", np.asarray(ckpt.get(f"{name}.weight_scale")).view(np.uint8))
        ws2 = g.initializer(f"{name}.weight_scale_2",
                            np.asarray(ckpt.get_f32(f"{name}.weight_scale_2"), dtype=np.float32).reshape(()))
        return g.op("MatMulBlockQuantizedFp4Weight", [x, b, ws, ws2], f"{plan.node_prefix}/MatMulBlockQuantizedFp4Weight",
                    domain="com.microsoft", block_size=NVFP4_GROUP)
