"""Teacher-forced logits of a converted model on a real export's evaluation tokens, saved for comparison across
instruction sets (run natively or under qemu-x86_64 -cpu MODEL; docs/real_model_numerics.md).

    python tools/isa_eval.py ONNX_DIR EXPORT_DIR OUT.npz [--reference reference.npz] [--greedy]
    python tools/isa_eval.py --figures EXPORT_DIR OUT.npz [--reference ...]   # the real-model test's figures
    python tools/qemu_user.py Haswell tools/isa_eval.py ONNX_DIR EXPORT_DIR OUT.npz  # an AVX2 CPU under QEMU

tools/qemu_user.py is `qemu-x86_64 -cpu MODEL $(which python)` plus an FMA shim for QEMU itself, without which the
emulated FMAs run about 6x slower on Intel hosts (96 tokens took over 20 minutes there; tools/qemu_fma_shim.c).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def figures(export_dir: str, out: str, reference: str) -> str:
    from builder.verify import perplexity

    ref, got = np.load(Path(export_dir) / reference), np.load(out)
    ids, logits = ref["eval_ids"], got["logits"]
    ppl_rel = perplexity(logits, ids) / perplexity(ref["logits"], ids) - 1
    top1 = float((logits.argmax(-1) == ref["logits"].argmax(-1)).mean())
    if ref["draw_ppl_rel"].size < 2:  # weight-only: one draw, no floor (test_real_model_weight_only_exact)
        line = (f"ppl delta {100 * ppl_rel:+.4f} %, top-1 {top1:.3f}, max |logit diff| "
                f"{float(np.abs(logits - ref['logits']).max()):.3g} (weight-only: no floor)")
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from real_model import FLOOR_ALPHA, noise_bounds
        b = noise_bounds(ref["draw_ppl_rel"], ref["draw_top1"], FLOOR_ALPHA)
        line = (f"ppl delta {100 * ppl_rel:+.2f} % (floor {100 * b['floor_ppl_rel']:.2f} %), top-1 "
                f"{top1:.3f} (floor {b['floor_top1']:.3f})")
    if "greedy" in got.files:
        def prefix(tokens):
            return [next((i for i, (a, b) in enumerate(zip(g, e)) if a != b), len(e))
                    for g, e in zip(tokens.tolist(), ref["greedy"].tolist())]
        nudged = prefix(ref["nudged_greedy"]) if "nudged_greedy" in ref.files else "not recorded: floor > 0.5 %"
        line += f", greedy prefix {prefix(got['greedy'])} (nudged {nudged})"
    return line


def main(argv=None) -> int:
    from builder.verify import load_onnx_model, onnx_greedy, onnx_sequence_logits

    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--figures":
        rest = sys.argv[2:]
        reference = rest[rest.index("--reference") + 1] if "--reference" in rest else "reference.npz"
        print(figures(rest[0], rest[1], reference))
        return 0

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
