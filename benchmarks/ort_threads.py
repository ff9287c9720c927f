"""Wall time of one com.quark_onnx linear in an ORT session with 1 and 2 intra-op threads, the way og runs a model
(issue #22: do the kernels' threads scale on both cores through ORT's pool, KernelContext_ParallelFor?).

    python benchmarks/ort_threads.py [--formats fp8,int8,bf16,uint4,fp32] [--shapes 4096x14336,14336x4096]
                                     [--threads 1,2] [--m 1] [--rounds 7] [--reps 20] [--spin 1]
                                     [--library NAME=PATH ...] [--json OUT]

Not a test. Shapes are K x N (weight [N, K]); the default ones are an 8B gate/up and down projection. Forms, each
a one-node model: the custom op with the library (fp8 MatMulFp8, int8 MatMulInt8, bf16 MatMulBf16, uint4 MatMulUint4
g128; weights from benchmarks/custom_ops_cpu.py and benchmarks/int4_kernel.py) and "fp32", ORT's own MatMul on the
dense fp32 weight (MLAS: the scaling the machine gives a kernel known to scale, measured in the same rounds).
--library adds another build of the library (e.g. main's) in the same rounds: before/after on the same load.
Sessions: intra_op_num_threads = 1 or 2; --spin 1 keeps ORT's default (the pool's threads spin after a run, as in
og's sessions), 0 sets session.intra_op.allow_spinning=0. Every round runs --reps calls of each (form, threads)
session in turn (the order shuffled each round); per session the minimum and the median of the per-call wall
times over all rounds are reported, "x" = 1-thread median / 2-thread median, and "cpu" = the median process CPU
time per call (all threads; with --spin 0 idle pool threads sleep, so it is the work the call cost; "cpu" ratio
= 2-thread / 1-thread: 1.0 means the split added no work, memory stalls included). The load average is printed
before and after: a 2-core machine shared with other jobs can only show scaling when they leave a core free.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from custom_ops_cpu import fp32_model, kernel_model, make_weight  # noqa: E402
from int4_kernel import model as int4_model, weights as int4_weights  # noqa: E402

from custom_ops import ort_library  # noqa: E402


def forms_of(fmt: str, k: int, n: int, rng):
    """(blob, weight bytes) of the kernel form and the fp32-dense form of one format at K x N."""
    if fmt == "uint4":
        b, s, zp, w = int4_weights(n, k, 128, rng)
        return (int4_model("ours MatMulUint4", n, k, 128, b, s, zp, w), b.nbytes + s.nbytes + zp.nbytes,
                int4_model("fp32 MatMul", n, k, 128, b, s, zp, w))
    op, inits, attrs, nbytes, dense = make_weight(fmt, rng, n, k)
    return kernel_model(op, inits, attrs), nbytes, fp32_model(dense)


def session(blob: bytes, threads: int, library: str | None, spin: bool) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    if not spin:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if library:
        so.register_custom_ops_library(library)
    return ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--formats", default="fp8,int8,bf16,uint4,fp32")
    ap.add_argument("--shapes", default="4096x14336,14336x4096")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--spin", type=int, default=1)
    ap.add_argument("--library", action="append", default=[], metavar="NAME=PATH")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    libs = {"": str(ort_library.build(log=lambda m: None))}
    for spec in a.library:
        name, _, path = spec.partition("=")
        libs[name] = path
    threads = [int(t) for t in a.threads.split(",")]
    rng = np.random.default_rng(0)
    rows = []
    print(f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}; M = {a.m}; spin {a.spin}; wall ms per call "
          f"(min / median), x = 1t median / 2t median")
    formats = a.formats.split(",")
    for shape in a.shapes.split(","):
        k, n = map(int, shape.split("x"))
        x = rng.standard_normal((a.m, k)).astype(np.float32)
        sessions = {}
        nbytes = {}
        for fmt in [f for f in formats if f != "fp32"] or ["fp8"]:
            blob, nb, dense_blob = forms_of(fmt, k, n, rng)
            if fmt in formats:
                for lib, path in libs.items():
                    for t in threads:
                        sessions[(fmt + (f"@{lib}" if lib else ""), t)] = session(blob, t, path, bool(a.spin))
                        nbytes[fmt + (f"@{lib}" if lib else "")] = nb
            if "fp32" in formats and "fp32" not in nbytes:
                for t in threads:
                    sessions[("fp32", t)] = session(dense_blob, t, None, bool(a.spin))
                nbytes["fp32"] = 4 * k * n
            del dense_blob
        outs = {key: s.run(None, {"A": x})[0] for key, s in sessions.items()}
        for (form, t), y in outs.items():
            same_as = outs[(form, threads[0])]
            if not np.array_equal(y, same_as) and form != "fp32":
                print(f"  {form}: {t} threads differ from {threads[0]} in bits")
        samples = {key: [] for key in sessions}
        cpu = {key: [] for key in sessions}
        order = list(sessions)
        for _ in range(a.rounds):
            rng.shuffle(order)
            for key in order:
                s = sessions[key]
                feed = {"A": x}
                for _ in range(a.reps):
                    c0, t0 = time.process_time(), time.perf_counter()
                    s.run(None, feed)
                    samples[key].append(time.perf_counter() - t0)
                    cpu[key].append(time.process_time() - c0)
        for form in nbytes:
            med = {t: statistics.median(samples[(form, t)]) * 1e3 for t in threads}
            mn = {t: min(samples[(form, t)]) * 1e3 for t in threads}
            cp = {t: statistics.median(cpu[(form, t)]) * 1e3 for t in threads}
            row = {"form": form, "K": k, "N": n, "M": a.m, "weight_MB": nbytes[form] / 1e6,
                   **{f"{t}t_min_ms": mn[t] for t in threads}, **{f"{t}t_median_ms": med[t] for t in threads},
                   **{f"{t}t_cpu_median_ms": cp[t] for t in threads}}
            cells = "  ".join(f"{t}t {mn[t]:.3f} / {med[t]:.3f} (cpu {cp[t]:.3f})" for t in threads)
            speedup = ""
            if len(threads) > 1:
                row["x"] = med[threads[0]] / med[threads[-1]]
                row["x_min"] = mn[threads[0]] / mn[threads[-1]]
                row["cpu_ratio"] = cp[threads[-1]] / cp[threads[0]]
                speedup = f"  x {row['x']:.2f} (min {row['x_min']:.2f}; cpu {row['cpu_ratio']:.2f})"
            gbs = nbytes[form] / (mn[threads[-1]] * 1e-3) / 1e9
            print(f"{form:14s} {k}x{n}: {cells}{speedup}  ({gbs:.1f} GB/s at {threads[-1]}t min)", flush=True)
            rows.append(row)
        del sessions
    print(f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if a.json:
        Path(a.json).write_text(json.dumps({"load_end": os.getloadavg(), "spin": a.spin, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
