"""Decode GEMV (M = 1) bandwidth of the CPU kernels against a plain memory read, per format, SIMD path and thread
count, all interleaved in one run (issue #22: the GEMVs must stream at least 50 % of a plain read's GB/s).

    python benchmarks/gemv_bandwidth.py [--shapes 4096x4096,4096x14336,14336x4096] [--formats fp8,int8,bf16,mxfp4,nvfp4]
                                        [--paths avx512,avx2] [--threads 1,2] [--rounds 9] [--m 1]
                                        [--library NAME=PATH ...] [--json OUT]

Shapes are K x N (weight [N, K] as Quark stores it): 4096x14336 is an 8B gate/up projection, 14336x4096 its
down projection. Format "mxfp4a": MXFP4 weights with A fake-quantized to the MXFP4 grid (a w_mxfp4_a_mxfp4 model's
input: the block-integer path), "mxfp4": float A (weight-only MXFP4). "uint4g32" / "uint4g128": the exact 4-bit
form (MatMulUint4, the cpu default for uint4 / int4), "uint4g32a8": the same weight at accuracy_level 4 (int8 A, the
MatMulNBits level-4 arithmetic); their bytes include the float32 scales and the zero points. Calls go straight to the C ABI (custom_ops/native.py; work split by OpenMP, the thread count set
per call by omp_set_num_threads), the path chosen per call by QO_CPU_KERNELS. --library adds another build of the
library (e.g. one of an earlier commit), timed in the same rounds (rows "path@NAME"): before/after on the same load.
Plain read: the C loop of benchmarks/custom_ops_cpu.py (a 256 MiB float32 buffer summed with 16 accumulators, larger
than the L3: an Intel Xeon guest that reports a 480 MiB L3 reads 32 MiB at 29 GB/s and 128 MiB or more at 19 GB/s,
1 thread), with the same thread counts. Every round times, in turn, the read and every (library, path) call of a
(shape, format) at each thread count; best of --rounds. Each call reads another copy of the weight (as many copies
as make 256 MiB, used in turn), so that every call streams its weight from memory, as a decode step does: with one
copy, the weight of one call stayed in the L3 for the next (timed back to back, later forms read it at L3 speed; the
read between rounds did not evict it either); best of --rounds. The first form of a round still runs right after the read:
the same build measured 3-8 % slower there than as a later form (AVX2 FP4, 8 pairs, 2026-12-05); to compare builds, give
both with --library so that neither is first.
Time: 1 thread by the calling thread's CPU time (not charged for the time other processes hold the core: the
load-robust figure on a shared machine). 2 threads: "cpu" = the process's CPU time / threads (OMP_WAIT_POLICY=
passive, so no spinning is counted: what the threads cost when both run at once, memory contention included, but
not whether they overlap) and "wall" (the overlap, only meaningful on a quiet machine: the load is printed).
"GB/s" = weight bytes (codes + block scales) / best time; "%" = of the plain read at the same thread count and
clock. Every output is checked bit for bit against the first one's.
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # before libgomp loads: idle threads sleep, not spin

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_isa_paths import activations, weights  # noqa: E402
from custom_ops import native  # noqa: E402
from custom_ops_cpu import read_loop  # noqa: E402


COPY_BYTES = 256 * 2**20  # more than this guest's L3 holds (see the docstring)


def _clocks() -> tuple[float, float, float]:
    return time.thread_time(), time.process_time(), time.perf_counter()


def _elapsed(t0, threads: int) -> dict[str, float]:
    t1 = _clocks()
    if threads == 1:
        return {"cpu": t1[0] - t0[0]}
    return {"cpu": (t1[1] - t0[1]) / threads, "wall": t1[2] - t0[2]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="4096x4096,4096x14336,14336x4096")
    ap.add_argument("--formats", default="fp8,int8,bf16,mxfp4,nvfp4")
    ap.add_argument("--paths", default="avx512,avx2")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--library", action="append", default=[], metavar="NAME=PATH",
                    help="another build of the library to time in the same rounds")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    libs = {"": native.load_library()}
    for spec in a.library:
        name, _, path = spec.partition("=")
        libs[name] = ctypes.CDLL(path)
        native._declare(libs[name])
    omp_threads = ctypes.CDLL(ctypes.util.find_library("gomp") or "libgomp.so.1").omp_set_num_threads
    read = read_loop()
    buf = np.ones(256 * 2**18, np.float32)
    paths, threads = a.paths.split(","), [int(t) for t in a.threads.split(",")]
    forms = [(lib, p) for lib in libs for p in paths]
    label = {f: f[1] + (f"@{f[0]}" if f[0] else "") for f in forms}
    rng = np.random.default_rng(0)
    seed = 1
    rows = []
    print(f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}; 1 thread: CPU time; 2+: CPU time / threads, "
          f"and wall; M = {a.m}")
    cols = ["1t" if t == 1 else f"{t}t {c}" for t in threads for c in (["cpu"] if t == 1 else ["cpu", "wall"])]
    print("| format | K x N | path | " + " | ".join(f"{c} GB/s (% of read)" for c in cols) + " |")
    print("|---|---|---|" + "---|" * len(cols))
    for shape in a.shapes.split(","):
        k, n = map(int, shape.split("x"))
        for fmt in a.formats.split(","):
            # copies of the same weight (same seed), used in turn: COPY_BYTES between two reads of one copy, so that
            # every call streams its weight from memory, as a decode step does (each layer read once per token)
            call, nbytes = weights(fmt, np.random.default_rng(seed), n, k)
            calls = [call] + [weights(fmt, np.random.default_rng(seed), n, k)[0]
                              for _ in range(max(1, -(-COPY_BYTES // nbytes) - 1))]
            seed += 1
            turn = 0
            x = activations(fmt, rng.standard_normal((a.m, k)).astype(np.float32))
            best: dict = {}
            outs = []
            for _ in range(a.rounds):
                for t in threads:
                    omp_threads(t)
                    t0 = _clocks()
                    read(buf.ctypes.data, buf.size, t)
                    for c, v in _elapsed(t0, t).items():
                        best["read", t, c] = min(best.get(("read", t, c), float("inf")), v)
                    for f in forms:
                        native._library = libs[f[0]]
                        os.environ["QO_CPU_KERNELS"] = f[1]
                        call = calls[turn % len(calls)]
                        turn += 1
                        t0 = _clocks()
                        y = call(x)
                        for c, v in _elapsed(t0, t).items():
                            best[f, t, c] = min(best.get((f, t, c), float("inf")), v)
                        outs.append(y)
            native._library = libs[""]
            os.environ.pop("QO_CPU_KERNELS", None)
            same = all(np.array_equal(y, outs[0]) for y in outs)
            keys = [(t, c) for t in threads for c in (["cpu"] if t == 1 else ["cpu", "wall"])]
            read_gbs = {key: buf.nbytes / best[("read",) + key] / 1e9 for key in keys}
            for f in forms:
                gbs = {key: nbytes / best[(f,) + key] / 1e9 for key in keys}
                rows.append({"format": fmt, "K": k, "N": n, "M": a.m, "path": label[f], "bit_identical": same,
                             **{f"{t}t_{c}_ms": best[f, t, c] * 1e3 for t, c in keys},
                             **{f"{t}t_{c}_gbs": gbs[t, c] for t, c in keys},
                             **{f"{t}t_{c}_read_gbs": read_gbs[t, c] for t, c in keys}})
                cells = " | ".join(f"{gbs[key]:.1f} ({100 * gbs[key] / read_gbs[key]:.0f} %)" for key in keys)
                print(f"| {fmt} | {k}x{n} | {label[f]} | {cells} |{'' if same else ' BITS DIFFER'}", flush=True)
            print("| read | | | " + " | ".join(f"{read_gbs[key]:.1f}" for key in keys) + " |", flush=True)
    print(f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if a.json:
        Path(a.json).write_text(json.dumps({"load_end": os.getloadavg(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
