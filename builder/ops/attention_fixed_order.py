"""com.quark_onnx GroupQueryAttentionFixedOrder: GroupQueryAttention's inputs, outputs and cache semantics, with one
summation order on every CPU (custom_ops/src/qo_cpu_attention.c; the op's ONNX-function fallback runs without the
library). The cpu default where the custom-op library is in use (builder/attention_variants.py).
GroupQueryAttentionFixedOrderSinks takes each head's sink logit as a tenth input (gpt-oss).

    q [B,S,H*D], k/v [B,S,Hkv*D], past_k/v [B,Hkv,P,D] ──► GroupQueryAttentionFixedOrder(seqlens_k, total_len,
        cos/sin[, sinks]) ──► out [B,S,H*D], present_k/v (past's buffer under genai's past_present_share_buffer)
"""
from __future__ import annotations

OP = "GroupQueryAttentionFixedOrder"
OP_SINKS = "GroupQueryAttentionFixedOrderSinks"


def fixed_order_attention(ctx, i: int, q: str, k: str, v: str, past_k: str, past_v: str, present_k: str,
                          present_v: str, shared, hp, sinks: str | None = None) -> str:
    from custom_ops.functions import DOMAIN, function_protos

    g = ctx.graph
    op = OP_SINKS if sinks else OP
    for proto in function_protos(op, g.opsets[""]):  # the op's function and the helper its body calls
        g.add_function(proto, opset_version=1)
    inputs = [q, k, v, past_k, past_v, shared.seqlens_k, shared.total_seq_len, shared.cos_cache, shared.sin_cache]
    name = f"/model/layers.{i}/attn/{op}"
    return g.node(op, inputs + ([sinks] if sinks else []), name, outputs=[f"{name}/output_0", present_k, present_v],
                  domain=DOMAIN, num_heads=hp.num_heads, kv_num_heads=hp.num_kv_heads,
                  scale=float(hp.head_dim) ** -0.5, local_window_size=hp.layer_window(i))[0]
