"""Llama-family decoders: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM (q/k/v bias).

    input_ids ─► Gather(embed) ─► [ RMSNorm ─► q/k/v_proj ─► GQA(rotary, KV cache) ─► o_proj ─► +residual
                                    RMSNorm ─► gate/up_proj ─► SiLU·up ─► down_proj ─► +residual ] x L
              ─► RMSNorm ─► lm_head ─► logits
Residual adds are fused into SkipSimplifiedLayerNormalization.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ops.attention import AttentionInputs, attention_mask_inputs, group_query_attention
from ..ops.linear import emit_linear, emit_linears
from ..ops.mlp import silu_mlp
from ..ops.norm import rms_norm, skip_rms_norm
from ..ops.rotary import cos_sin_caches
from .base import DecoderHyper

ATTN_PROJ = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_PROJ = ("gate_proj", "up_proj", "down_proj")
MODEL_TYPES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2"}


def linear_layers(hp: DecoderHyper) -> list[tuple[str, int, int, str]]:
    """(module name, in_features, out_features, ONNX node prefix) for every linear, in graph order."""
    q_out, kv_out = hp.num_heads * hp.head_dim, hp.num_kv_heads * hp.head_dim
    shapes = {"q_proj": (hp.hidden_size, q_out), "k_proj": (hp.hidden_size, kv_out),
              "v_proj": (hp.hidden_size, kv_out), "o_proj": (q_out, hp.hidden_size),
              "gate_proj": (hp.hidden_size, hp.intermediate_size), "up_proj": (hp.hidden_size, hp.intermediate_size),
              "down_proj": (hp.intermediate_size, hp.hidden_size)}
    out = []
    for i in range(hp.num_layers):
        for proj in ATTN_PROJ:
            out.append((f"model.layers.{i}.self_attn.{proj}", *shapes[proj], f"/model/layers.{i}/attn/{proj}"))
        for proj in MLP_PROJ:
            out.append((f"model.layers.{i}.mlp.{proj}", *shapes[proj], f"/model/layers.{i}/mlp/{proj}"))
    out.append(("lm_head", hp.hidden_size, hp.vocab_size, "/lm_head"))
    return out


def float_tensors(hp: DecoderHyper) -> list[tuple[str, tuple[int, ...]]]:
    """(tensor, shape) of every float tensor the graph reads besides the linears, checked before emission."""
    out = [("model.embed_tokens.weight", (hp.vocab_size, hp.hidden_size)), ("model.norm.weight", (hp.hidden_size,))]
    for i in range(hp.num_layers):
        out += [(f"model.layers.{i}.input_layernorm.weight", (hp.hidden_size,)),
                (f"model.layers.{i}.post_attention_layernorm.weight", (hp.hidden_size,))]
    return out


@dataclass(frozen=True)
class DecoderIO:
    """The graph inputs every decoder shares, and the element type of its KV cache."""
    input_ids: str
    seqlens_k: str
    total_seq_len: str
    cache_type: int

    def layer_cache(self, ctx, i: int, hp: DecoderHyper) -> tuple[str, str, str, str]:
        """Declare layer i's past/present key/value in onnxruntime-genai's names and [B, kv_heads, S, D] layout."""
        g = ctx.graph
        past = ["batch_size", hp.num_kv_heads, "past_sequence_length", hp.head_dim]
        present = ["batch_size", hp.num_kv_heads, "total_sequence_length", hp.head_dim]
        return (g.input(f"past_key_values.{i}.key", self.cache_type, past),
                g.input(f"past_key_values.{i}.value", self.cache_type, past),
                g.output(f"present.{i}.key", self.cache_type, present),
                g.output(f"present.{i}.value", self.cache_type, present))


def decoder_inputs(ctx, attention) -> DecoderIO:
    """input_ids and attention_mask (with GQA's seqlens_k / total_sequence_length derived from the mask). An attention
    callable with a `cache_elem_type` attribute declares past/present in that ONNX type instead of the io type."""
    g = ctx.graph
    input_ids = g.input("input_ids", 7, ["batch_size", "sequence_length"])
    mask = g.input("attention_mask", 7, ["batch_size", "total_sequence_length"])
    seqlens, total_len = attention_mask_inputs(ctx, mask)
    return DecoderIO(input_ids, seqlens, total_len, getattr(attention, "cache_elem_type", None) or ctx.io_type)


PREFILL_LOGITS_FORMS = ("all", "last")  # --extra_options prefill_logits
# The default is "last" on cpu, rocm and migraphx: a prompt's lm_head runs once per sequence instead of once per
# token (the logits of the other positions, which onnxruntime-genai's generation never reads, cost a
# vocabulary-wide GEMM each and a [B, T, vocab] output: 3.3 GB in fp32 for a 4096-token gpt-oss prompt). The AMD
# graphs were checked in MIGraphX's parser and ref target against ORT CPU (every tiny scheme and MoE family,
# docs/amd_generations.md); cuda keeps "all" until it runs on a CUDA device. Teacher-forced logits of every position
# (perplexity, `verify`, the numerics tests) come from "all", or from a pruned model one token at a time
# (builder/verify.py).
PREFILL_LOGITS_DEFAULT = {"cpu": "last", "rocm": "last", "migraphx": "last"}


def prefill_logits_form(options, ep_name: str) -> str:
    return options.extra.get("prefill_logits", PREFILL_LOGITS_DEFAULT.get(ep_name, "all"))


def last_position_only(ctx) -> bool:
    return prefill_logits_form(ctx.options, ctx.ep.name) == "last"


def lm_head_input(ctx, x: str) -> str:
    """prefill_logits=last: the final hidden state at each sequence's last valid position only, [B, 1, H], so that
    a prompt's lm_head is one row per sequence instead of one per token. onnxruntime-genai reads such a model: it
    treats a logits output whose declared dim 1 is 1 as "pruned" (src/models/model.cpp Model::IsPruned) and then
    takes those logits as the last token's (src/models/logits.cpp, trimmed_prefill_logits_), microsoft/
    onnxruntime-genai a0c04eb. The position is sum(attention_mask) - 1 - past length, so right-padded rows of a batch
    pick their own last token (og's non-pruned path finds it the same way, skipping pad tokens from the end)."""
    if not last_position_only(ctx):
        return x
    g = ctx.graph
    p = "/lm_head/last_position"
    valid = g.op("ReduceSum", ["attention_mask", g.const_i64(f"{p}/axes", [1])], f"{p}/ReduceSum", keepdims=1)
    total = g.op("Shape", ["attention_mask"], f"{p}/Shape_total", start=1, end=2)
    chunk = g.op("Shape", ["input_ids"], f"{p}/Shape_chunk", start=1, end=2)
    past = g.op("Sub", [total, chunk], f"{p}/Sub_past")
    last = g.op("Sub", [g.op("Sub", [valid, g.const_i64(f"{p}/one", [1])], f"{p}/Sub_one"), past], f"{p}/Sub")
    last = g.op("Max", [last, g.const_i64(f"{p}/zero", [0])], f"{p}/Max")                    # [B, 1]
    index = g.op("Unsqueeze", [last, g.const_i64(f"{p}/unsqueeze_axes", [2])], f"{p}/Unsqueeze")  # [B, 1, 1]
    shape = g.op("Concat", [g.op("Shape", [index], f"{p}/Shape_index", start=0, end=2),
                            g.op("Shape", [x], f"{p}/Shape_hidden", start=2, end=3)], f"{p}/Concat", axis=0)
    index = g.op("Expand", [index, shape], f"{p}/Expand")                                        # [B, 1, H]
    return g.op("GatherElements", [x, index], f"{p}/GatherElements", axis=1)


def logits_output(ctx, hp: DecoderHyper, logits: str) -> None:
    ctx.graph.node("Identity", [logits], "/lm_head/logits", outputs=["logits"])
    positions = 1 if last_position_only(ctx) else "sequence_length"
    ctx.graph.output("logits", ctx.io_type, ["batch_size", positions, hp.vocab_size])


def build_graph(ctx, hp: DecoderHyper, plans: dict, attention, *, project_qkv=None, mlp=None,
                rotary_dim: int | None = None) -> None:
    """Emit the whole decoder. `plans` maps module name -> LinearPlan; `attention(ctx, layer, q, k, v, ...)`
    emits one layer's attention core (GQA, or an FP8 attention subgraph); the hooks replace the q/k/v projection
    and the MLP of a layer, rotary_dim the width of the rotated part of each head."""
    g = ctx.graph
    io_values = decoder_inputs(ctx, attention)
    project_qkv, mlp = project_qkv or llama_qkv, mlp or llama_mlp
    cos, sin = cos_sin_caches(rotary_dim or hp.head_dim, hp.max_positions, hp.rope_theta, hp.rope_scaling,
                              str(ctx.source))
    shared = AttentionInputs(io_values.seqlens_k, io_values.total_seq_len,
                             g.initializer("cos_cache", cos.astype(ctx.io_np)),
                             g.initializer("sin_cache", sin.astype(ctx.io_np)))

    residual = ctx.embedding(io_values.input_ids)
    x = rms_norm(ctx, residual, "model.layers.0.input_layernorm.weight", hp.rms_norm_eps,
                 "/model/layers.0/input_layernorm/SimplifiedLayerNorm")
    for i in range(hp.num_layers):
        pre = f"model.layers.{i}"
        q, k, v = project_qkv(ctx, i, x, plans, hp)
        attn = attention(ctx, i, q, k, v, *io_values.layer_cache(ctx, i, hp), shared, hp)
        attn_out = emit_linear(ctx, plans[f"{pre}.self_attn.o_proj"], attn)
        x, residual = skip_rms_norm(ctx, attn_out, residual, f"{pre}.post_attention_layernorm.weight",
                                    hp.rms_norm_eps, f"/model/layers.{i}/post_attention_layernorm/SkipLayerNorm")
        mlp_out = mlp(ctx, i, x, plans, hp)
        last = i == hp.num_layers - 1
        norm_w = "model.norm.weight" if last else f"model.layers.{i + 1}.input_layernorm.weight"
        norm_name = "/model/norm/SkipLayerNorm" if last else f"/model/layers.{i + 1}/input_layernorm/SkipLayerNorm"
        x, residual = skip_rms_norm(ctx, mlp_out, residual, norm_w, hp.rms_norm_eps, norm_name)
    logits_output(ctx, hp, emit_linear(ctx, plans["lm_head"], lm_head_input(ctx, x)))


def llama_qkv(ctx, i: int, x: str, plans: dict, hp: DecoderHyper) -> tuple[str, str, str]:
    """Separate q/k/v_proj modules (fused into one matmul when their schemes agree)."""
    pre = f"model.layers.{i}.self_attn"
    return emit_linears(ctx, [plans[f"{pre}.{p}"] for p in ("q_proj", "k_proj", "v_proj")], x,
                        f"{pre}.qkv_proj", f"/model/layers.{i}/attn/qkv_proj")


def llama_mlp(ctx, i: int, x: str, plans: dict, hp: DecoderHyper) -> str:
    pre = f"model.layers.{i}.mlp"
    return silu_mlp(ctx, x, plans[f"{pre}.gate_proj"], plans[f"{pre}.up_proj"], plans[f"{pre}.down_proj"],
                    f"/model/layers.{i}/mlp")


def default_attention(ctx, i, q, k, v, past_k, past_v, present_k, present_v, shared, hp, *,
                      extra_inputs: list[str] | None = None, extra_attrs: dict | None = None) -> str:
    """GroupQueryAttention; extra_inputs follow sin_cache (position_ids, attention_bias, head_sink, k_scale, ...)."""
    return group_query_attention(ctx, q, k, v, past_k, past_v, present_k, present_v, shared,
                                 num_heads=hp.num_heads, kv_heads=hp.num_kv_heads, head_dim=hp.head_dim,
                                 local_window=hp.layer_window(i), prefix=f"/model/layers.{i}/attn",
                                 extra_inputs=extra_inputs, extra_attrs=extra_attrs)
