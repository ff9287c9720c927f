"""Linear layers: the scheme's matmul, then the bias as a separate Add (every EP honours an Add).

Projections that read the same input (q/k/v, gate/up) are fused into one matmul when their scheme allows it
(same weight format, bits and group size), then split:

    x ──► MatMulNBits(N = Nq + Nk + Nv) ──► [+ bias] ──► Split ──► q, k, v
"""
from __future__ import annotations

import numpy as np

from ..quant.base import LinearPlan


def emit_linear(ctx, plan: LinearPlan, x: str) -> str:
    y = plan.scheme.emit(ctx, plan, x)
    if plan.has_bias:
        b = ctx.graph.initializer(f"{plan.name}.bias", ctx.float_weight(f"{plan.name}.bias"))
        y = ctx.graph.op("Add", [y, b], f"{plan.node_prefix}/BiasAdd")
    if ctx.progress:
        ctx.progress(plan)
    return y


def emit_linears(ctx, plans: list[LinearPlan], x: str, fused_name: str, fused_prefix: str) -> list[str]:
    """Emit several linears on the same input x, fused when every plan's scheme agrees on a fuse key."""
    keys = {getattr(p.scheme, "fuse_key", lambda *_: None)(p, ctx.ep) for p in plans}
    if not ctx.options.fuse_projections or len(keys) != 1 or None in keys:
        return [emit_linear(ctx, p, x) for p in plans]
    y = plans[0].scheme.emit_fused(ctx, plans, x, fused_name, fused_prefix)
    g = ctx.graph
    if all(p.has_bias for p in plans):
        bias = np.concatenate([ctx.float_weight(f"{p.name}.bias") for p in plans])
        y = g.op("Add", [y, g.initializer(f"{fused_name}.bias", bias)], f"{fused_prefix}/BiasAdd")
        biased = []
    else:
        biased = [p.has_bias for p in plans]
    sizes = g.const_i64(f"{fused_name}.split_sizes", [p.out_features for p in plans])
    outs = g.node("Split", [y, sizes], f"{fused_prefix}/Split", outputs=len(plans), axis=-1)
    for i, p in enumerate(plans):
        if biased and biased[i]:
            b = g.initializer(f"{p.name}.bias", ctx.float_weight(f"{p.name}.bias"))
            outs[i] = g.op("Add", [outs[i], b], f"{p.node_prefix}/BiasAdd")
        if ctx.progress:
            ctx.progress(p)
    return outs
