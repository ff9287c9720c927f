"""FP4 GEMV / GEMM, the two weight layouts side by side (issue #22): the checkpoint's [N, K/2] bytes
(qo_matmul_{mxfp4,nvfp4}_f32) against the same bytes in 16-row tiles (qo_matmul_{mxfp4,nvfp4}_r16_f32,
custom_ops/src/qo_cpu_fp4_r16.c), and a plain memory read, in one run.

    python benchmarks/fp4_r16_ab.py [--shapes 4096x4096,4096x14336,14336x4096] [--m 1] [--threads 1] [--rounds 5]

Protocol: as many copies of each weight as make 256 MiB (more than this guest's L3 keeps), called back to back on
every copy in turn, as a decode step reads its layers; the C functions are called through ctypes with their
arguments prepared once (no Python wrapper in the timed loop: the wrapper's checks cost the kernel 10-15 % of a
1 ms call). Time: 1 thread by the thread's CPU time, more by wall time (OMP_WAIT_POLICY=active: spinning, as ORT's
pool). Per cell: best of --rounds of the mean call time; GB/s = weight bytes (codes + block scales) / time; % of the
plain read (benchmarks/custom_ops_cpu.py's loop on a 256 MiB buffer) of the same round set and thread count.
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import os
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from custom_ops import fp4_r16, native  # noqa: E402
from custom_ops_cpu import read_loop  # noqa: E402

COPY_BYTES = 256 * 2**20


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="4096x4096,4096x14336,14336x4096", help="KxN,...")
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args(argv)
    lib = native.load_library()
    ctypes.CDLL(ctypes.util.find_library("gomp") or "libgomp.so.1").omp_set_num_threads(a.threads)
    clock = time.thread_time if a.threads == 1 else time.perf_counter
    read, buf = read_loop(), np.ones(COPY_BYTES // 4, np.float32)
    print(f"load {os.getloadavg()[0]:.2f}; M = {a.m}, threads {a.threads}, path {os.environ.get('QO_CPU_KERNELS', 'best')}")
    print("| format | K x N | checkpoint layout GB/s (% of read) | 16-row tiles GB/s (% of read) | tiles / checkpoint |")
    print("|---|---|---|---|---|")
    for shape in a.shapes.split(","):
        k, n = map(int, shape.split("x"))
        for fmt in ("nvfp4", "mxfp4"):
            block = 16 if fmt == "nvfp4" else 32
            rng = np.random.default_rng(1)
            nbytes = n * k // 2 + n * k // block
            copies = []
            for _ in range(max(2, COPY_BYTES // nbytes)):
                codes = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
                scales = (rng.uniform(0.5, 8, (n, k // 16)).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
                          if block == 16 else rng.integers(118, 124, (n, k // 32), dtype=np.uint8))
                copies.append((codes, scales) + fp4_r16.pack(codes, scales))
            x = rng.standard_normal((a.m, k)).astype(np.float32)
            y = {name: np.empty((a.m, n), np.float32) for name in ("checkpoint", "r16")}
            s2 = [ctypes.c_float(2e-3)] if block == 16 else []
            fns = {"checkpoint": getattr(lib, f"qo_matmul_{fmt}_f32"), "r16": getattr(lib, f"qo_matmul_{fmt}_r16_f32")}
            calls = {name: [(x.ctypes.data, c[2 * i].ctypes.data, c[2 * i + 1].ctypes.data, *s2, y[name].ctypes.data,
                             a.m, n, k) for c in copies] for i, name in enumerate(fns)}
            best = {}
            for _ in range(a.rounds):
                t = clock()
                read(buf.ctypes.data, buf.size, a.threads)
                best["read"] = min(best.get("read", float("inf")), clock() - t)
                for name, fn in fns.items():
                    t = clock()
                    for args in calls[name]:
                        fn(*args)
                    best[name] = min(best.get(name, float("inf")), (clock() - t) / len(copies))
            r = buf.nbytes / best["read"] / 1e9
            g = {name: nbytes / best[name] / 1e9 for name in fns}
            diff = float(np.abs(y["checkpoint"] - y["r16"]).max() / max(np.abs(y["checkpoint"]).max(), 1e-30))
            print(f"| {fmt} | {k}x{n} | {g['checkpoint']:.2f} ({100 * g['checkpoint'] / r:.0f} %) | "
                  f"{g['r16']:.2f} ({100 * g['r16'] / r:.0f} %) | {g['r16'] / g['checkpoint']:.2f}x |"
                  f"{'' if diff < 1e-5 else f' OUTPUTS DIFFER {diff:.1e}'}", flush=True)
    print(f"load {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
