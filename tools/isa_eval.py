"""Teacher-forced logits of a converted model on a real export's evaluation tokens, saved for comparison across
instruction sets (run natively or under qemu-x86_64 -cpu MODEL; docs/real_model_numerics.md).

    python tools/isa_eval.py ONNX_DIR EXPORT_DIR OUT.npz [--reference reference.npz] [--greedy]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None) -> int:
    from builder.verify import load_onnx_model, onnx_greedy, onnx_sequence_logits

    ap = argparse.ArgumentParser()
    ap.add_argument("onnx_dir")
    ap.add_argument("export_dir")
    ap.add_argument("out")
    ap.add_argument("--reference", default="reference.npz")
    ap.add_argument("--greedy", action="store_true")
    args = ap.parse_args(argv)
    ref = np.load(Path(args.export_dir) / args.reference)
    t = time.time()
    model = load_onnx_model(args.onnx_dir, None)
    res = dict(logits=onnx_sequence_logits(model, ref["eval_ids"]))
    if args.greedy:
        n = ref["greedy"].shape[1]
        res["greedy"] = np.asarray([onnx_greedy(model, ref[f"prompt{i}"], n) for i in range(ref["greedy"].shape[0])])
    np.savez(args.out, **res)
    print(f"{args.out}: {time.time() - t:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
