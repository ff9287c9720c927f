"""Greedy decode tokens/s of already-converted ONNX folders, side by side (onnxruntime-genai, CPU).

    python benchmarks/decode_speed.py DIR [DIR ...] [--prompt_len 16] [--tokens 64] [--repeats 3]
The prompt is random token ids, so no tokenizer is needed; the first generated token (prompt processing) is
excluded. Use it to compare this builder's output with onnxruntime-genai's builder on the same export.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def decode_tps(model_dir: Path, prompt: np.ndarray, tokens: int, repeats: int) -> float:
    import onnxruntime_genai as og
    model = og.Model(str(model_dir))
    best = 0.0
    for _ in range(repeats):
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=prompt.shape[1] + tokens, min_length=0)
        gen = og.Generator(model, params)
        gen.append_tokens(prompt)
        gen.generate_next_token()
        t, n = time.perf_counter(), 0
        while not gen.is_done():
            gen.generate_next_token()
            n += 1
        best = max(best, n / (time.perf_counter() - t))
    return best


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--prompt_len", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    for d in a.dirs:
        cfg = json.loads((Path(d) / "genai_config.json").read_text())["model"]
        vocab = cfg["vocab_size"]
        prompt = np.random.default_rng(0).integers(3, vocab, size=(1, a.prompt_len), dtype=np.int32)
        tps = decode_tps(Path(d), prompt, a.tokens, a.repeats)
        print(f"{d}: {tps:.1f} tokens/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
