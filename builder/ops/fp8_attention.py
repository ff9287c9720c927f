"""FP8 attention as explicit ops, numerically Quark's eager-attention emulation (attention_scheme "fp8").

Per layer (H heads, Hkv kv heads, D head_dim, S new tokens, T = past + S; scales from the checkpoint, any may be
absent):
    q ─QDQ(q_proj.output_scale)─► [B,S,H,D] ─RoPE─► [B,H,S,D] ──────────────────────┐
    k ─QDQ(k_proj.output_scale)─► [B,S,Hkv,D] ─RoPE─► [B,Hkv,S,D] ─Concat(past_k)─► present_k ─┤
    v ─QDQ(v_proj.output_scale)─► [B,Hkv,S,D] ─Concat(past_v)─► present_v                       │
    scores = MatMul(q grouped [B,Hkv,rep*S,D], present_k^T) * D^-0.5 ─► [B,H,S,T] ◄───────────┘
    Where(causal & attention_mask, scores, lowest) ─► Softmax ─QDQ(self_attn.prob_output_scale)─► P
    MatMul(P grouped, QDQ(present_v, v scale)) ─► [B,S,H*D]
K/V are quantized before RoPE, like Quark with kv_cache_post_rope=false (the k/v_proj output quantizers); the cache
holds post-RoPE K in genai's [B, kv_heads, seq, head_dim] layout. Re-quantizing present_v with its own scale is exact
(its values are already fp8 * s) and gives MIGraphX a DQ·DQ pair for an FP8 P·V GEMM. Q·K^T stays in float because
RoPE moves Q and K off the fp8 grid, exactly as in Quark's emulation.
Needs genai `past_present_share_buffer: false` (present = Concat(past, new)).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ConversionError

from .qdq import qdq_static


@dataclass(frozen=True)
class LayerScales:
    q: float | None = None
    k: float | None = None
    v: float | None = None
    prob: float | None = None


@dataclass(frozen=True)
class SharedAttention:
    """Per-graph values every layer uses."""
    cos: str         # [B, S, 1, D/2]
    sin: str
    allowed: str     # bool [B, 1, S, T]: causal and not padding (and inside the sliding window)
    key_index: str | None = None    # int64 [T]: absolute key positions 0..T-1
    query_index: str | None = None  # int64 [S, 1]: absolute positions of the new tokens


def shared_values(ctx, shared, hp, prefix: str = "/model/fp8_attn") -> SharedAttention:
    g = ctx.graph
    mask = "attention_mask"

    def i64(name, values):
        return g.const_i64(f"{prefix}/{name}", values)

    def dim(value, axis, name):
        shape = g.op("Shape", [value], f"{prefix}/{name}/Shape", start=axis, end=axis + 1)
        return g.op("Squeeze", [shape, i64(f"{name}_axes", [0])], f"{prefix}/{name}/Squeeze")

    total = dim(mask, 1, "total_len")
    new = dim("input_ids", 1, "new_len")
    past = g.op("Sub", [total, new], f"{prefix}/past_len")
    # positions of the new tokens: cumsum(mask) - 1 (left padding aware), clipped at 0
    cums = g.op("CumSum", [mask, g.scalar(f"{prefix}/cumsum_axis", 1, np.int64)], f"{prefix}/CumSum")
    pos_all = g.op("Sub", [cums, g.scalar(f"{prefix}/one", 1, np.int64)], f"{prefix}/positions_all")
    pos = g.op("Slice", [pos_all, g.op("Unsqueeze", [past, i64("ax0", [0])], f"{prefix}/start"),
                         g.op("Unsqueeze", [total, i64("ax0b", [0])], f"{prefix}/end"), i64("slice_axes", [1])],
               f"{prefix}/positions")
    pos = g.op("Max", [pos, g.scalar(f"{prefix}/zero", 0, np.int64)], f"{prefix}/positions_clip")
    cos, sin = [g.op("Unsqueeze", [g.op("Gather", [cache, pos], f"{prefix}/{n}/Gather"), i64(f"{n}_ax", [2])],
                     f"{prefix}/{n}/Unsqueeze") for n, cache in (("cos", shared.cos_cache), ("sin", shared.sin_cache))]
    one = g.scalar(f"{prefix}/step", 1, np.int64)
    k_idx = g.op("Range", [g.scalar(f"{prefix}/zero_s", 0, np.int64), total, one], f"{prefix}/key_index")
    q_abs = g.op("Unsqueeze", [g.op("Range", [past, total, one], f"{prefix}/query_index"), i64("q_ax", [1])],
                 f"{prefix}/query_index/Unsqueeze")
    allowed = g.op("LessOrEqual", [k_idx, q_abs], f"{prefix}/causal")          # [S, T]
    if not hp.uniform_window:  # one mask serves every layer
        raise ConversionError("FP8 attention with a mix of sliding-window and full-attention layers is not "
                              "supported", field="layer_types", value=f"{sum(hp.windowed_layers)} of "
                              f"{len(hp.windowed_layers)} sliding_attention", accepted="fp8_attention=off")
    if hp.sliding_window and hp.sliding_window > 0:
        lo = g.op("Sub", [q_abs, g.scalar(f"{prefix}/window", hp.sliding_window, np.int64)], f"{prefix}/win_lo")
        allowed = g.op("And", [allowed, g.op("Greater", [k_idx, lo], f"{prefix}/in_window")], f"{prefix}/windowed")
    pad = g.op("Unsqueeze", [g.op("Cast", [mask], f"{prefix}/mask_bool", to=9), i64("pad_axes", [1, 2])],
               f"{prefix}/mask_bool/Unsqueeze")                                 # [B, 1, 1, T]
    allowed = g.op("And", [allowed, pad], f"{prefix}/allowed")                 # [B, 1, S, T]
    return SharedAttention(cos, sin, allowed, k_idx, q_abs)


def _rope(ctx, x4: str, sa: SharedAttention, half: int, name: str) -> str:
    """Non-interleaved rotary on [B, S, N, D]: (x1, x2) -> (x1 c - x2 s, x2 c + x1 s)."""
    g = ctx.graph
    x1, x2 = g.node("Split", [x4, g.const_i64(f"{name}/split", [half, half])], f"{name}/Split", outputs=2, axis=-1)
    o1 = g.op("Sub", [g.op("Mul", [x1, sa.cos], f"{name}/Mul_x1c"), g.op("Mul", [x2, sa.sin], f"{name}/Mul_x2s")],
              f"{name}/Sub")
    o2 = g.op("Add", [g.op("Mul", [x2, sa.cos], f"{name}/Mul_x2c"), g.op("Mul", [x1, sa.sin], f"{name}/Mul_x1s")],
              f"{name}/Add")
    return g.op("Concat", [o1, o2], f"{name}/Concat", axis=-1)


def softmax_fixed_order(ctx, scores: str, p: str) -> str:
    """Softmax over the last axis as ReduceMax, Sub, Exp, ReduceSum, Div: the same result on AVX2 and AVX-512 CPUs.

    ORT's Softmax (and GroupQueryAttention's softmax) is MLAS's MlasComputeSoftmax, whose sum of the exponentials
    accumulates in 16 lanes with AVX-512F and 8 with AVX2: rows longer than 16 sum in another order (measured:
    tools/isa_op_outputs.py, Softmax96 and GroupQueryAttention differ by up to 4 ulp between native AVX-512 and
    QEMU Haswell). Its ReduceMax, Exp, ReduceSum and Div are identical there (the same tool, SoftmaxExplicit), so
    this form is (issue 21; docs/real_model_numerics.md)."""
    g = ctx.graph
    axes = g.const_i64(f"{p}/softmax/axes", [-1])
    top = g.op("ReduceMax", [scores, axes], f"{p}/softmax/ReduceMax", keepdims=1)
    e = g.op("Exp", [g.op("Sub", [scores, top], f"{p}/softmax/Sub")], f"{p}/softmax/Exp")
    total = g.op("ReduceSum", [e, axes], f"{p}/softmax/ReduceSum", keepdims=1)
    return g.op("Div", [e, total], f"{p}/softmax/Div")


def fp8_attention(ctx, i: int, q: str, k: str, v: str, past_k: str, past_v: str, present_k: str, present_v: str,
                  sa: SharedAttention, hp, scales: LayerScales, sinks: str | None = None,
                  fixed_softmax: bool = False) -> str:
    """sinks: [H] attention-sink logits (gpt-oss; builder/ops/sink_attention.py), appended to every score row
    before the softmax and dropped after it. fixed_softmax: softmax_fixed_order instead of ORT's Softmax."""
    g = ctx.graph
    p = f"/model/layers.{i}/attn"
    h, hkv, d = hp.num_heads, hp.num_kv_heads, hp.head_dim
    fp8 = "fp8_e4m3"
    if scales.q is not None:
        q = qdq_static(ctx, q, scales.q, fp8, f"{p}/q_quant")
    if scales.k is not None:
        k = qdq_static(ctx, k, scales.k, fp8, f"{p}/k_quant")
    if scales.v is not None:
        v = qdq_static(ctx, v, scales.v, fp8, f"{p}/v_quant")

    def shape(name, dims):
        return g.const_i64(f"{p}/{name}_shape", dims)

    q4 = g.op("Reshape", [q, shape("q", [0, 0, h, d])], f"{p}/q_reshape")
    k4 = g.op("Reshape", [k, shape("k", [0, 0, hkv, d])], f"{p}/k_reshape")
    v4 = g.op("Reshape", [v, shape("v", [0, 0, hkv, d])], f"{p}/v_reshape")
    q4 = _rope(ctx, q4, sa, d // 2, f"{p}/q_rotary")
    k4 = _rope(ctx, k4, sa, d // 2, f"{p}/k_rotary")
    perm = [0, 2, 1, 3]
    q_t = g.op("Transpose", [q4], f"{p}/q_transpose", perm=perm)
    k_t = g.op("Transpose", [k4], f"{p}/k_transpose", perm=perm)
    v_t = g.op("Transpose", [v4], f"{p}/v_transpose", perm=perm)
    g.node("Concat", [past_k, k_t], f"{p}/present_key/Concat", outputs=[present_k], axis=2)
    g.node("Concat", [past_v, v_t], f"{p}/present_value/Concat", outputs=[present_v], axis=2)
    grouped = shape("grouped", [0, hkv, -1, d])
    q_g = g.op("Reshape", [q_t, grouped], f"{p}/q_grouped")                        # [B, Hkv, rep*S, D]
    k_tt = g.op("Transpose", [present_k], f"{p}/k_T", perm=[0, 1, 3, 2])           # [B, Hkv, D, T]
    scores = g.op("MatMul", [q_g, k_tt], f"{p}/QK/MatMul")
    scores = g.op("Mul", [scores, g.scalar(f"{p}/scaling", float(d) ** -0.5, ctx.io_np)], f"{p}/QK/Mul_scale")
    scores = g.op("Reshape", [scores, shape("scores", [0, h, -1, 0])], f"{p}/scores_heads")   # [B, H, S, T]
    lowest = g.scalar(f"{p}/lowest", float(np.finfo(ctx.io_np).min) if ctx.io != "bf16" else -3.38e38, ctx.io_np)
    scores = g.op("Where", [sa.allowed, scores, lowest], f"{p}/mask/Where")
    if sinks is not None:
        from .sink_attention import append_sink_column, drop_sink_column
        probs = drop_sink_column(ctx, g.op("Softmax", [append_sink_column(ctx, scores, sinks, h, p)],
                                           f"{p}/Softmax", axis=-1), p)
    elif fixed_softmax:
        probs = softmax_fixed_order(ctx, scores, p)
    else:
        probs = g.op("Softmax", [scores], f"{p}/Softmax", axis=-1)
    values = present_v
    if scales.prob is not None:
        probs = qdq_static(ctx, probs, scales.prob, fp8, f"{p}/prob_quant")
        if scales.v is not None:  # exact re-quantization: lets MIGraphX run P·V as an FP8 GEMM
            values = qdq_static(ctx, present_v, scales.v, fp8, f"{p}/v_cache_quant")
    p_g = g.op("Reshape", [probs, shape("probs_grouped", [0, hkv, -1, 0])], f"{p}/probs_grouped")
    out = g.op("MatMul", [p_g, values], f"{p}/PV/MatMul")                          # [B, Hkv, rep*S, D]
    out = g.op("Reshape", [out, shape("out_heads", [0, h, -1, d])], f"{p}/out_heads")
    out = g.op("Transpose", [out], f"{p}/out_transpose", perm=perm)
    return g.op("Reshape", [out, shape("out", [0, 0, h * d])], f"{p}/out_reshape")
