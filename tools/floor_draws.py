"""How often does a faithful runtime fail the real-model floor? K nudged Quark forwards of one real export (each as if
it were the runtime under test), and the leave-one-out false-failure rate of the floor rule (docs/real_model_numerics.md).

    python tools/floor_draws.py draws ROOT SCHEME K OUT.npz [--onnx DIR]   # K nudged forwards (seeds 0..K-1)
    python tools/floor_draws.py rates OUT.npz [--trials N]                # old rule vs real_model.noise_bounds

ROOT is a fixture cache (QO_FIXTURE_CACHE) holding SCHEME's export (tests/real_model.py). --onnx: also the converted
model's ppl / top-1, for its rank among the draws. Run with OMP_NUM_THREADS=2 to reproduce the test's reference.
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))


def draws(root: Path, scheme: str, k: int, out: str, onnx: str | None) -> None:
    import torch

    from builder.verify import perplexity
    from real_model import REAL_SCHEMES, _noise_floor_logits, _quantized_reference, export_dir_for

    recipe = REAL_SCHEMES[scheme]
    ref = np.load(export_dir_for(root, recipe) / "reference.npz")
    ids_np = ref["eval_ids"]
    ids = torch.from_numpy(ids_np).reshape(1, -1)
    model = _quantized_reference(root, recipe, None)[0]
    with torch.no_grad():
        q = model(input_ids=ids, use_cache=False).logits[0].float().numpy()
    print(f"{scheme}: Quark == reference.npz: {np.array_equal(q, ref['logits'])}", flush=True)
    runs = [_noise_floor_logits(model, ids, s) for s in range(k)]
    res = dict(ppl_q=perplexity(q, ids_np), top_q=q.argmax(-1), ppl=np.array([perplexity(r, ids_np) for r in runs]),
               top=np.array([r.argmax(-1) for r in runs]))
    if onnx:
        from builder.verify import load_onnx_model, onnx_sequence_logits
        o = onnx_sequence_logits(load_onnx_model(onnx, None), ids_np)
        res.update(ppl_o=perplexity(o, ids_np), top_o=o.argmax(-1))
    np.savez(out, **res)


def rates(path: str, trials: int) -> None:
    from real_model import FLOOR_ALPHA, NOISE_DRAWS, noise_bounds

    f = np.load(path)
    ppl_q, ppl, top, top_q = float(f["ppl_q"]), f["ppl"], f["top"], f["top_q"]
    k = ppl.size
    d, a = ppl / ppl_q - 1, (top == top_q).mean(-1)
    z = (d - d.mean()) / d.std()
    print(f"K={k}: ppl delta mean {100 * d.mean():+.2f} % sd {100 * d.std(ddof=1):.2f} % [{100 * d.min():+.2f}, "
          f"{100 * d.max():+.2f}] skew {np.mean(z ** 3):.2f} kurtosis {np.mean(z ** 4):.2f}; top-1 mean {a.mean():.3f} "
          f"[{a.min():.3f}, {a.max():.3f}]")
    if "ppl_o" in f.files:
        od, oa = float(f["ppl_o"]) / ppl_q - 1, float((f["top_o"] == top_q).mean())
        print(f"onnx: {100 * od:+.2f} %, top-1 {oa:.3f}; draws farther from Quark: {(np.abs(d) > abs(od)).sum()}/{k}, "
              f"with lower top-1: {(a < oa).sum()}/{k}")

    def old(i, s):  # the range over the pairs among Quark and 3 draws
        rp, rt = np.concatenate([[ppl_q], ppl[s]]), np.concatenate([top_q[None], top[s]])
        pairs = list(itertools.combinations(range(len(s) + 1), 2))
        return (abs(d[i]) > max(0.005, max(abs(rp[x] / rp[y] - 1) for x, y in pairs)),
                a[i] < min((rt[x] == rt[y]).mean() for x, y in pairs))

    def new(i, s, alpha):
        b = noise_bounds(d[s], a[s], alpha)
        return abs(d[i]) > max(0.005, b["floor_ppl_rel"]), a[i] < b["floor_top1"]

    rng = np.random.default_rng(0)
    rules = [("old: range of Quark + 3", 3, old)] + [
        (f"new: {NOISE_DRAWS} draws, alpha {al}", NOISE_DRAWS, lambda i, s, al=al: new(i, s, al)) for al in (0.01, FLOOR_ALPHA)]
    for label, n, rule in rules:
        fails = np.zeros(3)
        count = 0
        for i in range(k):
            others = np.delete(np.arange(k), i)
            for _ in range(trials // k + 1):
                bp, bt = rule(i, rng.choice(others, n, replace=False))
                fails += (bp, bt, bp or bt)
                count += 1
        print(f"{label:28s} false failures: ppl {fails[0] / count:.3f}, top-1 {fails[1] / count:.3f}, either "
              f"{fails[2] / count:.3f} ({count} trials)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    dr = sub.add_parser("draws")
    dr.add_argument("root")
    dr.add_argument("scheme")
    dr.add_argument("k", type=int)
    dr.add_argument("out")
    dr.add_argument("--onnx")
    ra = sub.add_parser("rates")
    ra.add_argument("out")
    ra.add_argument("--trials", type=int, default=8000)
    args = ap.parse_args(argv)
    if args.cmd == "draws":
        draws(Path(args.root), args.scheme, args.k, args.out, args.onnx)
    else:
        rates(args.out, args.trials)
    return 0


if __name__ == "__main__":
    sys.exit(main())
