"""CPU speed of each com.quark_onnx kernel (custom-op library) against its ONNX-function fallback and against the
standard-op form the builder emits on CPU by default, at decode and prefill sizes, all through ORT 1.x CPU.

    python benchmarks/custom_ops_cpu.py [--k 4096 --n 4096] [--prefill 128] [--seconds 1.5] [--threads N] [--json OUT]

Forms per op (one-node or few-node models, weights as initializers, A fp32 [M, K]):
  kernel    the com.quark_onnx node, library registered (custom_ops/build/ort, `python -m custom_ops.ort_library`)
  function  the same model without the library: ORT inlines the FunctionProto (weight decoded on every run)
  standard  what the builder emits on CPU without custom ops: MXFP4 -> MatMul on the dense fp32 weight
            (fp4_linear=dense); FP8 -> activation Q/DQ (static) or the per-token unit + MatMul on the fp32
            dequantized weight (fp8_linear=dequantized_weight). 4x (FP8) / 8x (MXFP4) the weight bytes.
Timing: the forms of one case run round-robin, one call each per round, until --seconds per form; the median is
reported (a shared 2-core machine is noisy: compare within a row, not across runs).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from custom_ops import ort_library  # noqa: E402
from custom_ops import reference as ref  # noqa: E402
from custom_ops.single_op import session, single_op_model  # noqa: E402


def standard_model(op: str, k: int, weights: dict, w_dense: np.ndarray) -> onnx.ModelProto:
    """The builder's CPU standard-op form: fp32 weight [K, N] MatMul, after the same activation quantization."""
    n = helper.make_node
    inits = [numpy_helper.from_array(np.ascontiguousarray(w_dense.T.astype(np.float32)), "W")]
    nodes, x = [], "A"
    if op == "MatMulFp8W8A8":
        inits += [numpy_helper.from_array(np.asarray(weights["A_scale"], np.float32), "s"),
                  helper.make_tensor("z", TensorProto.FLOAT8E4M3FN, [], b"\x00", raw=True)]
        nodes += [n("QuantizeLinear", ["A", "s", "z"], ["q"], saturate=1), n("DequantizeLinear", ["q", "s"], ["x"])]
        x = "x"
    elif op == "MatMulFp8W8A8Dyn":  # builder/ops/qdq.py fp8_dynamic_unit: u = fp8(x / s) ; y = (u @ W) * s
        inits += [numpy_helper.from_array(np.array(448, np.float32), "fp8_max"),
                  numpy_helper.from_array(np.array(0, np.float32), "zero"),
                  numpy_helper.from_array(np.array(np.finfo(np.float32).eps, np.float32), "eps"),
                  numpy_helper.from_array(np.array(1, np.float32), "one"),
                  numpy_helper.from_array(np.array([-1], np.int64), "axes"),
                  helper.make_tensor("z", TensorProto.FLOAT8E4M3FN, [], b"\x00", raw=True)]
        nodes += [n("Abs", ["A"], ["ab"]), n("ReduceMax", ["ab", "axes"], ["am"], keepdims=1),
                  n("Div", ["am", "fp8_max"], ["s0"]), n("Equal", ["s0", "zero"], ["iz"]),
                  n("Where", ["iz", "eps", "s0"], ["s"]), n("Div", ["A", "s"], ["xs"]),
                  n("QuantizeLinear", ["xs", "one", "z"], ["q"], saturate=1),
                  n("DequantizeLinear", ["q", "one"], ["x"])]
        x = "x"
    out = "Y" if op != "MatMulFp8W8A8Dyn" else "y0"
    nodes.append(n("MatMul", [x, "W"], [out]))
    if op == "MatMulFp8W8A8Dyn":
        nodes.append(n("Mul", ["y0", "s"], ["Y"]))
    graph = helper.make_graph(nodes, f"standard_{op}", [helper.make_tensor_value_info("A", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def weights_for(op: str, rng, n: int, k: int):
    if op == "MatMulMxfp4":
        b, s = ref.random_mxfp4_weight(rng, n, k)
        return {"B": b, "B_scale": s}, ref.dequantize_mxfp4(b, s)
    w = rng.standard_normal((n, k)).astype(np.float32)
    scale = (np.abs(w).max(axis=1) / 448).astype(np.float32)
    b = ref.saturate_cast_e4m3fn(w / scale[:, None])
    weights = {"B": b, "B_scale": scale}
    if op == "MatMulFp8W8A8":
        weights["A_scale"] = np.float32(4.0 / 448)
    return weights, ref.dequantize_fp8_weight(b, scale)


def time_forms(sessions: dict, a: np.ndarray, seconds: float) -> dict[str, float]:
    for s in sessions.values():  # warm-up (first-run allocations, function inlining already done at load)
        s.run(None, {"A": a})
    samples = {name: [] for name in sessions}
    spent = dict.fromkeys(sessions, 0.0)
    while min(spent.values()) < seconds or min(len(v) for v in samples.values()) < 3:
        for name, s in sessions.items():
            t0 = time.perf_counter()
            s.run(None, {"A": a})
            dt = time.perf_counter() - t0
            samples[name].append(dt)
            spent[name] += dt
        if max(len(v) for v in samples.values()) >= 200:
            break
    return {name: statistics.median(v) * 1e3 for name, v in samples.items()}


_MEMORY_CHILD = """
import gc, sys, numpy as np
sys.path.insert(0, sys.argv[1])
from benchmarks.custom_ops_cpu import standard_model, weights_for
from custom_ops.single_op import session, single_op_model
op, form, k, n, m, lib = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7]
weights, w_dense = weights_for(op, np.random.default_rng(0), n, k)
blob = (standard_model(op, k, weights, w_dense) if form == "standard"
        else single_op_model(op, np.float32, k, weights)).SerializeToString()
del weights, w_dense
gc.collect()
def kib(field):
    return int(next(l for l in open("/proc/self/status") if l.startswith(field)).split()[1])
import onnx
rss0 = kib("VmRSS:")
s = session(onnx.load_from_string(blob), library=lib if form == "kernel" else None)
rss1 = kib("VmRSS:")
open("/proc/self/clear_refs", "w").write("5")  # Linux: reset the peak (VmHWM) to the current RSS
s.run(None, {"A": np.ones((m, k), np.float32)})
print(rss1 - rss0, kib("VmHWM:") - rss1)
"""


def run_memory(library: str, k: int, n: int, m: int) -> list[dict]:
    """RSS growth from creating the session (the model blob held by the caller already counted before), and the
    extra peak of one run (Linux VmHWM after clear_refs); a fresh process per form."""
    import subprocess
    rows = []
    for op in ("MatMulMxfp4", "MatMulFp8W8A8", "MatMulFp8W8A8Dyn"):
        row = {"op": op, "M": m}
        for form in ("kernel", "function", "standard"):
            out = subprocess.run([sys.executable, "-c", _MEMORY_CHILD, str(REPO), op, form, str(k), str(n), str(m),
                                  library], capture_output=True, text=True, check=True).stdout.split()
            row[f"{form}_session_MiB"] = round(int(out[0]) / 1024, 1)
            row[f"{form}_run_peak_MiB"] = round(int(out[1]) / 1024, 1)
        rows.append(row)
        print(f"{op:17s} M={m}: session RSS (+ extra peak of one run): " + ", ".join(
            f"{f} {row[f'{f}_session_MiB']:.0f} (+{row[f'{f}_run_peak_MiB']:.0f}) MiB"
            for f in ("kernel", "function", "standard")), flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--prefill", type=int, default=128)
    p.add_argument("--seconds", type=float, default=1.5)
    p.add_argument("--threads", type=int, default=0, help="ORT intra-op threads (0: ORT's default, one per core)")
    p.add_argument("--json", type=Path)
    p.add_argument("--memory", action="store_true", help="only the peak-memory comparison (fresh process per form)")
    args = p.parse_args(argv)
    library = str(ort_library.build(log=lambda m: print(m, file=sys.stderr)))
    if args.memory:
        rows = run_memory(library, args.k, args.n, 1)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=2))
        return 0
    rng = np.random.default_rng(0)
    rows = []
    for op in ("MatMulMxfp4", "MatMulFp8W8A8", "MatMulFp8W8A8Dyn"):
        weights, w_dense = weights_for(op, rng, args.n, args.k)
        model = single_op_model(op, np.float32, args.k, weights)
        t = args.threads
        sessions = {"kernel": session(model, library=library, threads=t), "function": session(model, threads=t),
                    "standard": session(standard_model(op, args.k, weights, w_dense), threads=t)}
        for label, m in (("decode", 1), ("prefill", args.prefill)):
            a = rng.standard_normal((m, args.k)).astype(np.float32)
            ys = {name: s.run(None, {"A": a})[0] for name, s in sessions.items()}
            spread = max(float(np.abs(ys[f] - ys["kernel"]).max()) for f in ys) / float(np.abs(ys["kernel"]).max())
            ms = time_forms(sessions, a, args.seconds)
            row = dict(op=op, phase=label, M=m, K=args.k, N=args.n, **{f"{k}_ms": round(v, 3) for k, v in ms.items()},
                       kernel_vs_function=round(ms["function"] / ms["kernel"], 2),
                       kernel_vs_standard=round(ms["standard"] / ms["kernel"], 2), max_rel_spread=spread)
            rows.append(row)
            print(f"{op:17s} {label:7s} M={m:<4d} kernel {ms['kernel']:9.2f} ms  function {ms['function']:9.2f} ms  "
                  f"standard {ms['standard']:9.2f} ms  (function/kernel {row['kernel_vs_function']:.2f}x, "
                  f"standard/kernel {row['kernel_vs_standard']:.2f}x)", flush=True)
        del sessions
    print("\n| op | phase (M) | kernel ms | function fallback ms | standard form ms | function / kernel | "
          "standard / kernel |\n|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['op']} | {r['phase']} ({r['M']}) | {r['kernel_ms']:.2f} | {r['function_ms']:.2f} | "
              f"{r['standard_ms']:.2f} | {r['kernel_vs_function']:.2f}x | {r['kernel_vs_standard']:.2f}x |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
