"""Prefill and decode speed of already-converted ONNX folders, interleaved (A B A B ... per round), best of N rounds,
wall and process CPU time (onnxruntime-genai, CPU). Not a test.

    python benchmarks/prefill_decode_ab.py DIR [DIR ...] [--prompt_len 96] [--tokens 64] [--rounds 8]
e.g. one export converted with the default and with `--extra_options attention=fused` (docs/real_model_numerics.md,
issue 21's fixed-order softmax). The prompt is fixed synthetic token ids, so no tokenizer is needed.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np


def main(argv=None) -> int:
    import onnxruntime_genai as og

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--prompt_len", type=int, default=96)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args(argv)
    models = [og.Model(d) for d in args.dirs]
    ids = (np.arange(args.prompt_len) * 37 % 40000 + 100).astype(np.int32).reshape(1, -1)
    best = {d: dict(prefill=1e9, pcpu=1e9, decode=1e9, dcpu=1e9) for d in args.dirs}
    for _ in range(args.rounds):
        for d, model in zip(args.dirs, models):
            params = og.GeneratorParams(model)
            params.set_search_options(max_length=args.prompt_len + args.tokens, do_sample=False)
            gen = og.Generator(model, params)
            t0, c0 = time.perf_counter(), time.process_time()
            gen.append_tokens(ids)
            t1, c1 = time.perf_counter(), time.process_time()
            n = 0
            while not gen.is_done() and n < args.tokens:
                gen.generate_next_token()
                n += 1
            t2, c2 = time.perf_counter(), time.process_time()
            b = best[d]
            b["prefill"], b["pcpu"] = min(b["prefill"], t1 - t0), min(b["pcpu"], c1 - c0)
            b["decode"], b["dcpu"] = min(b["decode"], (t2 - t1) / n), min(b["dcpu"], (c2 - c1) / n)
    for d in args.dirs:
        b = best[d]
        print(f"{Path(d).name}: prefill {args.prompt_len} tokens {b['prefill'] * 1e3:.1f} ms (CPU {b['pcpu'] * 1e3:.1f} "
              f"ms), decode {1 / b['decode']:.1f} tok/s ({b['decode'] * 1e3:.2f} ms/token, CPU "
              f"{b['dcpu'] * 1e3:.2f} ms/token)")
    print("loadavg", Path("/proc/loadavg").read_text().strip() if Path("/proc/loadavg").exists() else "n/a")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
