"""One lm_head matmul at a Llama-3 vocabulary on ORT CPU, in each storage form the builder can emit.

    python benchmarks/lm_head_forms.py [--hidden 2048] [--vocab 128256] [--threads 2] [--runs 20] [--prompt 128]

x [M, hidden] times the lm_head, at M=1 (one decode token) and M=--prompt (a prompt's logits): fp32 MatMul on
W.T (the exact default on CPU before the row-order Gemm), fp32 Gemm transB=1 on W (the exact CPU default now),
the com.quark_onnx MatMulBf16 kernel on the checkpoint's bf16 W (`--extra_options lm_head=bf16`, exact; needs
`python -m custom_ops.ort_library`), fp16 MatMul (what `-p fp16` stores), and MatMulNBits at accuracy_level 4 with
8-bit weights (`--extra_options lm_head=int8`, block 128, and block 32 for comparison) and 4-bit block 32 (what the
onnxruntime-genai builder makes of the lm_head when it is not excluded). Random weights: speed only. Prints mean
ms per run.
"""
from __future__ import annotations

import argparse
import gc
import tempfile
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper


def _tensor(array: np.ndarray, name: str) -> onnx.TensorProto:
    if array.dtype == ml_dtypes.bfloat16:
        return helper.make_tensor(name, TensorProto.BFLOAT16, array.shape, array.view(np.uint16).tobytes(), raw=True)
    return numpy_helper.from_array(array, name)


def session(node, inits, elem, k, n, threads, library=None, functions=()):
    """Saved with external data and loaded from the file, so that only ORT holds the weight (peak ~2x one copy)."""
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", elem, ["M", k])],
                          [helper.make_tensor_value_info("y", elem, ["M", n])],
                          [_tensor(*i) for i in inits])
    inits.clear()
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    if functions:
        opsets.append(helper.make_opsetid("com.quark_onnx", 1))
    m = helper.make_model(g, opset_imports=opsets, functions=list(functions))
    m.ir_version = 10
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    if library:
        so.register_custom_ops_library(str(library))
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


def report(label, sess, x, prompt, runs, dtype=np.float32):
    one = ms_per_run(sess, x[:1].astype(dtype), runs)
    many = ms_per_run(sess, x.astype(dtype), max(2, runs // 10))
    print(f"{label}: M=1 {one:.1f} ms, M={prompt} {many:.1f} ms", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--prompt", type=int, default=128)
    a = ap.parse_args()
    k, n = a.hidden, a.vocab
    rng = np.random.default_rng(0)
    x = rng.standard_normal((a.prompt, k)).astype(np.float32)
    w = (0.02 * rng.standard_normal((n, k), np.float32)).astype(ml_dtypes.bfloat16)  # [vocab, hidden] like a checkpoint
    mm = helper.make_node("MatMul", ["x", "w"], ["y"])
    for dtype, elem, label in ((np.float32, 1, "fp32 MatMul on W.T"), (np.float16, 10, "fp16 MatMul (fp16 io)")):
        sess = session(mm, [(np.ascontiguousarray(w.astype(dtype).T), "w")], elem, k, n, a.threads)
        report(label, sess, x, a.prompt, a.runs, dtype)
        del sess
        gc.collect()
    gemm = helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)
    sess = session(gemm, [(w.astype(np.float32), "w")], 1, k, n, a.threads)
    report("fp32 Gemm transB=1 on W (CPU default)", sess, x, a.prompt, a.runs)
    del sess
    gc.collect()
    try:
        from custom_ops.functions import FUNCTIONS
        from custom_ops.ort_library import available
        library, why = available()
    except ImportError as exc:
        library, why = None, str(exc)
    if library:
        node = helper.make_node("MatMulBf16", ["x", "w"], ["y"], domain="com.quark_onnx")
        sess = session(node, [(w, "w")], 1, k, n, a.threads, library=library, functions=[FUNCTIONS["MatMulBf16"]()])
        report("MatMulBf16 kernel on bf16 W (lm_head=bf16)", sess, x, a.prompt, a.runs)
        del sess
        gc.collect()
    else:
        print(f"MatMulBf16 kernel: skipped ({why})")
    for bits, bs in ((8, 128), (8, 32), (4, 32)):
        nb = k // bs
        node = helper.make_node("MatMulNBits", ["x", "b", "s"], ["y"], domain="com.microsoft", K=k, N=n, bits=bits,
                                block_size=bs, accuracy_level=4)
        sess = session(node, [(rng.integers(0, 256, (n, nb, bs * bits // 8), dtype=np.uint8), "b"),
                              (np.full(n * nb, 0.01, np.float32), "s")], 1, k, n, a.threads)
        report(f"MatMulNBits {bits}-bit block {bs} accuracy_level 4", sess, x, a.prompt, a.runs)
        del sess
        gc.collect()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
