"""CPU decode speed (og.Generator tokens/s) of FP8 W8A8 and INT8 W8A8 conversions vs the same model with float weights.

    python benchmarks/bench_decode.py [--root DIR] [--hidden 1024] [--layers 4] [--tokens 128] [--repeats 3]
Quantizes one random Llama with amd-quark (tests/quark_factory.py, cached under --root), converts the float model and
each quantized export with `-e cpu`, and decodes greedily with onnxruntime-genai. Not a test: prints a table.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))
from decode_speed import decode_tps  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=str(Path(tempfile.gettempdir()) / "quark_onnx_bench"))
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    import quark_factory as qf
    from builder.convert import convert

    spec = qf.TinyModelSpec(hidden=args.hidden, intermediate=args.hidden * 3, layers=args.layers,
                            heads=args.hidden // 64, kv_heads=max(1, args.hidden // 256), vocab=2048,
                            max_position_embeddings=1024)
    recipes = ["fp8_w8a8", "int8_w8a8"]
    exports = qf.ensure_exports(args.root, [(spec, qf.RECIPES[r]) for r in recipes], timeout_s=3600)
    out_root = Path(args.root) / "onnx"
    models = {"float": exports[0] / "float"} | {r: e / "quark" for r, e in zip(recipes, exports)}
    prompt = np.random.default_rng(0).integers(3, spec.vocab, (1, 16)).astype(np.int32)
    rows = []
    for name, src in models.items():
        out = out_root / f"{name}_h{args.hidden}_l{args.layers}"
        convert(src, out, "cpu", log=lambda m: None)
        rows.append((name, decode_tps(out, prompt, args.tokens, args.repeats)))
    base = rows[0][1]
    print(f"model: llama hidden={args.hidden} layers={args.layers} vocab={spec.vocab}, -e cpu fp32, "
          f"{args.tokens} new tokens, best of {args.repeats}")
    print(f"{'weights':<12}{'tokens/s':>10}{'vs float':>10}")
    for name, tps in rows:
        print(f"{name:<12}{tps:>10.1f}{tps / base:>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
