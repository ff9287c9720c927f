"""Qwen3-MoE decoders (Qwen3MoeForCausalLM): the Qwen3 attention block (per-head q/k RMSNorm before RoPE), and in
the sparse layers a top-k mixture of SiLU experts in place of the MLP. Also the MoE block shared with Qwen2-MoE
(builder/arch/qwen2_moe.py), whose sparse layers add a shared expert.

Which layers are sparse, as transformers' Qwen3MoeDecoderLayer / Qwen2MoeDecoderLayer decide:
    layer i is sparse  <=>  i not in mlp_only_layers  and  num_experts > 0  and  (i + 1) % decoder_sparse_step == 0
the others have a dense SiLU MLP of width intermediate_size; experts have width moe_intermediate_size.

Routing (Qwen3MoeTopKRouter): softmax(x @ gate.weightᵀ) in fp32, top-k, renormalized to sum 1 only when
norm_topk_prob is true (Qwen3-MoE checkpoints set it true; the config default is false, Qwen2-MoE's too).

Tensor names (amd-quark 0.13 exports from transformers 5, whose preprocess_for_quantization turns the fused 3-D
expert parameters into one nn.Linear per expert and projection; the Hub layout has the same names):
    model.layers.{i}.mlp.gate.weight                          [E, hidden]  router (an nn.Linear once Quark preprocessed
                                                           it; the template excludes `*.gate`; emitted as exported)
    model.layers.{i}.mlp.experts.{e}.gate_proj/up_proj        [I_moe, hidden]
    model.layers.{i}.mlp.experts.{e}.down_proj                [hidden, I_moe]
    model.layers.{i}.mlp.shared_expert.gate_proj/up_proj/down_proj  (Qwen2-MoE: shared_expert_intermediate_size)
    model.layers.{i}.mlp.shared_expert_gate                   [1, hidden]  nn.Linear (Quark's template excludes it)
    model.layers.{i}.mlp.gate_proj/up_proj/down_proj          dense layers
Not read: fused float experts (`mlp.experts.gate_up_proj [E, 2I, hidden]`, Quark run without the preprocess); the
plan then fails naming the missing per-expert tensor.

Per sparse layer:
    x ─► MoE (builder/ops/moe.py: QMoE on CPU for 4-bit experts, else routed in standard ops) ─┐
    x ─► shared_expert (SiLU MLP) ─► · sigmoid(shared_expert_gate(x)) ──────────────────────────────(Add)───┴─► y
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from ..errors import ConversionError
from ..ops.linear import emit_linear
from ..ops.mlp import silu_mlp
from ..ops.moe import check_expert_plans, emit_moe, form_note
from . import llama, qwen3
from .base import DecoderHyper

# genai_config model.type: onnxruntime-genai runs the graph as its plain decoder of that type
MODEL_TYPES = {"Qwen3MoeForCausalLM": "qwen3"}
MOE_FAMILY = True  # tests/test_architecture_coverage.py: tested end to end with 4-bit and MXFP4 experts
MLP_PROJ = ("gate_proj", "up_proj", "down_proj")
ROUTER = "gate"                        # under model.layers.{i}.mlp: a Linear once Quark preprocessed it
EXPERT = "experts.{e}.{proj}"          # under model.layers.{i}.mlp
SHARED_EXPERT = "shared_expert.{proj}"
SHARED_EXPERT_GATE = "shared_expert_gate"

default_attention = qwen3.default_attention
head_norms = qwen3.head_norms


@dataclass(frozen=True)
class QwenMoEHyper(DecoderHyper):
    num_experts: int = 0              # config num_experts (transformers 5 writes num_local_experts)
    experts_per_token: int = 0        # config num_experts_per_tok (top-k)
    moe_intermediate_size: int = 0    # width of one expert
    norm_topk_prob: bool = False      # renormalize the top-k probabilities
    sparse_layers: tuple[bool, ...] = ()
    shared_expert_size: int = 0       # shared_expert_intermediate_size (Qwen2-MoE); 0: no shared expert
    # Quark replaces Qwen3MoeTopKRouter by an nn.Linear (QuarkQwen3MoeTopKRouter), a layer it may quantize;
    # Qwen2MoeTopKRouter stays a plain parameter, never quantized (a float tensor here)
    router_is_linear: bool = True

    def block(self, i: int) -> str:
        return f"model.layers.{i}.mlp"

    def expert_linears(self, i: int, e: int) -> tuple[str, str, str]:
        """Module names of expert e's gate, up and down projections in layer i."""
        return tuple(f"{self.block(i)}.{EXPERT.format(e=e, proj=p)}" for p in MLP_PROJ)

    def shared_linears(self, i: int) -> tuple[str, str, str]:
        return tuple(f"{self.block(i)}.{SHARED_EXPERT.format(proj=p)}" for p in MLP_PROJ)


def _positive(cfg: dict, field: str, config_file: str, default=None) -> int:
    value = cfg.get(field, default)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConversionError("must be a positive integer", file=config_file, field=field, value=value)
    return value


def refine_hyper(cfg: dict, hp: DecoderHyper, config_file: str, *, shared_expert: bool = False,
                 router_is_linear: bool = True) -> QwenMoEHyper:
    """The decoder hyper-parameters plus the MoE ones; everything this family cannot express is refused."""
    # Hub config.json files say num_experts; transformers 5 writes its attribute_map name num_local_experts
    key = "num_experts" if cfg.get("num_experts") is not None else "num_local_experts"
    experts = _positive(cfg, key, config_file) if key in cfg else _positive(cfg, "num_experts", config_file)
    top_k = _positive(cfg, "num_experts_per_tok", config_file)
    if top_k > experts:
        raise ConversionError("num_experts_per_tok exceeds num_experts", file=config_file,
                              field="num_experts_per_tok", value=top_k, accepted=f"1..{experts}")
    moe_inter = _positive(cfg, "moe_intermediate_size", config_file)
    step = _positive(cfg, "decoder_sparse_step", config_file, default=1)
    dense = cfg.get("mlp_only_layers") or []
    if not isinstance(dense, list) or not all(isinstance(i, int) and 0 <= i < hp.num_layers for i in dense):
        raise ConversionError("mlp_only_layers must list layer indices", file=config_file, field="mlp_only_layers",
                              value=dense, accepted=f"integers in 0..{hp.num_layers - 1}")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ConversionError("only SiLU-gated experts are supported", file=config_file, field="hidden_act",
                              value=act, accepted="silu")
    norm_topk = cfg.get("norm_topk_prob", False)
    if not isinstance(norm_topk, bool):
        raise ConversionError("must be true or false", file=config_file, field="norm_topk_prob", value=norm_topk)
    shared = _positive(cfg, "shared_expert_intermediate_size", config_file) if shared_expert else 0
    sparse = tuple(i not in dense and (i + 1) % step == 0 for i in range(hp.num_layers))
    base = {f.name: getattr(hp, f.name) for f in fields(DecoderHyper)}
    return QwenMoEHyper(**base, num_experts=experts, experts_per_token=top_k, moe_intermediate_size=moe_inter,
                        norm_topk_prob=norm_topk, sparse_layers=sparse, shared_expert_size=shared,
                        router_is_linear=router_is_linear)


def linear_layers(hp: QwenMoEHyper) -> list[tuple[str, int, int, str]]:
    """(module name, in_features, out_features, ONNX node prefix) for every linear, in graph order."""
    q_out, kv_out = hp.num_heads * hp.head_dim, hp.num_kv_heads * hp.head_dim
    attn = {"q_proj": (hp.hidden_size, q_out), "k_proj": (hp.hidden_size, kv_out),
            "v_proj": (hp.hidden_size, kv_out), "o_proj": (q_out, hp.hidden_size)}

    def mlp(width):
        return zip(MLP_PROJ, ((hp.hidden_size, width), (hp.hidden_size, width), (width, hp.hidden_size)))

    out = []
    for i in range(hp.num_layers):
        for proj, shape in attn.items():
            out.append((f"model.layers.{i}.self_attn.{proj}", *shape, f"/model/layers.{i}/attn/{proj}"))
        if not hp.sparse_layers[i]:
            for proj, shape in mlp(hp.intermediate_size):
                out.append((f"{hp.block(i)}.{proj}", *shape, f"/model/layers.{i}/mlp/{proj}"))
            continue
        if hp.router_is_linear:
            out.append((f"{hp.block(i)}.{ROUTER}", hp.hidden_size, hp.num_experts, f"/model/layers.{i}/moe/gate"))
        for e in range(hp.num_experts):
            for name, (proj, shape) in zip(hp.expert_linears(i, e), mlp(hp.moe_intermediate_size)):
                out.append((name, *shape, f"/model/layers.{i}/moe/experts.{e}/{proj}"))
        if hp.shared_expert_size:
            for name, (proj, shape) in zip(hp.shared_linears(i), mlp(hp.shared_expert_size)):
                out.append((name, *shape, f"/model/layers.{i}/moe/shared_expert/{proj}"))
            out.append((f"{hp.block(i)}.{SHARED_EXPERT_GATE}", hp.hidden_size, 1,
                        f"/model/layers.{i}/moe/shared_expert_gate"))
    out.append(("lm_head", hp.hidden_size, hp.vocab_size, "/lm_head"))
    return out


def check_plans(model_plan) -> None:
    hp = model_plan.hp
    names = [n for i in range(hp.num_layers) if hp.sparse_layers[i]
             for e in range(hp.num_experts) for n in hp.expert_linears(i, e)]
    check_expert_plans(model_plan.linears, names, str(model_plan.source / "config.json"))


def plan_notes(model_plan) -> list[str]:
    hp, plans = model_plan.hp, model_plan.linears
    blocks = {i: [tuple(plans[n] for n in hp.expert_linears(i, e)) for e in range(hp.num_experts)]
              for i in range(hp.num_layers) if hp.sparse_layers[i]}
    return [form_note(model_plan, blocks)]


def moe_float_tensors(hp: QwenMoEHyper) -> list[tuple[str, tuple[int, ...]]]:
    """The routers of the sparse layers when they are plain parameters (else they are linear layers)."""
    if hp.router_is_linear:
        return []
    return [(f"{hp.block(i)}.{ROUTER}.weight", (hp.num_experts, hp.hidden_size))
            for i in range(hp.num_layers) if hp.sparse_layers[i]]


def float_tensors(hp: QwenMoEHyper) -> list[tuple[str, tuple[int, ...]]]:
    return qwen3.float_tensors(hp) + moe_float_tensors(hp)


def build_graph(ctx, hp: QwenMoEHyper, plans: dict, attention) -> None:
    """llama.build_graph with the sparse MoE block in place of the MLP of the sparse layers."""
    llama.build_graph(ctx, hp, plans, attention, mlp=moe_or_dense_mlp)


def moe_or_dense_mlp(ctx, i: int, x: str, plans: dict, hp: QwenMoEHyper) -> str:
    if not hp.sparse_layers[i]:
        return llama.llama_mlp(ctx, i, x, plans, hp)
    block, prefix = hp.block(i), f"/model/layers.{i}/moe"
    experts = [tuple(plans[n] for n in hp.expert_linears(i, e)) for e in range(hp.num_experts)]
    router = plans[f"{block}.{ROUTER}"] if hp.router_is_linear else f"{block}.{ROUTER}.weight"
    y = emit_moe(ctx, x, router, experts, hp.experts_per_token, block, prefix,
                 normalize=hp.norm_topk_prob)
    if not hp.shared_expert_size:
        return y
    g = ctx.graph
    gate, up, down = (plans[n] for n in hp.shared_linears(i))
    shared = silu_mlp(ctx, x, gate, up, down, f"{prefix}/shared_expert")
    weight = g.op("Sigmoid", [emit_linear(ctx, plans[f"{block}.{SHARED_EXPERT_GATE}"], x)],
                  f"{prefix}/shared_expert_gate/Sigmoid")
    shared = g.op("Mul", [shared, weight], f"{prefix}/shared_expert/Weighted")
    return g.op("Add", [y, shared], f"{prefix}/Add")
