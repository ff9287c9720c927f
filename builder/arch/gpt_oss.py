"""gpt-oss decoders (GptOssForCausalLM), as transformers 5's modeling_gpt_oss.py defines them:

    x ─► RMSNorm ─► q/k/v_proj (+bias) ─► GQA(rotary, KV cache, head_sink = self_attn.sinks, window by layer_types)
      ─► o_proj (+bias) ─► +residual ─► RMSNorm ─► MoE (builder/ops/moe_clamped_swiglu.py) ─► +residual

Attention sinks: eager_attention_forward appends one logit per head (sinks [H]) to every row of the attention
scores before the softmax and drops its probability after: GroupQueryAttention's head_sink input (index 11) is that
extra denominator term. Sliding/full attention alternate through `layer_types` (window `sliding_window`).

Tensor names (amd-quark 0.13 exports from transformers 5; Quark's preprocess_for_quantization replaces GptOssExperts
by QuarkGptOssExperts, one nn.Linear per expert and projection, gate/up kept fused and interleaved, and the router
by an nn.Linear that the gpt_oss template excludes):
    model.layers.{i}.self_attn.{q,k,v,o}_proj.weight/.bias, model.layers.{i}.self_attn.sinks [H]
    model.layers.{i}.mlp.router.weight [E, hidden] / .bias [E]
    model.layers.{i}.mlp.experts.{e}.gate_up_proj.weight [2I, hidden] / .bias [2I]   rows g0, u0, g1, u1, ...
    model.layers.{i}.mlp.experts.{e}.down_proj.weight [hidden, I] / .bias [hidden]
Not read (the plan fails naming the missing per-expert tensor): the Hub's fused 3-D experts
(`mlp.experts.gate_up_proj [E, hidden, 2I]`, also as OpenAI's MXFP4 `_blocks`/`_scales`), and separate per-expert
gate_proj/up_proj (refused by check_config when the checkpoint has them: no Quark 0.13 + transformers 5 run makes
that layout, so it could not be checked here).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path

from ..checkpoint import Checkpoint
from ..errors import ConversionError
from ..ops.moe import check_expert_plans, form_note
from ..ops.moe_clamped_swiglu import emit_moe
from ..ops.sink_attention import SinkAttention
from . import llama
from .base import DecoderHyper, _windowed_layers

MODEL_TYPES = {"GptOssForCausalLM": "gptoss"}  # onnxruntime-genai 0.18's model type name
MOE_FAMILY = True  # tests/test_architecture_coverage.py: tested end to end with 4-bit and MXFP4 experts
EXPERT_PROJ = ("gate_up_proj", "down_proj")
ROUTER = "mlp.router"
SINKS = "self_attn.sinks"


@dataclass(frozen=True)
class GptOssHyper(DecoderHyper):
    num_experts: int = 0         # config num_local_experts
    experts_per_token: int = 0   # config num_experts_per_tok
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0

    def expert_linears(self, i: int, e: int) -> tuple[str, str]:
        return tuple(f"model.layers.{i}.mlp.experts.{e}.{p}" for p in EXPERT_PROJ)


def refine_hyper(cfg: dict, hp: DecoderHyper, config_file: str) -> GptOssHyper:
    experts, top_k = cfg.get("num_local_experts"), cfg.get("num_experts_per_tok")
    for field, value in (("num_local_experts", experts), ("num_experts_per_tok", top_k)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConversionError("must be a positive integer", file=config_file, field=field, value=value)
    if top_k > experts:
        raise ConversionError("num_experts_per_tok exceeds num_local_experts", file=config_file,
                              field="num_experts_per_tok", value=top_k, accepted=f"1..{experts}")
    alpha, limit = cfg.get("swiglu_alpha", 1.702), cfg.get("swiglu_limit", 7.0)
    for field, value in (("swiglu_alpha", alpha), ("swiglu_limit", limit)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
            raise ConversionError("must be a positive number", file=config_file, field=field, value=value)
    if cfg.get("attention_bias", True) is not True:
        raise ConversionError("gpt-oss without attention biases is not supported", file=config_file,
                              field="attention_bias", value=cfg.get("attention_bias"), accepted="true")
    windowed = _windowed_layers(cfg, hp.sliding_window if hp.sliding_window > 0 else None, hp.num_layers,
                                config_file)
    base = {f.name: getattr(hp, f.name) for f in fields(DecoderHyper)}
    hp = GptOssHyper(**base, num_experts=experts, experts_per_token=top_k, swiglu_alpha=float(alpha),
                     swiglu_limit=float(limit))
    if windowed is not None:
        hp = replace(hp, windowed_layers=windowed)
    split = "model.layers.0.mlp.experts.0.gate_proj.weight"
    folder = Path(config_file).parent
    if any(folder.glob("*.safetensors")) and split in Checkpoint(folder):  # reads only the headers
        raise ConversionError("separate per-expert gate_proj/up_proj are not supported (Quark 0.13 with "
                              "transformers 5 keeps gate_up_proj fused and interleaved)", file=config_file,
                              layer=split.rsplit(".", 1)[0], field="architectures[0]", value=hp.architecture)
    return hp


def linear_layers(hp: GptOssHyper) -> list[tuple[str, int, int, str]]:
    q_out, kv_out = hp.num_heads * hp.head_dim, hp.num_kv_heads * hp.head_dim
    attn = {"q_proj": (hp.hidden_size, q_out), "k_proj": (hp.hidden_size, kv_out),
            "v_proj": (hp.hidden_size, kv_out), "o_proj": (q_out, hp.hidden_size)}
    expert = ((hp.hidden_size, 2 * hp.intermediate_size), (hp.intermediate_size, hp.hidden_size))
    out = []
    for i in range(hp.num_layers):
        for proj, shape in attn.items():
            out.append((f"model.layers.{i}.self_attn.{proj}", *shape, f"/model/layers.{i}/attn/{proj}"))
        out.append((f"model.layers.{i}.{ROUTER}", hp.hidden_size, hp.num_experts, f"/model/layers.{i}/moe/router"))
        for e in range(hp.num_experts):
            for name, proj, shape in zip(hp.expert_linears(i, e), EXPERT_PROJ, expert):
                out.append((name, *shape, f"/model/layers.{i}/moe/experts.{e}/{proj}"))
    out.append(("lm_head", hp.hidden_size, hp.vocab_size, "/lm_head"))
    return out


def float_tensors(hp: GptOssHyper) -> list[tuple[str, tuple[int, ...]]]:
    return llama.float_tensors(hp) + [(f"model.layers.{i}.{SINKS}", (hp.num_heads,)) for i in range(hp.num_layers)]


def check_plans(model_plan) -> None:
    hp, plans, config_file = model_plan.hp, model_plan.linears, str(model_plan.source / "config.json")
    check_expert_plans(plans, [n for i in range(hp.num_layers) for e in range(hp.num_experts)
                               for n in hp.expert_linears(i, e)], config_file)
    for i in range(hp.num_layers):
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            plan = plans[f"model.layers.{i}.self_attn.{proj}"]
            if not plan.has_bias:
                raise ConversionError("gpt-oss attention projection without bias", file=config_file,
                                      layer=plan.name, field="attention_bias", value=True)
            if plan.spec is not None and plan.spec.output_tensors:  # FP8 KV cache / attention: not with sinks
                raise ConversionError("FP8 KV cache / attention quantization is not supported with attention "
                                      "sinks", file=config_file, layer=plan.name,
                                      field=f"{plan.spec.source}.output_tensors",
                                      value=plan.spec.output_tensors[0].short())


def plan_notes(model_plan) -> list[str]:
    hp, plans = model_plan.hp, model_plan.linears
    notes = []
    if not model_plan.ep.gqa_head_sink:  # default_attention emits the explicit subgraph: present = Concat(past, new)
        model_plan.search_extras["past_present_share_buffer"] = False
        notes.append(f"attention sinks on {model_plan.ep.name}: explicit MatMul/Softmax subgraph with the sink column "
                     "and per-layer sliding-window masks (its GroupQueryAttention has no head_sink input); genai "
                     "past_present_share_buffer=false")
    return notes + [form_note(model_plan, {i: [tuple(plans[n] for n in hp.expert_linears(i, e)) for e in range(hp.num_experts)]
                                   for i in range(hp.num_layers)}, biases=True)]


def layer_sinks(ctx, i: int) -> str:
    """Layer i's sink logits [H] as a float initializer (GroupQueryAttention's head_sink input)."""
    return ctx.float_initializer(f"model.layers.{i}.{SINKS}", f"model.layers.{i}.{SINKS}")


def default_attention(ctx, i, q, k, v, past_k, past_v, present_k, present_v, shared, hp) -> str:
    """GroupQueryAttention with the layer's sinks as head_sink (input 11, after position_ids and attention_bias);
    on an EP whose GroupQueryAttention has no head_sink (MIGraphX), the explicit subgraph of ops/sink_attention.py."""
    if not ctx.ep.gqa_head_sink:
        return _SINK_ATTENTION(ctx, i, q, k, v, past_k, past_v, present_k, present_v, shared, hp)
    return llama.default_attention(ctx, i, q, k, v, past_k, past_v, present_k, present_v, shared, hp,
                                   extra_inputs=["", "", layer_sinks(ctx, i)])


_SINK_ATTENTION = SinkAttention(lambda i: f"model.layers.{i}.{SINKS}")


def build_graph(ctx, hp: GptOssHyper, plans: dict, attention) -> None:
    llama.build_graph(ctx, hp, plans, attention, mlp=moe_mlp)


def moe_mlp(ctx, i: int, x: str, plans: dict, hp: GptOssHyper) -> str:
    experts = [tuple(plans[n] for n in hp.expert_linears(i, e)) for e in range(hp.num_experts)]
    block = f"model.layers.{i}.mlp"
    return emit_moe(ctx, x, plans[f"model.layers.{i}.{ROUTER}"], experts, hp.experts_per_token, hp.swiglu_alpha,
                    hp.swiglu_limit, block, f"/model/layers.{i}/moe")
