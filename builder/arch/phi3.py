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
from ..ops.linear import emit_linear
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
    """llama.build_graph with Phi-3's fused modules and partial rotary."""
    llama.build_graph(ctx, hp, plans, attention, project_qkv=phi3_qkv, mlp=phi3_mlp, rotary_dim=rotary_dim(hp))


def phi3_qkv(ctx, i: int, x: str, plans: dict, hp: DecoderHyper) -> tuple[str, str, str]:
    qkv = plans[f"model.layers.{i}.self_attn.qkv_proj"]
    q_out, kv_out = hp.num_heads * hp.head_dim, hp.num_kv_heads * hp.head_dim
    return tuple(_split(ctx, emit_linear(ctx, qkv, x), [q_out, kv_out, kv_out], qkv.name, qkv.node_prefix))


def phi3_mlp(ctx, i: int, x: str, plans: dict, hp: DecoderHyper) -> str:
    g, p = ctx.graph, f"/model/layers.{i}/mlp"
    gate_up = plans[f"model.layers.{i}.mlp.gate_up_proj"]
    gate, up = _split(ctx, emit_linear(ctx, gate_up, x), [hp.intermediate_size] * 2, gate_up.name,
                      gate_up.node_prefix)
    act = g.op("Mul", [gate, g.op("Sigmoid", [gate], f"{p}/act_fn/Sigmoid")], f"{p}/act_fn/Mul")
    return emit_linear(ctx, plans[f"model.layers.{i}.mlp.down_proj"], g.op("Mul", [act, up], f"{p}/Mul"))
