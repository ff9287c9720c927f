"""One 4-bit per-group linear in onnxruntime, interleaved: our exact com.quark_onnx MatMulUint4 against MatMulNBits at
accuracy_level 1 (exact, fp32) and 4 (int8 activations) and the fp32 MatMul of the decoded weight.

    python benchmarks/int4_kernel.py [--threads 1 2] [--m 1 128] [--shapes 2048x8192 8192x2048] [--block 128]
                                     [--library NAME=PATH ...]

Not a test. Needs the ORT custom-op library (python -m custom_ops.ort_library). Prints ms per call (best of
--rounds interleaved rounds, each the mean of --reps calls) and the ratio to MatMulNBits accuracy_level 1.
--library adds MatMulUint4 from another build of the library (e.g. main's) to the same rounds ("ours@NAME").
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def weights(n, k, bs, rng):
    k_blocks = -(-k // bs)
    q = rng.integers(0, 16, size=(n, k_blocks * bs), dtype=np.uint8)
    b = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8).reshape(n, k_blocks, bs // 2)
    s = (rng.standard_normal((n, k_blocks)) * 0.02).astype(np.float32)
    z = rng.integers(0, 16, size=(n, k_blocks), dtype=np.uint8)
    zpad = np.concatenate([z, np.zeros((n, k_blocks % 2), np.uint8)], axis=1)
    zp = (zpad[:, 0::2] | (zpad[:, 1::2] << 4)).astype(np.uint8)
    w = (q[:, :k].astype(np.float32) - np.repeat(z, bs, 1)[:, :k]) * np.repeat(s, bs, 1)[:, :k]
    return b, s, zp, w.astype(np.float32)


def model(kind, n, k, bs, b, s, zp, w):
    inits = []
    if kind == "fp32 MatMul":
        inits = [onnx.numpy_helper.from_array(np.ascontiguousarray(w.T), "W")]
        node = helper.make_node("MatMul", ["A", "W"], ["Y"])
    else:
        inits = [onnx.numpy_helper.from_array(b, "B"), onnx.numpy_helper.from_array(s.reshape(-1), "S"),
                 onnx.numpy_helper.from_array(zp.reshape(-1), "Z")]
        if kind.startswith("MatMulNBits"):
            node = helper.make_node("MatMulNBits", ["A", "B", "S", "Z"], ["Y"], domain="com.microsoft", K=k, N=n,
                                    bits=4, block_size=bs, accuracy_level=int(kind[-1]))
        else:
            node = helper.make_node("MatMulUint4", ["A", "B", "S", "Z"], ["Y"], domain="com.quark_onnx", K=k, N=n,
                                    block_size=bs)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", k])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", n])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1),
                                            helper.make_opsetid("com.quark_onnx", 1)])
    return m.SerializeToString()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--m", type=int, nargs="+", default=[1, 128])
    ap.add_argument("--shapes", nargs="+", default=["2048x8192", "8192x2048"], help="KxN")
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="cpu: process CPU time (all threads; robust on a loaded machine, not a latency)")
    ap.add_argument("--library", action="append", default=[], metavar="NAME=PATH")
    args = ap.parse_args()
    from custom_ops import ort_library
    lib = str(ort_library.build(log=lambda m: None))
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    others = dict(spec.partition("=")[::2] for spec in args.library)
    kinds = ["ours MatMulUint4"] + [f"ours@{name}" for name in others] + ["MatMulNBits al1", "MatMulNBits al4",
                                                                         "fp32 MatMul"]
    rng = np.random.default_rng(0)
    print(f"load {os.getloadavg()}; clock {args.clock}")
    for shape in args.shapes:
        k, n = map(int, shape.split("x"))
        b, s, zp, w = weights(n, k, args.block, rng)
        for threads in args.threads:
            sessions = {}
            for kind in kinds:
                so = ort.SessionOptions()
                so.intra_op_num_threads = threads
                so.register_custom_ops_library(others.get(kind.partition("@")[2], lib))
                sessions[kind] = ort.InferenceSession(model(kind, n, k, args.block, b, s, zp, w), so,
                                                      providers=["CPUExecutionProvider"])
            for m in args.m:
                a = rng.standard_normal((m, k)).astype(np.float32)
                best = {kk: 1e9 for kk in kinds}
                ys = {}
                for kind, sess in sessions.items():
                    ys[kind] = sess.run(None, {"A": a})[0]
                for _ in range(args.rounds):
                    for kind, sess in sessions.items():
                        t0 = clock()
                        for _ in range(args.reps):
                            sess.run(None, {"A": a})
                        best[kind] = min(best[kind], (clock() - t0) / args.reps * 1e3)
                ref = best["MatMulNBits al1"]
                diff = float(np.max(np.abs(ys["ours MatMulUint4"] - ys["fp32 MatMul"])))
                print(f"K={k} N={n} g{args.block} M={m} threads={threads}: " +
                      ", ".join(f"{kk} {v:.3f} ms ({ref / v:.2f}x al1)" for kk, v in best.items()) +
                      f"; max|ours - fp32| {diff:.2e}" +
                      "".join(f"; {kk} bits {'==' if np.array_equal(ys[kk], ys['ours MatMulUint4']) else '!='} ours"
                              for kk in kinds if kk.startswith("ours@")), flush=True)
    print(f"load {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
