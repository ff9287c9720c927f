"""CPU decode tokens/s of a DeepSeek-V3-shaped model: MoE emitted densely vs routed (com.microsoft QMoE).

    python benchmarks/deepseek_cpu_decode.py [--hidden 256] [--moe_inter 128] [--experts 64] [--groups 8]
                                             [--topk_group 4] [--top_k 6] [--layers 4] [--tokens 64] [--rounds 2]

Writes a Quark-style uint4 per-group (g32) DeepseekV3ForCausalLM export with random packed weights, in the layout
amd-quark 0.13 writes with its deepseek_v3 template (experts, shared experts and the first dense MLP quantized;
self_attn, the router mlp.gate and lm_head float, bf16), converts it for the CPU EP with --extra_options moe=dense
and moe=routed (accuracy_level=1, fp32 io), and times greedy decode with onnxruntime-genai (best of --repeats, first
token excluded), the two forms interleaved for --rounds rounds (the machine may be shared). Random weights: speed
only, not accuracy (tests/test_deepseek_v3.py checks the numerics).
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]
from decode_speed import decode_tps  # noqa: E402
from synthetic_export import QUANT_CONFIG  # noqa: E402
from synthetic_quark_export import linear_tensors  # noqa: E402

VOCAB = 4096


MLA_SHAPE = (8, 96, 64, 32, 32, 32)  # heads, q_lora_rank, kv_lora_rank, qk_nope, qk_rope, v_head_dim


def write_export(out: Path, a, group: int = 32, mla: tuple[int, ...] = MLA_SHAPE) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    bf16 = ml_dtypes.bfloat16
    heads, q_lora, kv_lora, nope, rope, v = mla
    q = copy.deepcopy(QUANT_CONFIG)
    q["global_quant_config"]["weight"]["group_size"] = group
    q["exclude"] = ["lm_head", "*self_attn*", "*mlp.gate"]
    cfg = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": a.hidden,
           "intermediate_size": 4 * a.hidden, "moe_intermediate_size": a.moe_inter, "num_hidden_layers": a.layers,
           "num_attention_heads": heads, "num_key_value_heads": heads, "vocab_size": VOCAB,
           "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
           "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16",
           "hidden_act": "silu", "n_routed_experts": a.experts, "num_experts_per_tok": a.top_k, "n_group": a.groups,
           "topk_group": a.topk_group, "n_shared_experts": 1, "first_k_dense_replace": 1, "norm_topk_prob": True,
           "routed_scaling_factor": 2.5, "q_lora_rank": q_lora, "kv_lora_rank": kv_lora, "qk_nope_head_dim": nope,
           "qk_rope_head_dim": rope, "v_head_dim": v, "rope_interleave": True, "quantization_config": q}

    def float_w(n_out, n_in):
        return (rng.standard_normal((n_out, n_in), np.float32) / np.sqrt(n_in)).astype(bf16)

    h = a.hidden
    tensors = {"model.embed_tokens.weight": (0.02 * rng.standard_normal((VOCAB, h), np.float32)).astype(bf16),
               "model.norm.weight": np.ones(h, bf16), "lm_head.weight": float_w(VOCAB, h)}
    for i in range(a.layers):
        p = f"model.layers.{i}"
        for norm, size in (("input_layernorm", h), ("post_attention_layernorm", h),
                           ("self_attn.q_a_layernorm", q_lora), ("self_attn.kv_a_layernorm", kv_lora)):
            tensors[f"{p}.{norm}.weight"] = np.ones(size, bf16)
        for proj, (n_out, n_in) in {"q_a_proj": (q_lora, h), "q_b_proj": (heads * (nope + rope), q_lora),
                                    "kv_a_proj_with_mqa": (kv_lora + rope, h),
                                    "kv_b_proj": (heads * (nope + v), kv_lora), "o_proj": (h, heads * v)}.items():
            tensors[f"{p}.self_attn.{proj}.weight"] = float_w(n_out, n_in)
        if i == 0:
            mlps = {"mlp": 4 * h}
        else:
            tensors[f"{p}.mlp.gate.weight"] = float_w(a.experts, h).astype(np.float32)
            tensors[f"{p}.mlp.gate.e_score_correction_bias"] = np.zeros(a.experts, np.float32)
            mlps = {f"mlp.experts.{e}": a.moe_inter for e in range(a.experts)}
            mlps["mlp.shared_experts"] = a.moe_inter
        for block, inter in mlps.items():
            for proj, (n_out, n_in) in {"gate_proj": (inter, h), "up_proj": (inter, h),
                                        "down_proj": (h, inter)}.items():
                tensors.update(linear_tensors(rng, f"{p}.{block}.{proj}", n_out, n_in, group))
    save_file(tensors, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=str(Path(tempfile.gettempdir()) / "quark_onnx_deepseek_bench"))
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--moe_inter", type=int, default=128)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--topk_group", type=int, default=4)
    ap.add_argument("--top_k", type=int, default=6)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    from builder.convert import convert
    from builder.emit_context import BuildOptions
    root = Path(a.root)
    src = root / "export"
    write_export(src, a)
    prompt = np.random.default_rng(1).integers(3, VOCAB, size=(1, 16), dtype=np.int32)
    print(f"hidden {a.hidden}, moe_intermediate {a.moe_inter}, {a.experts} experts in {a.groups} groups, "
          f"top-{a.top_k} of {a.topk_group} groups, 1 shared, {a.layers} layers (first dense)")
    forms = ("dense", "routed")
    for form in forms:
        convert(src, root / form, "cpu", "fp32", BuildOptions(accuracy_level=1, extra={"moe": form}),
                log=lambda _m: None)
    results = {form: [] for form in forms}
    for _ in range(a.rounds):
        for form in forms:
            results[form].append(decode_tps(root / form, prompt, a.tokens, a.repeats))
    for form in forms:
        print(f"{form:7s} " + " ".join(f"{t:8.1f}" for t in results[form]) + " tokens/s")
    print(f"routed / dense: {max(results['routed']) / max(results['dense']):.2f}x (best of each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
