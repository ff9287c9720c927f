#!/usr/bin/env python3
"""(Re)make the committed examples with amd-quark 0.13 on CPU: the export examples/tiny-llama-uint4-quark/ and the
float model it was quantized from, examples/tiny-llama-float/ (the input of the README's pipeline section).

    python examples/make_example.py [--out examples/tiny-llama-uint4-quark] [--float_out examples/tiny-llama-float]

A random LlamaForCausalLM (hidden 64, 2 layers, 4 heads / 2 KV heads, vocab 256, bf16) quantized to uint4
asymmetric per-group 32 (lm_head left in bf16, the template's default) and exported in Quark hf_format, with a tiny
tokenizer and generation_config.json. reference.npz beside it holds what Quark's own fake-quantized model computes
(see tests/quark_factory.py REFERENCE_KEYS). Needs `pip install -e .[quantize]`.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from quark_factory import RECIPES, TinyModelSpec, make_export  # noqa: E402

EXAMPLE_SPEC = TinyModelSpec(arch="llama", hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, vocab=256,
                             dtype="bfloat16", seed=0)
EXAMPLE_RECIPE = RECIPES["uint4_g32"]
KEEP = ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "examples" / "tiny-llama-uint4-quark"))
    ap.add_argument("--float_out", default=str(REPO / "examples" / "tiny-llama-float"))
    args = ap.parse_args()
    out, float_out = Path(args.out), Path(args.float_out)
    with tempfile.TemporaryDirectory() as tmp:
        made = make_export(Path(tmp) / "export", EXAMPLE_SPEC, EXAMPLE_RECIPE, prompt_len=8, new_tokens=16)
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        for name in KEEP:
            shutil.copy2(made / "quark" / name, out / name)
        shutil.copy2(made / "reference.npz", out / "reference.npz")
        if float_out.exists():
            shutil.rmtree(float_out)
        shutil.copytree(made / "float", float_out)
    for folder in (out, float_out):
        size = sum(f.stat().st_size for f in folder.iterdir())
        print(f"wrote {folder} ({size / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
