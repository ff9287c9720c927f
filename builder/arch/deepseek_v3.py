"""DeepSeek-V3 decoders (DeepseekV3ForCausalLM; also DeepSeek-R1), as transformers 5's modeling_deepseek_v3.py.

Per layer:
    x ─► RMSNorm ─► MLA (builder/ops/mla_attention.py: q/kv LoRA projections, decoupled RoPE part, materialised
                    per-head K/V in GroupQueryAttention and its cache; mla_cache=latent: the compressed latent as
                    the cache, kv_b_proj absorbed, explicit-op attention) ─► o_proj ─► +residual
      ─► RMSNorm ─► layers < first_k_dense_replace: SiLU MLP (mlp.gate/up/down_proj)
                    else: grouped sigmoid top-k routing (builder/ops/grouped_topk_router.py) over the routed
                    experts: one QMoE on CPU for 4-bit integer experts (builder/ops/grouped_qmoe.py), else routed in
                    standard ops (builder/ops/routed_experts.py); moe=dense: every
                    expert computed and weighted (exact; zero weight for the experts not chosen); plus the shared
                    experts' SiLU MLP ─► +residual
Tensor names (amd-quark 0.13 exports from transformers 5, whose preprocess_for_quantization makes one nn.Linear per
expert; the original DeepSeek checkpoints use the same names):
    model.layers.{i}.self_attn.{q_a_proj, q_a_layernorm, q_b_proj | q_proj, kv_a_proj_with_mqa, kv_a_layernorm,
                                kv_b_proj, o_proj}
    model.layers.{i}.mlp.{gate_proj, up_proj, down_proj}                       (dense layers)
    model.layers.{i}.mlp.gate.weight [E, hidden], .gate.e_score_correction_bias [E]   (router, float)
    model.layers.{i}.mlp.experts.{e}.{gate_proj, up_proj, down_proj}, mlp.shared_experts.{...}
Multi-token-prediction layers (model.layers.{num_hidden_layers}..., num_nextn_predict_layers) are not read, as in
transformers. The q_a/kv_a norms use eps 1e-6 whatever rms_norm_eps says (DeepseekV3RMSNorm's default there).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np
from onnx import TensorProto

from ..errors import ConversionError
from ..ops.linear import emit_linear, emit_linears
from ..ops.fp8_attention import shared_values
from ..ops.mla_attention import RopeValues, latent_cache_width, mla_attention, mla_latent_attention, rope_values
from ..ops.grouped_qmoe import routed_qmoe
from ..ops.grouped_topk_router import grouped_topk_weights
from ..ops.mlp import silu_mlp
from ..ops import routed_experts
from ..ops.moe import expert_form, form_note
from ..ops.norm import rms_norm, skip_rms_norm
from ..ops.rotary import cos_sin_caches, yarn_mscale
from ..quant.fp8_w8a8 import scalar_scale
from . import llama
from .base import DecoderHyper

# genai_config model.type: onnxruntime-genai 0.18 has no deepseek type; the graph's inputs and outputs are those of
# its plain decoder types (input_ids, attention_mask, past/present per layer, logits).
MODEL_TYPES = {"DeepseekV3ForCausalLM": "llama"}
MOE_FAMILY = True  # tests/test_architecture_coverage.py: tested end to end with 4-bit and MXFP4 experts
MLP_PROJ = ("gate_proj", "up_proj", "down_proj")
MLA_NORM_EPS = 1e-6
ROPE_TYPES = ("default", "yarn")
# tensor names, as data: module name templates under model.layers.{i}
ATTN = "model.layers.{i}.self_attn"
MLP = "model.layers.{i}.mlp"
EXPERT = "model.layers.{i}.mlp.experts.{e}"
SHARED = "model.layers.{i}.mlp.shared_experts"
ROUTER = "model.layers.{i}.mlp.gate.weight"
ROUTER_BIAS = "model.layers.{i}.mlp.gate.e_score_correction_bias"

default_attention = None  # MLA is emitted by build_graph itself; plan_attention replaces the attention variants


@dataclass(frozen=True)
class DeepseekHyper(DecoderHyper):
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    rope_interleave: bool = True
    softmax_scale: float = 1.0
    mla_norm_eps: float = MLA_NORM_EPS
    num_experts: int = 0
    experts_per_token: int = 0
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    n_shared_experts: int = 0
    moe_intermediate_size: int = 0
    first_k_dense_replace: int = 0

    def is_moe(self, i: int) -> bool:
        return i >= self.first_k_dense_replace


def _int(cfg, key, config_file, minimum=1, default=None):
    value = cfg.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConversionError(f"must be an integer >= {minimum}", file=config_file, field=key, value=value)
    return value


def rope_config(cfg: dict, config_file: str) -> tuple[float, dict | None]:
    """(theta, scaling) from transformers 5's rope_parameters or the original config.json's rope_scaling."""
    rope = dict(cfg.get("rope_parameters") or {})
    legacy = cfg.get("rope_scaling") or {}
    theta = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    scaling = {**legacy, **rope}
    rope_type = scaling.get("rope_type", scaling.get("type", "default")) or "default"
    if rope_type not in ROPE_TYPES:
        field = "rope_parameters.rope_type" if rope else "rope_scaling.type"
        raise ConversionError("rope type not supported for DeepSeek-V3", file=config_file, field=field,
                              value=rope_type, accepted=", ".join(ROPE_TYPES))
    return theta, (None if rope_type == "default" else dict(scaling, rope_type=rope_type))


def refine_hyper(cfg: dict, hp: DecoderHyper, config_file: str) -> DeepseekHyper:
    """The decoder hyper-parameters plus MLA and routing; everything this family cannot express is refused."""
    q_lora = cfg.get("q_lora_rank")
    if q_lora is not None:
        q_lora = _int(cfg, "q_lora_rank", config_file)
    kv_lora = _int(cfg, "kv_lora_rank", config_file)
    nope, rope_dim = _int(cfg, "qk_nope_head_dim", config_file), _int(cfg, "qk_rope_head_dim", config_file, 2)
    v_dim = _int(cfg, "v_head_dim", config_file)
    if rope_dim % 2:
        raise ConversionError("qk_rope_head_dim must be even", file=config_file, field="qk_rope_head_dim",
                              value=rope_dim)
    if hp.num_kv_heads != hp.num_heads:  # transformers would repeat the H materialised heads again
        raise ConversionError("num_key_value_heads must equal num_attention_heads (MLA materialises one K/V per "
                              "head)", file=config_file, field="num_key_value_heads", value=hp.num_kv_heads,
                              accepted=str(hp.num_heads))
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ConversionError("only SiLU MLPs and experts are supported", file=config_file, field="hidden_act",
                              value=act, accepted="silu")
    for key, accepted in (("scoring_func", "sigmoid"), ("topk_method", "noaux_tc")):
        if cfg.get(key, accepted) != accepted:  # original DeepSeek config.json keys; transformers 5 implies these
            raise ConversionError("routing not supported (transformers 5's DeepseekV3TopkRouter is sigmoid + "
                                  "noaux_tc)", file=config_file, field=key, value=cfg[key], accepted=accepted)
    experts = _int(cfg, "n_routed_experts", config_file, default=cfg.get("num_local_experts"))
    top_k = _int(cfg, "num_experts_per_tok", config_file)
    n_group, topk_group = _int(cfg, "n_group", config_file), _int(cfg, "topk_group", config_file)
    if experts % n_group or experts // n_group < 2:
        raise ConversionError("n_routed_experts must split into n_group groups of at least 2 experts (the group "
                              "score is the sum of each group's top 2)", file=config_file, field="n_group",
                              value=n_group, accepted=f"a divisor of {experts} up to {experts // 2}")
    if topk_group > n_group:
        raise ConversionError("topk_group exceeds n_group", file=config_file, field="topk_group", value=topk_group,
                              accepted=f"1..{n_group}")
    if top_k > topk_group * (experts // n_group):
        raise ConversionError("num_experts_per_tok exceeds the experts of the topk_group groups", file=config_file,
                              field="num_experts_per_tok", value=top_k,
                              accepted=f"1..{topk_group * (experts // n_group)}")
    layers = hp.num_layers
    first_dense = _int(cfg, "first_k_dense_replace", config_file, 0, default=0)
    shared = _int(cfg, "n_shared_experts", config_file, 0, default=0)
    moe_inter = _int(cfg, "moe_intermediate_size", config_file)
    scale = float(cfg.get("routed_scaling_factor", 1.0))
    theta, scaling = rope_config(cfg, config_file)
    qk = nope + rope_dim
    softmax_scale = qk ** -0.5
    if scaling is not None:  # yarn; transformers' yarn_apply_mscale, then cos/sin times the attention factor
        if "original_max_position_embeddings" not in scaling:
            raise ConversionError("yarn rope needs original_max_position_embeddings", file=config_file,
                                  field="rope_parameters.original_max_position_embeddings", value=None)
        if scaling.get("factor") is None:  # transformers: max_position_embeddings / original
            scaling = dict(scaling, factor=hp.max_positions / float(scaling["original_max_position_embeddings"]))
        if scaling.get("mscale_all_dim"):
            m = yarn_mscale(float(scaling["factor"]), float(scaling["mscale_all_dim"]))
            softmax_scale *= m * m
    base = {f.name: getattr(hp, f.name) for f in fields(DecoderHyper)}
    base.update(head_dim=max(qk, v_dim), num_kv_heads=hp.num_heads, rope_theta=theta, rope_scaling=scaling,
                partial_rotary_factor=1.0, sliding_window=-1, windowed_layers=None)
    return DeepseekHyper(**base, q_lora_rank=q_lora, kv_lora_rank=kv_lora, qk_nope_head_dim=nope,
                         qk_rope_head_dim=rope_dim, v_head_dim=v_dim,
                         rope_interleave=bool(cfg.get("rope_interleave", True)), softmax_scale=softmax_scale,
                         num_experts=experts, experts_per_token=top_k,
                         n_group=n_group, topk_group=topk_group, norm_topk_prob=bool(cfg.get("norm_topk_prob", True)),
                         routed_scaling_factor=scale, n_shared_experts=shared, moe_intermediate_size=moe_inter,
                         first_k_dense_replace=min(first_dense, layers))


def _attn_shapes(hp: DeepseekHyper) -> dict[str, tuple[int, int]]:
    h, qk = hp.num_heads, hp.qk_nope_head_dim + hp.qk_rope_head_dim
    shapes = {"kv_a_proj_with_mqa": (hp.hidden_size, hp.kv_lora_rank + hp.qk_rope_head_dim),
              "kv_b_proj": (hp.kv_lora_rank, h * (hp.qk_nope_head_dim + hp.v_head_dim)),
              "o_proj": (h * hp.v_head_dim, hp.hidden_size)}
    if hp.q_lora_rank is None:
        return {"q_proj": (hp.hidden_size, h * qk), **shapes}
    return {"q_a_proj": (hp.hidden_size, hp.q_lora_rank), "q_b_proj": (hp.q_lora_rank, h * qk), **shapes}


def _mlp_shapes(hidden: int, inter: int) -> dict[str, tuple[int, int]]:
    return {"gate_proj": (hidden, inter), "up_proj": (hidden, inter), "down_proj": (inter, hidden)}


def expert_linears(hp: DeepseekHyper, i: int, e: int) -> tuple[str, str, str]:
    return tuple(f"{EXPERT.format(i=i, e=e)}.{p}" for p in MLP_PROJ)


def shared_linears(hp: DeepseekHyper, i: int) -> tuple[str, str, str]:
    return tuple(f"{SHARED.format(i=i)}.{p}" for p in MLP_PROJ)


def linear_layers(hp: DeepseekHyper) -> list[tuple[str, int, int, str]]:
    """(module name, in_features, out_features, ONNX node prefix) for every linear, in graph order."""
    out = []
    expert = _mlp_shapes(hp.hidden_size, hp.moe_intermediate_size)
    for i in range(hp.num_layers):
        for proj, shape in _attn_shapes(hp).items():
            out.append((f"{ATTN.format(i=i)}.{proj}", *shape, f"/model/layers.{i}/attn/{proj}"))
        if not hp.is_moe(i):
            for proj, shape in _mlp_shapes(hp.hidden_size, hp.intermediate_size).items():
                out.append((f"{MLP.format(i=i)}.{proj}", *shape, f"/model/layers.{i}/mlp/{proj}"))
            continue
        for e in range(hp.num_experts):
            for name, (proj, shape) in zip(expert_linears(hp, i, e), expert.items()):
                out.append((name, *shape, f"/model/layers.{i}/moe/experts.{e}/{proj}"))
        if hp.n_shared_experts:
            shared = _mlp_shapes(hp.hidden_size, hp.moe_intermediate_size * hp.n_shared_experts)
            for name, (proj, shape) in zip(shared_linears(hp, i), shared.items()):
                out.append((name, *shape, f"/model/layers.{i}/moe/shared_experts/{proj}"))
    out.append(("lm_head", hp.hidden_size, hp.vocab_size, "/lm_head"))
    return out


def float_tensors(hp: DeepseekHyper) -> list[tuple[str, tuple[int, ...]]]:
    out = llama.float_tensors(hp)
    for i in range(hp.num_layers):
        attn = ATTN.format(i=i)
        if hp.q_lora_rank is not None:
            out.append((f"{attn}.q_a_layernorm.weight", (hp.q_lora_rank,)))
        out.append((f"{attn}.kv_a_layernorm.weight", (hp.kv_lora_rank,)))
        if hp.is_moe(i):
            out += [(ROUTER.format(i=i), (hp.num_experts, hp.hidden_size)),
                    (ROUTER_BIAS.format(i=i), (hp.num_experts,))]
    return out


@dataclass(frozen=True)
class MlaPlan:
    """What build_graph needs besides the linears: the FP8 KV-cache scale of each layer (None: no quantizer) and the
    cache form (--extra_options mla_cache: materialized | latent)."""
    kv_scales: tuple[float | None, ...]
    cache_form: str = "materialized"


LATENT_EPS = ("cpu", "cuda")  # mla_cache=latent: explicit standard ops; run on cpu, built (not run) for cuda
LATENT_KV_B_SCHEMES = ("FloatLinear", "IntWeightOnly", "Mxfp4Linear")  # decoded exactly in numpy, input-side quant only


def check_latent_cache(model_plan, kv_scales) -> None:
    """mla_cache=latent applies only where absorbing kv_b_proj is exact (builder/ops/mla_attention.py)."""
    hp, ep = model_plan.hp, model_plan.ep
    field = "--extra_options mla_cache"
    if ep.name not in LATENT_EPS:
        raise ConversionError(f"mla_cache=latent is built for {', '.join(LATENT_EPS)} only (explicit-op attention "
                              "not checked on this EP)", field=field, value="latent", accepted="materialized")
    if any(s is not None for s in kv_scales):
        raise ConversionError("mla_cache=latent: Quark's FP8 KV cache quantizes kv_b_proj's output (per-head k_nope "
                              "and V), which the absorbed form never computes", field=field, value="latent",
                              accepted="materialized (or kv_cache=off to drop the FP8 KV cache)")
    if (hp.kv_lora_rank + hp.qk_rope_head_dim) % 2:
        raise ConversionError("mla_cache=latent splits the latent over genai's key and value caches: "
                              "kv_lora_rank + qk_rope_head_dim must be even", field=field, value="latent",
                              accepted="materialized")
    for i in range(hp.num_layers):
        plan = model_plan.linears[f"{ATTN.format(i=i)}.kv_b_proj"]
        if plan.scheme.__name__ not in LATENT_KV_B_SCHEMES or plan.has_bias:
            what = "a bias" if plan.has_bias else f"scheme {plan.scheme.name}"
            raise ConversionError(f"mla_cache=latent: kv_b_proj with {what} cannot be absorbed exactly",
                                  layer=plan.name, field=field, value="latent",
                                  accepted="materialized (latent: kv_b_proj float, int weight-only or MXFP4)")


def plan_attention(model_plan, ckpt) -> MlaPlan:
    """Quark's FP8 KV cache on MLA is an output quantizer on kv_b_proj (its template's kv_layers_name "*kv_b_proj"):
    read and checked here, before anything is written. --extra_options kv_cache=off ignores it (with a note);
    native is refused (a float8 GroupQueryAttention cache would not hold Quark's values)."""
    hp, quant = model_plan.hp, model_plan.quant
    out = []
    for i in range(hp.num_layers):
        name = f"{ATTN.format(i=i)}.kv_b_proj"
        spec = model_plan.linears[name].spec
        if spec is None or not spec.output_tensors:
            out.append(None)
            continue
        t = spec.output_tensors[0]
        if len(spec.output_tensors) != 1 or t.dtype != "fp8_e4m3" or t.qscheme != "per_tensor" or t.is_dynamic \
                or t.symmetric is False:
            raise ConversionError("only static symmetric per_tensor fp8_e4m3 KV-cache quantization is supported",
                                  file=quant.config_file, layer=name, field=f"{spec.source}.output_tensors",
                                  value=t.short(), accepted="fp8_e4m3 per_tensor sym")
        if f"{name}.output_scale" not in ckpt:
            raise ConversionError("output quantization configured but output_scale missing", file=ckpt.model_dir,
                                  layer=f"{name}.output_scale", field="output_tensors.dtype", value=t.dtype)
        out.append(scalar_scale(ckpt, f"{name}.output_scale"))
    if quant is not None and quant.softmax_spec is not None:
        raise ConversionError("FP8 attention (softmax_quant_spec) is not supported for DeepSeek-V3 MLA",
                              file=quant.config_file, field="softmax_quant_spec", value=quant.softmax_spec.short())
    mode, notes = model_plan.options.kv_cache, model_plan.notes
    if mode not in ("auto", "emulate", "off"):
        raise ConversionError("DeepSeek-V3 MLA: the cache is the materialised K/V in the io dtype; Quark's FP8 KV "
                              "cache (kv_b_proj's output quantizer, before the rope part joins K) is emulated, a "
                              "float8 GroupQueryAttention cache would quantize other values",
                              field="--extra_options kv_cache", value=mode, accepted="auto, emulate, off")
    if any(s is not None for s in out):
        if mode == "off":
            notes.append("kv_cache=off: the checkpoint's kv_b_proj.output_scale (FP8 KV cache) are ignored")
            out = [None] * len(out)
        else:
            notes.append("FP8 KV cache emulated: kv_b_proj's output (k_nope and V of every head) is "
                         "quantize-dequantized with kv_b_proj.output_scale; the cache holds those values in the io "
                         "dtype")
    form = model_plan.options.extra.get("mla_cache", "materialized")
    if form == "latent":
        check_latent_cache(model_plan, out)
        width = latent_cache_width(hp)
        model_plan.decoder_extras.update(head_size=width, num_key_value_heads=1)
        model_plan.search_extras["past_present_share_buffer"] = False
        notes.append(f"mla_cache=latent: the cache is MLA's latent (kv_a_layernorm(c) and the roped k_rot, "
                     f"{2 * width} values per token and layer as key/value [B, 1, T, {width}]); kv_b_proj absorbed "
                     "into the query and output sides; genai past_present_share_buffer=false")
    return MlaPlan(tuple(out), form)


def rope_caches(hp: DeepseekHyper, config_file: str) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin [max_positions, r/2] (times yarn's attention factor, as transformers scales cos/sin)."""
    return cos_sin_caches(hp.qk_rope_head_dim, hp.max_positions, hp.rope_theta, hp.rope_scaling, config_file)


def build_graph(ctx, hp: DeepseekHyper, plans: dict, attention: MlaPlan) -> None:
    g = ctx.graph
    io_values = llama.decoder_inputs(ctx, None)
    cos, sin = rope_caches(hp, str(ctx.source))
    cos, sin = g.initializer("cos_cache", cos.astype(ctx.io_np)), g.initializer("sin_cache", sin.astype(ctx.io_np))
    latent = attention.cache_form == "latent"
    if latent:  # positions and the causal/padding mask of the explicit-op attention
        sa = shared_values(ctx, _Caches(cos, sin), hp, prefix="/model/mla_rope")
        rv, cache_hp = RopeValues(sa.cos, sa.sin), replace(hp, num_kv_heads=1, head_dim=latent_cache_width(hp))
    else:
        rv = rope_values(ctx, cos, sin)

    residual = ctx.embedding(io_values.input_ids)
    x = rms_norm(ctx, residual, "model.layers.0.input_layernorm.weight", hp.rms_norm_eps,
                 "/model/layers.0/input_layernorm/SimplifiedLayerNorm")
    for i in range(hp.num_layers):
        pre = f"model.layers.{i}"
        if latent:
            attn_out = mla_latent_attention(ctx, i, x, plans, hp, rv, sa.allowed,
                                            io_values.layer_cache(ctx, i, cache_hp))
        else:
            attn_out = mla_attention(ctx, i, x, plans, hp, rv, io_values.seqlens_k, io_values.total_seq_len,
                                     io_values.layer_cache(ctx, i, hp), attention.kv_scales[i])
        x, residual = skip_rms_norm(ctx, attn_out, residual, f"{pre}.post_attention_layernorm.weight",
                                    hp.rms_norm_eps, f"/model/layers.{i}/post_attention_layernorm/SkipLayerNorm")
        mlp_out = moe_block(ctx, i, x, plans, hp) if hp.is_moe(i) else llama.llama_mlp(ctx, i, x, plans, hp)
        last = i == hp.num_layers - 1
        norm_w = "model.norm.weight" if last else f"model.layers.{i + 1}.input_layernorm.weight"
        norm_name = "/model/norm/SkipLayerNorm" if last else f"/model/layers.{i + 1}/input_layernorm/SkipLayerNorm"
        x, residual = skip_rms_norm(ctx, mlp_out, residual, norm_w, hp.rms_norm_eps, norm_name)
    llama.logits_output(ctx, hp, emit_linear(ctx, plans["lm_head"], llama.lm_head_input(ctx, x)))


@dataclass(frozen=True)
class _Caches:  # what shared_values reads: the cos/sin initializers
    cos_cache: str
    sin_cache: str


def plan_notes(model_plan) -> list[str]:
    """How the MoE layers will be emitted (QMoE, MatMulExperts*, standard-op routed or dense), for `inspect` and the
    conversion log."""
    hp, plans = model_plan.hp, model_plan.linears
    return [form_note(model_plan, {i: [tuple(plans[n] for n in expert_linears(hp, i, e)) for e in range(hp.num_experts)]
                                   for i in range(hp.num_layers) if hp.is_moe(i)})]


def moe_block(ctx, i: int, x: str, plans: dict, hp: DeepseekHyper) -> str:
    """Routed experts weighted by the grouped top-k weights, plus the shared experts. On CPU with 4-bit integer
    experts: one QMoE computing only the chosen experts (builder/ops/grouped_qmoe.py); elsewhere the routed form in
    standard ops (builder/ops/routed_experts.py, TopK of the dense weights); mixed experts or --extra_options
    moe=dense: every expert computed and weighted (exact: the others weigh 0), every expert's gate/up (and the shared
    experts') in one matmul where their schemes agree."""
    g = ctx.graph
    name, prefix = MLP.format(i=i), f"/model/layers.{i}/moe"
    weights = grouped_topk_weights(ctx, x, ROUTER.format(i=i), ROUTER_BIAS.format(i=i), hp, name, prefix)
    if ctx.io_type != TensorProto.FLOAT:
        weights = g.op("Cast", [weights], f"{prefix}/router/CastBack", to=ctx.io_type)
    experts = [tuple(plans[n] for n in expert_linears(hp, i, e)) for e in range(hp.num_experts)]
    shared = tuple(plans[n] for n in shared_linears(hp, i)) if hp.n_shared_experts else None
    form, bs = expert_form(ctx, experts)  # moe=routed (default): QMoE on CPU for 4-bit integer experts of one
    if form != "dense":                   # format, else the standard-op routed form (ops/routed_experts.py)
        if form == "qmoe":
            routed = routed_qmoe(ctx, x, weights, experts, hp.experts_per_token, name, prefix, bs)
        else:
            routing = routed_experts.routing_from_dense(ctx, weights, hp.experts_per_token, hp.num_experts, name,
                                                        prefix)
            routed = routed_experts.emit_routed_experts(ctx, x, routing, experts, routed_experts.silu_activation,
                                                        hp.experts_per_token, name, prefix)
        if shared is None:
            return routed
        shared_out = silu_mlp(ctx, x, *shared, f"{prefix}/shared_experts")
        return g.op("Add", [routed, shared_out], f"{prefix}/AddShared")
    first = [p for gate, up, _ in experts for p in (gate, up)] + (list(shared[:2]) if shared else [])
    gate_up = emit_linears(ctx, first, x, f"{name}.experts.gate_up_proj", f"{prefix}/experts/gate_up_proj")
    outs = []
    for e, (_, _, down) in enumerate(experts):
        y = _silu_down(ctx, gate_up[2 * e], gate_up[2 * e + 1], down, f"{prefix}/experts.{e}")
        n = f"{name}.experts.{e}.routing"
        w_e = g.op("Slice", [weights, g.const_i64(f"{n}.start", [e]), g.const_i64(f"{n}.end", [e + 1]),
                             g.const_i64(f"{n}.axes", [-1])], f"{prefix}/experts.{e}/RoutingWeight")
        outs.append(g.op("Mul", [y, w_e], f"{prefix}/experts.{e}/Weighted"))
    routed = outs[0] if len(outs) == 1 else g.op("Sum", outs, f"{prefix}/experts/Sum")
    if shared is None:
        return routed
    shared_out = _silu_down(ctx, gate_up[-2], gate_up[-1], shared[2], f"{prefix}/shared_experts")
    return g.op("Add", [routed, shared_out], f"{prefix}/AddShared")


def _silu_down(ctx, gate: str, up: str, down, prefix: str) -> str:
    g = ctx.graph
    act = g.op("Mul", [gate, g.op("Sigmoid", [gate], f"{prefix}/act_fn/Sigmoid")], f"{prefix}/act_fn/Mul")
    return emit_linear(ctx, down, g.op("Mul", [act, up], f"{prefix}/Mul"))

