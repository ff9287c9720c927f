"""MatMulNBits accuracy_level A/B on CPU: prefill and decode speed, and logit fidelity of one build against another.

    python -m builder -i EXPORT -o AL1 -e cpu --extra_options accuracy_level=1
    python -m builder -i EXPORT -o AL4 -e cpu --extra_options accuracy_level=4
    python benchmarks/accuracy_level.py AL1 AL4 [--rounds 3] [--prefill_len 256] [--prompt_len 16] [--tokens 32]
                                       [--fidelity_seqs 4] [--fidelity_len 128]

Speed: each round runs every folder once, in order (A/B/A/B...), each in a fresh process (onnxruntime-genai CPU,
after one short warm-up generation): prefill = append_tokens of a random `prefill_len`-token prompt; decode = tokens/s
of `tokens` greedy tokens after a random `prompt_len`-token prompt (benchmarks/real_model_speed.py's time_one).
Prints every round and the medians; on a shared machine compare the ratios within one run.
Fidelity: teacher-forced logits (builder/verify.py's onnx_sequence_logits) of the later folders against the first
on `fidelity_seqs` random token sequences: max |logit diff| and top-1 agreement. On random weights this says how far
the activation quantization moves the logits, not what it does to a trained model's perplexity. Not a test.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))


def _vocab(model_dir: str) -> int:
    return json.loads((Path(model_dir) / "genai_config.json").read_text())["model"]["vocab_size"]


def one_round(model_dir: str, prefill_len: int, prompt_len: int, tokens: int) -> dict:
    """Runs in its own process: {"prefill_ms", "decode_tps"} for one folder."""
    import onnxruntime_genai as og

    from real_model_speed import time_one

    rng = np.random.default_rng(0)
    vocab = _vocab(model_dir)
    model = og.Model(model_dir)
    time_one(model, rng.integers(3, vocab, 8), 2)  # warm-up: kernels, allocator
    prefill_s, _ = time_one(model, rng.integers(3, vocab, prefill_len), 1)
    _, decode_tps = time_one(model, rng.integers(3, vocab, prompt_len), tokens)
    return {"prefill_ms": prefill_s * 1e3, "decode_tps": decode_tps}


def fidelity(dirs: list[str], seqs: int, length: int) -> list[dict]:
    import onnxruntime_genai as og

    from builder.verify import onnx_sequence_logits

    rng = np.random.default_rng(1)
    ids = [rng.integers(3, _vocab(dirs[0]), length) for _ in range(seqs)]
    logits = {}
    for d in dirs:  # one model in memory at a time
        model = og.Model(d)
        logits[d] = np.stack([onnx_sequence_logits(model, s) for s in ids])
        del model
    ref = logits[dirs[0]].astype(np.float64)
    rows = []
    for d in dirs[1:]:
        diff = np.abs(logits[d] - ref)
        rows.append(dict(folder=d, max_abs_logit_diff=float(diff.max()), mean_abs_logit_diff=float(diff.mean()),
                         top1_agreement=float((logits[d].argmax(-1) == ref.argmax(-1)).mean()),
                         reference_logit_range=float(np.abs(ref).max()), positions=seqs * length))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="*", help="converted folders; the first is the fidelity reference")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prefill_len", type=int, default=256)
    ap.add_argument("--prompt_len", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--fidelity_seqs", type=int, default=4)
    ap.add_argument("--fidelity_len", type=int, default=128)
    ap.add_argument("--no_fidelity", action="store_true")
    ap.add_argument("--no_speed", action="store_true")
    ap.add_argument("--_one", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a._one:
        print(json.dumps(one_round(a._one, a.prefill_len, a.prompt_len, a.tokens)))
        return 0
    if not a.dirs:
        ap.error("give at least one converted folder")
    if not a.no_speed:
        results = {d: [] for d in a.dirs}
        for r in range(a.rounds):
            for d in a.dirs:
                out = subprocess.run([sys.executable, __file__, "--_one", d, "--prefill_len", str(a.prefill_len),
                                      "--prompt_len", str(a.prompt_len), "--tokens", str(a.tokens)],
                                     check=True, stdout=subprocess.PIPE, text=True).stdout
                res = json.loads(out.strip().splitlines()[-1])
                results[d].append(res)
                print(f"round {r + 1} {d}: prefill {res['prefill_ms']:.0f} ms, decode {res['decode_tps']:.2f} tok/s",
                      flush=True)
        base = a.dirs[0]
        med = {d: (statistics.median(x["prefill_ms"] for x in v), statistics.median(x["decode_tps"] for x in v))
               for d, v in results.items()}
        print(f"prefill {a.prefill_len} tokens; decode {a.tokens} tokens after {a.prompt_len}; "
              f"median of {a.rounds} interleaved rounds, fresh process each")
        print(f"{'folder':40} {'prefill ms':>11} {'x first':>8} {'decode tok/s':>13} {'x first':>8}")
        for d, (p, t) in med.items():
            print(f"{d:40} {p:11.0f} {p / med[base][0]:8.2f} {t:13.2f} {t / med[base][1]:8.2f}")
    if not a.no_fidelity:
        t = time.perf_counter()
        for row in fidelity(a.dirs, a.fidelity_seqs, a.fidelity_len):
            print(f"fidelity vs {a.dirs[0]} ({time.perf_counter() - t:.0f} s): " + json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
