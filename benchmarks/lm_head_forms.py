"""One lm_head matmul at a Llama-3 vocabulary on ORT CPU, in each storage form the builder can emit.

    python benchmarks/lm_head_forms.py [--hidden 2048] [--vocab 128256] [--threads 2] [--runs 20]

x [1, hidden] (one decode token) times the lm_head: fp32 MatMul (the exact default on CPU), fp16 MatMul (what
`-p fp16` stores), and MatMulNBits at accuracy_level 4 with 8-bit weights (`--extra_options lm_head=int8`, block 128,
and block 32 for comparison) and 4-bit block 32 (what the onnxruntime-genai builder makes of the lm_head when it is
not excluded). Random weights: speed only. Prints mean ms per run.
"""
from __future__ import annotations

import argparse
import gc
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import onnx
from onnx import helper, numpy_helper


def session(node, inits, elem, k, n, threads):
    """Saved with external data and loaded from the file, so that only ORT holds the weight (peak ~2x one copy)."""
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", elem, [1, k])],
                          [helper.make_tensor_value_info("y", elem, [1, n])],
                          [numpy_helper.from_array(*i) for i in inits])
    inits.clear()
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.onnx"
        onnx.save(m, str(path), save_as_external_data=True, location="m.onnx.data")
        del m, g
        gc.collect()
        return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def ms_per_run(sess, x, runs):
    for _ in range(3):
        sess.run(None, {"x": x})
    t = time.perf_counter()
    for _ in range(runs):
        sess.run(None, {"x": x})
    return (time.perf_counter() - t) / runs * 1e3


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=20)
    a = ap.parse_args()
    k, n = a.hidden, a.vocab
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, k)).astype(np.float32)
    mm = helper.make_node("MatMul", ["x", "w"], ["y"])
    for dtype, elem, label in ((np.float32, 1, "fp32 MatMul"), (np.float16, 10, "fp16 MatMul (fp16 io)")):
        w = (0.02 * rng.standard_normal((k, n), np.float32)).astype(dtype, copy=False)
        sess = session(mm, [(w, "w")], elem, k, n, a.threads)
        del w
        print(f"{label}: {ms_per_run(sess, x.astype(dtype), a.runs):.1f} ms", flush=True)
        del sess
        gc.collect()
    for bits, bs in ((8, 128), (8, 32), (4, 32)):
        nb = k // bs
        node = helper.make_node("MatMulNBits", ["x", "b", "s"], ["y"], domain="com.microsoft", K=k, N=n, bits=bits,
                                block_size=bs, accuracy_level=4)
        sess = session(node, [(rng.integers(0, 256, (n, nb, bs * bits // 8), dtype=np.uint8), "b"),
                              (np.full(n * nb, 0.01, np.float32), "s")], 1, k, n, a.threads)
        print(f"MatMulNBits {bits}-bit block {bs} accuracy_level 4: {ms_per_run(sess, x, a.runs):.1f} ms", flush=True)
        del sess
        gc.collect()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
