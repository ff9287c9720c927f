"""CPU decode tokens/s of an MXFP4/NVFP4 Quark export converted several ways, against its float model.

    python benchmarks/fp4_cpu_decode.py EXPORT_DIR [--tokens 64] [--repeats 3]

EXPORT_DIR is a tests/quark_factory.py export (quark/ + float/ subfolders). Each variant is converted with
builder.convert (cpu, fp32) and timed with og.Generator: prompt of 16 tokens, then `--tokens` greedy steps; the
best of `--repeats` runs is reported. Results go to stdout as a markdown table (docs/fp4.md keeps the figures).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
from builder.convert import convert  # noqa: E402
from decode_speed import decode_tps  # noqa: E402
from builder.emit_context import BuildOptions  # noqa: E402

NBITS8 = {"fp4_linear": "matmul_nbits8"}
VARIANTS = {
    "float weights (fp32 MatMul)": ("float", {}),
    "MXFP4 dense (CPU default) + activation emulation": ("quark", {}),
    "MXFP4 matmul_nbits8 acc 1 + activation emulation": ("quark", {"accuracy_level": 1, "extra": NBITS8}),
    "MXFP4 matmul_nbits8 acc 1, mx_activations=skip": ("quark", {"accuracy_level": 1, "mx_activations": "skip",
                                                                 "extra": NBITS8}),
    "MXFP4 matmul_nbits8 acc 4 + activation emulation (not Quark-exact)": ("quark", {"accuracy_level": 4,
                                                                                     "extra": NBITS8}),
    "MXFP4 matmul_nbits8 acc 4, mx_activations=skip": ("quark", {"accuracy_level": 4, "mx_activations": "skip",
                                                                 "extra": NBITS8}),
}


def decode_tokens_per_s(model_dir: Path, tokens: int, repeats: int) -> float:
    return decode_tps(model_dir, np.arange(3, 19, dtype=np.int32)[None], tokens, repeats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("export", type=Path)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print("| variant | decode tokens/s | model.onnx.data MiB |\n|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, (sub, opts)) in enumerate(VARIANTS.items()):
            out = Path(tmp) / f"v{i}"
            convert(args.export / sub, out, "cpu", "fp32", BuildOptions(**opts), log=lambda _m: None)
            tps = decode_tokens_per_s(out, args.tokens, args.repeats)
            size = (out / "model.onnx.data").stat().st_size / 2**20
            print(f"| {label} | {tps:.1f} | {size:.0f} |", flush=True)


if __name__ == "__main__":
    main()
