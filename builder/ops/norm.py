"""RMSNorm as SimplifiedLayerNormalization, and the residual-add + RMSNorm fusion.

    x ──► SimplifiedLayerNormalization(w) ──► y
    x, skip ──► SkipSimplifiedLayerNormalization(w) ──► y, (x + skip)   # second output: the new residual
"""
from __future__ import annotations


def rms_norm(ctx, x: str, weight_tensor: str, eps: float, node_name: str) -> str:
    w = ctx.graph.initializer(weight_tensor, ctx.float_weight(weight_tensor))
    return ctx.graph.op("SimplifiedLayerNormalization", [x, w], node_name, axis=-1, epsilon=eps, stash_type=1)


def skip_rms_norm(ctx, x: str, skip: str, weight_tensor: str, eps: float, node_name: str) -> tuple[str, str]:
    w = ctx.graph.initializer(weight_tensor, ctx.float_weight(weight_tensor))
    out = ctx.graph.node("SkipSimplifiedLayerNormalization", [x, skip, w], node_name,
                         outputs=[f"{node_name}/output_0", "", "", f"{node_name}/output_3"],
                         domain="com.microsoft", epsilon=eps)
    return out[0], out[3]
