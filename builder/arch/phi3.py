"""Phi-3 decoders (Phi3ForCausalLM): the Llama block with fused projections stored as single Linear modules.

transformers' Phi3Attention / Phi3MLP keep one weight for q/k/v and one for gate/up, and Quark quantizes those
modules as they are (its "phi3" LLMTemplate lists *qkv_proj, mlp.gate_up_proj), so each is ONE linear plan here,
split after the matmul:

    x ─► self_attn.qkv_proj [(H + 2*Hkv)*D] ─► Split [H*D, Hkv*D, Hkv*D] ─► q, k, v ─► GQA(rotary) ─► o_proj
    x ─► mlp.gate_up_proj [2*I] ─► Split [I, I] ─► gate, up ─► SiLU(gate)·up ─► down_proj

Partial rotary (rope_parameters.partial_rotary_factor < 1): transformers rotates the first
rotary_dim = int(head_dim * factor) dims of each head and passes the rest through; GroupQueryAttention does the
same when its cos/sin caches are rotary_dim/2 wide (onnxruntime requires rotary_dim/2 to be a multiple of 8).
Refused: rope types other than "default" (Phi-3's longrope/su switches short/long factors on the sequence
length, which fixed caches cannot express), activations other than SiLU.
"""
from __future__ import annotations

from ..errors import ConversionError
from ..ops.attention import AttentionInputs, attention_mask_inputs
from ..ops.linear import emit_linear
from ..ops.norm import rms_norm, skip_rms_norm
from ..ops.rotary import cos_sin_caches
from . import llama
from .base import DecoderHyper

MODEL_TYPES = {"Phi3ForCausalLM": "phi3"}

float_tensors = llama.float_tensors
default_attention = llama.default_attention


def rotary_dim(hp: DecoderHyper) -> int:
    return int(hp.head_dim * hp.partial_rotary_factor)


def check_config(cfg: dict, hp: DecoderHyper, config_file: str) -> None:
    """Everything this family cannot express, refused before any tensor is read."""
    if hp.rope_scaling is not None:
        scaling = hp.rope_scaling
        rope_type = scaling.get("rope_type", scaling.get("type"))
        raise ConversionError("Phi-3 rope scaling is not supported (longrope/su pick short or long factors by "
                              "sequence length; fixed GroupQueryAttention caches cannot)", file=config_file,
                              field="rope_parameters.rope_type", value=rope_type, accepted="default")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ConversionError("only the SiLU-gated MLP is supported", file=config_file, field="hidden_act",
                              value=act, accepted="silu")
    factor, rot = hp.partial_rotary_factor, rotary_dim(hp)
    if not 0 < factor <= 1 or rot % 2 or (rot // 2) % 8 or rot == 0:
        raise ConversionError("GroupQueryAttention's fused rotary needs rotary_dim/2 (rotary_dim = "
                              f"int(head_dim {hp.head_dim} * partial_rotary_factor)) to be a positive multiple of 8",
                              file=config_file, field="rope_parameters.partial_rotary_factor", value=factor,
                              accepted=f"factors giving rotary_dim in {list(range(16, hp.head_dim + 1, 16))}")


def linear_layers(hp: DecoderHyper) -> list[tuple[str, int, int, str]]:
    """(module name, in_features, out_features, ONNX node prefix) for every linear, in graph order."""
    q_out, kv_out = hp.num_heads * hp.head_dim, hp.num_kv_heads * hp.head_dim
    shapes = {"self_attn.qkv_proj": (hp.hidden_size, q_out + 2 * kv_out), "self_attn.o_proj": (q_out, hp.hidden_size),
              "mlp.gate_up_proj": (hp.hidden_size, 2 * hp.intermediate_size),
              "mlp.down_proj": (hp.intermediate_size, hp.hidden_size)}
    out = []
    for i in range(hp.num_layers):
        for module, (n_in, n_out) in shapes.items():
            block, proj = module.split(".")
            out.append((f"model.layers.{i}.{module}", n_in, n_out,
                        f"/model/layers.{i}/{'attn' if block == 'self_attn' else 'mlp'}/{proj}"))
    out.append(("lm_head", hp.hidden_size, hp.vocab_size, "/lm_head"))
    return out


def _split(ctx, y: str, sizes: list[int], name: str, prefix: str) -> list[str]:
    return ctx.graph.node("Split", [y, ctx.graph.const_i64(f"{name}.split_sizes", sizes)], f"{prefix}/Split",
                          outputs=len(sizes), axis=-1)


def build_graph(ctx, hp: DecoderHyper, plans: dict, attention) -> None:
    """Emit the whole decoder (same inputs/outputs and attention contract as llama.build_graph)."""
    g, io = ctx.graph, ctx.io_type
    cache_t = getattr(attention, "cache_elem_type", None) or io
    input_ids = g.input("input_ids", 7, ["batch_size", "sequence_length"])
    mask = g.input("attention_mask", 7, ["batch_size", "total_sequence_length"])
    kv_shape = ["batch_size", hp.num_kv_heads, "past_sequence_length", hp.head_dim]
    present_shape = ["batch_size", hp.num_kv_heads, "total_sequence_length", hp.head_dim]
    seqlens, total_len = attention_mask_inputs(ctx, mask)
    cos, sin = cos_sin_caches(rotary_dim(hp), hp.max_positions, hp.rope_theta, hp.rope_scaling, str(ctx.source))
    shared = AttentionInputs(seqlens, total_len, g.initializer("cos_cache", cos.astype(ctx.io_np)),
                             g.initializer("sin_cache", sin.astype(ctx.io_np)))
    q_out, kv_out = hp.num_heads * hp.head_dim, hp.num_kv_heads * hp.head_dim

    embed = ctx.float_initializer("model.embed_tokens.weight", "model.embed_tokens.weight")
    residual = g.op("Gather", [embed, input_ids], "/model/embed_tokens/Gather")
    x = rms_norm(ctx, residual, "model.layers.0.input_layernorm.weight", hp.rms_norm_eps,
                 "/model/layers.0/input_layernorm/SimplifiedLayerNorm")
    for i in range(hp.num_layers):
        pre, p = f"model.layers.{i}", f"/model/layers.{i}"
        qkv = plans[f"{pre}.self_attn.qkv_proj"]
        q, k, v = _split(ctx, emit_linear(ctx, qkv, x), [q_out, kv_out, kv_out], qkv.name, qkv.node_prefix)
        past_k = g.input(f"past_key_values.{i}.key", cache_t, kv_shape)
        past_v = g.input(f"past_key_values.{i}.value", cache_t, kv_shape)
        present_k = g.output(f"present.{i}.key", cache_t, present_shape)
        present_v = g.output(f"present.{i}.value", cache_t, present_shape)
        attn = attention(ctx, i, q, k, v, past_k, past_v, present_k, present_v, shared, hp)
        attn_out = emit_linear(ctx, plans[f"{pre}.self_attn.o_proj"], attn)
        x, residual = skip_rms_norm(ctx, attn_out, residual, f"{pre}.post_attention_layernorm.weight",
                                    hp.rms_norm_eps, f"{p}/post_attention_layernorm/SkipLayerNorm")
        gate_up = plans[f"{pre}.mlp.gate_up_proj"]
        gate, up = _split(ctx, emit_linear(ctx, gate_up, x), [hp.intermediate_size] * 2, gate_up.name,
                          gate_up.node_prefix)
        act = g.op("Mul", [gate, g.op("Sigmoid", [gate], f"{p}/mlp/act_fn/Sigmoid")], f"{p}/mlp/act_fn/Mul")
        mlp_out = emit_linear(ctx, plans[f"{pre}.mlp.down_proj"], g.op("Mul", [act, up], f"{p}/mlp/Mul"))
        last = i == hp.num_layers - 1
        norm_w = "model.norm.weight" if last else f"model.layers.{i + 1}.input_layernorm.weight"
        norm_name = "/model/norm/SkipLayerNorm" if last else f"/model/layers.{i + 1}/input_layernorm/SkipLayerNorm"
        x, residual = skip_rms_norm(ctx, mlp_out, residual, norm_w, hp.rms_norm_eps, norm_name)
    logits = emit_linear(ctx, plans["lm_head"], x)
    g.node("Identity", [logits], "/lm_head/logits", outputs=["logits"])
    g.output("logits", io, ["batch_size", "sequence_length", hp.vocab_size])
