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
      ─► RMSNorm ─► MoE (builder/ops/moe.py: QMoE on CPU for 4-bit experts, else routed in standard ops) ─► +residual
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from ..checkpoint import Checkpoint
from ..errors import ConversionError
from ..ops.moe import check_expert_plans, emit_moe, form_note
from . import llama
from .base import DecoderHyper

# genai_config model.type: onnxruntime-genai 0.18 has no "mixtral" ("Unsupported model_type"); the graph's inputs and
# outputs are those of its plain decoder types, and Mixtral's sliding window applies to every layer as Mistral's.
MODEL_TYPES = {"MixtralForCausalLM": "mistral"}
MOE_FAMILY = True  # tests/test_architecture_coverage.py: tested end to end with 4-bit and MXFP4 experts
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


def check_plans(model_plan) -> None:
    hp = model_plan.hp
    check_expert_plans(model_plan.linears, [n for i in range(hp.num_layers) for e in range(hp.num_experts)
                                            for n in hp.expert_linears(i, e)], str(model_plan.source / "config.json"))


def plan_notes(model_plan) -> list[str]:
    hp, plans = model_plan.hp, model_plan.linears
    return [form_note(model_plan, {i: [tuple(plans[n] for n in hp.expert_linears(i, e)) for e in range(hp.num_experts)]
                                   for i in range(hp.num_layers)})]


def build_graph(ctx, hp: MoEHyper, plans: dict, attention) -> None:
    """llama.build_graph with the sparse MoE block in place of the MLP."""
    llama.build_graph(ctx, hp, plans, attention, mlp=moe_mlp)


def moe_mlp(ctx, i: int, x: str, plans: dict, hp: MoEHyper) -> str:
    experts = [tuple(plans[n] for n in hp.expert_linears(i, e)) for e in range(hp.num_experts)]
    block = hp.moe_block(i)
    return emit_moe(ctx, x, f"{block}.gate.weight", experts, hp.experts_per_token, block,
                     f"/model/layers.{i}/moe")
