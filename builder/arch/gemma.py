"""Gemma-2 and Gemma-3 text decoders (Gemma2ForCausalLM, Gemma3ForCausalLM), as transformers' modeling_gemma2/3.

    input_ids ─► Gather(embed) ─► Mul(sqrt(hidden), rounded to the checkpoint dtype) ─► h
    per layer:  x = input_norm(h)
                a = o_proj(GQA(q/k/v_proj(x)))          # Gemma3: head RMSNorm on q, k before RoPE (1 + w)
                h = h + post_attention_norm(a)           # post-norm, then residual add
                x = pre_feedforward_norm(h)              # fused with the add above: SkipSimplifiedLayerNorm
                m = down_proj(gelu_tanh(gate_proj(x)) * up_proj(x))
                h = h + post_feedforward_norm(m)         # fused with the next input_norm (or model.norm)
    logits = lm_head(norm(h)), then cap * tanh(logits / cap) if final_logit_softcapping

Every Gemma RMSNorm computes x / rms(x) * (1 + w) in fp32: the SimplifiedLayerNormalization weight holds 1 + w.
GroupQueryAttention: scale = query_pre_attn_scalar ** -0.5, softcap = attn_logit_softcapping (0: none),
local_window_size per layer from layer_types. Gemma3 windowed layers rotate with rope_local_base_freq
(rope_parameters.sliding_attention), global layers with rope_theta and its scaling: two cos/sin caches.
Refused: activations other than gelu_pytorch_tanh / gelu, bidirectional attention, FP8 attention (explicit
MatMul/Softmax subgraph without scale/softcap/per-layer rope).
"""
from __future__ import annotations

import math
from dataclasses import replace

import ml_dtypes
import numpy as np

from ..errors import ConversionError
from ..ops.attention import AttentionInputs
from ..ops.linear import emit_linear, emit_linears
from ..ops.norm import head_rms_norm, rms_norm, skip_rms_norm
from ..ops.rotary import cos_sin_caches
from . import llama
from .base import DecoderHyper

MODEL_TYPES = {"Gemma2ForCausalLM": "gemma2", "Gemma3ForCausalLM": "gemma3_text"}
GELU_APPROXIMATE = {"gelu_pytorch_tanh": "tanh", "gelu": "none"}
NORM_OFFSET = 1.0  # Gemma RMSNorm multiplies by (1 + weight)
_CKPT_NP = {"BF16": ml_dtypes.bfloat16, "F16": np.float16, "F32": np.float32}

linear_layers = llama.linear_layers


def refine_hyper(cfg: dict, hp: DecoderHyper, config_file: str) -> DecoderHyper:
    """Gemma's own hyper-parameters, validated; everything this family cannot express is refused here, before any
    tensor is read."""
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in GELU_APPROXIMATE:
        raise ConversionError("Gemma MLP activation not supported", file=config_file, field="hidden_activation",
                              value=act, accepted=", ".join(GELU_APPROXIMATE))
    if cfg.get("use_bidirectional_attention"):
        raise ConversionError("bidirectional attention is not supported (decoder-only generation)",
                              file=config_file, field="use_bidirectional_attention", value=True, accepted="false")
    scalar = cfg.get("query_pre_attn_scalar")
    if isinstance(scalar, bool) or not isinstance(scalar, (int, float)) or scalar <= 0:
        raise ConversionError("query_pre_attn_scalar must be a positive number", file=config_file,
                              field="query_pre_attn_scalar", value=scalar)
    caps = {}
    for field in ("attn_logit_softcapping", "final_logit_softcapping"):
        cap = cfg.get(field)
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or cap <= 0):
            raise ConversionError("softcapping must be a positive number or null", file=config_file, field=field,
                                  value=cap)
        caps[field] = float(cap or 0.0)
    if hp.head_dim % 2 or (hp.head_dim // 2) % 8:
        raise ConversionError("GroupQueryAttention's fused rotary needs head_dim/2 to be a multiple of 8",
                              file=config_file, field="head_dim", value=hp.head_dim)
    return replace(hp, query_pre_attn_scalar=float(scalar), attn_logit_softcap=caps["attn_logit_softcapping"],
                   final_logit_softcap=caps["final_logit_softcapping"], hidden_act=act)


def float_tensors(hp: DecoderHyper) -> list[tuple[str, tuple[int, ...]]]:
    out = [("model.embed_tokens.weight", (hp.vocab_size, hp.hidden_size)), ("model.norm.weight", (hp.hidden_size,))]
    for i in range(hp.num_layers):
        out += [(f"model.layers.{i}.{n}.weight", (hp.hidden_size,))
                for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                          "post_feedforward_layernorm")]
        if hp.model_type == "gemma3_text":
            out += [(f"model.layers.{i}.self_attn.{n}.weight", (hp.head_dim,)) for n in ("q_norm", "k_norm")]
    return out


def head_norms(ctx, i: int, q: str, k: str, hp: DecoderHyper) -> tuple[str, str]:
    """Gemma3 q_norm/k_norm (1 + w) on each head, after the projections and before RoPE; Gemma2 has none."""
    if hp.model_type != "gemma3_text":
        return q, k
    attn, p = f"model.layers.{i}.self_attn", f"/model/layers.{i}/attn"
    q = head_rms_norm(ctx, q, f"{attn}.q_norm.weight", hp.num_heads, hp.head_dim, hp.rms_norm_eps, f"{p}/q_norm",
                      NORM_OFFSET)
    k = head_rms_norm(ctx, k, f"{attn}.k_norm.weight", hp.num_kv_heads, hp.head_dim, hp.rms_norm_eps,
                      f"{p}/k_norm", NORM_OFFSET)
    return q, k


def default_attention(ctx, i, q, k, v, past_k, past_v, present_k, present_v, shared, hp, *,
                      extra_inputs: list[str] | None = None, extra_attrs: dict | None = None) -> str:
    """GroupQueryAttention with Gemma's scale and attention-logit softcap (extra_inputs follow sin_cache)."""
    q, k = head_norms(ctx, i, q, k, hp)
    attrs = dict(num_heads=hp.num_heads, kv_num_heads=hp.num_kv_heads,
                 scale=hp.query_pre_attn_scalar ** -0.5, softcap=hp.attn_logit_softcap,
                 do_rotary=1, rotary_interleaved=0, local_window_size=hp.layer_window(i))
    attrs.update(extra_attrs or {})
    inputs = [q, k, v, past_k, past_v, shared.seqlens_k, shared.total_seq_len, shared.cos_cache, shared.sin_cache]
    name = f"/model/layers.{i}/attn/GroupQueryAttention"
    return ctx.graph.node("GroupQueryAttention", inputs + list(extra_inputs or []), name,
                          outputs=[f"{name}/output_0", present_k, present_v], domain="com.microsoft", **attrs)[0]


def _rope_inputs(ctx, hp: DecoderHyper, seqlens: str, total_len: str) -> tuple[AttentionInputs, AttentionInputs]:
    """(global layers, windowed layers) cos/sin caches; one shared pair unless Gemma3's local rope differs."""
    g, src = ctx.graph, str(ctx.source)
    cos, sin = cos_sin_caches(hp.head_dim, hp.max_positions, hp.rope_theta, hp.rope_scaling, src)
    full = AttentionInputs(seqlens, total_len, g.initializer("cos_cache", cos.astype(ctx.io_np)),
                           g.initializer("sin_cache", sin.astype(ctx.io_np)))
    local = hp.sliding_rope if hp.model_type == "gemma3_text" else None
    if hp.model_type == "gemma3_text" and local is None:
        local = (10000.0, None)  # Gemma3TextConfig's default rope_local_base_freq
    if local is None or local == (hp.rope_theta, hp.rope_scaling):
        return full, full
    cos, sin = cos_sin_caches(hp.head_dim, hp.max_positions, local[0], local[1], src)
    return full, AttentionInputs(seqlens, total_len, g.initializer("cos_cache_local", cos.astype(ctx.io_np)),
                                 g.initializer("sin_cache_local", sin.astype(ctx.io_np)))


def _scaled_embedding(ctx, hp: DecoderHyper, input_ids: str) -> str:
    """Gather, then * sqrt(hidden) rounded to the checkpoint's dtype (transformers: embed_scale.to(weight.dtype))."""
    g, name = ctx.graph, "model.embed_tokens.weight"
    ckpt_np = _CKPT_NP.get(ctx.ckpt.dtype(name), np.float32)
    scale = float(np.asarray(math.sqrt(hp.hidden_size), dtype=np.float32).astype(ckpt_np))
    gathered = ctx.embedding(input_ids, name)
    const = g.initializer("/model/embed_tokens/embed_scale", np.asarray(scale, dtype=ctx.io_np))
    return g.op("Mul", [gathered, const], "/model/embed_tokens/Mul")


def _gelu_mlp(ctx, x: str, gate, up, down, prefix: str, approximate: str) -> str:
    g, u = emit_linears(ctx, [gate, up], x, gate.name.rsplit(".", 1)[0] + ".gate_up_proj", f"{prefix}/gate_up_proj")
    act = ctx.graph.op("Gelu", [g], f"{prefix}/act_fn/Gelu", approximate=approximate)
    return emit_linear(ctx, down, ctx.graph.op("Mul", [act, u], f"{prefix}/Mul"))


def build_graph(ctx, hp: DecoderHyper, plans: dict, attention) -> None:
    """Emit the whole decoder (same inputs/outputs and attention contract as llama.build_graph)."""
    if getattr(attention, "explicit_fp8", False):
        raise ConversionError("FP8 attention (q_proj.output_scale / softmax quantization) is not supported for "
                              "Gemma: its explicit attention subgraph has no query_pre_attn_scalar, softcap or "
                              "per-layer rope", file=ctx.ckpt.model_dir, field="--extra_options fp8_attention",
                              value="auto", accepted="off")
    g = ctx.graph
    io_values = llama.decoder_inputs(ctx, attention)
    full_rope, local_rope = _rope_inputs(ctx, hp, io_values.seqlens_k, io_values.total_seq_len)
    eps, off = hp.rms_norm_eps, NORM_OFFSET

    residual = _scaled_embedding(ctx, hp, io_values.input_ids)
    x = rms_norm(ctx, residual, "model.layers.0.input_layernorm.weight", eps,
                 "/model/layers.0/input_layernorm/SimplifiedLayerNorm", off)
    for i in range(hp.num_layers):
        pre, p = f"model.layers.{i}", f"/model/layers.{i}"
        q, k, v = emit_linears(ctx, [plans[f"{pre}.self_attn.{n}"] for n in ("q_proj", "k_proj", "v_proj")], x,
                               f"{pre}.self_attn.qkv_proj", f"{p}/attn/qkv_proj")
        shared = local_rope if hp.layer_window(i) > 0 else full_rope
        attn = attention(ctx, i, q, k, v, *io_values.layer_cache(ctx, i, hp), shared, hp)
        attn_out = emit_linear(ctx, plans[f"{pre}.self_attn.o_proj"], attn)
        attn_out = rms_norm(ctx, attn_out, f"{pre}.post_attention_layernorm.weight", eps,
                            f"{p}/post_attention_layernorm/SimplifiedLayerNorm", off)
        x, residual = skip_rms_norm(ctx, attn_out, residual, f"{pre}.pre_feedforward_layernorm.weight", eps,
                                    f"{p}/pre_feedforward_layernorm/SkipLayerNorm", off)
        mlp_out = _gelu_mlp(ctx, x, plans[f"{pre}.mlp.gate_proj"], plans[f"{pre}.mlp.up_proj"],
                            plans[f"{pre}.mlp.down_proj"], f"{p}/mlp", GELU_APPROXIMATE[hp.hidden_act])
        mlp_out = rms_norm(ctx, mlp_out, f"{pre}.post_feedforward_layernorm.weight", eps,
                           f"{p}/post_feedforward_layernorm/SimplifiedLayerNorm", off)
        last = i == hp.num_layers - 1
        norm_w = "model.norm.weight" if last else f"model.layers.{i + 1}.input_layernorm.weight"
        norm_name = "/model/norm/SkipLayerNorm" if last else f"/model/layers.{i + 1}/input_layernorm/SkipLayerNorm"
        x, residual = skip_rms_norm(ctx, mlp_out, residual, norm_w, eps, norm_name, off)
    logits = emit_linear(ctx, plans["lm_head"], llama.lm_head_input(ctx, x))
    if hp.final_logit_softcap:
        cap = g.initializer("/lm_head/softcap", np.asarray(hp.final_logit_softcap, dtype=ctx.io_np))
        t = g.op("Tanh", [g.op("Div", [logits, cap], "/lm_head/softcap/Div")], "/lm_head/softcap/Tanh")
        logits = g.op("Mul", [t, cap], "/lm_head/softcap/Mul")
    llama.logits_output(ctx, hp, logits)
