"""Prefill and decode speed on the real SmolLM2-135M exports of tests/real_model.py, through onnxruntime-genai CPU,
interleaved: float weights vs INT8 W8A8 (default int8_linear=dequantized_weight and the opt-in fused qdq form) and
uint4 at accuracy_level 1 vs 4.

    python benchmarks/real_model_speed.py [--root QO_FIXTURE_CACHE] [--prompt_len 256] [--tokens 64] [--rounds 3]
The exports must exist (python tests/real_model.py make --root DIR). Prints the median of `rounds` interleaved rounds;
on a shared machine compare the ratios within one run. Not a test.
"""
from __future__ import annotations

import argparse
import glob
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

VARIANTS = [  # (label, export name or "float", extra options)
    ("float", "float", {}),
    ("int8 W8A8 dequantized_weight (default)", "int8_w8a8", {}),
    ("int8 W8A8 qdq (fused integer GEMM)", "int8_w8a8", {"int8_linear": "qdq"}),
    ("uint4 accuracy_level=1", "uint4_g64_lmhead_down_g32", {"accuracy_level": "1"}),
    ("uint4 accuracy_level=4", "uint4_g64_lmhead_down_g32", {"accuracy_level": "4"}),
]


def time_one(model, prompt: np.ndarray, tokens: int) -> tuple[float, float]:
    """(prefill seconds, decode tokens/s) for one greedy generation."""
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(max_length=prompt.size + tokens + 1, do_sample=False)
    gen = og.Generator(model, params)
    t0 = time.perf_counter()
    gen.append_tokens(prompt.reshape(1, -1).astype(np.int32))
    t1 = time.perf_counter()
    for _ in range(tokens):
        gen.generate_next_token()
    return t1 - t0, tokens / (time.perf_counter() - t1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=os.environ.get("QO_FIXTURE_CACHE", str(REPO / ".cache" / "fixtures")))
    ap.add_argument("--prompt_len", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import onnxruntime_genai as og

    from builder.__main__ import parse_extra_options
    from builder.convert import convert

    real = Path(args.root) / "real"
    out = Path(tempfile.mkdtemp(prefix="real_speed_"))
    models = {}
    for label, name, extra in VARIANTS:
        src = real / "smollm2-135m-float" if name == "float" else Path(glob.glob(str(real / f"{name}-*"))[0]) / "quark"
        dst = out / label.split(" (")[0].replace(" ", "_").replace("=", "")
        convert(src, dst, "cpu", options=parse_extra_options([f"{k}={v}" for k, v in extra.items()]),
                log=lambda m: None)
        models[label] = og.Model(str(dst))
    prompt = np.random.default_rng(0).integers(100, 40000, args.prompt_len)
    results = {label: ([], []) for label in models}
    for _ in range(args.rounds):
        for label, model in models.items():
            p, d = time_one(model, prompt, args.tokens)
            results[label][0].append(p)
            results[label][1].append(d)
    base_p, base_d = (statistics.median(v) for v in results["float"])
    print(f"prompt {args.prompt_len} tokens, {args.tokens} decoded, median of {args.rounds} interleaved rounds")
    print(f"{'variant':42} {'prefill s':>10} {'x float':>8} {'decode tok/s':>13} {'x float':>8}")
    for label, (ps, ds) in results.items():
        p, d = statistics.median(ps), statistics.median(ds)
        print(f"{label:42} {p:10.3f} {p / base_p:8.2f} {d:13.1f} {d / base_d:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
