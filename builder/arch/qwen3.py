"""Qwen3 dense decoders (Qwen3ForCausalLM): the Llama graph plus a per-head RMSNorm on q and k.

Per layer, as transformers' Qwen3Attention (q/k/v bias only if attention_bias; head_dim may differ from
hidden/heads):
    x ─► q/k/v_proj ─► q ─► head RMSNorm(q_norm.weight [D], rms_norm_eps) ─┐
                       k ─► head RMSNorm(k_norm.weight [D], rms_norm_eps) ─┼─► GQA(rotary, KV cache)
                       v ──────────────────────────────────────────────────┘
The norms sit after the projections (and after Quark's q/k_proj output quantizers, which observe the projection
outputs) and before RoPE. Attention variants call `head_norms` at that point (builder/attention_variants.py).
"""
from __future__ import annotations

from ..ops.norm import head_rms_norm
from . import llama
from .base import DecoderHyper

MODEL_TYPES = {"Qwen3ForCausalLM": "qwen3"}

linear_layers = llama.linear_layers
build_graph = llama.build_graph


def float_tensors(hp: DecoderHyper) -> list[tuple[str, tuple[int, ...]]]:
    norms = [(f"model.layers.{i}.self_attn.{n}.weight", (hp.head_dim,))
             for i in range(hp.num_layers) for n in ("q_norm", "k_norm")]
    return llama.float_tensors(hp) + norms


def head_norms(ctx, i: int, q: str, k: str, hp: DecoderHyper) -> tuple[str, str]:
    """q [B,S,H*D], k [B,S,Hkv*D] -> the same shapes, each head RMS-normalized with its layer's q_norm/k_norm."""
    attn, p = f"model.layers.{i}.self_attn", f"/model/layers.{i}/attn"
    q = head_rms_norm(ctx, q, f"{attn}.q_norm.weight", hp.num_heads, hp.head_dim, hp.rms_norm_eps, f"{p}/q_norm")
    k = head_rms_norm(ctx, k, f"{attn}.k_norm.weight", hp.num_kv_heads, hp.head_dim, hp.rms_norm_eps, f"{p}/k_norm")
    return q, k


def default_attention(ctx, i, q, k, v, past_k, past_v, present_k, present_v, shared, hp, **gqa_extras) -> str:
    q, k = head_norms(ctx, i, q, k, hp)
    return llama.default_attention(ctx, i, q, k, v, past_k, past_v, present_k, present_v, shared, hp,
                                   **gqa_extras)
