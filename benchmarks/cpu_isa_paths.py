"""The CPU kernels' SIMD paths against each other (custom_ops/src/qo_cpu_kernels.c): AVX-512 vs AVX2 (vs portable C
with --portable), per weight format, decode (M = 1) and prefill (M = 128), one thread (or --threads), interleaved
(A, B, A, B ...), best of --rounds; every path's output is checked bit for bit against the AVX2 path's.

    python benchmarks/cpu_isa_paths.py [--shapes 4096x4096,4096x14336] [--formats fp8,int8,bf16,mxfp4,nvfp4]
                                       [--m 1,128] [--rounds 7] [--threads 1] [--json OUT]

Shapes are K x N (weight [N, K] as Quark stores it). Calls go straight to the C ABI (custom_ops/native.py, no ORT);
the path is chosen per call by QO_CPU_KERNELS (read at every call). With one thread the time is the calling
thread's CPU time (OpenMP runs a 1-thread region on the caller; CLOCK_THREAD_CPUTIME_ID is not charged for the time
other processes hold the core, so it is the load-robust figure on a shared machine), else wall time.
"GB/s" = weight bytes / best time.
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

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from custom_ops import native  # noqa: E402


def weights(fmt: str, rng, n: int, k: int):
    """(call(a) -> y, weight bytes); FP8 / INT8 as Quark quantizes a Gaussian per output channel (few subnormals)."""
    if fmt in ("fp8", "int8"):
        w = rng.standard_normal((n, k)).astype(np.float32)
        if fmt == "fp8":
            s = (np.abs(w).max(1) / 448).astype(np.float32)
            codes = (w / s[:, None]).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
            return (lambda a: native.matmul_fp8(a, codes, s)), codes.nbytes
        s = (np.abs(w).max(1) / 127).astype(np.float32)
        q = np.clip(np.round(w / s[:, None]), -127, 127).astype(np.int8)
        return (lambda a: native.matmul_int8(a, q, s)), q.nbytes
    if fmt == "bf16":
        bits = (rng.standard_normal((n, k)) * 0.05).astype(ml_dtypes.bfloat16).view(np.uint16)
        return (lambda a: native.matmul_bf16(a, bits)), bits.nbytes
    if fmt.startswith("uint4g"):  # "uint4g32": the exact 4-bit form (MatMulUint4), "uint4g32a8": accuracy_level 4
        bs = int(fmt[6:].removesuffix("a8"))
        level = 4 if fmt.endswith("a8") else 1
        kb = -(-k // bs)
        packed = rng.integers(0, 256, (n, kb, bs // 2), dtype=np.uint8)
        s = rng.uniform(1e-3, 2e-2, (n, kb)).astype(np.float32)
        zp = rng.integers(0, 256, (n, (kb + 1) // 2), dtype=np.uint8)
        return ((lambda a: native.matmul_int4(a, packed, s, zp, k, bs, level)),
                packed.nbytes + s.nbytes + zp.nbytes)
    packed = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    if fmt in ("mxfp4r16", "nvfp4r16"):  # the same bytes in 16-row tiles (custom_ops/src/qo_cpu_fp4_r16.c)
        from custom_ops import fp4_r16
        if fmt == "mxfp4r16":
            b, s = fp4_r16.pack(packed, rng.integers(118, 124, (n, k // 32), dtype=np.uint8))
            return (lambda a: native.matmul_mxfp4_r16(a, b, s)), b.nbytes + s.nbytes
        s8 = rng.uniform(0.5, 8, (n, k // 16)).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
        b, s = fp4_r16.pack(packed, s8)
        return (lambda a: native.matmul_nvfp4_r16(a, b, s, np.float32(2e-3))), b.nbytes + s.nbytes
    if fmt in ("mxfp4", "mxfp4a"):
        scales = rng.integers(118, 124, (n, k // 32), dtype=np.uint8)
        return (lambda a: native.matmul_mxfp4(a, packed, scales)), packed.nbytes + scales.nbytes
    scales = rng.uniform(0.5, 8, (n, k // 16)).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    return (lambda a: native.matmul_nvfp4(a, packed, scales, np.float32(2e-3))), packed.nbytes + scales.nbytes


def mxfp4_activations(x: np.ndarray) -> np.ndarray:
    """x fake-quantized as Quark's MXFP4 activations (32-blocks along K, "even" scale: 2^(floor(log2 amax) + (mantissa
    >= 1.75) - 2), e2m1 round half to even): what a w_mxfp4_a_mxfp4 graph feeds MatMulMxfp4."""
    b = x.astype(np.float64).reshape(x.shape[0], -1, 32)
    amax = np.abs(b).max(-1, keepdims=True)
    e = np.floor(np.log2(np.where(amax > 0, amax, 1.0)))
    scale = 2.0 ** np.clip(e + (amax / 2.0 ** e >= 1.75) - 2, -127, 127)
    v = np.abs(b / scale)
    step = np.where(v < 2, 0.5, np.where(v < 4, 1.0, 2.0))
    q = np.minimum(np.round(v / step) * step, 6.0) * np.sign(b)
    return (q * scale).reshape(x.shape).astype(np.float32)


def activations(fmt: str, x: np.ndarray) -> np.ndarray:
    """The activation a format is timed with: "mxfp4a" = MXFP4 weights with A on the MXFP4 grid (the block-integer
    path of qo_cpu_kernels.c), every other format float A."""
    return mxfp4_activations(x) if fmt == "mxfp4a" else x


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="4096x4096,4096x14336")
    ap.add_argument("--formats", default="fp8,int8,bf16,mxfp4,nvfp4")
    ap.add_argument("--m", default="1,128")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--portable", action="store_true", help="also time the portable C path")
    ap.add_argument("--paths", default="avx512,avx2", help="QO_CPU_KERNELS values to compare (avx2 must be one)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    native.load_library()
    ctypes.CDLL(ctypes.util.find_library("gomp") or "libgomp.so.1").omp_set_num_threads(a.threads)
    paths = a.paths.split(",") + (["portable"] if a.portable else [])
    rng = np.random.default_rng(0)
    rows = []
    print(f"load {os.getloadavg()[0]:.2f}, threads {a.threads}")
    print("| format | K x N | M | " + " | ".join(f"{p} ms (GB/s)" for p in paths) + " | avx2 / avx512 |")
    print("|---|---|---|" + "---|" * len(paths) + "---|")
    for shape in a.shapes.split(","):
        k, n = map(int, shape.split("x"))
        for fmt in a.formats.split(","):
            call, nbytes = weights(fmt, rng, n, k)
            for m in map(int, a.m.split(",")):
                x = activations(fmt, rng.standard_normal((m, k)).astype(np.float32))
                best = {p: float("inf") for p in paths}
                outs = {}
                for _ in range(a.rounds):
                    for p in paths:
                        os.environ["QO_CPU_KERNELS"] = p
                        t = time.thread_time() if a.threads == 1 else time.perf_counter()
                        y = call(x)
                        best[p] = min(best[p], (time.thread_time() if a.threads == 1 else time.perf_counter()) - t)
                        outs[p] = y
                os.environ.pop("QO_CPU_KERNELS", None)
                same = all(np.array_equal(outs[p], outs["avx2"]) for p in paths)
                row = {"format": fmt, "K": k, "N": n, "M": m, "threads": a.threads, "bit_identical": same,
                       **{f"{p}_ms": best[p] * 1e3 for p in paths},
                       **{f"{p}_gbs": nbytes / best[p] / 1e9 for p in paths}}
                rows.append(row)
                cells = " | ".join(f"{best[p] * 1e3:.2f} ({nbytes / best[p] / 1e9:.1f})" for p in paths)
                print(f"| {fmt} | {k}x{n} | {m} | {cells} | {best['avx2'] / best['avx512']:.2f}x"
                      f"{'' if same else ' BITS DIFFER'} |", flush=True)
    print(f"load {os.getloadavg()[0]:.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"load_end": os.getloadavg(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
