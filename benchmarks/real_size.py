"""Real-size CPU outputs of the published Quark schemes: the compact default against the old fp32-dense form.

    python benchmarks/real_size.py [--work DIR] [--layers 2] [--vocab 32000|proportional] [--rounds 2]
                                   [--only fp8_kv,...,qwen3_moe_mxfp4,gpt_oss_mxfp4_fp8,...] [--max_gib 8]
                                   [--no_dense]

For each release shape it writes a layer-sliced, format-exact synthetic Quark export (the tensor names, dtypes, shapes
and quantization_config of a real amd-quark export of that scheme: benchmarks/real_size_quant_configs.json holds the
configs amd-quark wrote for the tiny test fixtures, tests/quark_factory.py; random weights), converts it for `-e cpu`
twice, with the default (compact) and with `--extra_options custom_ops_library=none` (the dense fp32 forms of
before), and loads each in onnxruntime-genai in a fresh process, the two forms interleaved (A, B, A, B).

Per row: output / export bytes extrapolated to the full model (per-layer bytes x the real depth, vocabulary-sized
tensors x the real vocabulary; the runtime slice uses a smaller vocabulary to stay under 5 GiB); load and decode
RSS (VmHWM after load / after decoding; "session / output": the decode peak less the process's RSS before the model
was loaded, over the output's bytes); decode tok/s and prefill ms (128 tokens) as measured on the slice, and as
ratios to the fp32-dense form of the same run; GB/s streamed at decode (the bytes the session's weights hold per
token, the embedding excepted, times tok/s) and that as a share of the machine's plain memory-read bandwidth measured
in the same run (a C loop over 1 GiB, 1 and 2 threads, before and after, best; og runs a thread per physical core,
genai_config intra_op_num_threads 0 since 2026-12-05, so the share is of the 2-thread read; before that og ran one
thread on 2-vCPU machines). Writes benchmarks/results/real_size.{json,md}.

Shapes (public configs): Llama-3.1-8B (hidden 4096, intermediate 14336, 32 layers, 32/8 heads, vocab 128256) as
FP8 W8A8 + FP8 KV (amd/Llama-3.1-8B-Instruct-FP8-KV's scheme), PTPC FP8, NVFP4, MXFP4 and INT8 W8A8.
MoE (write_moe_export: amd-quark's per-expert layout, checked against its own tiny exports by
tests/test_real_size_moe.py): gpt-oss-20b (hidden 2880, 24 layers, 32 experts top-4 of width 2880, 64/8 heads of 64,
vocab 201088, sinks, sliding window 128 on alternate layers, clamped SwiGLU, biases) as MXFP4 (amd-quark's mxfp4
template: every linear but lm_head and the routers), and Qwen3-30B-A3B (hidden 2048, 48 layers, 128 experts top-8 of
width 768, 32/4 heads of 128, vocab 151936, norm_topk_prob) as uint4 g32 (asymmetric, weight-only: the test
factory's uint4_g32) and MXFP4; both also as mxfp4_fp8 (MXFP4 weights, static FP8 activations: the *_mxfp4_fp8
rows), and Qwen3-30B-A3B as FP8 W8A8 + FP8 KV (qwen3_moe_fp8_kv: MatMulExpertsFp8) and NVFP4 (qwen3_moe_nvfp4:
MatMulExpertsNvfp4R16). Their cpu default: com.quark_onnx MatMulExpertsMxfp4 for MXFP4 experts (MatMulExpertsMxfp4R16, the 16-row
tiles, where A is float: mxfp4_fp8),
MatMulExpertsUint4 at accuracy_level 1 (exact) for uint4 experts and MatMulUint4 (exact) for their attention
(builder/ops/moe.py; the uint4 rows also run int4_experts=qmoe, one com.microsoft QMoE per layer, and
accuracy_level=4: int8 activations in the experts op and MatMulNBits, the default before 2026-12-05). What
custom_ops_library=none gives them is not fp32-dense experts: MXFP4 experts take the routed standard-op form (the stacked bytes decoded in standard ops;
attention fp32), uint4 experts take QMoE and the attention MatMulNBits (4-bit integer weights never had an fp32 CPU
form). `--vocab proportional` (the release's vocabulary x --layers / its depth) keeps the
lm_head's share of a token's bytes and of the RSS as in the full model. Each og run gets an address-space limit
(--max_gib); a form whose 128-token prefill does not fit is rerun with a 1-token prompt (decode only) and its
prefill reported as not measured.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]
from synthetic_quark_export import BF16, SAFETENSORS_NAMES, eager, normal_bf16, save_shard  # noqa: E402
from run_record import command_line  # noqa: E402

SAFETENSORS_NAMES.update({np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3", np.dtype(np.uint8): "U8",
                          np.dtype(np.int8): "I8"})  # the writer's dtype table, with the quantized dtypes

CONFIGS = json.loads((REPO / "benchmarks" / "real_size_quant_configs.json").read_text())
LLAMA_8B = dict(hidden=4096, inter=14336, layers=32, heads=32, kv_heads=8, vocab=128256)
PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
               "mlp.up_proj", "mlp.down_proj")


def _scalar(value: float) -> np.ndarray:
    return np.array(value, np.float32)


def _fp8(rng, n: int, k: int, per_channel: bool) -> np.ndarray:
    """e4m3fn codes as Quark's FP8 export makes them: a Gaussian weight divided by its scale max|w| / 448 (per tensor
    or per output channel) and cast. Uniformly random codes would make 1 in 16 codes zero or subnormal, which almost
    never happens in a quantized weight (|w| < 2^-6 of the scale, about 4e-5 of the max) and which sends a 32-element
    chunk of the CPU kernel's decode down its slower exact route (qo_cpu_kernels.c): with random codes nearly every
    chunk did, and the FP8 rows measured that route, not the one real weights take."""
    w = rng.standard_normal((n, k), dtype=np.float32)
    amax = np.abs(w).max(axis=1, keepdims=True) if per_channel else np.abs(w).max()
    return (w / (amax / np.float32(448))).astype(ml_dtypes.float8_e4m3fn)


def linear_tensors(scheme: str, rng, proj: str, n: int, k: int) -> dict[str, np.ndarray]:
    """The tensors amd-quark writes for one nn.Linear of this scheme (names, dtypes and shapes of the fixtures)."""
    if scheme in ("fp8_kv", "ptpc"):
        t = {"weight": _fp8(rng, n, k, per_channel=scheme == "ptpc")}
        if scheme == "ptpc":  # per-channel weight, dynamic per-token activation: no input scale
            t["weight_scale"] = rng.uniform(2e-5, 1e-4, n).astype(np.float32)
        else:
            t["weight_scale"], t["input_scale"] = _scalar(5e-5), _scalar(0.02)
            if proj in ("self_attn.k_proj", "self_attn.v_proj"):
                t["output_scale"] = _scalar(0.05)
        return t
    if scheme == "int8":
        return {"weight": rng.integers(-127, 128, size=(n, k), dtype=np.int8), "weight_scale": _scalar(2e-4),
                "weight_zero_point": np.array(0, np.int8), "input_scale": _scalar(0.02),
                "input_zero_point": np.array(0, np.int8)}
    packed = rng.integers(0, 256, size=(n, k // 2), dtype=np.uint8)
    if scheme in ("mxfp4", "mxfp4_fp8"):
        t = {"weight": packed, "weight_scale": rng.integers(118, 124, size=(n, k // 32), dtype=np.uint8)}
        if scheme == "mxfp4_fp8":  # static per-tensor FP8 activations: amax / 448 of an input of amax about 9
            t["input_scale"] = _scalar(0.02)
        return t
    assert scheme == "nvfp4"
    block = rng.uniform(0.5, 8.0, size=(n, k // 16)).astype(ml_dtypes.float8_e4m3fn)
    return {"weight": packed, "weight_scale": block, "weight_scale_2": _scalar(2e-3), "input_scale_2": _scalar(0.01)}


# the form each row is compared with: --extra_options custom_ops_library=none, the CPU forms of before the compact
# default. For dense linears those are fp32 (FP8 / INT8 weights dequantized, FP4 decoded at load); MXFP4 experts
# without the library take the routed standard-op form (their stacked checkpoint bytes, decoded in standard ops);
# 4-bit integer weights were never fp32 there: MatMulNBits and QMoE experts, only lm_head / embedding fp32
def baseline_form(scheme: str) -> str:
    kind, shape = SCHEMES[scheme][0], SCHEMES[scheme][3]
    if kind == "uint4":
        return "no library (custom_ops_library=none: QMoE, MatMulNBits, fp32 lm_head)"
    if "arch" in shape:
        return "no library (custom_ops_library=none: standard-op routed experts, fp32 attention)"
    return "fp32-dense (custom_ops_library=none)"


# the compact form asked for explicitly: the default chooses it only where the shipped library has the op's kernel
# (builder/compact_forms.py missing_kernels); this run measures the form either way and says which ran. uint4: the
# cpu default itself (MatMulUint4 linears, MatMulExpertsUint4 experts), no option
COMPACT_OPTION = {"fp8_kv": ["fp8_linear=compact"], "ptpc": ["fp8_linear=compact"], "int8": ["int8_linear=compact"],
                  "mxfp4": ["fp4_linear=compact"], "mxfp4_fp8": ["fp4_linear=compact"], "nvfp4": ["fp4_linear=compact"],
                  "uint4": []}
# uint4 MoE rows: also --extra_options int4_experts=qmoe (QMoE instead of MatMulExpertsUint4: the default before
# 2026-12-05, and the form without the library; docs/moe.md)
INT4_EXPERTS_FORM = "int4_experts=qmoe (QMoE, MatMulUint4)"
# the default before 2026-12-05: int8 activations (MatMulExpertsUint4 and MatMulNBits at accuracy_level 4)
INT8_ACT_FORM = "accuracy_level=4 (MatMulExpertsUint4 and MatMulNBits: int8 activations)"
# MoE release shapes (public configs); moe_inter: the expert width
QWEN3_30B_A3B = dict(arch="qwen3_moe", hidden=2048, inter=6144, moe_inter=768, layers=48, heads=32, kv_heads=4,
                     head_dim=128, vocab=151936, experts=128, top_k=8)
GPT_OSS_20B = dict(arch="gpt_oss", hidden=2880, inter=2880, moe_inter=2880, layers=24, heads=64, kv_heads=8,
                   head_dim=64, vocab=201088, experts=32, top_k=4)
SCHEMES = {  # row name -> (synthetic scheme, config key of real_size_quant_configs.json, release it stands for, shape)
    "fp8_kv": ("fp8_kv", "fp8_w8a8_kv", "Llama-3.1-8B FP8 W8A8 + FP8 KV", LLAMA_8B),
    "ptpc": ("ptpc", "ptpc_fp8", "Llama-3.1-8B PTPC FP8", LLAMA_8B),
    "nvfp4": ("nvfp4", "nvfp4", "Llama-3.1-8B NVFP4", LLAMA_8B),
    "mxfp4": ("mxfp4", "mxfp4", "Llama-3.1-8B MXFP4 (dense stand-in for gpt-oss's MXFP4 linears)", LLAMA_8B),
    "int8": ("int8", "int8_w8a8", "Llama-3.1-8B INT8 W8A8", LLAMA_8B),
    "gpt_oss_mxfp4": ("mxfp4", "mxfp4", "gpt-oss-20b MXFP4 (experts and attention)", GPT_OSS_20B),
    "qwen3_moe_uint4": ("uint4", "uint4_g32", "Qwen3-30B-A3B uint4 g32", QWEN3_30B_A3B),
    "qwen3_moe_mxfp4": ("mxfp4", "mxfp4", "Qwen3-30B-A3B MXFP4", QWEN3_30B_A3B),
    # amd-quark's mxfp4_fp8 template (w_mxfp4_a_fp8): MXFP4 weights, static per-tensor FP8 activations; float A,
    # so the cpu default takes the 16-row FP4 tiles (MatMulExpertsMxfp4R16, MatMulMxfp4R16)
    # FP8 W8A8 + FP8 KV experts (amd-quark's fp8_w8a8_kv template; AMD's Mixtral FP8-KV releases are this scheme)
    "qwen3_moe_fp8_kv": ("fp8_kv", "fp8_w8a8_kv", "Qwen3-30B-A3B FP8 W8A8 + FP8 KV", QWEN3_30B_A3B),
    # NVFP4 experts (amd-quark's nvfp4 template: dynamic NVFP4 activations; MatMulExpertsNvfp4R16, 16-row tiles)
    "qwen3_moe_nvfp4": ("nvfp4", "nvfp4", "Qwen3-30B-A3B NVFP4", QWEN3_30B_A3B),
    "gpt_oss_mxfp4_fp8": ("mxfp4_fp8", "mxfp4_fp8", "gpt-oss-20b MXFP4 weights + FP8 activations", GPT_OSS_20B),
    "qwen3_moe_mxfp4_fp8": ("mxfp4_fp8", "mxfp4_fp8", "Qwen3-30B-A3B MXFP4 weights + FP8 activations",
                            QWEN3_30B_A3B),
}


def write_export(out: Path, scheme: str, layers: int, vocab: int) -> Path:
    kind, config_key, _, s = SCHEMES[scheme]
    if "arch" in s:
        return write_moe_export(out, kind, CONFIGS[config_key], dict(s, layers=layers, vocab=vocab))
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    hidden, inter, head_dim = s["hidden"], s["inter"], s["hidden"] // s["heads"]
    kv = head_dim * s["kv_heads"]
    shapes = {"self_attn.q_proj": (hidden, hidden), "self_attn.k_proj": (kv, hidden),
              "self_attn.v_proj": (kv, hidden), "self_attn.o_proj": (hidden, hidden),
              "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden), "mlp.down_proj": (hidden, inter)}
    names = {}
    first = {"model.embed_tokens.weight": normal_bf16(rng, vocab, hidden), "model.norm.weight": eager(np.ones(hidden, BF16)),
             "lm_head.weight": normal_bf16(rng, vocab, hidden)}
    save_shard(out / "model-00000.safetensors", first)
    names.update(dict.fromkeys(first, "model-00000.safetensors"))
    for i in range(layers):
        p = f"model.layers.{i}"
        tensors = {f"{p}.input_layernorm.weight": eager(np.ones(hidden, BF16)),
                   f"{p}.post_attention_layernorm.weight": eager(np.ones(hidden, BF16))}
        for proj, (n, k) in shapes.items():
            for suffix, value in linear_tensors(kind, rng, proj, n, k).items():
                tensors[f"{p}.{proj}.{suffix}"] = eager(np.array(value, order="C"))  # 0-d stays 0-d
        shard = f"model-{i + 1:05d}.safetensors"
        save_shard(out / shard, tensors)
        names.update(dict.fromkeys(tensors, shard))
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": names}))
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
           "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": s["heads"],
           "num_key_value_heads": s["kv_heads"], "head_dim": head_dim, "vocab_size": vocab,
           "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
           "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192},
           "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16",
           "quantization_config": CONFIGS[config_key]}
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    _finish(out)
    return out


def _finish(out: Path) -> None:
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    sys.path.insert(0, str(REPO / "tests"))
    from tiny_tokenizer import write_tokenizer  # a byte-level BPE og can load (token ids are fed directly)
    write_tokenizer(out)


# ---- MoE exports ------------------------------------------------------------------------------------------------
# The layout amd-quark 0.13 (transformers 5) writes for Qwen3-MoE and gpt-oss, as in the tiny fixtures of
# tests/quark_factory.py (shapes qwen3_moe / gpt_oss, recipes uint4_g32 / mxfp4; tests/test_real_size_moe.py compares
# names, dtypes, shapes, config keys and quantization_config): one nn.Linear per expert and projection
# (Quark's preprocess_for_quantization splits the fused 3-D experts), gpt-oss's gate_up_proj kept fused (rows g0, u0,
# g1, u1, ...) with float biases; the routers (Qwen3 mlp.gate, gpt-oss mlp.router) float and named, layer by layer,
# in `exclude` before lm_head. Float tensors in the model dtype (bfloat16 for the releases; quantization scales of
# uint4 too), MXFP4 scales e8m0 bytes.
def moe_linear_tensors(kind: str, rng, n: int, k: int, float_dtype, proj: str = "") -> dict[str, np.ndarray]:
    if kind == "uint4":  # Quark's reorder-packed int32 words [K, N/8], scales [K/32, N], zero points [K/32, N/8]
        from synthetic_quark_export import linear_tensors as uint4_tensors
        t = {key.rsplit(".", 1)[-1]: v for key, v in uint4_tensors(rng, "w", n, k, 32).items()}
        t["weight_scale"] = t["weight_scale"].astype(float_dtype)
        zp = t["weight_zero_point"]  # asymmetric: zero points vary (not all 8, which MatMulNBits would leave out)
        t["weight_zero_point"] = np.frombuffer(rng.bytes(zp.size * 4), np.int32).reshape(zp.shape)
        return t
    return linear_tensors(kind, rng, proj, n, k)  # proj: FP8 KV's output scales on k_proj / v_proj


def moe_config(s: dict, quant: dict, float_name: str) -> dict:
    """config.json as transformers 5 writes it for the two families (the keys of the tiny fixtures' configs)."""
    common = {"attention_dropout": 0.0, "bos_token_id": 1, "dtype": float_name, "eos_token_id": 2,
              "head_dim": s["head_dim"], "hidden_act": "silu", "hidden_size": s["hidden"], "initializer_range": 0.02,
              "intermediate_size": s["inter"], "num_attention_heads": s["heads"],
              "num_experts_per_tok": s["top_k"], "num_hidden_layers": s["layers"],
              "num_key_value_heads": s["kv_heads"], "num_local_experts": s["experts"], "output_router_logits": False,
              "pad_token_id": None, "router_aux_loss_coef": 0.001, "tie_word_embeddings": False,
              "transformers_version": "5.24.0", "use_cache": True, "vocab_size": s["vocab"]}
    if s["arch"] == "qwen3_moe":
        cfg = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", **common,
               "attention_bias": False, "decoder_sparse_step": 1, "max_position_embeddings": 40960,
               "mlp_only_layers": [], "moe_intermediate_size": s["moe_inter"], "norm_topk_prob": True,
               "rms_norm_eps": 1e-6, "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
               "sliding_window": None, "use_sliding_window": False}
    else:  # gpt-oss-20b: alternating sliding (128) / full attention, yarn rope, clamped SwiGLU
        cfg = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", **common, "attention_bias": True,
               "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(s["layers"])],
               "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
               "rope_parameters": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                   "original_max_position_embeddings": 4096, "truncate": False,
                                   "rope_theta": 150000.0},
               "sliding_window": 128, "swiglu_alpha": 1.702, "swiglu_limit": 7.0}
    cfg["quantization_config"] = quant
    return dict(sorted(cfg.items()))


def write_moe_export(out: Path, kind: str, quant: dict, s: dict, float_dtype=BF16) -> Path:
    """A layer-sliced Quark export of a Qwen3-MoE or gpt-oss shape `s` (QWEN3_30B_A3B / GPT_OSS_20B keys), one shard
    per layer. float_dtype: the model dtype (the tests write float32, as their tiny fixtures are)."""
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    fd = np.dtype(float_dtype)
    gpt = s["arch"] == "gpt_oss"
    hidden, e_inter, head_dim = s["hidden"], s["moe_inter"], s["head_dim"]
    q_out, kv = s["heads"] * head_dim, s["kv_heads"] * head_dim
    router = "mlp.router" if gpt else "mlp.gate"

    def floats(*shape, std=0.02):
        return eager((std * rng.standard_normal(shape, np.float32)).astype(fd))

    def embedding():
        return normal_bf16(rng, s["vocab"], hidden) if fd == BF16 else floats(s["vocab"], hidden)

    names = {}
    first = {"lm_head.weight": embedding(), "model.embed_tokens.weight": embedding(),
             "model.norm.weight": eager(np.ones(hidden, fd))}
    save_shard(out / "model-00000.safetensors", first)
    names.update(dict.fromkeys(first, "model-00000.safetensors"))
    attn = {"q_proj": (q_out, hidden), "k_proj": (kv, hidden), "v_proj": (kv, hidden), "o_proj": (hidden, q_out)}
    experts = {"gate_up_proj": (2 * e_inter, hidden), "down_proj": (hidden, e_inter)} if gpt else \
        {"gate_proj": (e_inter, hidden), "up_proj": (e_inter, hidden), "down_proj": (hidden, e_inter)}
    for i in range(s["layers"]):
        p = f"model.layers.{i}"
        tensors = {f"{p}.input_layernorm.weight": eager(np.ones(hidden, fd)),
                   f"{p}.post_attention_layernorm.weight": eager(np.ones(hidden, fd)),
                   # std 1/sqrt(hidden): router logits of std about 1 on the unit-RMS normed input, a trained
                   # router's spread (std 1.0, as before 2026-12-05, gave logits of std ~45: a softmax so peaked that
                   # 6-7 of the top-8 weights were exactly 0, and QMoE skips zero-weight experts)
                   f"{p}.{router}.weight": floats(s["experts"], hidden, std=hidden ** -0.5)}
        if gpt:
            tensors[f"{p}.{router}.bias"] = floats(s["experts"])
            tensors[f"{p}.self_attn.sinks"] = floats(s["heads"], std=1.0)
        else:
            tensors[f"{p}.self_attn.q_norm.weight"] = eager(np.ones(head_dim, fd))
            tensors[f"{p}.self_attn.k_norm.weight"] = eager(np.ones(head_dim, fd))
        linears = {f"self_attn.{k}": v for k, v in attn.items()}
        linears.update({f"mlp.experts.{e}.{k}": v for e in range(s["experts"]) for k, v in experts.items()})
        for proj, (n, k) in linears.items():
            for suffix, value in moe_linear_tensors(kind, rng, n, k, fd, proj).items():
                tensors[f"{p}.{proj}.{suffix}"] = eager(np.array(value, order="C"))
            if gpt:
                tensors[f"{p}.{proj}.bias"] = floats(n)
        shard = f"model-{i + 1:05d}.safetensors"
        save_shard(out / shard, tensors)
        names.update(dict.fromkeys(tensors, shard))
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": names}))
    quant = json.loads(json.dumps(quant))
    quant["exclude"] = [f"model.layers.{i}.{router}" for i in range(s["layers"])] + ["lm_head"]
    float_name = "bfloat16" if fd == BF16 else "float32"
    (out / "config.json").write_text(json.dumps(moe_config(s, quant, float_name), indent=1))
    _finish(out)
    return out


# ---- sizes ------------------------------------------------------------------------------------------------------
LAYER = re.compile(r"model\.layers\.(\d+)\.")


def _split_bytes(items, vocab: int) -> dict:
    """{"layer": bytes of one layer (mean), "vocab": bytes of vocabulary-sized tensors, "other": the rest}."""
    layers, per_vocab, other = {}, 0, 0
    for name, shape, nbytes in items:
        m = LAYER.search(name)
        if m:
            layers[m.group(1)] = layers.get(m.group(1), 0) + nbytes
        elif shape and shape[0] == vocab:
            per_vocab += nbytes
        else:
            other += nbytes
    return {"layer": sum(layers.values()) / max(1, len(layers)), "vocab": per_vocab, "other": other}


def export_items(export: Path):
    import struct
    for f in sorted(export.glob("*.safetensors")):
        with open(f, "rb") as fh:
            header = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
        for name, v in header.items():
            if name != "__metadata__":
                yield name, v["shape"], v["data_offsets"][1] - v["data_offsets"][0]


def output_items(model_dir: Path):
    import onnx
    model = onnx.load(str(model_dir / "model.onnx"), load_external_data=False)
    for t in model.graph.initializer:
        size = int(np.prod(t.dims, dtype=np.int64)) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        yield t.name, list(t.dims), size


def full_bytes(split: dict, vocab: int, shape: dict = LLAMA_8B) -> float:
    return split["layer"] * shape["layers"] + split["vocab"] * shape["vocab"] / vocab + split["other"]


# ---- conversion and og runs (children) --------------------------------------------------------------------------
def convert(export: Path, out: Path, extra: list[str]) -> dict:
    if out.exists():
        shutil.rmtree(out)
    cmd = [sys.executable, "-m", "builder", "-i", str(export), "-o", str(out), "-e", "cpu", "-q"]
    if extra:
        cmd += ["--extra_options", *extra]
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)))
    if r.returncode:
        raise SystemExit(f"conversion failed: {' '.join(cmd)}\n{r.stderr[-2000:]}")
    return {"convert_s": round(time.perf_counter() - t, 1), "warnings": [ln for ln in r.stderr.splitlines()
                                                                       if ln.startswith("warning")]}


def child_run(model_dir: str, prefill_len: int, tokens: int) -> dict:
    import onnxruntime_genai as og

    def hwm(field: str = "VmHWM") -> int:
        with open("/proc/self/status") as fh:
            return round(int(re.search(field + r":\s+(\d+)", fh.read()).group(1)) / 1024)

    base = hwm()  # the process before the model: python, numpy, onnxruntime-genai
    t = time.perf_counter()
    model = og.Model(model_dir)
    out = {"base_rss_mib": base, "load_s": round(time.perf_counter() - t, 2), "load_rss_mib": hwm()}
    vocab = json.loads((Path(model_dir) / "genai_config.json").read_text())["model"]["vocab_size"]
    rng = np.random.default_rng(0)
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=prefill_len + tokens + 1, min_length=0)
    warm = og.Generator(model, params)  # first run (prepacking), through the branches the prefill takes
    warm.append_tokens(rng.integers(3, vocab, size=(1, prefill_len), dtype=np.int32))
    del warm
    gen = og.Generator(model, params)
    t = time.perf_counter()
    gen.append_tokens(rng.integers(3, vocab, size=(1, prefill_len), dtype=np.int32))
    out["prefill_ms"] = round((time.perf_counter() - t) * 1e3, 1)
    gen.generate_next_token()
    t, n = time.perf_counter(), 0
    while n < tokens and not gen.is_done():
        gen.generate_next_token()
        n += 1
    out["decode_tps"] = round(n / (time.perf_counter() - t), 3)
    out["decode_rss_mib"] = hwm()  # the peak (VmHWM): load, the prefills and the decode
    out["end_rss_mib"] = hwm("VmRSS")
    # the end RSS split: anonymous (heap: pre-packed weights, folded copies) and file-backed (pages of the mmapped
    # external data the session touched and still maps: e.g. QMoE's scales, read by its PrePack and kept)
    out["end_rss_anon_mib"], out["end_rss_file_mib"] = hwm("RssAnon"), hwm("RssFile")
    return out


def run_child(model_dir: Path, prefill_len: int, tokens: int, max_gib: float = 0) -> dict:
    """One og run in a fresh process; max_gib: its address-space limit (RLIMIT_AS), so that a form whose peak does not
    fit fails with an allocation error instead of pushing a shared machine out of memory."""
    def limit():
        if max_gib:
            import resource
            resource.setrlimit(resource.RLIMIT_AS, (int(max_gib * 2**30),) * 2)
    r = subprocess.run([sys.executable, __file__, "_child", str(model_dir), str(prefill_len), str(tokens)],
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), preexec_fn=limit)
    if r.returncode:
        why = (r.stderr.strip().splitlines() or [f"exit code {r.returncode}"])[-1][:300]
        if r.returncode < 0:
            why = f"killed by signal {-r.returncode} (out of memory?)"
        elif max_gib and re.search(r"alloc|memory", r.stderr, re.I):
            why = f"out of memory under the {max_gib:g} GiB address-space limit (--max_gib): {why}"
        return {"error": why}
    return json.loads(r.stdout.strip().splitlines()[-1])


def shipped_kernels(model_dir: Path) -> frozenset:
    """The kernel entry points of the custom-op library an output ships (empty without one)."""
    from builder.custom_ops_library import exported_kernels
    cfg = json.loads((model_dir / "genai_config.json").read_text())["model"]["decoder"]
    library = cfg.get("session_options", {}).get("custom_ops_library")
    return exported_kernels(str(model_dir / library)) if library else frozenset()


def session_weight_bytes(model_dir: Path, top_k: int | None = None) -> dict:
    """Bytes a decode step streams, per form: com.quark_onnx weights as stored when the shipped library has the op's
    kernel, else as ORT constant-folds them (float32 [K, N]); every other 2-D float weight as stored; the embedding
    (one row gathered per token) left out. MoE experts: top_k / E of each [E, ...] stack (MatMulExperts*, QMoE; the
    routed standard-op form's If: builder/ops/routed_experts.py gathered_bytes_per_token)."""
    import onnx
    from builder.custom_ops_library import OP_SYMBOLS
    from builder.ops.routed_experts import gathered_bytes_per_token
    symbols = shipped_kernels(model_dir)
    model = onnx.load(str(model_dir / "model.onnx"), load_external_data=False)
    sizes = {t.name: (list(t.dims), int(np.prod(t.dims, dtype=np.int64))
                      * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize) for t in model.graph.initializer}
    streamed, seen = sum(gathered_bytes_per_token(model).values()), set()
    for node in model.graph.node:
        experts = node.op_type == "QMoE" or node.op_type.startswith("MatMulExperts")
        if experts:
            k = next((a.i for a in node.attribute if a.name == "k"), top_k)
            weights = [i for i in node.input[1:] if i in sizes and len(sizes[i][0]) >= 2]
            seen.update(weights)
            streamed += sum(sizes[w][1] * k / sizes[w][0][0] for w in weights)
        elif node.domain == "com.quark_onnx" and node.op_type.startswith("GroupQueryAttentionFixedOrder"):
            continue  # its initializers: the rotary tables (a row per position read) and sinks, as GroupQueryAttention
        elif node.domain == "com.quark_onnx" and node.op_type.startswith("QuantizeDequantize"):
            continue  # an activation's Q/DQ: its scale is not a weight (QuantizeLinear's is not counted either)
        elif node.domain == "com.quark_onnx":
            weights = [i for i in node.input[1:] if i in sizes]
            seen.update(weights)
            if OP_SYMBOLS.get(node.op_type) in symbols:
                streamed += sum(sizes[w][1] for w in weights)
            else:
                attrs = {a.name: a.i for a in node.attribute}
                dims = sizes[node.input[1]][0]
                streamed += 4 * attrs.get("N", dims[0]) * attrs.get("K", int(np.prod(dims[1:])))
        elif node.op_type in ("MatMul", "Gemm", "MatMulNBits"):
            for i in node.input[1:]:  # MatMulNBits: its 1-D scales and zero points too
                if i in sizes and i not in seen and (len(sizes[i][0]) >= 2 or node.op_type == "MatMulNBits"):
                    streamed += sizes[i][1]
                    seen.add(i)
    return {"streamed_bytes_per_token": int(streamed)}


def kernels_used(model_dir: Path) -> dict[str, str]:
    """{com.quark_onnx op: "kernel" | "function (folded to fp32 at load)"} for the ops of the output."""
    import onnx
    from builder.custom_ops_library import OP_SYMBOLS
    symbols = shipped_kernels(model_dir)
    ops = {n.op_type for n in onnx.load(str(model_dir / "model.onnx"), load_external_data=False).graph.node
           if n.domain == "com.quark_onnx"}
    return {op: "kernel" if OP_SYMBOLS.get(op) in symbols else "function (folded to fp32 at load)" for op in ops}


def session_rss_ratio(r: dict) -> str:
    """Decode RSS less the process's RSS before the model was loaded, over the output's bytes on disk (the slice);
    rows measured before base_rss_mib existed: the whole RSS, marked *."""
    out = r["output_bytes_slice"] / 2**20
    if "base_rss_mib" in r:
        split = ""
        if "end_rss_anon_mib" in r:  # the end RSS: anonymous + file-backed (benchmarks/qmoe_rss.py)
            split = f"; end: anon {r['end_rss_anon_mib']} + file {r['end_rss_file_mib']}"
        return f"{(r['decode_rss_mib'] - r['base_rss_mib']) / out:.2f}{split}"
    return f"{r['decode_rss_mib'] / out:.2f}*"


def _prefill(r: dict) -> str:
    if "prefill_ms" not in r:  # decode measured after a 1-token prompt
        return f"not measured: {r['prefill_error']}"[:160]
    return f"{r['prefill_ms']:.0f} ({_x(r, 'prefill_vs_dense')})"


def _x(row: dict, key: str) -> str:
    return f"{row[key]:.2f}x" if key in row else "dense: not measured"


def table(rows: list[dict]) -> str:
    head = ("| shape | form | output / export (full depth) | output GB | load RSS / output | decode RSS MiB "
            "(session / output) | decode tok/s (x dense) | prefill 128 ms (x dense) | GB/s streamed (of plain read) |")
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            size = f"{r['ratio_to_export']:.2f}x | {r['output_gb_full']:.2f} (export {r['export_gb_full']:.2f})" \
                if "ratio_to_export" in r else " | "
            lines.append(f"| {r['release']} | {r['form']} | {size} | {r['error']} |||||")
            continue
        of_read = f" ({100 * r['gbps_of_read']:.0f} % of read)" if "gbps_of_read" in r else ""
        lines.append(
            f"| {r['release']} | {r['form']} | {r['ratio_to_export']:.2f}x | {r['output_gb_full']:.2f} "
            f"(export {r['export_gb_full']:.2f}) | {r['load_rss_mib'] / (r['output_bytes_slice'] / 2**20):.2f} | "
            f"{r['decode_rss_mib']} ({session_rss_ratio(r)}) | "
            f"{r['decode_tps']:.2f} ({_x(r, 'decode_vs_dense')}) | "
            f"{_prefill(r)} | {r['gbps']:.2f}{of_read} |")
    return "\n".join(lines)


def slice_vocab(option: str, shape: dict, layers: int) -> int:
    if option == "proportional":
        return -(-shape["vocab"] * layers // shape["layers"] // 64) * 64
    if not option.isdigit() or int(option) < 64:
        raise SystemExit(f"--vocab: a vocabulary size >= 64 or 'proportional', not {option!r}")
    return int(option)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/real_size.py", description=__doc__.split("\n")[0])
    ap.add_argument("--work", default="/tmp/qo_real_size")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", default="32000",
                    help="vocabulary of the runtime slice (sizes: the release's), or 'proportional': the release's "
                         "vocabulary x layers / its depth, so that lm_head and layers keep their full-model shares")
    ap.add_argument("--rounds", type=int, default=2, help="A,B rounds per shape (best of)")
    ap.add_argument("--prefill", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--only", default=",".join(SCHEMES))
    ap.add_argument("--keep", action="store_true", help="keep the exports and outputs")
    ap.add_argument("--form", action="append", default=[], metavar="NAME=OPTION[;OPTION]",
                    help="one more form of each row: the compact form's options plus these --extra_options "
                         "(e.g. fused=attention=fused), timed in the same rounds")
    ap.add_argument("--max_gib", type=float, default=8.0,
                    help="address-space limit of each og run (GiB; 0: none); a run past it is reported, not made")
    ap.add_argument("--results", default="real_size",
                    help="benchmarks/results/NAME.{json,md} (rows of other shapes already there are kept)")
    ap.add_argument("--no_dense", action="store_true",
                    help="only the compact default (full depth: the dense fp32 form would not fit the disk or the "
                         "memory); the ratios to the dense form are then not reported")
    ap.add_argument("--run_folded", action="store_true",
                    help="also load compact outputs whose ops the library has no kernel for (memory: see --help)")
    a = ap.parse_args(argv)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    read = plain_read_gbs()
    print(f"plain memory read: {read['read_1t_GBs']} GB/s (1 thread), {read['read_2t_GBs']} GB/s (2 threads)",
          flush=True)
    rows = []
    for scheme in a.only.split(","):
        if scheme not in SCHEMES:
            ap.error(f"--only: unknown row {scheme!r} (rows: {', '.join(SCHEMES)})")
    for scheme in a.only.split(","):
        kind, _, release, shape = SCHEMES[scheme]
        vocab = slice_vocab(a.vocab, shape, a.layers)
        export = write_export(work / f"{scheme}_export", scheme, a.layers, vocab)
        ex_split = _split_bytes(list(export_items(export)), vocab)
        forms = {"compact" if kind != "uint4" else "default": (work / f"{scheme}_compact", COMPACT_OPTION[kind]),
                 baseline_form(scheme): (work / f"{scheme}_dense", ["custom_ops_library=none"])}
        if a.no_dense:
            del forms[baseline_form(scheme)]
        for spec in a.form:
            name, _, options = spec.partition("=")
            given = options.split(";")  # the form's options replace the compact form's of the same key
            keys = {o.partition("=")[0] for o in given}
            forms[name] = (work / f"{scheme}_{name}",
                           [o for o in COMPACT_OPTION[kind] if o.partition("=")[0] not in keys] + given)
        if kind == "uint4" and "arch" in shape and not a.no_dense:  # QMoE (with the library) vs the default experts op
            forms[INT4_EXPERTS_FORM] = (work / f"{scheme}_qmoe", ["int4_experts=qmoe"])
            # accuracy_level 4 (int8 activations in the experts op and the dense linears; the default is 1: exact)
            forms[INT8_ACT_FORM] = (work / f"{scheme}_acc4", ["accuracy_level=4"])
        info = {form: convert(export, out, extra) for form, (out, extra) in forms.items()}
        runs = {form: [] for form in forms}
        folded = {form: [op for op, how in kernels_used(out).items() if how != "kernel"]
                  for form, (out, _) in forms.items()}
        for _ in range(a.rounds):  # interleaved: A, B, A, B
            for form, (out, _) in forms.items():
                if folded[form] and not a.run_folded:  # the function fallback: ORT folds it to fp32 at load
                    runs[form].append({"error": f"not run: the library has no {'/'.join(folded[form])} kernel; its "
                                                "function is folded to fp32 at load (peak about 2x the dense form "
                                                "for FP8, out of memory for NVFP4; --run_folded runs it)"})
                    continue
                if runs[form] and ("prefill_error" in runs[form][-1]
                                   or "out of memory" in runs[form][-1].get("error", "")):
                    prompt = 1  # no second try of a prefill that did not fit: decode after a 1-token prompt
                else:
                    prompt = a.prefill
                run = run_child(out, prompt, a.tokens, a.max_gib)
                if prompt > 1 and "out of memory" in run.get("error", ""):
                    why = run["error"]
                    run = run_child(out, 1, a.tokens, a.max_gib)
                    if "error" not in run:
                        run["prefill_error"] = f"{a.prefill}-token prefill: {why}"
                if prompt == 1 and "error" not in run:
                    run["prefill_error"] = next(r.get("prefill_error") for r in runs[form] + [run]
                                                if r.get("prefill_error"))
                runs[form].append(run)
        load = os.getloadavg()[0]
        dense = None
        for form, (out, _) in forms.items():
            ok = [r for r in runs[form] if "error" not in r]
            if not ok:
                items = list(output_items(out))
                out_split = _split_bytes(items, vocab)
                out_split["other"] += sum(f.stat().st_size for f in out.iterdir() if f.is_file()
                                          and not f.name.startswith("tokenizer")) - sum(s for _, _, s in items)
                full = full_bytes(out_split, vocab, shape) / 1e9
                rows.append({"release": release, "scheme": scheme, "form": form, "error": runs[form][0]["error"],
                             "output_gb_full": full, "export_gb_full": full_bytes(ex_split, vocab, shape) / 1e9,
                             "ratio_to_export": full / (full_bytes(ex_split, vocab, shape) / 1e9), **info[form],
                             "kernels": kernels_used(out)})
                continue
            full_prompt = [r for r in ok if "prefill_error" not in r]
            best = {"decode_tps": max(r["decode_tps"] for r in ok),
                    **({"prefill_ms": min(r["prefill_ms"] for r in full_prompt)} if full_prompt else
                       {"prefill_error": ok[0]["prefill_error"]}),
                    "load_rss_mib": min(r["load_rss_mib"] for r in ok),
                    "decode_rss_mib": min(r["decode_rss_mib"] for r in ok), "load_s": min(r["load_s"] for r in ok)}
            if all("base_rss_mib" in r for r in ok):
                best["base_rss_mib"] = min(r["base_rss_mib"] for r in ok)
            if all("end_rss_anon_mib" in r for r in ok):
                best.update({k: min(r[k] for r in ok) for k in ("end_rss_anon_mib", "end_rss_file_mib")})
            items = list(output_items(out))
            out_split = _split_bytes(items, vocab)
            graph_etc = sum(f.stat().st_size for f in out.iterdir() if f.is_file()
                            and not f.name.startswith("tokenizer")) - sum(s for _, _, s in items)
            out_split["other"] += graph_etc
            streamed = session_weight_bytes(out, shape.get("top_k"))["streamed_bytes_per_token"]
            info[form]["kernels"] = kernels_used(out)
            row = {"release": release, "scheme": scheme, "form": form, **best, **info[form],
                   "runs": runs[form], "export_gb_full": full_bytes(ex_split, vocab, shape) / 1e9,
                   "output_gb_full": full_bytes(out_split, vocab, shape) / 1e9,
                   "output_bytes_slice": sum(s for _, _, s in items) + graph_etc,
                   "streamed_bytes_per_token_slice": streamed, "gbps": streamed * best["decode_tps"] / 1e9,
                   "load_avg_1min": load, "layers": a.layers, "vocab_slice": vocab,
                   "full_layers": shape["layers"], "full_vocab": shape["vocab"]}
            row["ratio_to_export"] = row["output_gb_full"] / row["export_gb_full"]
            row["read_GBs"], row["gbps_of_read"] = read, row["gbps"] / read["read_2t_GBs"]  # updated at the end
            if form == baseline_form(scheme):
                dense = row
            rows.append(row)
        for row in rows:
            if row.get("scheme") == scheme and "error" not in row and dense:
                row["decode_vs_dense"] = row["decode_tps"] / dense["decode_tps"]
                if "prefill_ms" in row and "prefill_ms" in dense:
                    row["prefill_vs_dense"] = row["prefill_ms"] / dense["prefill_ms"]
        print(table([r for r in rows if r.get("scheme") == scheme or r["release"] == release]), flush=True)
        _save(rows, argv, name=a.results)
        if not a.keep:
            for out, _ in forms.values():
                shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(export, ignore_errors=True)
    after = plain_read_gbs()
    best = {k: max(v, after[k]) for k, v in read.items()}
    for row in rows:
        if "gbps" in row:  # og runs a thread per core (intra_op_num_threads 0): against the all-thread read
            row["read_GBs"], row["gbps_of_read"] = best, row["gbps"] / best["read_2t_GBs"]
    print(f"plain memory read: {best} (best of before {read} and after {after})")
    _save(rows, argv, best, name=a.results)
    print(table(rows))
    return 0


def plain_read_gbs() -> dict[str, float]:
    """The machine's plain memory-read bandwidth, measured in this run: a C loop summing a 1 GiB float32 buffer
    (32x the 32 MiB L3) with 1 and 2 threads, best of 5 (benchmarks/custom_ops_cpu.py memory_read_gbs)."""
    from custom_ops_cpu import memory_read_gbs
    return memory_read_gbs(mib=1024, tries=5)


def cpu_name() -> str:
    """The CPU model and its widest SIMD, e.g. "Intel(R) Xeon(R) Processor, AVX-512 + AMX", for each row."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown"
    model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "unknown")
    flags = set(next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), []))
    simd = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"{model}, {simd}{' + AMX' if 'amx_tile' in flags else ''}, {os.cpu_count()} CPUs"


def _save(rows: list[dict], argv, read: dict | None = None, name: str = "real_size") -> None:
    """Write the table and JSON; rows of other shapes already in the JSON (an earlier --only run) are kept, each
    with the command and date of the run that measured it."""
    results = REPO / "benchmarks" / "results"
    results.mkdir(exist_ok=True)
    command = command_line("benchmarks/real_size.py", list(argv if argv is not None else sys.argv[1:]))
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    cpu = cpu_name()
    rows = [{**r, "command": r.get("command", command), "date": r.get("date", date), "cpu": r.get("cpu", cpu)}
            for r in rows]
    old = results / f"{name}.json"
    if old.exists():
        mine = {r.get("scheme") for r in rows}
        before = json.loads(old.read_text())
        rows = [{**r, "command": r.get("command", before["meta"]["command"])} for r in before["rows"]
                if r.get("scheme") not in mine] + rows
    meta = {"command": command, "date": date,
            "machine": {"cpus": os.cpu_count(), "load_avg_end": os.getloadavg(), "plain_read_GBs": read},
            "note": "sizes extrapolated to each release's depth and vocabulary (rows: full_layers, full_vocab; the "
                    "8B rows: 32 layers, 128256); speed and RSS measured on the slice; each row's command and date "
                    "(rows without a date: the 8B run of 2026-12-02)"}
    (results / f"{name}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    write_markdown(rows, name)


def write_markdown(rows: list[dict], name: str = "real_size") -> None:
    """benchmarks/results/real_size.md from the rows (python -c "import real_size as r, json; r.write_markdown(
    json.load(open('benchmarks/results/real_size.json'))['rows'])" redraws it after a change of the table)."""
    def run_key(r):
        return r["command"], r.get("date", "2026-12-02"), r.get("cpu", "AMD EPYC (Zen 5), AVX-512, 2 CPUs")
    runs = "\n".join(f"- {d} ({cpu}): `{c}` ({', '.join(sorted({r['release'] for r in rows if run_key(r) == (c, d, cpu)}))})"
                      for c, d, cpu in dict.fromkeys(run_key(r) for r in rows))
    (REPO / "benchmarks" / "results" / f"{name}.md").write_text(f"Runs:\n{runs}\n\n{table(rows)}\n")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_child":
        print(json.dumps(child_run(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
        raise SystemExit(0)
    raise SystemExit(main())
