"""Opt-in `--extra_options lm_head=int8`: a float (excluded or tied) lm_head re-quantized to 8-bit MatMulNBits.

    x ──► MatMulNBits(bits=8, block_size=bs, B uint8 [V, H/bs, bs], scales [V*H/bs]) ──► logits

At a 128k vocabulary the float lm_head is the biggest tensor a decode step reads (1 GiB in fp32 at hidden 2048), so on
CPU it sets the decode speed. Each row of W [V, H] is quantized in blocks of bs along H (128, or the largest of
64/32/16 dividing H), symmetric: s = max|w| / 127 (rounded to the io dtype first, so the stored scale is the one
used), q = round(w / s) + 128, the default zero point 128 left out. The rounding error is at most s/2 = max|w|/254
per weight; docs/benchmarks.md has the measured logit and perplexity cost. Streamed from the checkpoint in row
blocks, packed by the worker threads.
Not Quark's numerics: the checkpoint keeps this layer float; the default (`lm_head=float`) stays exact.
"""
from __future__ import annotations

import numpy as np

from ..emit_context import row_block
from ..errors import ConversionError
from ..pipeline import ordered_map
from .base import LinearPlan
from .float_linear import FloatLinear

LM_HEAD_FORMS = ("float", "int8", "bf16")  # bf16: builder/quant/float_bf16.py
BLOCKS = (128, 64, 32, 16)  # 128: 1.8x the decode speed of 32 at the same bits (docs/benchmarks.md)


def block_for(k: int) -> int | None:
    return next((b for b in BLOCKS if k % b == 0), None)


def quantize_rows(w: np.ndarray, block: int, scale_dtype) -> tuple[np.ndarray, np.ndarray]:
    """float [n, k] -> (uint8 q [n, k/block, block], scale [n, k/block] in scale_dtype), symmetric, zero point 128."""
    n, k = w.shape
    wb = w.astype(np.float32).reshape(n, k // block, block)
    scale = (np.abs(wb).max(axis=2) / 127.0).astype(scale_dtype)
    s = scale.astype(np.float32)
    s = np.where(s > 0, s, 1.0)[..., None]
    q = np.clip(np.rint(wb / s), -127, 127) + 128
    return q.astype(np.uint8), scale


class FloatToInt8Linear(FloatLinear):
    name = "float->int8"

    @classmethod
    def accepts(cls, spec) -> bool:
        return False  # chosen by --extra_options lm_head=int8 (convert.plan_model), never by a spec

    @classmethod
    def check(cls, plan: LinearPlan, ckpt, ep) -> None:
        super().check(plan, ckpt, ep)
        if 8 not in ep.matmul_nbits_bits:
            raise ConversionError(f"{ep.name} has no 8-bit MatMulNBits", layer=plan.name,
                                  field="--extra_options lm_head", value="int8", accepted="float")
        if block_for(plan.in_features) is None:
            raise ConversionError(f"lm_head=int8 needs in_features={plan.in_features} divisible by 16",
                                  layer=plan.name, field="--extra_options lm_head", value="int8", accepted="float")

    @classmethod
    def describe(cls, plan: LinearPlan, ep, io: str | None = None) -> str:
        return (f"MatMulNBits bits=8 block_size={block_for(plan.in_features)} (float weight re-quantized: "
                "--extra_options lm_head=int8)")

    @classmethod
    def emit(cls, ctx, plan: LinearPlan, x: str) -> str:
        tensor = plan.weight_name or f"{plan.name}.weight"
        n, k = plan.out_features, plan.in_features
        bs = block_for(k)
        step = row_block((n, k), np.float32)
        scales: list[np.ndarray] = []

        def pack(start: int):
            return quantize_rows(ctx.ckpt.read_rows(tensor, start, start + step), bs, ctx.io_np)

        def b_blocks():
            for q, scale in ordered_map(pack, range(0, n, step)):
                scales.append(scale)
                yield q

        g = ctx.graph
        b = g.stream(f"{plan.name}.MatMulNBits.B", np.uint8, (n, k // bs, bs), b_blocks())
        s = g.initializer(f"{plan.name}.MatMulNBits.scales", np.concatenate(scales).reshape(-1))
        acc = ctx.options.accuracy_level
        if acc is None:
            acc = ctx.ep.default_accuracy_level(8)
        return g.op("MatMulNBits", [x, b, s], f"{plan.node_prefix}/MatMulNBits", domain="com.microsoft", K=k, N=n,
                    bits=8, block_size=bs, accuracy_level=acc)
