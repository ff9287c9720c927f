"""One-shot GPU check: build the GPU kernels for the GPU present (nvcc on NVIDIA, hipcc on AMD), run every case of
custom_ops/gpu_cases.py on it (the cases CI runs through HIP-CPU, against the same float64 numpy answers), time each
kernel on 4096 x 4096 weights against the bytes of weight it streams (GB/s, beside a device-to-device memcpy's
GB/s), and write one JSON report. Needs numpy and ml_dtypes; no ORT, no torch, no network.

    python custom_ops/gpu_check.py [--out report.json] [--backend auto|cuda|hip] [--arch 90|gfx942] [--quick]
    python custom_ops/gpu_check.py --self-test    # no GPU: the same code path on the HIP-CPU build (CI runs it)
    python custom_ops/gpu_check.py --build-only   # no GPU: compile for an explicit arch (nvcc sm_90 / hipcc gfx90a)

Exit code 0 when every case matches, 1 when one does not, 2 when the check could not run.
Sized for well under 10 minutes on one GPU: the build (~1 min for nvcc, two archs) and the float64 references of
the timed shapes dominate.
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

from custom_ops import gpu_cases as gc  # noqa: E402
from custom_ops import hip_cpu  # noqa: E402

SRC = PACKAGE_DIR / "src"
BUILD_DIR = PACKAGE_DIR / "build" / "gpu"
H2D, D2H, D2D = 1, 2, 3  # cudaMemcpyKind == hipMemcpyKind
TIMED_SHAPES = [(1, 4096, 4096), (8, 4096, 4096), (128, 4096, 4096)]
SELF_TEST_TIMED_SHAPES = [(1, 64, 256)]


# ---------------- build ----------------

def find_tool(name: str, env_home: str, default_home: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidate = os.path.join(os.environ.get(env_home, default_home), "bin", name)
    return candidate if os.path.exists(candidate) else None


def _compile(attempts: list[list[str]], env=None) -> list[str]:
    errors = []
    for command in attempts:
        result = subprocess.run(command, capture_output=True, text=True, env=env)
        if result.returncode == 0:
            return command
        errors.append(f"{' '.join(command)}\n{result.stderr[-3000:]}")
    raise RuntimeError("GPU build failed:\n" + "\n".join(errors))


def build_cuda(nvcc: str, arch: str | None) -> tuple[Path, list[str]]:
    """nvcc straight to a shared library linked against the shared cudart (the one this script loads)."""
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    out = BUILD_DIR / "libqo_gpu_kernels_cuda.so"
    base = ["-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-cudart", "shared", "-DQO_WITH_CUDA", "-I",
            str(SRC), str(SRC / "qo_gpu_kernels.cu"), str(SRC / "qo_version.c"), "-o", str(out)]
    archs = [[f"-gencode=arch=compute_{arch},code=sm_{arch}"]] if arch else [
        ["-arch=native"], ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90,code=sm_90"]]
    return out, _compile([[nvcc, *flags, *base] for flags in archs])


def amd_gpu_archs() -> list[str]:
    for tool in ("amdgpu-arch", "rocm_agent_enumerator"):
        path = find_tool(tool, "ROCM_PATH", "/opt/rocm")
        if path:
            result = subprocess.run([path], capture_output=True, text=True)
            archs = sorted({a for a in result.stdout.split() if a.startswith("gfx") and a != "gfx000"})
            if archs:
                return archs
    return []


def build_hip(hipcc: str, arch: str | None) -> tuple[Path, list[str]]:
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    out = BUILD_DIR / "libqo_gpu_kernels_hip.so"
    archs = [arch] if arch else (amd_gpu_archs() or ["native"])
    command = [hipcc, "-O3", "-std=c++17", "-shared", "-fPIC", "-DQO_WITH_HIP", "-I", str(SRC),
               *(f"--offload-arch={a}" for a in archs), str(SRC / "qo_version.c"), "-x", "hip",
               str(SRC / "qo_gpu_kernels.cu"), "-o", str(out)]
    # HIP_PLATFORM=amd: hipcc hands .cu files to nvcc when a CUDA toolkit is installed.
    return out, _compile([command], env={**os.environ, "HIP_PLATFORM": "amd"})


# ---------------- device runtimes (CUDA and HIP share the call shapes) ----------------

def load_runtime_library(backend: str) -> ctypes.CDLL:
    if backend == "cuda":
        names = ["libcudart.so"] + sorted(glob.glob(os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"),
                                                                 "lib64", "libcudart.so*")))
        names += sorted(glob.glob("/usr/local/cuda*/lib64/libcudart.so*"))
    else:
        names = ["libamdhip64.so", os.path.join(os.environ.get("ROCM_PATH", "/opt/rocm"), "lib", "libamdhip64.so")]
    for name in names:
        try:
            return ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            continue
    raise RuntimeError(f"{backend} runtime library not found (tried {names[:4]})")


class GpuRuntime:
    """Device memory and events through libcudart / libamdhip64; implements gpu_cases' Memory."""

    def __init__(self, library: ctypes.CDLL, prefix: str):
        self.rt, self.prefix = library, prefix
        p = ctypes.c_void_p
        self._fn("GetErrorString").restype = ctypes.c_char_p
        self._fn("Malloc").argtypes = [ctypes.POINTER(p), ctypes.c_size_t]
        self._fn("Free").argtypes = [p]
        self._fn("Memcpy").argtypes = [p, p, ctypes.c_size_t, ctypes.c_int]
        self._fn("EventCreate").argtypes = [ctypes.POINTER(p)]
        self._fn("EventRecord").argtypes = [p, p]
        self._fn("EventSynchronize").argtypes = [p]
        self._fn("EventElapsedTime").argtypes = [ctypes.POINTER(ctypes.c_float), p, p]
        self.allocations: list[int] = []

    def _fn(self, name: str):
        return getattr(self.rt, self.prefix + name)

    def check(self, code: int, what: str) -> None:
        if code != 0:
            raise RuntimeError(f"{what}: {self.prefix} error {code} {self._fn('GetErrorString')(code).decode()}")

    def device_count(self) -> int:
        count = ctypes.c_int(0)
        return count.value if self._fn("GetDeviceCount")(ctypes.byref(count)) == 0 else 0

    def device_info(self) -> dict:
        info = {"backend": self.prefix}
        if self.prefix == "cuda":
            for key, attr in (("cc_major", 75), ("cc_minor", 76), ("sm_count", 16)):
                value = ctypes.c_int()
                if self.rt.cudaDeviceGetAttribute(ctypes.byref(value), attr, 0) == 0:
                    info[key] = value.value
        else:
            info["archs"] = amd_gpu_archs()
        runtime = ctypes.c_int()
        if self._fn("RuntimeGetVersion")(ctypes.byref(runtime)) == 0:
            info["runtime_version"] = runtime.value
        return info

    def upload(self, array: np.ndarray) -> int:
        array = np.ascontiguousarray(array)
        pointer = ctypes.c_void_p()
        self.check(self._fn("Malloc")(ctypes.byref(pointer), max(array.nbytes, 1)), "Malloc")
        self.allocations.append(pointer.value)
        if array.nbytes:
            self.check(self._fn("Memcpy")(pointer, array.ctypes.data, array.nbytes, H2D), "Memcpy H2D")
        return pointer.value

    def empty(self, nbytes: int) -> int:
        return self.upload(np.full(max(nbytes, 1), 0xFF, dtype=np.uint8))  # NaN-poisoned

    def synchronize(self) -> None:
        self.check(self._fn("DeviceSynchronize")(), "kernel execution")

    def download(self, pointer: int, like: np.ndarray) -> np.ndarray:
        self.synchronize()
        out = np.empty_like(like)
        self.check(self._fn("Memcpy")(out.ctypes.data, ctypes.c_void_p(pointer), out.nbytes, D2H), "Memcpy D2H")
        return out

    def free_all(self) -> None:
        for pointer in self.allocations:
            self._fn("Free")(ctypes.c_void_p(pointer))
        self.allocations.clear()

    def time_ms(self, launch, warmup: int = 3, iterations: int = 20) -> float:
        for _ in range(warmup):
            launch()
        start, stop = ctypes.c_void_p(), ctypes.c_void_p()
        self.check(self._fn("EventCreate")(ctypes.byref(start)), "EventCreate")
        self.check(self._fn("EventCreate")(ctypes.byref(stop)), "EventCreate")
        self.check(self._fn("EventRecord")(start, None), "EventRecord")
        for _ in range(iterations):
            launch()
        self.check(self._fn("EventRecord")(stop, None), "EventRecord")
        self.check(self._fn("EventSynchronize")(stop), "EventSynchronize")
        elapsed = ctypes.c_float()
        self.check(self._fn("EventElapsedTime")(ctypes.byref(elapsed), start, stop), "EventElapsedTime")
        return elapsed.value / iterations

    def copy_GBps(self, nbytes: int = 256 << 20) -> float:
        """Device-to-device memcpy: bytes read + written per second, the plain memory figure beside the kernels'."""
        src, dst = self.empty(nbytes), self.empty(nbytes)
        copy = lambda: self._fn("Memcpy")(ctypes.c_void_p(dst), ctypes.c_void_p(src), nbytes, D2D)  # noqa: E731
        ms = self.time_ms(copy, warmup=2, iterations=10)
        self.free_all()
        return 2 * nbytes / ms / 1e6


class HipCpuRuntime(gc.HostMemory):
    """--self-test: the HIP-CPU build; wall-clock timing (CPU figures, meaningless for a GPU)."""

    def time_ms(self, launch, warmup: int = 1, iterations: int = 3) -> float:
        for _ in range(warmup):
            launch()
        self.synchronize()
        start = time.perf_counter()
        for _ in range(iterations):
            launch()
        self.synchronize()
        return (time.perf_counter() - start) * 1e3 / iterations

    def copy_GBps(self, nbytes: int = 64 << 20) -> float:
        src = np.ones(nbytes, np.uint8)
        start = time.perf_counter()
        dst = src.copy()
        return 2 * dst.nbytes / (time.perf_counter() - start) / 1e9


# ---------------- the run ----------------

def timed_case(lib, runtime, case: gc.Case) -> dict:
    inputs = gc.make_inputs(case)
    result = gc.run_case(lib, runtime, case, inputs)
    if result.get("pass"):
        launch, _, _ = gc.prepare(lib, runtime, case, inputs)
        ms = runtime.time_ms(launch)
        runtime.free_all()
        result.update(ms=ms, weight_GBps=inputs.weight_bytes / ms / 1e6, weight_bytes=inputs.weight_bytes,
                      TFLOPS=2.0 * case.M * case.N * case.K / ms / 1e9)
    return result


def run_all(lib, runtime, timed_shapes, log=print) -> dict:
    report = {"cases": [], "timed": []}
    all_pass = True
    for case in gc.cases():
        try:
            result = gc.run_case(lib, runtime, case)
        except Exception as error:  # one broken case must not hide the others
            result = {"case": case.name, "pass": False, "error": f"{type(error).__name__}: {error}"}
        all_pass &= bool(result.get("pass"))
        report["cases"].append(result)
        log(f"{'PASS' if result.get('pass') else 'FAIL'} {case.name:44s} "
            f"err/sum|AW|={result.get('max_error_over_sum_abs', float('nan')):.2e} {result.get('error', '')}")
    report["copy_GBps"] = runtime.copy_GBps()
    for op in gc.OPS:
        for m, n, k in timed_shapes:
            case = gc.Case(op, "f16", m, n, k, per_channel=True, special=False)
            try:
                result = timed_case(lib, runtime, case)
            except Exception as error:
                result = {"case": case.name, "pass": False, "error": f"{type(error).__name__}: {error}"}
            all_pass &= bool(result.get("pass"))
            report["timed"].append(result)
            log(f"{'PASS' if result.get('pass') else 'FAIL'} {case.name:44s} " + (
                f"{result['ms']:.4f} ms {result['weight_GBps']:.1f} GB/s of weight" if "ms" in result else
                result.get("error", "")))
    report["all_pass"] = all_pass
    report["max_error_over_sum_abs_f32"] = {
        op: max(r.get("max_error_over_sum_abs", 0.0) for r in report["cases"]
                if r["case"].startswith(op + "-f32")) for op in gc.OPS}
    return report


def pick_backend(requested: str) -> tuple[str, str]:
    """(backend, compiler) for the GPU present."""
    nvcc, hipcc = find_tool("nvcc", "CUDA_HOME", "/usr/local/cuda"), find_tool("hipcc", "ROCM_PATH", "/opt/rocm")
    for backend, compiler in (("cuda", nvcc), ("hip", hipcc)):
        if requested not in ("auto", backend) or compiler is None:
            continue
        try:
            if GpuRuntime(load_runtime_library(backend), backend).device_count() > 0:
                return backend, compiler
        except (RuntimeError, AttributeError):
            continue
    raise RuntimeError(f"no usable GPU for backend {requested!r} (nvcc: {nvcc}, hipcc: {hipcc}, and a device the "
                       "runtime library sees)")


def write_report(report: dict, out: str, exit_code: int) -> int:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(report, indent=2))
    print(f"report: {out} ({'all pass' if exit_code == 0 else 'FAILURES' if exit_code == 1 else 'did not run'})")
    return exit_code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(PACKAGE_DIR / "build" / "gpu_check.json"))
    parser.add_argument("--backend", choices=("auto", "cuda", "hip"), default="auto")
    parser.add_argument("--arch", help="nvcc SM number like 90, or an AMD target like gfx942 (default: the GPU's)")
    parser.add_argument("--quick", action="store_true", help="only the M = 1 timed shape")
    parser.add_argument("--self-test", action="store_true", help="no GPU: run on the HIP-CPU build")
    parser.add_argument("--build-only", action="store_true", help="no GPU: compile for --arch (default sm_90)")
    args = parser.parse_args(argv)
    report: dict = {"host": platform.node(), "python": sys.version.split()[0], "started": time.time()}
    exit_code = 2
    try:
        if args.build_only:
            compiler = find_tool("nvcc", "CUDA_HOME", "/usr/local/cuda")
            if compiler and args.backend in ("auto", "cuda"):
                _, command = build_cuda(compiler, args.arch or "90")
            else:
                hipcc = find_tool("hipcc", "ROCM_PATH", "/opt/rocm")
                if hipcc is None:
                    raise RuntimeError("neither nvcc nor hipcc found")
                _, command = build_hip(hipcc, args.arch or "gfx90a")
            report.update(build_command=" ".join(command), all_pass=True)
            exit_code = 0
        else:
            if args.self_test:
                library = hip_cpu.build(warp_sizes=(64,), log=lambda m: None)[64]
                lib = hip_cpu.load(library)
                runtime = HipCpuRuntime(lib.qo_hip_cpu_synchronize)
                report.update(backend="hip-cpu", build_command=" ".join(hip_cpu.compile_command(
                    hip_cpu.find_compiler(), hip_cpu.UNPACKED, 64, library)))
                timed = SELF_TEST_TIMED_SHAPES
            else:
                backend, compiler = pick_backend(args.backend)
                library, command = (build_cuda if backend == "cuda" else build_hip)(compiler, args.arch)
                report["build_command"] = " ".join(command)
                runtime = GpuRuntime(load_runtime_library(backend), backend)
                report["device"] = runtime.device_info()
                lib = gc.declare_kernels(ctypes.CDLL(str(library)))
                timed = TIMED_SHAPES[:1] if args.quick else TIMED_SHAPES
            report.update(run_all(lib, runtime, timed))
            exit_code = 0 if report["all_pass"] else 1
    except Exception as error:
        report["fatal"] = f"{type(error).__name__}: {error}"
        report["traceback"] = traceback.format_exc()
        print(report["fatal"], file=sys.stderr)
    report["seconds"] = time.time() - report.pop("started")
    return write_report(report, args.out, exit_code)


if __name__ == "__main__":
    sys.exit(main())
