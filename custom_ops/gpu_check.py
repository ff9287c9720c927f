"""One-shot GPU check: build the CUDA kernels, run each against the numpy reference on a few shapes, time them,
print and write a JSON report. Needs a CUDA GPU, nvcc, numpy and ml_dtypes; nothing else (no torch, no ORT).

    python custom_ops/gpu_check.py [--out report.json] [--arch 90] [--quick]

Exit code 0 when every case matches the reference, 1 when one does not, 2 when the check could not run.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(PACKAGE_DIR.parent))

import numpy as np  # noqa: E402

SRC = PACKAGE_DIR / "src"
BUILD_DIR = PACKAGE_DIR / "build" / "cuda"
H2D, D2H = 1, 2  # cudaMemcpyKind


# ---------------- build ----------------

def find_nvcc() -> str | None:
    for candidate in (shutil.which("nvcc"), os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")):
        if candidate and os.path.exists(candidate):
            return candidate
    return None


def build_library(nvcc: str, arch: str | None) -> tuple[Path, list[str]]:
    """nvcc straight to a shared library (CUDA kernels + ABI version), linked against the shared cudart so that
    this script's ctypes cudart is the same runtime. Tries -arch=native, then explicit sm_80/sm_90."""
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    out = BUILD_DIR / "libquark_onnx_ops_cuda.so"
    base = [nvcc, "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-cudart", "shared", "-DQO_WITH_CUDA",
            "-I", str(SRC), str(SRC / "qo_gpu_kernels.cu"), str(SRC / "qo_version.c"), "-o", str(out)]
    arch_options = [[f"-gencode=arch=compute_{arch},code=sm_{arch}"]] if arch else [
        ["-arch=native"], ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90,code=sm_90"]]
    errors = []
    for flags in arch_options:
        command = base[:1] + flags + base[1:]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode == 0:
            return out, command
        errors.append(f"{' '.join(command)}\n{result.stderr[-3000:]}")
    raise RuntimeError("nvcc build failed:\n" + "\n".join(errors))


def load_cudart() -> ctypes.CDLL:
    names = ["libcudart.so"] + sorted(glob.glob("/usr/local/cuda*/lib64/libcudart.so*")) + sorted(
        glob.glob("/usr/local/cuda*/targets/*/lib/libcudart.so*"))
    cuda_home = os.environ.get("CUDA_HOME")
    if cuda_home:
        names = sorted(glob.glob(os.path.join(cuda_home, "lib64", "libcudart.so*"))) + names
    for name in names:
        try:
            return ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            continue
    raise RuntimeError(f"libcudart not found (tried {names[:6]}...)")


class Cuda:
    def __init__(self, cudart: ctypes.CDLL):
        self.rt = cudart
        cudart.cudaGetErrorString.restype = ctypes.c_char_p
        cudart.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        cudart.cudaFree.argtypes = [ctypes.c_void_p]
        cudart.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        cudart.cudaEventCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        cudart.cudaEventRecord.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        cudart.cudaEventSynchronize.argtypes = [ctypes.c_void_p]
        cudart.cudaEventElapsedTime.argtypes = [ctypes.POINTER(ctypes.c_float), ctypes.c_void_p, ctypes.c_void_p]
        cudart.cudaDeviceGetAttribute.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int]
        self.allocations: list[int] = []

    def check(self, code: int, what: str) -> None:
        if code != 0:
            raise RuntimeError(f"{what}: CUDA error {code} {self.rt.cudaGetErrorString(code).decode()}")

    def device_info(self) -> dict:
        info = {}
        for key, attr in (("cc_major", 75), ("cc_minor", 76), ("sm_count", 16)):
            value = ctypes.c_int()
            self.check(self.rt.cudaDeviceGetAttribute(ctypes.byref(value), attr, 0), "cudaDeviceGetAttribute")
            info[key] = value.value
        runtime, driver = ctypes.c_int(), ctypes.c_int()
        self.rt.cudaRuntimeGetVersion(ctypes.byref(runtime))
        self.rt.cudaDriverGetVersion(ctypes.byref(driver))
        info.update(runtime_version=runtime.value, driver_version=driver.value)
        return info

    def upload(self, array: np.ndarray) -> int:
        array = np.ascontiguousarray(array)
        pointer = ctypes.c_void_p()
        self.check(self.rt.cudaMalloc(ctypes.byref(pointer), max(array.nbytes, 1)), "cudaMalloc")
        self.allocations.append(pointer.value)
        if array.nbytes:
            self.check(self.rt.cudaMemcpy(pointer, array.ctypes.data, array.nbytes, H2D), "cudaMemcpy H2D")
        return pointer.value

    def empty(self, nbytes: int) -> int:
        return self.upload(np.zeros(nbytes, dtype=np.uint8))

    def download(self, pointer: int, like: np.ndarray) -> np.ndarray:
        self.check(self.rt.cudaDeviceSynchronize(), "kernel execution")
        out = np.empty_like(like)
        self.check(self.rt.cudaMemcpy(out.ctypes.data, ctypes.c_void_p(pointer), out.nbytes, D2H), "cudaMemcpy D2H")
        return out

    def free_all(self) -> None:
        for pointer in self.allocations:
            self.rt.cudaFree(ctypes.c_void_p(pointer))
        self.allocations.clear()

    def time_ms(self, launch, warmup: int, iterations: int) -> float:
        for _ in range(warmup):
            launch()
        start, stop = ctypes.c_void_p(), ctypes.c_void_p()
        self.check(self.rt.cudaEventCreate(ctypes.byref(start)), "cudaEventCreate")
        self.check(self.rt.cudaEventCreate(ctypes.byref(stop)), "cudaEventCreate")
        self.check(self.rt.cudaEventRecord(start, None), "cudaEventRecord")
        for _ in range(iterations):
            launch()
        self.check(self.rt.cudaEventRecord(stop, None), "cudaEventRecord")
        self.check(self.rt.cudaEventSynchronize(stop), "cudaEventSynchronize")
        elapsed = ctypes.c_float()
        self.check(self.rt.cudaEventElapsedTime(ctypes.byref(elapsed), start, stop), "cudaEventElapsedTime")
        return elapsed.value / iterations


# ---------------- cases ----------------

def compare(y: np.ndarray, expected: np.ndarray, bound: np.ndarray) -> dict:
    """Same rule as tests/test_custom_ops.py: NaN positions equal, error <= 1e-5 |A||W| (+1e-3 |ref| for fp16)."""
    y64 = y.astype(np.float64)
    nan_match = bool(np.array_equal(np.isnan(y64), np.isnan(expected)))
    ok = ~np.isnan(expected)
    if y.dtype == np.float16:
        overflow = ok & (np.abs(expected) >= 65520)
        ok &= ~overflow
    tolerance = 1e-5 * bound[ok] + 1e-30 + (1e-3 * np.abs(expected[ok]) if y.dtype == np.float16 else 0)
    error = np.abs(y64[ok] - expected[ok])
    worst = float(np.max(error / tolerance)) if error.size else 0.0
    return {"pass": nan_match and worst <= 1.0, "nan_positions_match": nan_match, "worst_error_over_tolerance": worst,
            "max_abs_error": float(error.max()) if error.size else 0.0}


def run_case(cuda: Cuda, lib: ctypes.CDLL, op: str, dtype, m: int, n: int, k: int, per_channel: bool,
             timing: bool) -> dict:
    from custom_ops import reference as ref
    import ml_dtypes

    rng = np.random.default_rng(m * 7919 + n * 31 + k)
    a = rng.standard_normal((m, k)).astype(np.float32)
    case = {"op": op, "dtype": np.dtype(dtype).name, "M": m, "N": n, "K": k}
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    if op == "mxfp4":
        b, scale = ref.random_mxfp4_weight(rng, n, k, scale_exponent_range=(118, 130))
        scale[n - 1, 0] = 255  # NaN block: last column must be NaN
        a = a.astype(dtype)
        weight = ref.dequantize_mxfp4(b, scale)
        a_used = a.astype(np.float64)
        args_host = [b, scale]
        fn = getattr(lib, "qo_gpu_matmul_mxfp4_" + ("f32" if dtype == np.float32 else "f16"))
        fn.argtypes = [p, p, p, p, i64, i64, i64, p]
        weight_bytes = b.nbytes + scale.nbytes
    else:
        a = (a * 50).astype(dtype)
        b = (rng.standard_normal((n, k)) * 40).astype(ml_dtypes.float8_e4m3fn)
        b_scale = (rng.random(n).astype(np.float32) + 0.05) if per_channel else np.array([0.03], np.float32)
        case["per_channel"] = per_channel
        dynamic = op == "fp8_dyn"
        a_scale = None if dynamic else np.float32(0.37)
        a_used = ref.quantize_dequantize_e4m3fn(a, ref.dynamic_row_scale(a) if dynamic else a_scale).astype(np.float64)
        weight = ref.dequantize_fp8_weight(b, b_scale)
        suffix = "f32" if dtype == np.float32 else "f16"
        fn = getattr(lib, ("qo_gpu_matmul_fp8_w8a8_dyn_" if dynamic else "qo_gpu_matmul_fp8_w8a8_") + suffix)
        fn.argtypes = [p, p, p, i64, p, p, i64, i64, i64, p]
        args_host = [b.view(np.uint8), b_scale, None if dynamic else np.array([a_scale], np.float32)]
        weight_bytes = b.nbytes + b_scale.nbytes
    with np.errstate(invalid="ignore", over="ignore"):
        expected = a_used @ weight.T
        bound = np.abs(np.nan_to_num(a_used)) @ np.abs(np.nan_to_num(weight)).T

    d_a = cuda.upload(a)
    y_like = np.empty((m, n), dtype=dtype)
    d_y = cuda.empty(y_like.nbytes)
    if op == "mxfp4":
        d_b, d_s = cuda.upload(args_host[0]), cuda.upload(args_host[1])
        launch = lambda: fn(d_a, d_b, d_s, d_y, m, n, k, None)  # noqa: E731
    else:
        d_b, d_bs = cuda.upload(args_host[0]), cuda.upload(args_host[1])
        count = args_host[1].size
        if op == "fp8_dyn":
            d_ws = cuda.empty(4 * m)
            launch = lambda: fn(d_a, d_b, d_bs, count, d_ws, d_y, m, n, k, None)  # noqa: E731
        else:
            d_as = cuda.upload(args_host[2])
            launch = lambda: fn(d_a, d_b, d_bs, count, d_as, d_y, m, n, k, None)  # noqa: E731
    status = launch()
    if status != 0:
        case.update({"pass": False, "error": f"launcher returned status {status}"})
        return case
    y = cuda.download(d_y, y_like)
    case.update(compare(y, expected, bound))
    if timing:
        ms = cuda.time_ms(launch, warmup=3, iterations=20)
        case.update({"ms": ms, "weight_GBps": weight_bytes / ms / 1e6, "TFLOPS": 2.0 * m * n * k / ms / 1e9})
    return case


def cases(quick: bool):
    shapes = [(1, 64, 64), (3, 100, 96), (8, 512, 1024), (33, 130, 256)]
    timed = [(1, 4096, 4096), (8, 4096, 4096), (128, 4096, 4096)]
    if quick:
        timed = timed[:1]
    for op in ("mxfp4", "fp8", "fp8_dyn"):
        for dtype in (np.float32, np.float16):
            for m, n, k in shapes:
                yield op, dtype, m, n, k, (m % 2 == 1), False
            for m, n, k in timed:
                yield op, dtype, m, n, k, True, True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(PACKAGE_DIR / "build" / "gpu_check.json"))
    parser.add_argument("--arch", help="SM number like 90 (default: -arch=native, then sm_80+sm_90)")
    parser.add_argument("--quick", action="store_true", help="fewer timed shapes")
    args = parser.parse_args()
    report: dict = {"host": platform.node(), "python": sys.version.split()[0], "started": time.time(), "cases": []}
    exit_code = 2
    try:
        nvcc = find_nvcc()
        if nvcc is None:
            raise RuntimeError("nvcc not found (PATH or $CUDA_HOME/bin)")
        report["nvcc"] = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
        library, command = build_library(nvcc, args.arch)
        report["build_command"] = " ".join(command)
        cuda = Cuda(load_cudart())
        report["device"] = cuda.device_info()
        lib = ctypes.CDLL(str(library))
        lib.qo_gpu_backend.restype = ctypes.c_char_p
        report["backend"] = lib.qo_gpu_backend().decode()
        all_pass = True
        for op, dtype, m, n, k, per_channel, timing in cases(args.quick):
            try:
                case = run_case(cuda, lib, op, dtype, m, n, k, per_channel, timing)
            except Exception as error:  # keep going: one broken case must not hide the others
                case = {"op": op, "dtype": np.dtype(dtype).name, "M": m, "N": n, "K": k, "pass": False,
                        "error": f"{type(error).__name__}: {error}"}
            finally:
                cuda.free_all()
            all_pass &= bool(case.get("pass"))
            report["cases"].append(case)
            timing_text = f" {case['ms']:.4f} ms {case['weight_GBps']:.0f} GB/s" if "ms" in case else ""
            print(f"{'PASS' if case.get('pass') else 'FAIL'} {op:8s} {case['dtype']:8s} M={m:<4d} N={n:<5d} K={k:<5d}"
                  f" ratio={case.get('worst_error_over_tolerance', float('nan')):.3g}{timing_text}"
                  f" {case.get('error', '')}", flush=True)
        report["all_pass"] = all_pass
        exit_code = 0 if all_pass else 1
    except Exception as error:
        report["fatal"] = f"{type(error).__name__}: {error}"
        report["traceback"] = traceback.format_exc()
        print(report["fatal"], file=sys.stderr)
    report["seconds"] = time.time() - report.pop("started")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"report: {args.out} ({'all pass' if exit_code == 0 else 'FAILURES' if exit_code == 1 else 'did not run'})")
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
