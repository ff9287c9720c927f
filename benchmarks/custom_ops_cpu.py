"""CPU speed of the com.quark_onnx weight kernels (custom-op library) against ORT's fp32 MatMul on the dense fp32
weight (MLAS), per weight format, at decode (M = 1) and prefill (M = 128), with 1 and 2 intra-op threads, next to a
plain memory-read bandwidth measured in the same run.

    python benchmarks/custom_ops_cpu.py [--shapes 4096x4096,4096x14336] [--formats mxfp4,nvfp4,fp8,...]
                                        [--seconds 1.0] [--json OUT] [--memory]

Weights: MXFP4 / NVFP4 random codes and block scales; FP8 and INT8 a Gaussian quantized per output channel (FP8:
e4m3 codes of w / (max|w| / 448), as Quark's export; uniformly random FP8 codes would hit the decode's slow route
for subnormal codes far more often than real weights do, see qo_cpu_kernels.c); BF16 a Gaussian.
Shapes are K x N (A [M, K], weight [N, K] as Quark stores it; the fp32 form is a [K, N] initializer of MatMul).
Forms per format, each a one-node model built here (no function fallback, no builder):
  kernel  com.quark_onnx.<Op> with the library (custom_ops/build/ort, built on demand)
  fp32    MatMul on the same weight decoded to fp32 (what the CPU default stores today)
Memory read: a C loop summing a 256 MiB buffer (16 float32 accumulators, -O2 -march=native -fopenmp, built into
/tmp), 1 and 2 threads, best of 10, before and after the timings (the better of the two is the reference); and
1 thread by the calling thread's CPU time, the figure to hold against the kernels' 1-thread CPU time on a loaded
machine (wall-clock reads are squeezed by the other jobs' time slices as much as the kernels are). "GB/s" of a form = its weight bytes / its median time (a 4096 x 4096 FP8 weight is 16.8 MB and
stays in the 32 MiB L3 between calls; 4096 x 14336 ones do not). Timing: the four sessions of a (format, shape, M)
run round robin, one call each per round, until --seconds each; medians reported. The machine is shared and
loaded: the load average is printed beside the figures; compare within a row. Sessions do not spin
(session.intra_op.allow_spinning=0: a spinning 2-thread pool would slow the session that runs after it) and the
order is shuffled every round. Both the minimum (closest to the uncontended time) and the median are reported.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from custom_ops import ort_library  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_isa_paths import activations  # noqa: E402

DOMAIN = "com.quark_onnx"

_READ_LOOP = r"""
#include <stddef.h>
#include <omp.h>
float qo_bench_sum(const float* p, size_t n, int threads) {
  float total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
  {
    float s[16] = {0};
#pragma omp for schedule(static)
    for (size_t i = 0; i < n / 16; ++i)
      for (int j = 0; j < 16; ++j) s[j] += p[16 * i + j];
    for (int j = 0; j < 16; ++j) total += s[j];
  }
  return total;
}
"""


def read_loop():
    """The plain read loop (_READ_LOOP) built into the temp folder: fn(pointer, float count, threads)."""
    folder = Path(tempfile.gettempdir()) / f"qo_bench_{os.getuid()}"
    folder.mkdir(exist_ok=True)
    src, lib = folder / "read.c", folder / "libread.so"
    src.write_text(_READ_LOOP)
    subprocess.run(["cc", "-O2", "-march=native", "-fopenmp", "-shared", "-fPIC", str(src), "-o", str(lib)],
                   check=True)
    fn = ctypes.CDLL(str(lib)).qo_bench_sum
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_float
    return fn


def memory_read_gbs(mib: int = 256, tries: int = 10) -> dict[str, float]:
    """Plain read bandwidth (GB/s) of a `mib` MiB float32 buffer (8x the L3) with 1 and 2 threads, best of `tries`."""
    fn = read_loop()
    buf = np.ones(mib * 2**18, np.float32)
    out = {}
    for threads in (1, 2):
        best = min(_timed(lambda: fn(buf.ctypes.data, buf.size, threads)) for _ in range(tries))
        out[f"read_{threads}t_GBs"] = round(buf.nbytes / best / 1e9, 2)
    # one thread by the calling thread's CPU time (not charged for time slices other processes take; the
    # load-robust figure to hold against the kernels' 1-thread CPU time)
    best = min(_cpu_timed(lambda: fn(buf.ctypes.data, buf.size, 1)) for _ in range(tries))
    out["read_1t_cpu_GBs"] = round(buf.nbytes / best / 1e9, 2)
    return out


def _cpu_timed(f) -> float:
    t0 = time.thread_time()
    f()
    return time.thread_time() - t0


def _timed(f) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


# ---------------- weights per format: (op, initializers, attributes, weight bytes, dense fp32 [N, K]) ----------------
def _f8(name, codes):
    return helper.make_tensor(name, TensorProto.FLOAT8E4M3FN, codes.shape, codes.tobytes(), raw=True)


def _e4m3(codes):
    return np.asarray(codes, np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)


E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, 0, -.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def _unpack(packed):
    codes = np.empty((packed.shape[0], packed.shape[1] * 2), np.uint8)
    codes[:, 0::2], codes[:, 1::2] = packed & 0xF, packed >> 4
    return E2M1[codes]


def make_weight(fmt: str, rng, n: int, k: int):
    if fmt in ("mxfp4", "mxfp4a"):  # mxfp4a: A on the MXFP4 grid (cpu_isa_paths.activations)
        b = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
        s = rng.integers(120, 130, (n, k // 32), dtype=np.uint8)
        dense = _unpack(b) * np.repeat(np.exp2(s.astype(np.float32) - 127), 32, axis=1)
        return "MatMulMxfp4", [numpy_helper.from_array(b, "B"), numpy_helper.from_array(s, "B_scale")], \
            {"K": k, "N": n}, b.nbytes + s.nbytes, dense
    if fmt == "nvfp4":
        b = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
        s = rng.integers(0x30, 0x60, (n, k // 16), dtype=np.uint8)
        s2 = np.float32(0.001)
        dense = _unpack(b) * np.repeat((_e4m3(s) * s2).astype(np.float32), 16, axis=1)
        return "MatMulNvfp4", [numpy_helper.from_array(b, "B"), _f8("B_scale", s),
                               numpy_helper.from_array(np.array(s2), "B_scale_2")], \
            {"K": k, "N": n}, b.nbytes + s.nbytes, dense
    if fmt in ("mxfp4r16", "nvfp4r16"):  # the same bytes in 16-row tiles (custom_ops/src/qo_cpu_fp4_r16.c)
        from custom_ops import fp4_r16
        op, inits, attrs, nbytes, dense = make_weight(fmt[:-3], rng, n, k)
        b, s = (numpy_helper.to_array(t) for t in inits[:2])
        b16, s16 = fp4_r16.pack(b, s.view(np.uint8))
        tiles = [numpy_helper.from_array(b16, "B"),
                 _f8("B_scale", s16) if fmt == "nvfp4r16" else numpy_helper.from_array(s16, "B_scale")]
        return op + "R16", tiles + inits[2:], attrs, nbytes, dense
    if fmt in ("fp8", "fp8_w8a8_dyn"):  # a Gaussian weight quantized per channel, as Quark's FP8 PTPC export does
        w = (rng.standard_normal((n, k)) * 0.02).astype(np.float32)
        s = (np.abs(w).max(axis=1) / 448).astype(np.float32)
        b = (w / s[:, None]).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
        op = "MatMulFp8" if fmt == "fp8" else "MatMulFp8W8A8Dyn"
        return op, [_f8("B", b), numpy_helper.from_array(s, "B_scale")], {}, b.nbytes + s.nbytes, _e4m3(b) * s[:, None]
    if fmt in ("int8", "int8_w8a8"):  # per-channel symmetric int8 of a Gaussian weight
        w = (rng.standard_normal((n, k)) * 0.02).astype(np.float32)
        s = (np.abs(w).max(axis=1) / 127).astype(np.float32)
        b = np.clip(np.rint(w / s[:, None]), -127, 127).astype(np.int8)
        inits = [numpy_helper.from_array(b, "B"), numpy_helper.from_array(s, "B_scale")]
        if fmt == "int8_w8a8":  # + a static activation scale: 127 steps over +-2.5 (the A here is N(0, 1))
            inits.append(numpy_helper.from_array(np.array(2.5 / 127, np.float32), "A_scale"))
        return "MatMulInt8" if fmt == "int8" else "MatMulInt8W8A8", inits, {}, b.nbytes + s.nbytes, \
            b.astype(np.float32) * s[:, None]
    if fmt == "bf16":
        w = (rng.standard_normal((n, k)) * 0.02).astype(ml_dtypes.bfloat16)
        return "MatMulBf16", [helper.make_tensor("B", TensorProto.BFLOAT16, w.shape, w.view(np.uint16).tobytes(),
                                                 raw=True)], {}, w.nbytes, w.astype(np.float32)
    raise ValueError(fmt)


def _model(nodes, inits, opsets) -> bytes:
    graph = helper.make_graph(nodes, "bench", [helper.make_tensor_value_info("A", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    model.ir_version = 10
    return model.SerializeToString()


def kernel_model(op, inits, attrs) -> bytes:
    node = helper.make_node(op, ["A"] + [t.name for t in inits], ["Y"], domain=DOMAIN, **attrs)
    return _model([node], inits, [("", 21), (DOMAIN, 1)])


def fp32_model(dense: np.ndarray) -> bytes:
    w = numpy_helper.from_array(np.ascontiguousarray(dense.T.astype(np.float32)), "W")
    return _model([helper.make_node("MatMul", ["A", "W"], ["Y"])], [w], [("", 21)])


def session(blob: bytes, threads: int, library: str | None) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    # ORT's pool threads spin after a run by default; on 2 cores they would slow whichever session runs next
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if library:
        so.register_custom_ops_library(library)
    return ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"])


def time_round_robin(sessions: dict, a: np.ndarray, seconds: float) -> tuple[dict, dict, dict]:
    """(median ms, min ms, median CPU ms of the calling thread) per session. On a loaded machine the minimum is the
    closest to the uncontended time; a 1-thread session runs on the calling thread, so its CPU time does not count
    the time other processes held the core (it still feels their cache and memory traffic)."""
    for s in sessions.values():
        s.run(None, {"A": a})
    samples = {name: [] for name in sessions}
    cpu = {name: [] for name in sessions}
    spent = dict.fromkeys(sessions, 0.0)
    order = list(sessions)
    rng = np.random.default_rng(1)
    while min(spent.values()) < seconds or min(len(v) for v in samples.values()) < 5:
        rng.shuffle(order)  # no form always runs right after the same other one
        for name in order:
            s = sessions[name]
            c0 = time.thread_time()
            dt = _timed(lambda: s.run(None, {"A": a}))
            cpu[name].append(time.thread_time() - c0)
            samples[name].append(dt)
            spent[name] += dt
        if min(len(v) for v in samples.values()) >= 400:
            break
    return ({name: statistics.median(v) * 1e3 for name, v in samples.items()},
            {name: min(v) * 1e3 for name, v in samples.items()},
            {name: statistics.median(v) * 1e3 for name, v in cpu.items()})


_MEMORY_CHILD = """
import gc, sys, numpy as np
sys.path.insert(0, sys.argv[1])
from benchmarks.custom_ops_cpu import fp32_model, kernel_model, make_weight, session
fmt, form, k, n, lib = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
op, inits, attrs, nbytes, dense = make_weight(fmt, np.random.default_rng(0), n, k)
blob = kernel_model(op, inits, attrs) if form == "kernel" else fp32_model(dense)
del inits, dense
gc.collect()
def kib(field):
    return int(next(l for l in open("/proc/self/status") if l.startswith(field)).split()[1])
rss0 = kib("VmRSS:")
s = session(blob, 1, lib if form == "kernel" else None)
rss1 = kib("VmRSS:")
open("/proc/self/clear_refs", "w").write("5")  # Linux: reset the peak (VmHWM) to the current RSS
s.run(None, {"A": np.ones((1, k), np.float32)})
print(rss1 - rss0, kib("VmHWM:") - rss1, nbytes)
"""


def run_memory(library: str, formats: list[str], k: int, n: int) -> list[dict]:
    """RSS added by creating the session (the serialized model already held) and the extra peak of one M=1 run
    (Linux VmHWM after clear_refs), kernel form against the fp32 MatMul form; a fresh process per form."""
    rows = []
    for fmt in formats:
        row = {"format": fmt, "K": k, "N": n}
        for form in ("kernel", "fp32"):
            out = subprocess.run([sys.executable, "-c", _MEMORY_CHILD, str(REPO), fmt, form, str(k), str(n), library],
                                 capture_output=True, text=True, check=True).stdout.split()
            row[f"{form}_session_MiB"] = round(int(out[0]) / 1024, 1)
            row[f"{form}_run_peak_MiB"] = round(int(out[1]) / 1024, 1)
            row["weight_MiB"] = round(int(out[2]) / 2**20, 1)
        rows.append(row)
        print(f"{fmt:13s} {k}x{n}: weight {row['weight_MiB']} MiB; session RSS (+ extra peak of one run): kernel "
              f"{row['kernel_session_MiB']} (+{row['kernel_run_peak_MiB']}) MiB, fp32 MatMul {row['fp32_session_MiB']} "
              f"(+{row['fp32_run_peak_MiB']}) MiB", flush=True)
    return rows


FORMATS = ("mxfp4", "nvfp4", "mxfp4r16", "nvfp4r16", "fp8", "int8", "int8_w8a8", "bf16", "fp8_w8a8_dyn")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default="4096x4096,4096x14336", help="K x N, comma-separated")
    p.add_argument("--formats", default=",".join(FORMATS))
    p.add_argument("--prefill", type=int, default=128)
    p.add_argument("--seconds", type=float, default=1.0)
    p.add_argument("--json", type=Path)
    p.add_argument("--memory", action="store_true", help="only the session-memory comparison (first shape)")
    args = p.parse_args(argv)
    library = str(ort_library.build(log=lambda m: print(m, file=sys.stderr)))
    if args.memory:
        k, n = (int(x) for x in args.shapes.split(",")[0].lower().split("x"))
        rows = run_memory(library, args.formats.split(","), k, n)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=2))
        return 0
    load = lambda: "/".join(f"{x:.1f}" for x in os.getloadavg())
    bandwidth = memory_read_gbs()
    bandwidth_before = dict(bandwidth)
    print(f"plain memory read: {bandwidth['read_1t_GBs']} GB/s (1 thread), {bandwidth['read_2t_GBs']} GB/s "
          f"(2 threads); load average {load()}", flush=True)
    rng = np.random.default_rng(0)
    rows = []
    for shape in args.shapes.split(","):
        k, n = (int(x) for x in shape.lower().split("x"))
        for fmt in args.formats.split(","):
            op, inits, attrs, nbytes, dense = make_weight(fmt, rng, n, k)
            kblob, fblob = kernel_model(op, inits, attrs), fp32_model(dense)
            fp32_bytes = dense.size * 4
            del inits, dense
            sessions = {}
            for t in (1, 2):
                sessions[f"kernel_{t}t"] = session(kblob, t, library)
                sessions[f"fp32_{t}t"] = session(fblob, t, None)
            for m in (1, args.prefill):
                a = activations(fmt, rng.standard_normal((m, k)).astype(np.float32))
                y_k, y_f = sessions["kernel_1t"].run(None, {"A": a})[0], sessions["fp32_1t"].run(None, {"A": a})[0]
                agree = float(np.abs(y_k - y_f).max() / (np.abs(y_f).max() + 1e-30))
                ms, ms_min, ms_cpu = time_round_robin(sessions, a, args.seconds)
                row = dict(format=fmt, op=op, K=k, N=n, M=m, weight_MB=round(nbytes / 1e6, 2),
                           fp32_weight_MB=round(fp32_bytes / 1e6, 2), load_average=load(),
                           **{f"{name}_ms": round(v, 3) for name, v in ms.items()},
                           **{f"{name}_min_ms": round(v, 3) for name, v in ms_min.items()},
                           **{f"speedup_min_{t}t": round(ms_min[f'fp32_{t}t'] / ms_min[f'kernel_{t}t'], 2) for t in (1, 2)},
                           **{f"kernel_min_{t}t_GBs": round(nbytes / ms_min[f'kernel_{t}t'] / 1e6, 2) for t in (1, 2)},
                           **{f"kernel_{t}t_GBs": round(nbytes / ms[f'kernel_{t}t'] / 1e6, 2) for t in (1, 2)},
                           **{f"fp32_{t}t_GBs": round(fp32_bytes / ms[f'fp32_{t}t'] / 1e6, 2) for t in (1, 2)},
                           **{f"speedup_{t}t": round(ms[f'fp32_{t}t'] / ms[f'kernel_{t}t'], 2) for t in (1, 2)},
                           kernel_1t_cpu_ms=round(ms_cpu["kernel_1t"], 3), fp32_1t_cpu_ms=round(ms_cpu["fp32_1t"], 3),
                           speedup_cpu_1t=round(ms_cpu["fp32_1t"] / ms_cpu["kernel_1t"], 2),
                           kernel_2t_vs_1t=round(ms["kernel_1t"] / ms["kernel_2t"], 2),
                           rel_diff_vs_fp32=agree)
                row["stream_2t_vs_read_2t"] = round(row["kernel_2t_GBs"] / bandwidth["read_2t_GBs"], 2)
                row["stream_min_2t_vs_read_2t"] = round(row["kernel_min_2t_GBs"] / bandwidth["read_2t_GBs"], 2)
                rows.append(row)
                print(f"{fmt:13s} {k}x{n} M={m:<4d} kernel {ms['kernel_1t']:8.2f} / {ms['kernel_2t']:8.2f} ms  "
                      f"fp32 {ms['fp32_1t']:8.2f} / {ms['fp32_2t']:8.2f} ms (1t / 2t)  fp32/kernel "
                      f"{row['speedup_1t']:.2f}x / {row['speedup_2t']:.2f}x  kernel {row['kernel_2t_GBs']:.1f} GB/s "
                      f"(2t) = {row['stream_2t_vs_read_2t']:.2f} of read  load {row['load_average']}", flush=True)
                print(f"{'':13s} {'':{len(shape)}s} min:   kernel {ms_min['kernel_1t']:8.2f} / {ms_min['kernel_2t']:8.2f} ms  "
                      f"fp32 {ms_min['fp32_1t']:8.2f} / {ms_min['fp32_2t']:8.2f} ms  fp32/kernel "
                      f"{row['speedup_min_1t']:.2f}x / {row['speedup_min_2t']:.2f}x  kernel {row['kernel_min_2t_GBs']:.1f} "
                      f"GB/s (2t)", flush=True)
            del sessions
    after = memory_read_gbs()
    bandwidth = {k: max(v, after[k]) for k, v in bandwidth_before.items()}
    for r in rows:
        r["stream_min_2t_vs_read_2t"] = round(r["kernel_min_2t_GBs"] / bandwidth["read_2t_GBs"], 2)
        r["stream_2t_vs_read_2t"] = round(r["kernel_2t_GBs"] / bandwidth["read_2t_GBs"], 2)
        r["stream_min_1t_vs_read_1t"] = round(r["kernel_min_1t_GBs"] / bandwidth["read_1t_GBs"], 2)
        r["kernel_1t_cpu_GBs"] = round(r["weight_MB"] / r["kernel_1t_cpu_ms"], 2)
        r["stream_1t_cpu_vs_read_1t_cpu"] = round(r["kernel_1t_cpu_GBs"] / bandwidth["read_1t_cpu_GBs"], 2)
    print(f"\nplain memory read {bandwidth['read_1t_GBs']} / {bandwidth['read_2t_GBs']} GB/s (1 / 2 threads; 1 thread "
          f"by CPU time {bandwidth['read_1t_cpu_GBs']}; before "
          f"{bandwidth_before}, after {after}); load average now {load()}\n")
    print("min (median) of the round-robin calls\n")
    print("| format | K x N | M | kernel ms 1t / 2t | fp32 MatMul ms 1t / 2t | fp32 / kernel 1t / 2t | "
          "1t CPU ms kernel / fp32 (ratio) | kernel GB/s 1t CPU time (of 1t CPU-time read) | kernel GB/s 1t (of 1t read) | "
          "kernel GB/s 2t (of 2t read) | load |\n|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['format']} | {r['K']}x{r['N']} | {r['M']} | {r['kernel_1t_min_ms']:.2f} ({r['kernel_1t_ms']:.2f}) / "
              f"{r['kernel_2t_min_ms']:.2f} ({r['kernel_2t_ms']:.2f}) | {r['fp32_1t_min_ms']:.2f} ({r['fp32_1t_ms']:.2f}) / "
              f"{r['fp32_2t_min_ms']:.2f} ({r['fp32_2t_ms']:.2f}) | {r['speedup_min_1t']:.2f}x ({r['speedup_1t']:.2f}x) / "
              f"{r['speedup_min_2t']:.2f}x ({r['speedup_2t']:.2f}x) | {r['kernel_1t_cpu_ms']:.2f} / "
              f"{r['fp32_1t_cpu_ms']:.2f} ({r['speedup_cpu_1t']:.2f}x) | {r['kernel_1t_cpu_GBs']:.1f} "
              f"({r['stream_1t_cpu_vs_read_1t_cpu']:.2f}) | {r['kernel_min_1t_GBs']:.1f} "
              f"({r['stream_min_1t_vs_read_1t']:.2f}) | {r['kernel_min_2t_GBs']:.1f} "
              f"({r['stream_min_2t_vs_read_2t']:.2f}) | {r['load_average']} |")
    if args.json:
        args.json.write_text(json.dumps({"memory_read": bandwidth, "memory_read_before": bandwidth_before,
                                         "memory_read_after": after, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
