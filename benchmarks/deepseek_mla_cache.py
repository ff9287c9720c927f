"""DeepSeek MLA cache: bytes per token per layer and CPU decode tokens/s, materialised K/V vs the latent cache.

    python benchmarks/deepseek_mla_cache.py [--tokens 64] [--rounds 3] [--prompt_lens 16,512]

1. Cache bytes: a synthetic Quark-style uint4 g32 DeepseekV3 export (benchmarks/deepseek_cpu_decode.py write_export)
   with DeepSeek-V3's MLA head dims (128 heads, qk_nope 128, qk_rope 64, v 128, kv_lora_rank 512; tiny hidden,
   2 layers, 8 experts otherwise) is converted with --extra_options mla_cache=materialized and mla_cache=latent for
   fp32 and fp16 io; the bytes per token and layer are read from the emitted graph's past_key_values.0.key/value
   inputs ([B, kv_heads, T, head_size] each: kv_heads * head_size * element size, key plus value).
2. Speed: the same two forms at deepseek_cpu_decode.py's small shape (hidden 256, 8 heads, kv_lora 64) and at the
   real-head-dims export, for each prompt length: prefill seconds (og append_tokens of the prompt) and greedy decode
   tokens/s through onnxruntime-genai (first token excluded), the forms interleaved (A B A B), best of each.
Random weights: sizes and speed only (tests/test_deepseek_latent_cache.py checks the numerics).
"""
from __future__ import annotations

import argparse
import os
import time
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]
from decode_speed import decode_tps  # noqa: E402
from deepseek_cpu_decode import MLA_SHAPE, VOCAB, write_export  # noqa: E402

V3_MLA = (128, 96, 512, 128, 64, 128)  # DeepSeek-V3 heads / head dims (q_lora_rank kept small: not in the cache)
FORMS = ("materialized", "latent")
ELEM = {onnx.TensorProto.FLOAT: 4, onnx.TensorProto.FLOAT16: 2}


def cache_bytes_per_token_layer(model_dir: Path) -> int:
    model = onnx.load(str(model_dir / "model.onnx"), load_external_data=False)
    total = 0
    for inp in model.graph.input:
        if inp.name in ("past_key_values.0.key", "past_key_values.0.value"):
            dims = inp.type.tensor_type.shape.dim
            total += dims[1].dim_value * dims[3].dim_value * ELEM[inp.type.tensor_type.elem_type]
    return total


def prefill_seconds(model_dir: Path, prompt: np.ndarray, repeats: int) -> float:
    import onnxruntime_genai as og
    model = og.Model(str(model_dir))
    best = float("inf")
    for _ in range(repeats):
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=prompt.shape[1] + 1, min_length=0)
        gen = og.Generator(model, params)
        t = time.perf_counter()
        gen.append_tokens(prompt)
        best = min(best, time.perf_counter() - t)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=str(Path(tempfile.gettempdir()) / "quark_onnx_mla_cache"))
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt_lens", default="16,512")
    ap.add_argument("--shapes", default="small,v3_heads")
    a = ap.parse_args()
    from builder.convert import convert
    from builder.emit_context import BuildOptions
    root = Path(a.root)
    small = argparse.Namespace(hidden=256, moe_inter=128, experts=64, groups=8, topk_group=4, top_k=6, layers=4)
    real = argparse.Namespace(hidden=64, moe_inter=32, experts=8, groups=4, topk_group=2, top_k=2, layers=2)
    shapes = {"small": (small, MLA_SHAPE), "v3_heads": (real, V3_MLA)}
    shapes = {k: shapes[k] for k in a.shapes.split(",")}
    dirs = {}
    for name, (args, mla) in shapes.items():
        write_export(root / name / "export", args, mla=mla)
        for precision in ("fp32", "fp16"):
            for form in FORMS:
                out = root / name / f"{form}-{precision}"
                convert(root / name / "export", out, "cpu", precision,
                        BuildOptions(accuracy_level=1, extra={"mla_cache": form}), log=lambda _m: None)
                dirs[name, precision, form] = out
    print("cache bytes per token per layer (from past_key_values.0.key/value):")
    for name, (_args, mla) in shapes.items():
        for precision in ("fp32", "fp16"):
            b = {f: cache_bytes_per_token_layer(dirs[name, precision, f]) for f in FORMS}
            print(f"  {name} {mla} {precision}: materialized {b['materialized']}, latent {b['latent']} "
                  f"({b['materialized'] / b['latent']:.1f}x smaller)")
    print(f"fp32 io, accuracy_level=1, {a.tokens} new tokens, best of {a.repeats} per round, {a.rounds} rounds")
    for plen in (int(t) for t in a.prompt_lens.split(",")):
        prompt = np.random.default_rng(1).integers(3, VOCAB, size=(1, plen), dtype=np.int32)
        for name in shapes:
            tps, pre = {f: [] for f in FORMS}, {f: [] for f in FORMS}
            for _ in range(a.rounds):
                for form in FORMS:
                    pre[form].append(prefill_seconds(dirs[name, "fp32", form], prompt, a.repeats))
                    tps[form].append(decode_tps(dirs[name, "fp32", form], prompt, a.tokens, a.repeats))
            for form in FORMS:
                print(f"  {name} prompt {plen} {form:12s} decode tok/s " + " ".join(f"{t:7.1f}" for t in tps[form])
                      + "  prefill s " + " ".join(f"{t:7.3f}" for t in pre[form]))
            print(f"  {name} prompt {plen} latent / materialized: decode {max(tps['latent']) / max(tps['materialized']):.2f}x, "
                  f"prefill time {min(pre['latent']) / min(pre['materialized']):.2f}x (best of each); "
                  f"loadavg {os.getloadavg()[0]:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
