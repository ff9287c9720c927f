"""DeepSeek multi-head latent attention (MLA), as transformers 5's DeepseekV3Attention computes it, with the
per-head K and V materialised and handed to com.microsoft GroupQueryAttention (no fused rotary, MHA: kv heads = heads).

Per layer (H heads, n = qk_nope_head_dim, r = qk_rope_head_dim, v = v_head_dim, D = max(n + r, v)):
    x ─► q_a_proj ─► q_a_layernorm ─► q_b_proj ─► [B,S,H,n+r] ─Split─► q_nope [..n], q_rot [..r]   (or q_proj)
    x ─► kv_a_proj_with_mqa ─Split─► c [kv_lora_rank] ─► kv_a_layernorm ─► kv_b_proj ─[FP8 QDQ]─► [B,S,H,n+v]
                            └─► k_rot [r] (one head, shared)                     ─Split─► k_nope [..n], v [..v]
    q_rot, k_rot ─► RoPE (rope_interleave: even/odd lanes de-interleaved first, as apply_rotary_pos_emb_interleave,
                    whose output is the rotate-half layout) ; k_rot ─Expand─► H heads
    Q = [q_nope, q_rot], K = [k_nope, k_rot], V   zero-padded to D   ─► GroupQueryAttention(do_rotary=0,
        scale = (n + r)^-0.5 * mscale^2) ─► [B,S,H,D] ─Slice[..v]─► [B,S,H*v] ─► o_proj
The cache is what GQA keeps: the materialised per-head K and V, [B, H, T, D] each (genai head_size D, kv heads H).
Zero lanes do not change Q·K (both padded) nor the kept slice of P·V. Exact against eager attention up to fp32
rounding; it is the simple faithful choice, not MLA's compressed cache (kv_lora_rank + r values per token).
FP8 KV cache (Quark kv_cache_scheme on `*kv_b_proj`): kv_b_proj's output (k_nope and V of every head) is
quantize-dequantized with kv_b_proj.output_scale, as Quark's output quantizer does; k_rot is not quantized by Quark.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .linear import emit_linear
from .norm import rms_norm
from .qdq import qdq_static


@dataclass(frozen=True)
class RopeValues:
    """Per-graph rotary values: cos/sin [B, S, 1, r/2] at the new tokens' positions."""
    cos: str
    sin: str


def rope_values(ctx, cos_cache: str, sin_cache: str, prefix: str = "/model/mla_rope") -> RopeValues:
    """Positions of the new tokens = cumsum(attention_mask) - 1 over the last S columns (as transformers builds
    position_ids from the mask), clipped at 0; cos/sin gathered there."""
    g = ctx.graph

    def i64(name, values):
        return g.const_i64(f"{prefix}/{name}", values)

    mask = "attention_mask"
    total = g.op("Shape", [mask], f"{prefix}/total_len", start=1, end=2)
    new = g.op("Shape", ["input_ids"], f"{prefix}/new_len", start=1, end=2)
    past = g.op("Sub", [total, new], f"{prefix}/past_len")
    cums = g.op("CumSum", [mask, g.scalar(f"{prefix}/cumsum_axis", 1, np.int64)], f"{prefix}/CumSum")
    pos = g.op("Sub", [cums, g.scalar(f"{prefix}/one", 1, np.int64)], f"{prefix}/positions_all")
    pos = g.op("Slice", [pos, past, total, i64("slice_axes", [1])], f"{prefix}/positions")
    pos = g.op("Max", [pos, g.scalar(f"{prefix}/zero", 0, np.int64)], f"{prefix}/positions_clip")
    cos, sin = [g.op("Unsqueeze", [g.op("Gather", [cache, pos], f"{prefix}/{n}/Gather"), i64(f"{n}_axes", [2])],
                     f"{prefix}/{n}/Unsqueeze") for n, cache in (("cos", cos_cache), ("sin", sin_cache))]
    return RopeValues(cos, sin)


def _rotate(ctx, x4: str, rv: RopeValues, rope_dim: int, interleaved: bool, name: str) -> str:
    """RoPE on [B, S, N, r]: (x1, x2) -> (x1 c - x2 s, x2 c + x1 s), x1/x2 the halves (or the even/odd lanes)."""
    g = ctx.graph
    if interleaved:
        order = np.concatenate([np.arange(0, rope_dim, 2), np.arange(1, rope_dim, 2)])
        x4 = g.op("Gather", [x4, g.const_i64(f"{name}/deinterleave", order.tolist())], f"{name}/Deinterleave",
                  axis=-1)
    half = rope_dim // 2
    x1, x2 = g.node("Split", [x4, g.const_i64(f"{name}/split", [half, half])], f"{name}/Split", outputs=2, axis=-1)
    o1 = g.op("Sub", [g.op("Mul", [x1, rv.cos], f"{name}/Mul_x1c"), g.op("Mul", [x2, rv.sin], f"{name}/Mul_x2s")],
              f"{name}/Sub")
    o2 = g.op("Add", [g.op("Mul", [x2, rv.cos], f"{name}/Mul_x2c"), g.op("Mul", [x1, rv.sin], f"{name}/Mul_x1s")],
              f"{name}/Add")
    return g.op("Concat", [o1, o2], f"{name}/Concat", axis=-1)


def _pad_last(ctx, x4: str, extra: int, name: str) -> str:
    """Zero-pad the last axis of a [B, S, N, d] tensor by `extra` lanes."""
    if extra == 0:
        return x4
    g = ctx.graph
    pads = g.const_i64(f"{name}/pads", [0, 0, 0, 0, 0, 0, 0, extra])
    return g.op("Pad", [x4, pads], f"{name}/Pad", mode="constant")


def mla_attention(ctx, i: int, x: str, plans: dict, hp, rv: RopeValues, seqlens_k: str, total_seq_len: str,
                  cache: tuple[str, str, str, str], kv_scale: float | None) -> str:
    """One layer's MLA block from the normed hidden state x [B,S,hidden] to o_proj's output."""
    g = ctx.graph
    pre, p = f"model.layers.{i}.self_attn", f"/model/layers.{i}/attn"
    h, n, r, v = hp.num_heads, hp.qk_nope_head_dim, hp.qk_rope_head_dim, hp.v_head_dim
    qk, d = n + r, hp.head_dim

    if hp.q_lora_rank is None:
        q = emit_linear(ctx, plans[f"{pre}.q_proj"], x)
    else:
        q_a = emit_linear(ctx, plans[f"{pre}.q_a_proj"], x)
        q_a = rms_norm(ctx, q_a, f"{pre}.q_a_layernorm.weight", hp.mla_norm_eps,
                       f"{p}/q_a_layernorm/SimplifiedLayerNorm")
        q = emit_linear(ctx, plans[f"{pre}.q_b_proj"], q_a)
    q4 = g.op("Reshape", [q, g.const_i64(f"{p}/q_shape", [0, 0, h, qk])], f"{p}/q_reshape")
    q_nope, q_rot = g.node("Split", [q4, g.const_i64(f"{p}/q_split", [n, r])], f"{p}/q_split", outputs=2, axis=-1)

    ckv = emit_linear(ctx, plans[f"{pre}.kv_a_proj_with_mqa"], x)
    c, k_rot = g.node("Split", [ckv, g.const_i64(f"{p}/kv_a_split", [hp.kv_lora_rank, r])], f"{p}/kv_a_split",
                      outputs=2, axis=-1)
    c = rms_norm(ctx, c, f"{pre}.kv_a_layernorm.weight", hp.mla_norm_eps, f"{p}/kv_a_layernorm/SimplifiedLayerNorm")
    kv = emit_linear(ctx, plans[f"{pre}.kv_b_proj"], c)
    if kv_scale is not None:
        kv = qdq_static(ctx, kv, kv_scale, "fp8_e4m3", f"{p}/kv_b_proj/output_quant")
    kv4 = g.op("Reshape", [kv, g.const_i64(f"{p}/kv_shape", [0, 0, h, n + v])], f"{p}/kv_reshape")
    k_nope, value = g.node("Split", [kv4, g.const_i64(f"{p}/kv_split", [n, v])], f"{p}/kv_split", outputs=2,
                           axis=-1)

    k_rot4 = g.op("Reshape", [k_rot, g.const_i64(f"{p}/k_rot_shape", [0, 0, 1, r])], f"{p}/k_rot_reshape")
    q_rot = _rotate(ctx, q_rot, rv, r, hp.rope_interleave, f"{p}/q_rotary")
    k_rot4 = _rotate(ctx, k_rot4, rv, r, hp.rope_interleave, f"{p}/k_rotary")
    k_rot4 = g.op("Expand", [k_rot4, g.const_i64(f"{p}/k_rot_heads", [1, 1, h, 1])], f"{p}/k_rot_expand")
    query = _pad_last(ctx, g.op("Concat", [q_nope, q_rot], f"{p}/q_concat", axis=-1), d - qk, f"{p}/q_pad")
    key = _pad_last(ctx, g.op("Concat", [k_nope, k_rot4], f"{p}/k_concat", axis=-1), d - qk, f"{p}/k_pad")
    value = _pad_last(ctx, value, d - v, f"{p}/v_pad")
    flat = g.const_i64(f"{p}/heads_flat", [0, 0, h * d])
    query, key, value = (g.op("Reshape", [t, flat], f"{p}/{nm}_flat")
                         for t, nm in ((query, "q"), (key, "k"), (value, "v")))
    past_k, past_v, present_k, present_v = cache
    name = f"{p}/GroupQueryAttention"
    out = g.node("GroupQueryAttention", [query, key, value, past_k, past_v, seqlens_k, total_seq_len], name,
                 outputs=[f"{name}/output_0", present_k, present_v], domain="com.microsoft", num_heads=h,
                 kv_num_heads=h, scale=float(hp.softmax_scale), do_rotary=0, local_window_size=-1)[0]
    if d != v:
        out4 = g.op("Reshape", [out, g.const_i64(f"{p}/out_heads", [0, 0, h, d])], f"{p}/out_heads")
        out4 = g.op("Slice", [out4, g.const_i64(f"{p}/out_start", [0]), g.const_i64(f"{p}/out_end", [v]),
                              g.const_i64(f"{p}/out_axes", [-1])], f"{p}/out_slice")
        out = g.op("Reshape", [out4, g.const_i64(f"{p}/out_flat", [0, 0, h * v])], f"{p}/out_reshape")
    return emit_linear(ctx, plans[f"{pre}.o_proj"], out)

