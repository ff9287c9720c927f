"""Tiny AMD Quark hf_format exports made with the real amd-quark 0.13 on CPU, plus an independent reference.

One export = `<out_dir>/`:
  float/            the float model (spec dtype) it was made from, with tokenizer
  quark/            Quark's export_safetensors(..., custom_mode="quark") + tokenizer + generation_config.json
  reference.npz     what Quark's own frozen (fake-quantized) PyTorch model computes, see REFERENCE_KEYS
  quark_dequant.npz Quark's in-memory dequantized weight of every quantized Linear, {module_name: fp32 [out,in]}
  info.json         spec, recipe, timings, checks (written last: its presence marks a complete export)

Quark is imported lazily (import costs ~15-20 s); make many exports in one process with make_many(), or from
pytest with ensure_exports(), which runs this file as a subprocess for the exports that are not cached yet.
CLI: python tests/quark_factory.py make --root DIR --shape llama_h64 --recipe uint4_g64 [--recipe ...]
     python tests/quark_factory.py matrix --root DIR      (every SHAPES x RECIPES combination, prints a table)
"""
from __future__ import annotations

import argparse
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tiny_tokenizer, independent_decode

FACTORY_VERSION = 3  # 3: Quark fake-quant runs eager (QUARK_DISABLE_COMPILE=1), see _quiet_env
REFERENCE_KEYS = ("input_ids", "logits", "greedy", "greedy_margins", "float_logits", "dequant_logits",
                  "dequant_greedy", "dequant_greedy_margins")
ARCH_CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "phi3": ("Phi3Config", "Phi3ForCausalLM"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM"),  # key = Quark's LLMTemplate name
    "mixtral": ("MixtralConfig", "MixtralForCausalLM"),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM"),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM"),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM"),
}
# Qwen MoE settings (not TinyModelSpec fields: those would re-key every cache); per-shape variations go through
# TinyModelSpec.config_overrides. 8 experts top-2, expert width 64 (the dense MLP layers keep `intermediate`).
QWEN_MOE_KWARGS = {
    "qwen3_moe": dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, norm_topk_prob=True,
                      use_sliding_window=False),
    "qwen2_moe": dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, norm_topk_prob=False,
                      shared_expert_intermediate_size=96, use_sliding_window=False),
}
# gpt-oss: 4 experts top-2, sliding window 4 on layer 0 only, q/k/v/o biases, a swiglu_limit small enough (1.0) that
# the clamps act on these activations; _new_model randomizes the sinks and every bias (HF inits them to 0 / 0.1)
GPT_OSS_KWARGS = dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=4, swiglu_limit=1.0,
                      layer_types=["sliding_attention", "full_attention"], attention_bias=True)
MOE_ARCHS = ("mixtral", "qwen3_moe", "qwen2_moe", "gpt_oss", "deepseek_v3")  # Quark's preprocess_for_quantization splits their experts
# Gemma settings that make every difference from Llama visible in a 2-layer, 8-token model: sliding window 4 on
# layer 0 only, attention scale 24**-0.5 != head_dim**-0.5, softcaps small enough to bend the logits (Gemma2),
# a local rope theta and a linearly scaled global rope (Gemma3). Norm weights are randomized (HF inits them to 0,
# i.e. a scale of 1 + 0) so that the (1 + w) convention is tested.
GEMMA_KWARGS = {
    "gemma2": dict(sliding_window=4, query_pre_attn_scalar=24, attn_logit_softcapping=2.0,
                   final_logit_softcapping=3.0, layer_types=["sliding_attention", "full_attention"],
                   pad_token_id=0),
    "gemma3_text": dict(sliding_window=4, query_pre_attn_scalar=24, layer_types=["sliding_attention", "full_attention"],
                        pad_token_id=0),
}
# DeepSeek-V3 (TinyModelSpec.variant picks one): 8 routed experts, a shared expert, layer 0 dense; "": MLA with
# q LoRA, qk head 16 + 16 > v head 16, interleaved rope, top-3 experts of the best 2 of 4 groups; "qproj_yarn":
# q_proj, qk head 8 + 8 < v head 32, rotate-half rope, yarn scaling with mscale, top-2 of the best of 2 groups.
# The router bias is randomized (transformers inits it to 0) so that choosing by score + bias but weighting by
# score is tested.
DEEPSEEK_COMMON = dict(moe_intermediate_size=32, n_shared_experts=1, n_routed_experts=8, routed_scaling_factor=2.5,
                       first_k_dense_replace=1, norm_topk_prob=True, kv_lora_rank=32)
DEEPSEEK_VARIANTS = {
    "": dict(q_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16, rope_interleave=True,
             n_group=4, topk_group=2, num_experts_per_tok=3),
    "qproj_yarn": dict(q_lora_rank=None, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=32,
                       rope_interleave=False, n_group=2, topk_group=1, num_experts_per_tok=2,
                       rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                        "original_max_position_embeddings": 64, "mscale": 1.0,
                                        "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1}),
}
MOE_EXPERTS, MOE_TOP_K = 4, 2  # every "mixtral" spec (not TinyModelSpec fields: those would re-key every cache)
BOS_ID, EOS_ID = 1, 2


@dataclass(frozen=True)
class TinyModelSpec:
    arch: str = "llama"
    hidden: int = 64
    intermediate: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int | None = None
    vocab: int = 256
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # llama and qwen3 only; qwen2 always has q/k/v bias
    dtype: str = "float32"  # float32 | bfloat16 | float16
    seed: int = 0
    max_position_embeddings: int = 256
    rope_theta: float = 10000.0
    init_std: float = 0.1  # larger than HF's 0.02 so that greedy top-2 logit margins are not tiny
    variant: str = ""  # arch-specific sub-configuration (DEEPSEEK_VARIANTS); "" is left out of cache keys
    # ((config field, value), ...) set on the HF config last (lists as tuples); left out of the cache key when empty
    config_overrides: tuple = ()

    def __post_init__(self):  # from JSON (the factory subprocess): lists back to hashable tuples
        def frozen(v):
            return tuple(frozen(x) for x in v) if isinstance(v, (list, tuple)) else v
        object.__setattr__(self, "config_overrides", tuple((k, frozen(v)) for k, v in self.config_overrides))

    def hf_config(self):
        import transformers

        if self.arch not in ARCH_CLASSES:
            raise ValueError(f"TinyModelSpec.arch={self.arch!r}: expected one of {sorted(ARCH_CLASSES)}")
        config_cls = getattr(transformers, ARCH_CLASSES[self.arch][0])
        kwargs = dict(
            vocab_size=self.vocab,
            hidden_size=self.hidden,
            intermediate_size=self.intermediate,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            max_position_embeddings=self.max_position_embeddings,
            rms_norm_eps=1e-5,
            initializer_range=self.init_std,
            tie_word_embeddings=self.tie_word_embeddings,
            bos_token_id=BOS_ID,
            eos_token_id=EOS_ID,
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
        )
        if self.head_dim is not None:
            kwargs["head_dim"] = self.head_dim
        if self.arch in ("llama", "qwen3", "qwen3_moe"):
            kwargs["attention_bias"] = self.attention_bias
        elif self.attention_bias:
            raise ValueError(f"attention_bias applies to llama and qwen3 only (arch={self.arch!r})")
        if self.arch in ("mistral", "mixtral"):
            kwargs["sliding_window"] = None
        if self.arch == "mixtral":
            kwargs.update(num_local_experts=MOE_EXPERTS, num_experts_per_tok=MOE_TOP_K)
        if self.arch == "deepseek_v3":
            kwargs.update(DEEPSEEK_COMMON, **DEEPSEEK_VARIANTS[self.variant])
            kwargs["num_key_value_heads"] = self.heads  # MLA materialises one K/V per head
        elif self.variant:
            raise ValueError(f"TinyModelSpec.variant applies to deepseek_v3 only (arch={self.arch!r})")
        if self.arch in ("qwen2", "qwen3"):
            kwargs["use_sliding_window"] = False
        if self.arch in GEMMA_KWARGS:
            kwargs.update(GEMMA_KWARGS[self.arch])
        if self.arch in QWEN_MOE_KWARGS:
            kwargs.update(QWEN_MOE_KWARGS[self.arch])
        if self.arch == "gpt_oss":
            kwargs.update(GPT_OSS_KWARGS)
        # *_parameters values are dicts given as ((key, value), ...); other tuples are lists
        kwargs.update({k: (dict(v) if k.endswith("_parameters") else list(v)) if isinstance(v, tuple) else v
                       for k, v in self.config_overrides})
        if self.arch == "gemma3_text":
            kwargs["rope_parameters"] = {
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": self.rope_theta},
                "sliding_attention": {"rope_type": "default", "rope_theta": self.rope_theta / 10}}
        if self.arch == "phi3":  # Phi3Config's defaults: pad_token_id 32000 (> tiny vocab), no sliding window
            kwargs.update(pad_token_id=None, sliding_window=None)
        cfg = config_cls(**kwargs)
        cfg.dtype = self.dtype
        return cfg

    @property
    def model_class_name(self) -> str:
        return ARCH_CLASSES[self.arch][1]


@dataclass(frozen=True)
class QuantRecipe:
    """Everything needed to build the Quark QConfig and the export call.

    scheme / layer_config values are LLMTemplate scheme names (uint4_wo_64, int8, fp8, mxfp4, nvfp4, ...) or keys
    of CUSTOM_WEIGHT_ONLY_SCHEMES (hand-built QLayerConfigs registered with LLMTemplate.register_scheme).
    exclude=None keeps the template default (["lm_head"]); () quantizes everything.
    layer_config: ((name_or_fnmatch_pattern, scheme), ...) in Quark's precedence order.
    model_overrides: TinyModelSpec fields this recipe needs (e.g. (("tie_word_embeddings", True),)).
    """

    name: str
    scheme: str
    exclude: tuple[str, ...] | None = None
    layer_config: tuple[tuple[str, str], ...] = ()
    kv_cache_scheme: str | None = None
    attention_scheme: str | None = None
    weight_format: str = "real_quantized"
    pack_method: str = "reorder"
    model_overrides: tuple[tuple[str, object], ...] = ()

    def apply_to(self, spec: TinyModelSpec) -> TinyModelSpec:
        return dataclasses.replace(spec, **dict(self.model_overrides)) if self.model_overrides else spec

    @property
    def group_sizes(self) -> set[int]:
        names = [self.scheme] + [s for _, s in self.layer_config]
        return {g for n in names if (g := scheme_group_size(n))}


# name -> (dtype, qscheme, group_size, symmetric); weight-only schemes that LLMTemplate lacks
CUSTOM_WEIGHT_ONLY_SCHEMES: dict[str, tuple[str, str, int | None, bool]] = {
    "int8_wo_32": ("int8", "per_group", 32, True),
    "int8_wo_64": ("int8", "per_group", 64, True),
    "int8_wo_per_channel": ("int8", "per_channel", None, True),
    "uint8_wo_64": ("uint8", "per_group", 64, False),
    "uint8_wo_per_channel": ("uint8", "per_channel", None, False),
}
_FIXED_GROUP = {"mxfp4": 32, "nvfp4": 16, "mxfp4_weight_only": 32, "mxfp4_fp8": 32}


def scheme_group_size(scheme: str) -> int | None:
    if scheme in CUSTOM_WEIGHT_ONLY_SCHEMES:
        return CUSTOM_WEIGHT_ONLY_SCHEMES[scheme][2]
    tail = scheme.rsplit("_", 1)[-1]
    return int(tail) if tail.isdigit() else _FIXED_GROUP.get(scheme)


def _r(name: str, scheme: str, **kw) -> QuantRecipe:
    return QuantRecipe(name=name, scheme=scheme, **kw)


RECIPES: dict[str, QuantRecipe] = {
    r.name: r
    for r in [
        _r("uint4_g64", "uint4_wo_64"),
        _r("uint4_g32", "uint4_wo_32"),
        _r("uint4_g32_order", "uint4_wo_32", pack_method="order"),
        _r("uint4_g64_fake", "uint4_wo_64", weight_format="fake_quantized"),
        _r("int4_g64", "int4_wo_64"),
        _r("int4_g32", "int4_wo_32"),
        _r("int4_per_channel", "int4_wo_per_channel"),
        _r("uint4_per_channel", "uint4_wo_per_channel"),
        _r("int8_wo_g64", "int8_wo_64"),
        _r("int8_wo_g32", "int8_wo_32"),
        _r("int8_wo_per_channel", "int8_wo_per_channel"),
        _r("uint8_wo_g64", "uint8_wo_64"),
        _r("uint8_wo_per_channel", "uint8_wo_per_channel"),
        _r("lmhead_g32", "uint4_wo_64", exclude=(), layer_config=(("lm_head", "uint4_wo_32"),)),
        _r("down_proj_wildcard_g32", "uint4_wo_64", layer_config=(("*down_proj", "uint4_wo_32"),)),
        _r("excluded_layers", "uint4_wo_32", exclude=("model.layers.0.mlp.down_proj", "lm_head")),
        _r("tied_lmhead", "uint4_wo_64", exclude=(), model_overrides=(("tie_word_embeddings", True),)),
        _r("int8_w8a8", "int8"),
        _r("fp8_w8a8", "fp8"),
        _r("fp8_w8a8_kv", "fp8", kv_cache_scheme="fp8"),
        _r("uint4_g64_kv", "uint4_wo_64", kv_cache_scheme="fp8"),
        _r("uint4_g64_kv_attn", "uint4_wo_64", kv_cache_scheme="fp8", attention_scheme="fp8"),
        _r("fp8_w8a8_kv_attn", "fp8", kv_cache_scheme="fp8", attention_scheme="fp8"),
        _r("ptpc_fp8", "ptpc_fp8"),
        _r("mxfp4", "mxfp4"),
        _r("mxfp4_fp8", "mxfp4_fp8"),
        _r("mxfp4_kv", "mxfp4", kv_cache_scheme="fp8"),  # amd/Qwen3-235B-A22B-..._moe_w_mxfp4_a_mxfp4_kv_fp8  # MXFP4 weights, FP8 activations (amd/gpt-oss-120b-w-mxfp4-a-fp8)
        # MoE: expert 3 of every sparse layer left float (routed QMoE then does not apply: dense form)
        _r("uint4_g32_expert3_excluded", "uint4_wo_32", exclude=("lm_head", "*.gate", "*mlp.experts.3.*")),
        # MoE: routers not excluded (Quark's Qwen3-MoE / gpt-oss routers are nn.Linear subclasses once preprocessed;
        # measured: amd-quark 0.13 still leaves them float, and the export has no weight_scale for them)
        _r("uint4_g32_router_not_excluded", "uint4_wo_32", exclude=("lm_head",)),
        # amd/DeepSeek-R1-MXFP4's shape: attention MXFP4 too (only lm_head and the router float), FP8 KV cache
        _r("mxfp4_attn_kv", "mxfp4", exclude=("lm_head", "*mlp.gate"), kv_cache_scheme="fp8"),
        _r("nvfp4", "nvfp4"),
    ]
}

SHAPES: dict[str, TinyModelSpec] = {
    "llama_h64": TinyModelSpec(),
    "llama_h64_bf16": TinyModelSpec(dtype="bfloat16"),
    "llama_h64_fp16": TinyModelSpec(dtype="float16"),
    # hidden 96 is not a multiple of 64/128: only g32 (and per-channel, fp8, mxfp4, nvfp4) recipes fit
    "llama_h96": TinyModelSpec(hidden=96, intermediate=160, heads=6, kv_heads=2, head_dim=16),
    "llama_mha": TinyModelSpec(heads=4, kv_heads=4),
    "llama_bias": TinyModelSpec(attention_bias=True),
    "qwen2": TinyModelSpec(arch="qwen2"),
    "mistral": TinyModelSpec(arch="mistral"),
    # q/k RMSNorm per head; head_dim 32 != hidden/heads (q_proj 64 -> 128, o_proj 128 -> 64)
    "qwen3": TinyModelSpec(arch="qwen3", head_dim=32),
    # fused self_attn.qkv_proj [H*D + 2*Hkv*D] and mlp.gate_up_proj [2*intermediate], quantized as single modules;
    # seed 3: no greedy step emits eos (og.Generator stops there) and every top-2 margin is > 8e-3
    "phi3": TinyModelSpec(arch="phi3", seed=3),
    # head_dim 32: room for a partial rotary (rotary_dim 16) that ORT's GroupQueryAttention accepts
    "phi3_hd32": TinyModelSpec(arch="phi3", head_dim=32, seed=3),
    # sqrt(hidden) embedding scale, 4 (1 + w) norms per layer, GELU-tanh MLP, query_pre_attn_scalar, attention and
    # final logit softcaps, sliding window 4 on layer 0 (GEMMA_KWARGS)
    "gemma2": TinyModelSpec(arch="gemma2", head_dim=16),
    # + q/k norms, local rope theta on the windowed layer, linear rope scaling on the global one
    "gemma3": TinyModelSpec(arch="gemma3_text", head_dim=16),
    # sparse MoE, 4 experts top-2; Quark quantizes the per-expert linears that preprocess_for_quantization makes
    "mixtral": TinyModelSpec(arch="mixtral", intermediate=64),
    # MLA + grouped sigmoid routing + shared expert + a first dense layer (DEEPSEEK_VARIANTS)
    "deepseek_v3": TinyModelSpec(arch="deepseek_v3"),
    "deepseek_v3_qproj_yarn": TinyModelSpec(arch="deepseek_v3", variant="qproj_yarn"),
    # 8 experts top-2 (width 64), per-head q/k norms, head_dim 32; 3 layers: layer 1 a dense MLP (width 128)
    # through mlp_only_layers; renormalized top-k (norm_topk_prob true)
    "qwen3_moe": TinyModelSpec(arch="qwen3_moe", head_dim=32, layers=3, config_overrides=(("mlp_only_layers", (1,)),)),
    # raw top-k softmax weights (norm_topk_prob false) and the dense layer from decoder_sparse_step 2 (layers 0, 2
    # dense, layer 1 sparse)
    "qwen3_moe_raw": TinyModelSpec(arch="qwen3_moe", head_dim=32, layers=3, seed=2, config_overrides=(
        ("norm_topk_prob", False), ("decoder_sparse_step", 2))),
    # Qwen2-MoE: q/k/v bias, no q/k norms, a shared expert (width 96) weighted by sigmoid(shared_expert_gate)
    "qwen2_moe": TinyModelSpec(arch="qwen2_moe", layers=2, seed=1),
    # gpt-oss: attention sinks, alternating sliding/full attention, biases everywhere, clamped SwiGLU experts
    # (fused interleaved gate_up_proj per expert, as Quark's QuarkGptOssExperts makes them), router with bias
    "gpt_oss": TinyModelSpec(arch="gpt_oss", intermediate=64, head_dim=16),
    # + yarn rope as gpt-oss checkpoints have it (truncate false), scaled to the tiny context
    "gpt_oss_yarn": TinyModelSpec(arch="gpt_oss", intermediate=64, head_dim=16, config_overrides=(("rope_parameters", (
        ("rope_type", "yarn"), ("factor", 4.0), ("beta_fast", 32.0), ("beta_slow", 1.0),
        ("original_max_position_embeddings", 64), ("truncate", False), ("rope_theta", 10000.0))),)),
}

# docs/moe.md's table: every MoE family x expert scheme (recipe names above) that the MoE tests, the MIGraphX ref
# comparison (tools/migraphx_ref_compare.py) and the forms table (benchmarks/moe_forms_table.py) cover.
MOE_TABLE: dict[str, tuple[str, ...]] = {
    "qwen3_moe": ("uint4_g32", "int4_per_channel", "int8_wo_g32", "mxfp4", "mxfp4_fp8", "fp8_w8a8", "nvfp4",
                  "int8_w8a8"),
    "qwen2_moe": ("uint4_g32", "mxfp4", "fp8_w8a8", "nvfp4", "int8_w8a8"),
    "mixtral": ("uint4_g32", "int4_per_channel", "mxfp4", "fp8_w8a8", "nvfp4", "int8_w8a8"),
    "gpt_oss": ("uint4_g32", "int4_per_channel", "int8_wo_g32", "mxfp4", "mxfp4_fp8", "fp8_w8a8", "nvfp4",
                "int8_w8a8"),
    "deepseek_v3": ("uint4_g32", "mxfp4"),
}


def combo_problem(spec: TinyModelSpec, recipe: QuantRecipe) -> str | None:
    """Why this (spec, recipe) cannot make a valid export, or None. Group sizes must divide every in-features."""
    spec = recipe.apply_to(spec)
    in_features = {spec.hidden, spec.intermediate, spec.heads * (spec.head_dim or spec.hidden // spec.heads)}
    if spec.arch == "deepseek_v3":  # q_lora_rank, kv_lora_rank and H * v_head_dim are multiples of 32 here
        in_features = {spec.hidden, spec.intermediate, DEEPSEEK_COMMON["moe_intermediate_size"]}
    bad = sorted((g, n) for g in recipe.group_sizes for n in in_features if n % g)
    if bad:  # Quark raises "... is not divisible by group_size=64"
        return f"group sizes do not divide in-features (group, in): {bad}"
    schemes = {recipe.scheme} | {s for _, s in recipe.layer_config}
    if any(s.startswith("mxfp4") for s in schemes) and spec.dtype != "float32":
        return "amd-quark 0.13 on CPU: 'qdq_mxfp4 is only implemented in CUDA devices!' for bf16/fp16 models"
    return None


# ----------------------------------------------------------------------------------------------- cache

def cache_key(spec: TinyModelSpec, recipe: QuantRecipe, prompt_len: int = 8, new_tokens: int = 16) -> str:
    spec_fields = dataclasses.asdict(spec)
    if not spec_fields["variant"]:  # keeps the keys of every export made before the field existed
        del spec_fields["variant"]
    if not spec_fields["config_overrides"]:  # keys of the specs made before the field existed stay as they were
        del spec_fields["config_overrides"]
    if spec.arch == "deepseek_v3":  # its settings live in module dicts, not in spec fields
        spec_fields["arch_config"] = {**DEEPSEEK_COMMON, **DEEPSEEK_VARIANTS[spec.variant]}
    blob = json.dumps(
        dict(spec=spec_fields, recipe=dataclasses.asdict(recipe), version=FACTORY_VERSION,
             prompt_len=prompt_len, new_tokens=new_tokens),
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def export_dir_for(root: str | Path, spec: TinyModelSpec, recipe: QuantRecipe, prompt_len=8, new_tokens=16) -> Path:
    arch = f"{spec.arch}_{spec.variant}" if spec.variant else spec.arch
    return Path(root) / f"{recipe.name}-{arch}-h{spec.hidden}-{spec.dtype}-{cache_key(spec, recipe, prompt_len, new_tokens)}"


def is_complete(out_dir: Path) -> bool:
    return (out_dir / "info.json").is_file()


def make_many(root: str | Path, items: Iterable[tuple[TinyModelSpec, QuantRecipe]], prompt_len: int = 8,
              new_tokens: int = 16, raise_on_error: bool = True) -> list[Path | None]:
    """Make (in this process) every export not cached yet under root; returns their dirs (None = failed)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    paths: list[Path | None] = []
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for spec, recipe in items:
            out = export_dir_for(root, spec, recipe, prompt_len, new_tokens)
            if not is_complete(out):
                try:
                    make_export(out, spec, recipe, prompt_len, new_tokens)
                except Exception as exc:  # noqa: BLE001 - recorded for the matrix, re-raised for tests
                    (root / "_failures").mkdir(exist_ok=True)
                    (root / "_failures" / f"{out.name}.txt").write_text(f"{type(exc).__name__}: {exc}\n")
                    if raise_on_error:
                        raise
                    out = None
            paths.append(out)
    return paths


def _export_job(root, items, prompt_len, new_tokens, importer_refs) -> dict | None:
    """The subprocess job that makes what of `items` (and their importer references) is missing; None: nothing."""
    paths = [export_dir_for(root, s, r, prompt_len, new_tokens) for s, r in items]
    missing = [(s, r) for (s, r), p in zip(items, paths) if not is_complete(p)]
    from quark_importer_reference import CACHE_NAME
    wanted_refs = set(importer_refs)
    refs = [str(p) for item, p in zip(items, paths) if item in wanted_refs and not (p / CACHE_NAME).is_file()]
    if not (missing or refs):
        return None
    return dict(root=str(root), prompt_len=prompt_len, new_tokens=new_tokens, importer_refs=refs,
                items=[dict(spec=dataclasses.asdict(s), recipe=dataclasses.asdict(r)) for s, r in missing])


def start_exports(root: str | Path, items: list[tuple[TinyModelSpec, QuantRecipe]], log, prompt_len=8,
                  new_tokens=16, importer_refs=()) -> subprocess.Popen | None:
    """ensure_exports' subprocess, started without waiting for it (output to the open file `log`); None when
    everything is cached. Its make_many holds the cache lock, so an ensure_exports meanwhile waits for it."""
    job = _export_job(root, items, prompt_len, new_tokens, importer_refs)
    if job is None:
        return None
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "job", "-"], stdin=subprocess.PIPE,
                            stdout=log, stderr=subprocess.STDOUT, text=True, env=_quiet_env())
    proc.stdin.write(json.dumps(job))
    proc.stdin.close()
    return proc


def ensure_exports(root: str | Path, items: list[tuple[TinyModelSpec, QuantRecipe]], prompt_len=8,
                   new_tokens=16, timeout_s: float = 900, importer_refs=()) -> list[Path]:
    """Like make_many, but makes missing exports in a subprocess (Quark is never imported by the caller).

    importer_refs: items (of `items`) that also get Quark's importer reference (tests/quark_importer_reference.py),
    made in the same subprocess: one amd-quark import (~30 CPU s, most of it Quark scanning transformers' modeling
    files at import) instead of one more."""
    paths = [export_dir_for(root, s, r, prompt_len, new_tokens) for s, r in items]
    job = _export_job(root, items, prompt_len, new_tokens, importer_refs)
    if job is not None:
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "job", "-"], input=json.dumps(job),
                              text=True, capture_output=True, timeout=timeout_s, env=_quiet_env())
        if proc.returncode != 0:
            raise RuntimeError(f"quark_factory subprocess failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}")
    for p in paths:
        if not is_complete(p):
            raise RuntimeError(f"export {p} was not produced")
    return paths


def _quiet_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("QUARK_LOG_LEVEL", "error")
    env.setdefault("TQDM_DISABLE", "1")
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    # Quark torch.compiles its fake-quant per scheme/rank/dtype and silently goes eager for the rest of the process
    # once Dynamo's recompile limit is hit: eager everywhere makes an export independent of what else its process
    # made, and the compiles cost ~10x the exports (measured: 3 exports 10.3 s compiled, 0.5 s eager).
    env.setdefault("QUARK_DISABLE_COMPILE", "1")
    # tiny models: a second intra-op thread only adds synchronisation (2 threads on a busy 2-core box: 5 ms/Linear)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def recipe_from_dict(d: dict) -> QuantRecipe:
    d = dict(d)
    d["exclude"] = None if d.get("exclude") is None else tuple(d["exclude"])
    d["layer_config"] = tuple(tuple(x) for x in d.get("layer_config", ()))
    d["model_overrides"] = tuple(tuple(x) for x in d.get("model_overrides", ()))
    return QuantRecipe(**d)


# ---------------------------------------------------------------------------------------- making one

def _register_custom_schemes() -> None:
    from quark.torch import LLMTemplate
    from quark.torch.quantization.config import config as qc

    spec_classes = {
        ("int8", "per_group"): qc.Int8PerGroupSpec, ("int8", "per_channel"): qc.Int8PerChannelSpec,
        ("uint8", "per_group"): qc.Uint8PerGroupSpec, ("uint8", "per_channel"): qc.Uint8PerChannelSpec,
    }
    for name, (dtype, qscheme, group, symmetric) in CUSTOM_WEIGHT_ONLY_SCHEMES.items():
        if name in LLMTemplate.get_supported_schemes():
            continue
        kwargs = dict(symmetric=symmetric, scale_type="float", round_method="half_even", is_dynamic=False)
        if qscheme == "per_group":
            kwargs.update(ch_axis=-1, group_size=group)
        else:
            kwargs.update(ch_axis=0)
        weight = spec_classes[(dtype, qscheme)](**kwargs).to_quantization_spec()
        LLMTemplate.register_scheme(name, config=qc.QLayerConfig(weight=weight))


def build_quant_config(spec: TinyModelSpec, recipe: QuantRecipe):
    """The Quark QConfig for this recipe, from LLMTemplate.get(arch).get_config(...)."""
    from quark.torch import LLMTemplate

    _register_custom_schemes()
    kwargs: dict = dict(scheme=recipe.scheme)
    if recipe.exclude is not None:
        kwargs["exclude_layers"] = list(recipe.exclude)
    if recipe.layer_config:
        kwargs["layer_config"] = dict(recipe.layer_config)
    if recipe.kv_cache_scheme:
        kwargs["kv_cache_scheme"] = recipe.kv_cache_scheme
    if recipe.attention_scheme:
        kwargs["attention_scheme"] = recipe.attention_scheme
    return LLMTemplate.get(spec.arch).get_config(**kwargs)


def _is_weight_only(qconfig) -> bool:
    layer_cfgs = [qconfig.global_quant_config, *qconfig.layer_quant_config.values(),
                  *qconfig.layer_type_quant_config.values()]
    return (not qconfig.kv_cache_quant_config and qconfig.softmax_quant_spec is None
            and all(c.input_tensors is None and c.output_tensors is None for c in layer_cfgs))


def _new_model(spec: TinyModelSpec, torch_dtype, tie: bool | None = None):
    import torch
    import transformers

    cfg = spec.hf_config()
    if tie is not None:
        cfg.tie_word_embeddings = tie
    # _from_config builds in cfg.dtype; .to() makes the fp32 reference really fp32
    model = getattr(transformers, spec.model_class_name)._from_config(cfg, attn_implementation="eager")
    if spec.arch in GEMMA_KWARGS:  # HF inits Gemma norms to 0 (scale 1 + 0): random ones test the 1 + w
        gen = torch.Generator().manual_seed(spec.seed + 100)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.copy_(0.3 * torch.randn(p.shape, generator=gen))
    if spec.arch == "deepseek_v3":  # HF inits e_score_correction_bias to 0: a random one tests that it only chooses
        gen = torch.Generator().manual_seed(spec.seed + 200)
        with torch.no_grad():
            for name, b in model.named_buffers():
                if name.endswith("e_score_correction_bias"):
                    b.copy_(0.5 * torch.randn(b.shape, generator=gen))
    if spec.arch == "gpt_oss":  # sinks of a visible size, and non-zero expert/router/attention biases
        gen = torch.Generator().manual_seed(spec.seed + 100)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("sinks"):
                    p.copy_(torch.randn(p.shape, generator=gen))
                elif name.endswith("bias"):
                    p.copy_(0.3 * torch.randn(p.shape, generator=gen))
    return model.to(torch_dtype).eval().requires_grad_(False)


def _split_experts(model, spec: TinyModelSpec):
    """MoE models: Quark's own preprocess (what its LLM PTQ flow runs) turns transformers 5's fused 3-D expert
    parameters into one nn.Linear per expert and projection, the modules it quantizes and exports."""
    if spec.arch in MOE_ARCHS:
        from quark.torch.utils.llm.model_preparation import preprocess_for_quantization
        preprocess_for_quantization(model)
    return model


def forward_logits(model, ids):
    import torch

    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits.float()


def torch_greedy(model, ids, new_tokens: int):
    """Greedy continuation recomputing the whole sequence each step (no KV cache); eos is not a stop.
    Returns (token ids, top-1 minus top-2 logit margin of each step)."""
    import torch

    seq = ids
    out = []
    margins = []
    for _ in range(new_tokens):
        last = forward_logits(model, seq)[0, -1]
        top2 = torch.topk(last, 2).values
        margins.append(float(top2[0] - top2[1]))
        nxt = int(torch.argmax(last))
        out.append(nxt)
        seq = torch.cat([seq, torch.tensor([[nxt]], dtype=seq.dtype)], dim=1)
    return out, margins


def build_export(out: Path, spec: TinyModelSpec, recipe: QuantRecipe, prompt_len: int, new_tokens: int) -> dict:
    import numpy as np
    import torch
    from torch.utils.data import DataLoader

    t0 = time.time()
    from quark.torch import ModelQuantizer, export_safetensors
    from transformers import GenerationConfig

    from tiny_tokenizer import write_tokenizer

    t_import = time.time() - t0
    problem = combo_problem(spec, recipe)
    if problem:
        raise ValueError(f"{recipe.name} on {spec}: {problem}")
    dtype = getattr(torch, spec.dtype)
    torch.manual_seed(spec.seed)
    model = _new_model(spec, dtype)
    gen = torch.Generator().manual_seed(spec.seed + 1)
    input_ids = torch.randint(3, spec.vocab, (1, prompt_len), generator=gen)
    calib = [torch.randint(3, spec.vocab, (1, 16), generator=gen) for _ in range(4)]
    float_logits = forward_logits(model, input_ids)
    model.save_pretrained(out / "float")
    write_tokenizer(out / "float", spec.vocab, spec.max_position_embeddings)

    t1 = time.time()
    qconfig = build_quant_config(spec, recipe)
    model = _split_experts(model, spec)
    quantizer = ModelQuantizer(qconfig)
    model = quantizer.quantize_model(model, DataLoader(calib, batch_size=None))
    model = quantizer.freeze(model)
    t_quant = time.time() - t1

    # Quark's own dequantized weights: after freeze, QuantLinear.weight holds the fake-quantized value
    dequant = {}
    for name, mod in model.named_modules():
        if getattr(mod, "_weight_quantizer", None) is not None:
            dequant[name] = mod.get_quant_weight(mod.weight).detach().float().numpy().copy()
    logits = forward_logits(model, input_ids)
    greedy, margins = torch_greedy(model, input_ids, new_tokens)

    # PyTorch fp32 model on Quark's dequantized weights (untied: a quantized lm_head is its own tensor)
    plain = _split_experts(_new_model(spec, torch.float32, tie=False), spec)
    params = {n: p.detach().float() for n, p in model.named_parameters()}
    # not model.weight: for two-stage schemes (nvfp4) freeze leaves the float weight there
    params.update({f"{name}.weight": torch.from_numpy(w) for name, w in dequant.items()})
    plain_state = plain.state_dict()  # persistent buffers too (DeepSeek's e_score_correction_bias)
    params.update({n: b.detach().float() for n, b in model.named_buffers() if n in plain_state and n not in params})
    if "lm_head.weight" not in params:
        params["lm_head.weight"] = params["model.embed_tokens.weight"]
    missing, unexpected = plain.load_state_dict(params, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"plain reference model: missing={missing} unexpected={unexpected}")
    dequant_logits = forward_logits(plain, input_ids)
    dequant_greedy, dequant_margins = torch_greedy(plain, input_ids, new_tokens)
    weight_only = _is_weight_only(qconfig)
    wo_diff = float((dequant_logits - logits).abs().max())
    if weight_only and spec.dtype == "float32" and wo_diff > 1e-5:
        raise AssertionError(f"{recipe.name}: Quark frozen forward != fp32 model on dequantized weights ({wo_diff})")

    t2 = time.time()
    with torch.no_grad():
        export_safetensors(model, out / "quark", custom_mode="quark", weight_format=recipe.weight_format,
                           pack_method=recipe.pack_method)
    t_export = time.time() - t2
    write_tokenizer(out / "quark", spec.vocab, spec.max_position_embeddings)
    GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_ID, do_sample=False).save_pretrained(out / "quark")
    check_export(out / "quark", spec, recipe, set(dequant))

    np.savez(out / "reference.npz", input_ids=input_ids.numpy().astype(np.int64), logits=logits.numpy(),
             greedy=np.asarray(greedy, dtype=np.int64), greedy_margins=np.asarray(margins, dtype=np.float32),
             float_logits=float_logits.numpy(),
             dequant_logits=dequant_logits.numpy(), dequant_greedy=np.asarray(dequant_greedy, dtype=np.int64),
             dequant_greedy_margins=np.asarray(dequant_margins, dtype=np.float32))
    np.savez(out / "quark_dequant.npz", **dequant)
    return dict(
        seconds=dict(import_=round(t_import, 2), quantize=round(t_quant, 2), export=round(t_export, 2),
                     total=round(time.time() - t0, 2)),
        quantized_modules=sorted(dequant),
        checks=dict(weight_only=weight_only, quark_vs_dequant_fp32_max_abs=wo_diff,
                    quant_vs_float_max_abs=float((logits - float_logits).abs().max()),
                    greedy_min_top2_margin=round(min(margins), 6)),
    )


_EXPECTED_WEIGHT_DTYPE = {"int4": "I32", "uint4": "I32", "int8": "I8", "uint8": "U8", "fp8_e4m3": "F8_E4M3",
                          "fp4": "U8"}
_SAFETENSORS_DTYPE = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


def check_export(quark_dir: Path, spec: TinyModelSpec, recipe: QuantRecipe, quantized: set[str]) -> None:
    """Raise if the export is not what the recipe asked for (weight dtypes, exclusions, export options)."""
    from independent_decode import read_config, resolve_weight_spec, safetensors_index

    cfg = read_config(quark_dir)
    qcfg = cfg["quantization_config"]
    problems = []
    if qcfg.get("quant_method") != "quark":
        problems.append(f"quant_method={qcfg.get('quant_method')!r}")
    for key in ("weight_format", "pack_method"):
        if qcfg["export"][key] != getattr(recipe, key):
            problems.append(f"export.{key}={qcfg['export'][key]!r}, recipe asked {getattr(recipe, key)!r}")
    index = safetensors_index(quark_dir)
    model_dtype = _SAFETENSORS_DTYPE[spec.dtype]
    for name in sorted({k.rsplit(".", 1)[0] for k in index if k.endswith(".weight")}):
        weight_dtype = index[f"{name}.weight"][0]
        has_scale = f"{name}.weight_scale" in index
        if name in quantized:
            wspec = resolve_weight_spec(qcfg, name)
            first = wspec[0] if isinstance(wspec, list) else wspec
            want = model_dtype if recipe.weight_format == "fake_quantized" else _EXPECTED_WEIGHT_DTYPE[first["dtype"]]
            if weight_dtype != want or not has_scale:
                problems.append(f"{name}: weight {weight_dtype} (want {want}), weight_scale present={has_scale}")
        elif has_scale or weight_dtype != model_dtype:
            problems.append(f"{name}: not quantized in Quark but weight {weight_dtype}, weight_scale={has_scale}")
    for pattern in recipe.exclude or ():
        if pattern in quantized:
            problems.append(f"{pattern} was asked to be excluded but is quantized")
    if recipe.kv_cache_scheme and not any(k.endswith(("k_proj.output_scale", "kv_b_proj.output_scale"))
                                          for k in index):  # kv_b_proj: DeepSeek's MLA (Quark template)
        problems.append("kv_cache_scheme set but no k_proj.output_scale (nor kv_b_proj.output_scale)")
    if recipe.attention_scheme and not any(k.endswith("prob_output_scale") for k in index):
        problems.append("attention_scheme set but no self_attn.prob_output_scale")
    if problems:
        raise AssertionError(f"export {quark_dir} ({recipe.name}) is not what was asked:\n  " + "\n  ".join(problems))


def make_export(out_dir: str | Path, spec: TinyModelSpec, recipe: QuantRecipe, prompt_len: int = 8,
                new_tokens: int = 16) -> Path:
    """Build, quantize, export and reference one tiny model into out_dir (overwritten). Returns out_dir."""
    for k, v in _quiet_env().items():
        os.environ.setdefault(k, v)
    out = Path(out_dir)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    info = build_export(out, recipe.apply_to(spec), recipe, prompt_len, new_tokens)
    info.update(spec=dataclasses.asdict(spec), recipe=dataclasses.asdict(recipe), factory_version=FACTORY_VERSION)
    (out / "info.json").write_text(json.dumps(info, indent=1, default=str))
    return out


def _main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make")
    mk.add_argument("--root", required=True)
    mk.add_argument("--shape", action="append", default=[])
    mk.add_argument("--recipe", action="append", default=[])
    mx = sub.add_parser("matrix")
    mx.add_argument("--root", required=True)
    jb = sub.add_parser("job")
    jb.add_argument("file")
    args = ap.parse_args(argv)
    for k, v in _quiet_env().items():
        os.environ.setdefault(k, v)
    t0 = time.time()
    if args.cmd == "job":
        job = json.loads(sys.stdin.read() if args.file == "-" else Path(args.file).read_text())
        items = [(TinyModelSpec(**it["spec"]), recipe_from_dict(it["recipe"])) for it in job["items"]]
        make_many(job["root"], items, job["prompt_len"], job["new_tokens"])
        if job.get("importer_refs"):
            from quark_importer_reference import make_all
            make_all([Path(d) for d in job["importer_refs"]])
        return 0
    if args.cmd == "matrix":
        shapes, recipes = list(SHAPES), list(RECIPES)
    else:
        shapes, recipes = args.shape or ["llama_h64"], args.recipe or ["uint4_g64"]
    for shape in shapes:
        for rname in recipes:
            spec, recipe = SHAPES[shape], RECIPES[rname]
            problem = combo_problem(spec, recipe)
            if problem:
                print(f"{shape:16s} {rname:24s} SKIP {problem}", flush=True)
                continue
            t = time.time()
            [path] = make_many(args.root, [(spec, recipe)], raise_on_error=False)
            status = "ok" if path else "FAIL " + _last_failure(args.root, spec, recipe)
            extra = ""
            if path:
                checks = json.loads((path / "info.json").read_text())["checks"]
                extra = " ".join(f"{k}={v}" for k, v in checks.items())
            print(f"{shape:16s} {rname:24s} {status} {time.time() - t:.1f}s {extra}", flush=True)
    print(f"total {time.time() - t0:.1f}s")
    return 0


def _last_failure(root, spec, recipe) -> str:
    f = Path(root) / "_failures" / f"{export_dir_for(root, spec, recipe).name}.txt"
    return f.read_text().strip().splitlines()[0][:200] if f.exists() else "?"


if __name__ == "__main__":
    sys.exit(_main())
