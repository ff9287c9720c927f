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

--extra_options mla_cache=latent (mla_latent_attention): the compressed latent is the cache and kv_b_proj is absorbed
into the query and output sides (explicit ops; genai past_present_share_buffer false):
    latent = [Q_in(kv_a_layernorm(c)) [L], RoPE(k_rot) [r]]  (L = kv_lora_rank; Q_in: kv_b_proj's own dynamic
             input quantization, per token, e.g. Quark's MXFP4 activations, applied once before caching)
    cache: genai key = latent[0 : (L+r)/2], value = latent[(L+r)/2 :], each [B, 1, T, (L+r)/2] (one "kv head")
    W = kv_b_proj's decoded weight [H, n + v, L]: W_UK = W[:, :n], W_UV = W[:, n:]
    q_lat = q_nope · W_UK [B,H,S,L];  scores = [q_lat, RoPE(q_rot)] · latent^T * scale  (= q_nope·k_nope + q_rot·k_rot)
    Where(causal & attention_mask) ─► Softmax ─► P ;  out = (P · latent[:L]) · W_UVᵀ [B,H,S,v] ─► o_proj
    (an If per layer: above absorbed_max_tokens new tokens, i.e. prompts, K/V are materialised from the cached
    latent for that call instead, k_nopeᵀ = W_UK · latent[:L]ᵀ, V = latent[:L] · W_UVᵀ: fewer multiply-adds there)
The same products as the materialised form, reassociated: exact up to fp32 rounding for float, weight-only int and
MXFP4 (weights + dynamic per-token activations) kv_b_proj. Output-side quantization of kv_b_proj (Quark's FP8 KV
cache) acts on per-head k_nope/V that this form never computes: refused (builder/arch/deepseek_v3.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import helper

from .linear import emit_linear
from .norm import rms_norm
from .qdq import qdq_static

MLA_CACHE_FORMS = ("materialized", "latent")  # --extra_options mla_cache (builder/options.py)


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


def _query_heads(ctx, plans: dict, hp, x: str, pre: str, p: str) -> tuple[str, str]:
    """q_proj (or q_a_proj -> q_a_layernorm -> q_b_proj) of x, split per head into (q_nope, q_rot) [B, S, H, *]."""
    g = ctx.graph
    if hp.q_lora_rank is None:
        q = emit_linear(ctx, plans[f"{pre}.q_proj"], x)
    else:
        q_a = emit_linear(ctx, plans[f"{pre}.q_a_proj"], x)
        q_a = rms_norm(ctx, q_a, f"{pre}.q_a_layernorm.weight", hp.mla_norm_eps,
                       f"{p}/q_a_layernorm/SimplifiedLayerNorm")
        q = emit_linear(ctx, plans[f"{pre}.q_b_proj"], q_a)
    n, r = hp.qk_nope_head_dim, hp.qk_rope_head_dim
    q4 = g.op("Reshape", [q, g.const_i64(f"{p}/q_shape", [0, 0, hp.num_heads, n + r])], f"{p}/q_reshape")
    return tuple(g.node("Split", [q4, g.const_i64(f"{p}/q_split", [n, r])], f"{p}/q_split", outputs=2, axis=-1))


def mla_attention(ctx, i: int, x: str, plans: dict, hp, rv: RopeValues, seqlens_k: str, total_seq_len: str,
                  cache: tuple[str, str, str, str], kv_scale: float | None) -> str:
    """One layer's MLA block from the normed hidden state x [B,S,hidden] to o_proj's output."""
    g = ctx.graph
    pre, p = f"model.layers.{i}.self_attn", f"/model/layers.{i}/attn"
    h, n, r, v = hp.num_heads, hp.qk_nope_head_dim, hp.qk_rope_head_dim, hp.v_head_dim
    qk, d = n + r, hp.head_dim

    q_nope, q_rot = _query_heads(ctx, plans, hp, x, pre, p)

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



def kv_b_latent_weights(ctx, plan, hp) -> tuple[np.ndarray, np.ndarray]:
    """kv_b_proj's weight decoded in fp32 as Quark's dequantizer computes it, split per head into
    W_UK [H, n, L] (q_nope [.., n] @ W_UK -> q_lat [.., L]) and W_UVᵀ [H, L, v] (latent ctx [.., L] @ -> [.., v]),
    in the io dtype. The schemes accepted here are those deepseek_v3.plan_attention lets through."""
    from ..quant import fp4_codes
    from ..quant.int_weight_only import IntWeightOnly
    from ..quant.mxfp4 import Mxfp4Linear
    scheme = plan.scheme.__name__
    if scheme == "FloatLinear":
        w = np.asarray(ctx.ckpt.get(plan.weight_name or f"{plan.name}.weight"), dtype=np.float32)
    elif scheme == "IntWeightOnly":
        w = IntWeightOnly.load(plan, ctx.ckpt, ctx.quant.export.pack_method).dequantize()
    elif scheme == "Mxfp4Linear":
        fw = Mxfp4Linear.load(plan, ctx.ckpt)
        w = fp4_codes.dequantize(fw.codes, fw.block_scale, fw.group).astype(np.float32)
    else:  # pragma: no cover - refused in plan_attention
        raise AssertionError(scheme)
    h, n, v, lat = hp.num_heads, hp.qk_nope_head_dim, hp.v_head_dim, hp.kv_lora_rank
    w = w.reshape(h, n + v, lat)
    w_uk = np.ascontiguousarray(w[:, :n, :]).astype(ctx.io_np)
    w_uv_t = np.ascontiguousarray(w[:, n:, :].transpose(0, 2, 1)).astype(ctx.io_np)
    return w_uk, w_uv_t


def kv_b_input_quant(ctx, plan, c: str) -> str:
    """kv_b_proj's own input quantization (dynamic, per token) applied to the normed latent, as its emit would."""
    if plan.scheme.__name__ != "Mxfp4Linear" or not plan.spec.input_tensors:
        return c
    from ..quant.mxfp4 import MXFP4_GROUP, emulate_activations
    from .mx_activation import Fp4ActivationSpec, emit_fp4_activation_qdq
    if not emulate_activations(ctx):
        return c
    a = plan.spec.input_tensors[0]
    return emit_fp4_activation_qdq(ctx, c, Fp4ActivationSpec("mxfp4", MXFP4_GROUP, a.scale_calculation_mode or "even"),
                                   plan.node_prefix)


def absorbed_max_tokens(hp) -> int:
    """Most new tokens per call for which the absorbed attention costs fewer multiply-adds than materialising K/V
    from the latent: per layer and key position, absorbed H·S·(2L + r) against materialised H·(L·(n + v) +
    S·(n + r + v)), so S < L·(n + v) / (2L − n − v) (170 at DeepSeek-V3's shape); decode (S = 1) is always absorbed."""
    lat, n, v = hp.kv_lora_rank, hp.qk_nope_head_dim, hp.v_head_dim
    denominator = 2 * lat - n - v
    return max(1, (lat * (n + v)) // denominator) if denominator > 0 else 1 << 62


def latent_cache_width(hp) -> int:
    """genai head_size of the latent form: half the latent (key and value caches each hold one half)."""
    return (hp.kv_lora_rank + hp.qk_rope_head_dim) // 2


def mla_latent_attention(ctx, i: int, x: str, plans: dict, hp, rv: RopeValues, allowed: str,
                         cache: tuple[str, str, str, str]) -> str:
    """One layer's MLA block with the latent cache (module docstring); `allowed` is the bool [B, 1, S, T] mask
    (causal and not padding, builder/ops/fp8_attention.shared_values)."""
    g = ctx.graph
    pre, p = f"model.layers.{i}.self_attn", f"/model/layers.{i}/attn"
    h, r, lat = hp.num_heads, hp.qk_rope_head_dim, hp.kv_lora_rank
    half = latent_cache_width(hp)

    def c64(name, values):
        return g.const_i64(f"{p}/{name}", values)

    q_nope, q_rot = _query_heads(ctx, plans, hp, x, pre, p)
    q_rot = _rotate(ctx, q_rot, rv, r, hp.rope_interleave, f"{p}/q_rotary")

    ckv = emit_linear(ctx, plans[f"{pre}.kv_a_proj_with_mqa"], x)
    c, k_rot = g.node("Split", [ckv, c64("kv_a_split", [lat, r])], f"{p}/kv_a_split", outputs=2, axis=-1)
    c = rms_norm(ctx, c, f"{pre}.kv_a_layernorm.weight", hp.mla_norm_eps, f"{p}/kv_a_layernorm/SimplifiedLayerNorm")
    kv_b = plans[f"{pre}.kv_b_proj"]
    c = kv_b_input_quant(ctx, kv_b, c)
    k_rot4 = g.op("Reshape", [k_rot, c64("k_rot_shape", [0, 0, 1, r])], f"{p}/k_rot_reshape")
    k_rot = g.op("Reshape", [_rotate(ctx, k_rot4, rv, r, hp.rope_interleave, f"{p}/k_rotary"),
                             c64("k_rot_flat", [0, 0, r])], f"{p}/k_rot_flat")
    latent = g.op("Concat", [c, k_rot], f"{p}/latent/Concat", axis=-1)                         # [B, S, L + r]
    latent = g.op("Unsqueeze", [latent, c64("latent_axes", [1])], f"{p}/latent/Unsqueeze")    # [B, 1, S, L + r]
    new_k, new_v = g.node("Split", [latent, c64("latent_split", [half, half])], f"{p}/latent/Split", outputs=2,
                          axis=-1)
    past_k, past_v, present_k, present_v = cache
    g.node("Concat", [past_k, new_k], f"{p}/present_key/Concat", outputs=[present_k], axis=2)
    g.node("Concat", [past_v, new_v], f"{p}/present_value/Concat", outputs=[present_v], axis=2)
    full = g.op("Concat", [present_k, present_v], f"{p}/latent_all/Concat", axis=-1)          # [B, 1, T, L + r]

    w_uk, w_uv_t = kv_b_latent_weights(ctx, kv_b, hp)
    if ctx.progress:
        ctx.progress(kv_b)
    q_nope = g.op("Transpose", [q_nope], f"{p}/q_nope/Transpose", perm=[0, 2, 1, 3])          # [B, H, S, n]
    q_rot = g.op("Transpose", [q_rot], f"{p}/q_rot/Transpose", perm=[0, 2, 1, 3])              # [B, H, S, r]
    lowest = g.scalar(f"{p}/lowest", float(np.finfo(ctx.io_np).min) if ctx.io != "bf16" else -3.38e38, ctx.io_np)
    scale = g.scalar(f"{p}/scaling", float(hp.softmax_scale), ctx.io_np)
    c_all = g.op("Slice", [full, c64("c_start", [0]), c64("c_end", [lat]), c64("c_axes", [-1])], f"{p}/c_all/Slice")
    w_uk_name = g.initializer(f"{pre}.kv_b_proj.w_uk", w_uk)
    w_uv_name = g.initializer(f"{pre}.kv_b_proj.w_uv_t", w_uv_t)

    def probs_of(scores: str, q: str) -> str:
        scores = g.op("Mul", [scores, scale], f"{q}/QK/Mul_scale")
        return g.op("Softmax", [g.op("Where", [allowed, scores, lowest], f"{q}/mask/Where")], f"{q}/Softmax", axis=-1)

    # absorbed (few new tokens, decode): q_lat = q_nope · W_UK, scores over the latent, out = (P · c) · W_UVᵀ
    start, q = len(g.nodes), f"{p}/absorbed"
    q_lat = g.op("MatMul", [q_nope, w_uk_name], f"{q}/q_absorb/MatMul")                        # [B, H, S, L]
    query = g.op("Concat", [q_lat, q_rot], f"{q}/q_latent/Concat", axis=-1)                   # [B, H, S, L + r]
    scores = g.op("MatMul", [query, g.op("Transpose", [full], f"{q}/latent_T", perm=[0, 1, 3, 2])],
                  f"{q}/QK/MatMul")                                                             # [B, H, S, T]
    ctx_lat = g.op("MatMul", [probs_of(scores, q), c_all], f"{q}/PV/MatMul")                   # [B, H, S, L]
    absorbed = g.op("MatMul", [ctx_lat, w_uv_name], f"{q}/v_absorb/MatMul")                    # [B, H, S, v]
    absorbed_nodes = g.nodes[start:]
    del g.nodes[start:]
    # materialised from the latent (prompts): k_nopeᵀ = W_UK · cᵀ [B, H, n, T], V = c · W_UVᵀ [B, H, T, v]
    start, q = len(g.nodes), f"{p}/materialized"
    k_nope_t = g.op("MatMul", [w_uk_name, g.op("Transpose", [c_all], f"{q}/c_T", perm=[0, 1, 3, 2])],
                    f"{q}/k_nope/MatMul")
    k_rot_t = g.op("Transpose", [g.op("Slice", [full, c64("kr_start", [lat]), c64("kr_end", [lat + r]),
                                                c64("kr_axes", [-1])], f"{q}/k_rot/Slice")],
                   f"{q}/k_rot_T", perm=[0, 1, 3, 2])                                           # [B, 1, r, T]
    scores = g.op("Add", [g.op("MatMul", [q_nope, k_nope_t], f"{q}/QK_nope/MatMul"),
                          g.op("MatMul", [q_rot, k_rot_t], f"{q}/QK_rot/MatMul")], f"{q}/QK/Add")
    values = g.op("MatMul", [c_all, w_uv_name], f"{q}/v/MatMul")                               # [B, H, T, v]
    materialized = g.op("MatMul", [probs_of(scores, q), values], f"{q}/PV/MatMul")             # [B, H, S, v]
    materialized_nodes = g.nodes[start:]
    del g.nodes[start:]
    new_len = g.op("Shape", [x], f"{p}/new_len", start=1, end=2)
    cond = g.op("LessOrEqual", [new_len, c64("absorbed_max_tokens", [absorbed_max_tokens(hp)])],
                f"{p}/FewTokens")
    info = lambda v: helper.make_tensor_value_info(v, ctx.io_type, None)  # noqa: E731
    out = g.op("If", [cond], f"{p}/If",
               then_branch=helper.make_graph(absorbed_nodes, f"{p}/absorbed", [], [info(absorbed)]),
               else_branch=helper.make_graph(materialized_nodes, f"{p}/materialized", [], [info(materialized)]))
    out = g.op("Transpose", [out], f"{p}/out_transpose", perm=[0, 2, 1, 3])                    # [B, S, H, v]
    out = g.op("Reshape", [out, c64("out_flat", [0, 0, h * hp.v_head_dim])], f"{p}/out_reshape")
    return emit_linear(ctx, plans[f"{pre}.o_proj"], out)
