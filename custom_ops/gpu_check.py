"""One-shot GPU check: build the CUDA kernels, run each against the numpy reference (custom_ops/reference.py) on
every shape, time them, and time a dequantize-then-GEMM baseline in PyTorch on the same GPU; print and write one
JSON report. Needs a CUDA GPU, nvcc, numpy and ml_dtypes; PyTorch with CUDA for the baseline (skipped, and said so
in the report, without it). No ORT, no network.

    python custom_ops/gpu_check.py [--out report.json] [--arch 90] [--quick]
    python custom_ops/gpu_check.py --dry-run     # no GPU needed: nvcc build + the torch baselines on the CPU

Exit code 0 when every case matches the reference, 1 when one does not, 2 when the check could not run.
Sized for about 5 minutes on one H200 (nvcc build ~1 min; the float64 references dominate the rest).
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

def compare(y: np.ndarray, expected: np.ndarray, bound: np.ndarray, fp16_rel: float = 1e-3,
            bound_rel: float = 1e-5) -> dict:
    """Same rule as tests/test_custom_ops.py: NaN positions equal, error <= 1e-5 |A||W| (+1e-3 |ref| for fp16)."""
    y64 = y.astype(np.float64)
    nan_match = bool(np.array_equal(np.isnan(y64), np.isnan(expected)))
    ok = ~np.isnan(expected)
    if y.dtype == np.float16:
        overflow = ok & (np.abs(expected) >= 65520)
        ok &= ~overflow
    tolerance = bound_rel * bound[ok] + 1e-30 + (fp16_rel * np.abs(expected[ok]) if y.dtype == np.float16 else 0)
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
        torch_host = {"B": b, "B_scale": scale}
        if lib is not None:
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
        if lib is not None:
            fn = getattr(lib, ("qo_gpu_matmul_fp8_w8a8_dyn_" if dynamic else "qo_gpu_matmul_fp8_w8a8_") + suffix)
            fn.argtypes = [p, p, p, i64, p, p, i64, i64, i64, p]
        args_host = [b.view(np.uint8), b_scale, None if dynamic else np.array([a_scale], np.float32)]
        torch_host = {"B": b, "B_scale": b_scale, "A_scale": a_scale}
        weight_bytes = b.nbytes + b_scale.nbytes
    with np.errstate(invalid="ignore", over="ignore"):
        expected = a_used @ weight.T
        bound = np.abs(np.nan_to_num(a_used)) @ np.abs(np.nan_to_num(weight)).T
    if cuda is None:  # --dry-run: only the torch baseline, on the CPU
        case.update(baseline_case(op, dtype, a, torch_host, expected, bound, "cpu", False))
        return case

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
        case.update(baseline_case(op, dtype, a, torch_host, expected, bound, "cuda", True))
        if "torch_dequant_gemm_ms" in case:
            case["speedup_vs_torch_dequant_gemm"] = case["torch_dequant_gemm_ms"] / ms
    return case


# ---------------- PyTorch baseline: dequantize the weight, then one GEMM (a framework without the kernel) ----

def torch_baseline(op: str, dtype, a: np.ndarray, host: dict, device: str):
    """(launch, y_of_launch) computing op's result with torch: decode W to A's dtype on `device`, then a @ W.T.
    Activation quantization (fp8 ops) is done in torch too. Raises ImportError without torch."""
    import torch

    tdtype = torch.float32 if dtype == np.float32 else torch.float16
    ta = torch.from_numpy(np.ascontiguousarray(a)).to(device)
    if op == "mxfp4":
        codes = torch.from_numpy(host["B"]).to(device)
        scales = torch.from_numpy(host["B_scale"]).to(device)
        lut = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float32,
                           device=device)

        def weight():
            nibbles = torch.stack([codes & 15, codes >> 4], dim=-1).reshape(codes.shape[0], -1).long()
            s = torch.where(scales == 255, torch.nan, torch.exp2(scales.float() - 127))
            return (lut[nibbles] * s.repeat_interleave(32, dim=1)).to(tdtype)

        def launch():
            return ta @ weight().T
    else:
        b = torch.from_numpy(host["B"].view(np.uint8)).to(device).view(torch.float8_e4m3fn)
        b_scale = torch.from_numpy(np.asarray(host["B_scale"], np.float32).reshape(-1, 1)).to(device)

        def launch():
            a32 = ta.float()
            if op == "fp8_dyn":
                s = torch.clamp(a32.abs().amax(dim=-1, keepdim=True) / 448, min=1e-12)
            else:
                s = torch.tensor(float(host["A_scale"]), device=device)
            a_q = (torch.clamp(a32 / s, -448, 448).to(torch.float8_e4m3fn).float() * s).to(tdtype)
            return a_q @ (b.float() * b_scale).to(tdtype).T
    return launch


def time_torch_ms(launch, warmup: int, iterations: int) -> float:
    import torch
    for _ in range(warmup):
        launch()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iterations):
        launch()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / iterations


def baseline_case(op: str, dtype, a: np.ndarray, host: dict, expected, bound, device: str, timing: bool) -> dict:
    """The torch baseline's agreement with the reference and, on CUDA, its time per call."""
    try:
        launch = torch_baseline(op, dtype, a, host, device)
    except ImportError:
        return {"torch_baseline": "skipped: torch not importable"}
    y = launch().float().cpu().numpy().astype(dtype)
    # fp16: torch rounds the decoded weight and the quantized activation to fp16 before its GEMM (2^-11 each)
    check = compare(y, expected, bound, fp16_rel=2e-3, bound_rel=1.5e-3 if dtype == np.float16 else 1e-5)
    out = {"torch_pass": check["pass"], "torch_worst_error_over_tolerance": check["worst_error_over_tolerance"]}
    if timing and device == "cuda":
        out["torch_dequant_gemm_ms"] = time_torch_ms(launch, warmup=3, iterations=20)
    return out


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
    parser.add_argument("--dry-run", action="store_true",
                        help="no GPU: build with nvcc for sm_80/sm_90 and check the torch baselines on the CPU")
    args = parser.parse_args()
    if args.dry_run:
        return dry_run(args)
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


def dry_run(args) -> int:
    """What can be checked without a GPU: the nvcc build (explicit archs) and the torch baselines against the
    reference on the small shapes (CPU). Writes the same kind of report."""
    report: dict = {"dry_run": True, "cases": []}
    ok = True
    nvcc = find_nvcc()
    if nvcc:
        try:
            _, command = build_library(nvcc, args.arch or "90")
            report["build_command"] = " ".join(command)
        except RuntimeError as error:
            report["build_error"] = str(error)[-2000:]
            ok = False
    else:
        report["build"] = "skipped: nvcc not found"
    for op, dtype, m, n, k, per_channel, timing in cases(quick=True):
        if timing:
            continue
        case = run_case(None, None, op, dtype, m, n, k, per_channel, False)
        ok &= bool(case.get("torch_pass", True))
        report["cases"].append(case)
        print(f"{'PASS' if case.get('torch_pass', True) else 'FAIL'} torch baseline {op:8s} {case['dtype']:8s} "
              f"M={m:<4d} N={n:<5d} K={k:<5d} {case.get('torch_baseline', '')}", flush=True)
    report["all_pass"] = ok
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"dry-run report: {args.out} ({'ok' if ok else 'FAILURES'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
