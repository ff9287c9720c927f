"""RMSNorm as SimplifiedLayerNormalization, and the residual-add + RMSNorm fusion.

    x ──► SimplifiedLayerNormalization(w) ──► y
    x, skip ──► SkipSimplifiedLayerNormalization(w) ──► y, (x + skip)   # second output: the new residual
    per-head (Qwen3 q_norm/k_norm): x [B,S,N*D] ──► Reshape [B,S,N,D] ──► SimplifiedLayerNormalization ──► Reshape
weight_offset=1.0 (Gemma's x * (1 + w)): the initializer holds 1 + w, added in fp32 before the cast to the io dtype.
"""
from __future__ import annotations

import numpy as np

from ..errors import ConversionError


def norm_weight(ctx, weight_tensor: str, weight_offset: float = 0.0) -> str:
    if not weight_offset:
        return ctx.graph.initializer(weight_tensor, ctx.float_weight(weight_tensor))
    w = np.asarray(ctx.ckpt.get(weight_tensor), dtype=np.float32) + np.float32(weight_offset)
    return ctx.graph.initializer(weight_tensor, w.astype(ctx.io_np))


def rms_norm(ctx, x: str, weight_tensor: str, eps: float, node_name: str, weight_offset: float = 0.0) -> str:
    w = norm_weight(ctx, weight_tensor, weight_offset)
    return ctx.graph.op("SimplifiedLayerNormalization", [x, w], node_name, axis=-1, epsilon=eps, stash_type=1)


def skip_rms_norm(ctx, x: str, skip: str, weight_tensor: str, eps: float, node_name: str,
                  weight_offset: float = 0.0) -> tuple[str, str]:
    w = norm_weight(ctx, weight_tensor, weight_offset)
    out = ctx.graph.node("SkipSimplifiedLayerNormalization", [x, skip, w], node_name,
                         outputs=[f"{node_name}/output_0", "", "", f"{node_name}/output_3"],
                         domain="com.microsoft", epsilon=eps)
    return out[0], out[3]


def head_rms_norm(ctx, x: str, weight_tensor: str, num_heads: int, head_dim: int, eps: float, prefix: str,
                  weight_offset: float = 0.0) -> str:
    """RMSNorm over each head of a projection output (Qwen3 q_norm / k_norm, weight [head_dim]):

        x [B,S,N*D] ──► Reshape [B,S,N,D] ──► SimplifiedLayerNormalization(w [D], axis=-1) ──► Reshape [B,S,N*D]
    """
    g = ctx.graph
    check_vector(ctx, weight_tensor, head_dim)
    x4 = g.op("Reshape", [x, g.const_i64(f"{prefix}/heads_shape", [0, 0, num_heads, head_dim])], f"{prefix}/Reshape")
    y4 = rms_norm(ctx, x4, weight_tensor, eps, f"{prefix}/SimplifiedLayerNorm", weight_offset)
    return g.op("Reshape", [y4, g.const_i64(f"{prefix}/flat_shape", [0, 0, num_heads * head_dim])],
                f"{prefix}/Reshape_back")


def check_vector(ctx, weight_tensor: str, size: int) -> None:
    """A norm weight must be a [size] vector (the checkpoint is read lazily: a mismatch is caught here)."""
    shape = tuple(ctx.ckpt.shape(weight_tensor))  # raises "tensor missing from the checkpoint"
    if shape != (size,):
        raise ConversionError("norm weight has the wrong shape", file=ctx.ckpt.model_dir, layer=weight_tensor,
                              field="shape", value=list(shape), accepted=f"[{size}] (head_dim)")
