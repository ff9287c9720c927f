"""A linear layer: the scheme's matmul, then the bias as a separate Add (every EP honours an Add)."""
from __future__ import annotations

from ..quant.base import LinearPlan


def emit_linear(ctx, plan: LinearPlan, x: str) -> str:
    y = plan.scheme.emit(ctx, plan, x)
    if plan.has_bias:
        b = ctx.graph.initializer(f"{plan.name}.bias", ctx.float_weight(f"{plan.name}.bias"))
        y = ctx.graph.op("Add", [y, b], f"{plan.node_prefix}/BiasAdd")
    if ctx.progress:
        ctx.progress(plan)
    return y
