"""Mixtral sparse-MoE decoders (MixtralForCausalLM): the Llama attention block, and a top-k mixture of SiLU experts
in place of the MLP.

Two checkpoint layouts, told apart by the tensor names (config.json does not say):
  "quark": amd-quark 0.13 exports from transformers 5 (Quark's preprocess_for_quantization turns the fused 3-D
           expert parameters into one nn.Linear per expert and projection, which it then quantizes):
      model.layers.{i}.mlp.gate.weight                     [E, hidden]  router (not an nn.Linear: never quantized)
      model.layers.{i}.mlp.experts.{e}.gate_proj/up_proj   [I, hidden]  per-expert linears (quantized or float)
      model.layers.{i}.mlp.experts.{e}.down_proj           [hidden, I]
  "hf":    the Hub / save_pretrained layout (and Quark exports made from transformers 4):
      model.layers.{i}.block_sparse_moe.gate.weight, ...experts.{e}.w1 (gate), w3 (up), w2 (down)
Not read: Quark run without that preprocess leaves the experts float and fused (`mlp.experts.gate_up_proj
[E, 2I, hidden]`); the plan then fails naming the missing per-expert tensor.

Per layer:
    x ─► RMSNorm ─► q/k/v_proj ─► GQA(rotary, KV cache) ─► o_proj ─► +residual
      ─► RMSNorm ─► dense MoE (builder/ops/moe.py: every expert runs, renormalized top-k weights) ─► +residual
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from ..checkpoint import Checkpoint
from ..errors import ConversionError
from ..ops.attention import AttentionInputs, attention_mask_inputs
from ..ops.linear import emit_linear, emit_linears
from ..ops.moe import dense_moe
from ..ops.norm import rms_norm, skip_rms_norm
from ..ops.rotary import cos_sin_caches
from . import llama
from .base import DecoderHyper

# genai_config model.type: onnxruntime-genai 0.18 has no "mixtral" ("Unsupported model_type"); the graph's inputs and
# outputs are those of its plain decoder types, and Mixtral's sliding window applies to every layer as Mistral's.
MODEL_TYPES = {"MixtralForCausalLM": "mistral"}
EXPERT_PROJ = ("gate_proj", "up_proj", "down_proj")
# layout -> (MoE block name under model.layers.{i}, names of the gate/up/down projections of one expert)
LAYOUTS = {"quark": ("mlp", EXPERT_PROJ), "hf": ("block_sparse_moe", ("w1", "w3", "w2"))}

default_attention = llama.default_attention


@dataclass(frozen=True)
class MoEHyper(DecoderHyper):
    num_experts: int = 0       # config num_local_experts
    experts_per_token: int = 0  # config num_experts_per_tok (top-k)
    layout: str = "quark"       # key of LAYOUTS

    def moe_block(self, i: int) -> str:
        return f"model.layers.{i}.{LAYOUTS[self.layout][0]}"

    def expert_linears(self, i: int, e: int) -> tuple[str, str, str]:
        """Module names of expert e's gate, up and down projections in layer i."""
        return tuple(f"{self.moe_block(i)}.experts.{e}.{n}" for n in LAYOUTS[self.layout][1])


def refine_hyper(cfg: dict, hp: DecoderHyper, config_file: str) -> MoEHyper:
    """The decoder hyper-parameters plus the expert counts; everything this family cannot express is refused."""
    experts, top_k = cfg.get("num_local_experts"), cfg.get("num_experts_per_tok")
    for field, value in (("num_local_experts", experts), ("num_experts_per_tok", top_k)):
        if not isinstance(value, int) or value <= 0:
            raise ConversionError("must be a positive integer", file=config_file, field=field, value=value)
    if top_k > experts:
        raise ConversionError("num_experts_per_tok exceeds num_local_experts", file=config_file,
                              field="num_experts_per_tok", value=top_k, accepted=f"1..{experts}")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ConversionError("only SiLU-gated experts are supported", file=config_file, field="hidden_act",
                              value=act, accepted="silu")
    base = {f.name: getattr(hp, f.name) for f in fields(DecoderHyper)}
    hf_router = f"model.layers.0.{LAYOUTS['hf'][0]}.gate.weight"
    layout = "hf" if hf_router in Checkpoint(Path(config_file).parent) else "quark"  # reads only the headers
    return MoEHyper(**base, num_experts=experts, experts_per_token=top_k, layout=layout)


def linear_layers(hp: MoEHyper) -> list[tuple[str, int, int, str]]:
    """(module name, in_features, out_features, ONNX node prefix) for every linear, in graph order."""
    q_out, kv_out = hp.num_heads * hp.head_dim, hp.num_kv_heads * hp.head_dim
    attn = {"q_proj": (hp.hidden_size, q_out), "k_proj": (hp.hidden_size, kv_out),
            "v_proj": (hp.hidden_size, kv_out), "o_proj": (q_out, hp.hidden_size)}
    expert = {"gate_proj": (hp.hidden_size, hp.intermediate_size), "up_proj": (hp.hidden_size, hp.intermediate_size),
              "down_proj": (hp.intermediate_size, hp.hidden_size)}
    out = []
    for i in range(hp.num_layers):
        for proj, shape in attn.items():
            out.append((f"model.layers.{i}.self_attn.{proj}", *shape, f"/model/layers.{i}/attn/{proj}"))
        for e in range(hp.num_experts):
            for name, (proj, shape) in zip(hp.expert_linears(i, e), expert.items()):
                out.append((name, *shape, f"/model/layers.{i}/moe/experts.{e}/{proj}"))
    out.append(("lm_head", hp.hidden_size, hp.vocab_size, "/lm_head"))
    return out


def float_tensors(hp: MoEHyper) -> list[tuple[str, tuple[int, ...]]]:
    routers = [(f"{hp.moe_block(i)}.gate.weight", (hp.num_experts, hp.hidden_size)) for i in range(hp.num_layers)]
    return llama.float_tensors(hp) + routers


def build_graph(ctx, hp: MoEHyper, plans: dict, attention) -> None:
    """Emit the whole decoder (same inputs/outputs and attention contract as llama.build_graph)."""
    g, io = ctx.graph, ctx.io_type
    cache_t = getattr(attention, "cache_elem_type", None) or io
    input_ids = g.input("input_ids", 7, ["batch_size", "sequence_length"])
    mask = g.input("attention_mask", 7, ["batch_size", "total_sequence_length"])
    kv_shape = ["batch_size", hp.num_kv_heads, "past_sequence_length", hp.head_dim]
    present_shape = ["batch_size", hp.num_kv_heads, "total_sequence_length", hp.head_dim]
    seqlens, total_len = attention_mask_inputs(ctx, mask)
    cos, sin = cos_sin_caches(hp.head_dim, hp.max_positions, hp.rope_theta, hp.rope_scaling, str(ctx.source))
    shared = AttentionInputs(seqlens, total_len, g.initializer("cos_cache", cos.astype(ctx.io_np)),
                             g.initializer("sin_cache", sin.astype(ctx.io_np)))

    embed = ctx.float_initializer("model.embed_tokens.weight", "model.embed_tokens.weight")
    residual = g.op("Gather", [embed, input_ids], "/model/embed_tokens/Gather")
    x = rms_norm(ctx, residual, "model.layers.0.input_layernorm.weight", hp.rms_norm_eps,
                 "/model/layers.0/input_layernorm/SimplifiedLayerNorm")
    for i in range(hp.num_layers):
        pre, p = f"model.layers.{i}", f"/model/layers.{i}"
        q, k, v = emit_linears(ctx, [plans[f"{pre}.self_attn.{n}"] for n in ("q_proj", "k_proj", "v_proj")], x,
                               f"{pre}.self_attn.qkv_proj", f"{p}/attn/qkv_proj")
        past_k = g.input(f"past_key_values.{i}.key", cache_t, kv_shape)
        past_v = g.input(f"past_key_values.{i}.value", cache_t, kv_shape)
        present_k = g.output(f"present.{i}.key", cache_t, present_shape)
        present_v = g.output(f"present.{i}.value", cache_t, present_shape)
        attn = attention(ctx, i, q, k, v, past_k, past_v, present_k, present_v, shared, hp)
        attn_out = emit_linear(ctx, plans[f"{pre}.self_attn.o_proj"], attn)
        x, residual = skip_rms_norm(ctx, attn_out, residual, f"{pre}.post_attention_layernorm.weight",
                                    hp.rms_norm_eps, f"{p}/post_attention_layernorm/SkipLayerNorm")
        experts = [tuple(plans[n] for n in hp.expert_linears(i, e)) for e in range(hp.num_experts)]
        block = hp.moe_block(i)
        moe_out = dense_moe(ctx, x, f"{block}.gate.weight", experts, hp.experts_per_token, block, f"{p}/moe")
        last = i == hp.num_layers - 1
        norm_w = "model.norm.weight" if last else f"model.layers.{i + 1}.input_layernorm.weight"
        norm_name = "/model/norm/SkipLayerNorm" if last else f"/model/layers.{i + 1}/input_layernorm/SkipLayerNorm"
        x, residual = skip_rms_norm(ctx, moe_out, residual, norm_w, hp.rms_norm_eps, norm_name)
    logits = emit_linear(ctx, plans["lm_head"], x)
    g.node("Identity", [logits], "/lm_head/logits", outputs=["logits"])
    g.output("logits", io, ["batch_size", "sequence_length", hp.vocab_size])
