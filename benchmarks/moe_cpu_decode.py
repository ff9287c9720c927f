"""CPU decode tokens/s of a MoE block emitted densely vs routed (com.microsoft QMoE, or the standard-op "gather"
form of builder/ops/routed_experts.py), on a synthetic export.

    python benchmarks/moe_cpu_decode.py [--arch mixtral|qwen3_moe] [--hidden 256] [--inter 512] [--experts 8]
                                        [--top_k 2] [--layers 4] [--scheme uint4|mxfp4] [--forms dense,routed]
                                        [--prefill 1,4,16]
    python benchmarks/moe_cpu_decode.py --arch qwen3_moe --hidden 512 --inter 192 --experts 128 --top_k 8
    python benchmarks/moe_cpu_decode.py --arch qwen3_moe --qwen3_30b --layers 2 --scheme mxfp4 --forms dense,gather

    python benchmarks/moe_cpu_decode.py --qwen3_30b --layers 2 --scheme fp8 --forms dense,routed,gather --prefill 128
    python benchmarks/moe_cpu_decode.py --gpt_oss_20b --layers 2 --scheme mxfp4 --forms dense,routed,gather

--qwen3_30b: Qwen3-30B-A3B's shape (hidden 2048, 32 heads / 4 KV heads of 128, 128 experts of width 768, top-8),
vocabulary 4096 (the lm_head is not what is measured). --scheme mxfp4 writes MXFP4 weights with dynamic MXFP4
activations everywhere (Quark's mxfp4 template; random codes, e8m0 scales 2^-9..2^-5). --scheme fp8: FP8 W8A8 weights and static
per-tensor FP8 activations everywhere (Quark's fp8 template; codes of a Gaussian quantized per tensor). --scheme nvfp4:
NVFP4 weights (random e2m1 codes, e4m3 block scales) with Quark's NVFP4 activations (dynamic fp4 blocks of 16, static
input_scale_2) everywhere (Quark's nvfp4 template).
--gpt_oss_20b: gpt-oss-20b's expert shape (hidden 2880, 32 experts of width 2880, top-4; 64 / 8 heads of 64) on the
Qwen3-MoE skeleton (SiLU experts without biases: the expert bytes and FLOPs of gpt-oss, not its attention sinks).
Both shapes come from benchmarks/real_size.py, whose MoE rows measure the releases as whole outputs (amd-quark's own
layout, gpt-oss's sinks, biases and clamped experts; RSS and sizes; the compact default against no library).
--forms: dense (moe=dense), routed (moe=routed: QMoE for uint4; com.quark_onnx MatMulExperts* for MXFP4 / FP8 when
the custom-op library is there), gather (moe=gather: the standard-op form). --prefill T,...: also the latency of one
prompt of T tokens through each form (ORT CPU session per form, runs interleaved, best of --repeats; the gather form
only with --prefill_gather: its every-expert branch takes minutes at T = 128).

--arch qwen3_moe writes a Qwen3MoeForCausalLM export instead (per-head q/k norms, head_dim 64, experts of width
--inter, norm_topk_prob true, every layer sparse), the shape family of Qwen3-30B-A3B (128 experts, top-8).

Writes a Quark-style uint4 per-group (g32) Mixtral export with random packed weights (the layout of amd-quark 0.13
with transformers 5: model.layers.{i}.mlp.experts.{e}.gate_proj/up_proj/down_proj, a float router mlp.gate), converts
it twice for the CPU EP (--extra_options moe=dense and moe=routed, accuracy_level=1), and times greedy decode with
onnxruntime-genai (best of --repeats, first token excluded). Random weights: speed only, not accuracy.
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


MXFP4_SPEC = {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "ch_axis": -1, "scale_format": "e8m0",
              "scale_calculation_mode": "even", "round_method": "half_even", "is_dynamic": False,
              "observer_cls": "PerBlockMXObserver", "symmetric": None, "scale_type": "float"}


def mxfp4_tensors(rng, name: str, n_out: int, n_in: int) -> dict[str, np.ndarray]:
    return {f"{name}.weight": np.frombuffer(rng.bytes(n_out * n_in // 2), np.uint8).reshape(n_out, n_in // 2),
            f"{name}.weight_scale": rng.integers(118, 123, (n_out, n_in // 32)).astype(np.uint8)}


def fp8_tensors(rng, name: str, n_out: int, n_in: int) -> dict[str, np.ndarray]:
    w = rng.standard_normal((n_out, n_in), np.float32)
    s = np.float32(np.abs(w).max() / 448.0)
    return {f"{name}.weight": (w / s).astype(ml_dtypes.float8_e4m3fn), f"{name}.weight_scale": np.array(s),
            f"{name}.input_scale": np.array(np.float32(0.01))}


NVFP4_FP4 = {"dtype": "fp4", "qscheme": "per_group", "group_size": 16, "ch_axis": -1, "scale_format": "float32",
             "round_method": "half_even", "is_dynamic": False, "is_scale_quant": False,
             "observer_cls": "PerBlockMXObserver", "symmetric": None, "scale_type": "float32"}
NVFP4_FP8 = {"dtype": "fp8_e4m3", "qscheme": "per_tensor", "is_dynamic": False, "is_scale_quant": True,
             "symmetric": True, "observer_cls": "PerTensorMinMaxObserver", "round_method": "half_even",
             "scale_type": "float32", "ch_axis": None, "group_size": None}


def nvfp4_tensors(rng, name: str, n_out: int, n_in: int) -> dict[str, np.ndarray]:
    """Random e2m1 codes, e4m3 block scales 0.5..8, weight_scale_2 1e-3, input_scale_2 0.01 / (6 * 448) x 100."""
    scales = rng.uniform(0.5, 8.0, (n_out, n_in // 16)).astype(np.float32).astype(ml_dtypes.float8_e4m3fn)
    return {f"{name}.weight": np.frombuffer(rng.bytes(n_out * n_in // 2), np.uint8).reshape(n_out, n_in // 2),
            f"{name}.weight_scale": scales, f"{name}.weight_scale_2": np.array(np.float32(1e-3)),
            f"{name}.input_scale_2": np.array(np.float32(4e-4))}


FP8_SPEC = {"dtype": "fp8_e4m3", "qscheme": "per_tensor", "is_dynamic": False, "symmetric": True,
            "observer_cls": "PerTensorMinMaxObserver", "round_method": "half_even", "scale_type": "float",
            "ch_axis": None, "group_size": None}


def write_export(out: Path, hidden: int, inter: int, experts: int, top_k: int, layers: int, group: int = 32,
                 vocab: int = 4096, heads: int = 8, kv_heads: int = 2, arch: str = "mixtral", scheme: str = "uint4",
                 head_dim: int | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    bf16 = ml_dtypes.bfloat16
    q = copy.deepcopy(QUANT_CONFIG)
    q["global_quant_config"]["weight"]["group_size"] = group
    if scheme == "mxfp4":
        q["global_quant_config"]["weight"] = dict(MXFP4_SPEC)
        q["global_quant_config"]["input_tensors"] = dict(MXFP4_SPEC, is_dynamic=True)
        q["exclude"] = ["lm_head"] + [f"model.layers.{i}.mlp.gate" for i in range(layers)]
    if scheme == "nvfp4":
        q["global_quant_config"]["weight"] = [dict(NVFP4_FP4), dict(NVFP4_FP8)]
        q["global_quant_config"]["input_tensors"] = [dict(NVFP4_FP4, is_dynamic=True), dict(NVFP4_FP8)]
        q["exclude"] = ["lm_head"] + [f"model.layers.{i}.mlp.gate" for i in range(layers)]
    if scheme == "fp8":
        q["global_quant_config"]["weight"] = dict(FP8_SPEC)
        q["global_quant_config"]["input_tensors"] = dict(FP8_SPEC)
        q["exclude"] = ["lm_head"] + [f"model.layers.{i}.mlp.gate" for i in range(layers)]
    cfg = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": hidden,
           "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
           "num_key_value_heads": kv_heads, "vocab_size": vocab, "max_position_embeddings": 2048,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False, "bos_token_id": 1,
           "eos_token_id": 2, "torch_dtype": "bfloat16", "hidden_act": "silu", "num_local_experts": experts,
           "num_experts_per_tok": top_k, "quantization_config": q}
    head_dim = head_dim or hidden // heads
    if arch == "qwen3_moe":
        head_dim = head_dim if head_dim != hidden // heads else 64
        cfg.update(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", head_dim=head_dim,
                   num_experts=experts, moe_intermediate_size=inter, intermediate_size=4 * hidden,
                   norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
        del cfg["num_local_experts"]
    q_out, kv = heads * head_dim, head_dim * kv_heads
    tensors = {"model.embed_tokens.weight": (0.02 * rng.standard_normal((vocab, hidden), np.float32)).astype(bf16),
               "model.norm.weight": np.ones(hidden, bf16),
               "lm_head.weight": (0.02 * rng.standard_normal((vocab, hidden), np.float32)).astype(bf16)}
    for i in range(layers):
        p = f"model.layers.{i}"
        tensors[f"{p}.input_layernorm.weight"] = np.ones(hidden, bf16)
        tensors[f"{p}.post_attention_layernorm.weight"] = np.ones(hidden, bf16)
        tensors[f"{p}.mlp.gate.weight"] = rng.standard_normal((experts, hidden), np.float32).astype(bf16)
        if arch == "qwen3_moe":
            tensors[f"{p}.self_attn.q_norm.weight"] = np.ones(head_dim, bf16)
            tensors[f"{p}.self_attn.k_norm.weight"] = np.ones(head_dim, bf16)
        shapes = {"self_attn.q_proj": (q_out, hidden), "self_attn.k_proj": (kv, hidden),
                  "self_attn.v_proj": (kv, hidden), "self_attn.o_proj": (hidden, q_out)}
        for e in range(experts):
            shapes.update({f"mlp.experts.{e}.gate_proj": (inter, hidden), f"mlp.experts.{e}.up_proj": (inter, hidden),
                           f"mlp.experts.{e}.down_proj": (hidden, inter)})
        for proj, (n_out, n_in) in shapes.items():
            if scheme == "mxfp4":
                tensors.update(mxfp4_tensors(rng, f"{p}.{proj}", n_out, n_in))
            elif scheme == "fp8":
                tensors.update(fp8_tensors(rng, f"{p}.{proj}", n_out, n_in))
            elif scheme == "nvfp4":
                tensors.update(nvfp4_tensors(rng, f"{p}.{proj}", n_out, n_in))
            else:
                tensors.update(linear_tensors(rng, f"{p}.{proj}", n_out, n_in, group))
    save_file(tensors, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))


def prefill_session(model_dir: Path):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    cfg = json.loads((model_dir / "genai_config.json").read_text())["model"]["decoder"].get("session_options", {})
    if cfg.get("custom_ops_library"):
        so.register_custom_ops_library(str(model_dir / cfg["custom_ops_library"]))
    return ort.InferenceSession(str(model_dir / "model.onnx"), so, providers=["CPUExecutionProvider"])


def prefill_once(sess, t: int) -> float:
    """Seconds of one ORT CPU run of a t-token prompt with an empty cache."""
    import time
    ids = np.random.default_rng(2).integers(3, 4096, size=(1, t), dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    for inp in sess.get_inputs():
        if inp.name.startswith("past_key_values"):
            feeds[inp.name] = np.zeros((1, inp.shape[1], 0, inp.shape[3]), np.float32)
    start = time.perf_counter()
    sess.run(["logits"], feeds)
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=str(Path(tempfile.gettempdir()) / "quark_onnx_moe_bench"))
    ap.add_argument("--arch", choices=("mixtral", "qwen3_moe"), default="mixtral")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--inter", type=int, default=512)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top_k", type=int, default=2)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--qwen3_30b", action="store_true", help="Qwen3-30B-A3B's layer shape (see above)")
    ap.add_argument("--gpt_oss_20b", action="store_true", help="gpt-oss-20b's expert shape (see above)")
    ap.add_argument("--scheme", choices=("uint4", "mxfp4", "fp8", "nvfp4"), default="uint4")
    ap.add_argument("--prefill_gather", action="store_true")
    ap.add_argument("--forms", default="dense,routed")
    ap.add_argument("--prefill", default="")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    from builder.convert import convert
    from builder.emit_context import BuildOptions
    heads, kv_heads, head_dim = 8, 2, None
    if a.qwen3_30b or a.gpt_oss_20b:  # the release shapes of benchmarks/real_size.py
        from real_size import GPT_OSS_20B, QWEN3_30B_A3B
        s = QWEN3_30B_A3B if a.qwen3_30b else GPT_OSS_20B
        a.arch, a.hidden, a.inter = "qwen3_moe", s["hidden"], s["moe_inter"]
        a.experts, a.top_k = s["experts"], s["top_k"]
        heads, kv_heads, head_dim = s["heads"], s["kv_heads"], s["head_dim"]
    root = Path(a.root)
    src = root / "export"
    write_export(src, a.hidden, a.inter, a.experts, a.top_k, a.layers, arch=a.arch, scheme=a.scheme, heads=heads,
                 kv_heads=kv_heads, head_dim=head_dim)
    prompt = np.random.default_rng(1).integers(3, 4096, size=(1, 16), dtype=np.int32)
    print(f"{a.arch} {a.scheme}: hidden {a.hidden}, expert width {a.inter}, {a.experts} experts, top-{a.top_k}, "
          f"{a.layers} layers")
    forms = tuple(a.forms.split(","))
    for form in forms:
        convert(src, root / form, "cpu", "fp32", BuildOptions(accuracy_level=1, extra={"moe": form}),
                log=lambda _m: None)
    best = dict.fromkeys(forms, 0.0)
    for _ in range(a.repeats):  # interleaved: both forms see the same machine load
        for form in forms:
            best[form] = max(best[form], decode_tps(root / form, prompt, a.tokens, 1))
    for form in forms:
        print(f"{form:7s} {best[form]:8.1f} tokens/s (best of {a.repeats})")
    for form in forms[1:]:
        print(f"{form} / {forms[0]} {best[form] / best[forms[0]]:.2f}x")
    if a.prefill:
        lens = [int(t) for t in a.prefill.split(",")]
        sessions = {form: prefill_session(root / form) for form in forms if form != "gather" or a.prefill_gather}
        for t in lens:
            best_ms = dict.fromkeys(sessions, float("inf"))
            for form, sess in sessions.items():  # warm-up
                prefill_once(sess, t)
            for _ in range(a.repeats):  # interleaved
                for form, sess in sessions.items():
                    best_ms[form] = min(best_ms[form], prefill_once(sess, t) * 1e3)
            print(f"prefill {t:4d} tokens: " + ", ".join(f"{f} {v:9.1f} ms" for f, v in best_ms.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
