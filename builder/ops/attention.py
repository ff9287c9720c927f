"""Grouped-query attention with fused rotary and the KV cache, as com.microsoft GroupQueryAttention.

    q [B,S,H*D], k/v [B,S,Hkv*D], past_k/v [B,Hkv,P,D] ──► GroupQueryAttention(rotary cos/sin, seqlens_k, total_len)
        ──► out [B,S,H*D], present_k/v [B,Hkv,P+S,D]
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AttentionInputs:
    """Graph-level values shared by every layer's attention."""
    seqlens_k: str
    total_seq_len: str
    cos_cache: str
    sin_cache: str


def group_query_attention(ctx, q: str, k: str, v: str, past_k: str, past_v: str, present_k: str, present_v: str,
                          shared: AttentionInputs, *, num_heads: int, kv_heads: int, head_dim: int,
                          local_window: int, prefix: str, extra_inputs: list[str] | None = None,
                          extra_attrs: dict | None = None) -> str:
    inputs = [q, k, v, past_k, past_v, shared.seqlens_k, shared.total_seq_len, shared.cos_cache, shared.sin_cache]
    if extra_inputs:
        inputs += extra_inputs
    name = f"{prefix}/GroupQueryAttention"
    out = ctx.graph.node("GroupQueryAttention", inputs, name, outputs=[f"{name}/output_0", present_k, present_v],
                         domain="com.microsoft", num_heads=num_heads, kv_num_heads=kv_heads,
                         scale=float(head_dim) ** -0.5, do_rotary=1, rotary_interleaved=0,
                         local_window_size=local_window, **(extra_attrs or {}))
    return out[0]


def attention_mask_inputs(ctx, attention_mask: str) -> tuple[str, str]:
    """seqlens_k = sum(mask) - 1 (int32 [B]); total_sequence_length = mask.shape[1] (int32 scalar)."""
    g = ctx.graph
    total = g.op("ReduceSum", [attention_mask, g.const_i64("/model/attn_mask/axes", [1])],
                 "/model/attn_mask/ReduceSum", keepdims=0)
    minus = g.op("Sub", [total, g.scalar("/model/attn_mask/one", 1, "int64")], "/model/attn_mask/Sub")
    seqlens = g.op("Cast", [minus], "/model/attn_mask/seqlens_k", to=6)
    shape = g.op("Shape", [attention_mask], "/model/attn_mask/Shape", start=1, end=2)
    total_len = g.op("Squeeze", [shape, g.const_i64("/model/attn_mask/squeeze_axes", [0])],
                     "/model/attn_mask/Squeeze")
    total_len = g.op("Cast", [total_len], "/model/attn_mask/total_seq_len", to=6)
    return seqlens, total_len
