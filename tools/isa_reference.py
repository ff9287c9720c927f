"""Quark's reference for a real-model export, made on THIS CPU (or under `qemu-x86_64 -cpu MODEL`): the teacher-forced
logits, the 8 nudged draws that set the noise floor and the greedy tokens, exactly as tests/real_model.py makes
reference.npz, but written to OUT instead of the export folder. With tools/isa_eval.py (our ONNX model's logits on
the same CPU model) and `tools/isa_eval.py --figures EXPORT_DIR ONNX.npz --reference OUT` it is the real-model test
run end to end on another instruction set (docs/real_model_numerics.md).

    python tools/isa_reference.py EXPORT_DIR OUT.npz
    qemu-x86_64 -cpu Haswell $(which python) tools/isa_reference.py EXPORT_DIR OUT.npz   # an AVX2-only CPU
    python tools/qemu_user.py Haswell tools/isa_reference.py EXPORT_DIR OUT.npz  # the same, fast on Intel hosts

Weight-only and linear-activation schemes only: the importer (quark.torch.import_model_from_safetensors) rebuilds
Quark's model from the files; attention schemes need the in-memory quantization of tests/real_model.py.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]


def main(argv=None) -> int:
    import numpy as np
    import transformers
    from quark.torch import import_model_from_safetensors

    import real_model as rm

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print(next(ln for ln in __doc__.splitlines() if ln.strip().startswith("python tools/isa_reference.py")),
              file=sys.stderr)
        return 2
    export, out = Path(argv[0]), Path(argv[1])
    recipe = json.loads((export / "info.json").read_text())["recipe"]
    if recipe.get("attention_scheme"):
        print(f"{export}: attention scheme {recipe['name']}: needs tests/real_model.py's in-memory reference",
              file=sys.stderr)
        return 2
    t = time.time()
    tokenizer = transformers.AutoTokenizer.from_pretrained(export / "quark")
    ref = import_model_from_safetensors(None, str(export / "quark"), device="cpu").float().eval()
    rm._memoize_weights(ref)
    eval_ids = rm._long_tensor(tokenizer(rm.EVAL_TEXT, return_tensors="pt").input_ids[:, :rm.EVAL_TOKENS])
    prompts = [rm._long_tensor(tokenizer(p, return_tensors="pt").input_ids) for p in rm.PROMPTS]
    draws = rm.NOISE_DRAWS if recipe["name"] in rm.ACTIVATION_QUANTIZED else 1
    np.savez(out, **rm.reference_figures(ref, eval_ids, draws, prompts))
    print(f"{out}: {time.time() - t:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
