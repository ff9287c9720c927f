"""Build (on demand) and call the CPU kernels of custom_ops/src through ctypes.

The shared library goes to custom_ops/build/cpu/ (gitignored). It is built with CMake when `cmake` is on PATH,
otherwise with one direct compiler call (`cc -O3 -shared -fPIC`, OpenMP when the compiler accepts -fopenmp), and
rebuilt when a source is newer than the library.

    from custom_ops import native
    y = native.matmul_mxfp4(a, b_packed, b_scale)          # a float32|float16 [..., K]
    y = native.matmul_fp8_w8a8(a, b_fp8, b_scale, a_scale)
    y = native.matmul_fp8_w8a8_dyn(a, b_fp8, b_scale)
    y = native.matmul_fp8(a, b_fp8, b_scale)               # weight-only FP8 (MatMulFp8)
    y = native.matmul_int8(a, b_int8, b_scale)             # weight-only INT8 (MatMulInt8)
    y = native.matmul_nvfp4(a, b_packed, b_scale_e4m3, b_scale_2)
    y = native.matmul_bf16(a, b_bf16_bits)
    y = native.matmul_int4(a, b_packed, scales, zero_points_or_None, k, block_size)  # MatMulNBits' 4-bit layout

QO_CPU_KERNELS=portable in the environment makes the library take its portable C path instead of AVX2 (same bits).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no build lock
    fcntl = None

import ml_dtypes
import numpy as np

PACKAGE_DIR = Path(__file__).resolve().parent
SOURCE_DIR = PACKAGE_DIR / "src"
BUILD_DIR = PACKAGE_DIR / "build" / "cpu"
LIBRARY_NAME = "quark_onnx_ops"
CPU_SOURCES = ("qo_cpu_kernels.c", "qo_cpu_experts.c", "qo_cpu_int4.c", "qo_cpu_int4_panel.c", "qo_cpu_int4_a8.c", "qo_cpu_int8_w8a8.c", "qo_cpu_attention.c", "qo_cpu_fp4_r16.c", "qo_cpu_fp8_qdq.c", "qo_cpu_fp4_act.c", "qo_version.c")
HEADERS = ("qo_fp_formats.h", "qo_kernels.h", "qo_cpu_simd.h", "qo_cpu_int4_panel.h")
ABI_VERSION = 1
MXFP4_BLOCK_SIZE = 32

_library: ctypes.CDLL | None = None


class NativeBuildError(RuntimeError):
    pass


def library_path() -> Path:
    suffix = {"darwin": ".dylib", "win32": ".dll"}.get(sys.platform, ".so")
    prefix = "" if sys.platform == "win32" else "lib"
    return BUILD_DIR / f"{prefix}{LIBRARY_NAME}{suffix}"


def _inputs_of_build() -> list[Path]:
    return [SOURCE_DIR / name for name in CPU_SOURCES + HEADERS] + [PACKAGE_DIR / "CMakeLists.txt"]


def _is_stale(path: Path) -> bool:
    if not path.exists():
        return True
    built = path.stat().st_mtime
    return any(p.exists() and p.stat().st_mtime > built for p in _inputs_of_build())


def _run(cmd: list[str], cwd: Path | None = None) -> None:
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise NativeBuildError(f"command failed ({result.returncode}): {' '.join(cmd)}\n{result.stdout}\n{result.stderr}")


def _build_with_cmake(cmake: str) -> None:
    cmake_build = BUILD_DIR / "cmake"
    _run([cmake, "-S", str(PACKAGE_DIR), "-B", str(cmake_build), "-DCMAKE_BUILD_TYPE=Release",
          "-DQO_WITH_CPU=ON", "-DQO_WITH_CUDA=OFF", "-DQO_WITH_HIP=OFF", "-DQO_WITH_ORT=OFF",
          f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={BUILD_DIR}"])
    _run([cmake, "--build", str(cmake_build), "--config", "Release", "-j", "2"])


def _build_with_compiler() -> None:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not compiler:
        raise NativeBuildError("no C compiler found (set CC, or install cc/gcc/clang) to build custom_ops CPU kernels")
    sources = [str(SOURCE_DIR / s) for s in CPU_SOURCES]
    command = [compiler, "-O3", "-std=c99", "-ffp-contract=off", "-shared", "-fPIC", "-fvisibility=hidden", *sources,
               "-o", str(library_path())]
    # Threads when OpenMP links, else only its simd pragmas, else plain.
    for parallel_flags in (["-fopenmp"], ["-fopenmp-simd"], []):
        try:
            _run(command[:2] + parallel_flags + command[2:] + ["-lm"])
            return
        except NativeBuildError:
            if not parallel_flags:
                raise


def build(force: bool = False, use_cmake: bool | None = None) -> Path:
    """Build the CPU library if missing or stale (or force); returns its path. use_cmake=None: cmake when found."""
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    with open(BUILD_DIR / ".build.lock", "w") as lock:  # two test processes must not build at once
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        if force or _is_stale(library_path()):
            cmake = shutil.which("cmake") if use_cmake in (None, True) else None
            if use_cmake and not cmake:
                raise NativeBuildError("use_cmake=True but cmake is not on PATH")
            _build_with_cmake(cmake) if cmake else _build_with_compiler()
            if not library_path().exists():
                raise NativeBuildError(f"build finished but {library_path()} is missing")
    return library_path()


def _declare(lib: ctypes.CDLL) -> None:
    p, i64, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
    signatures = {
        "qo_matmul_mxfp4_f32": [p, p, p, p, i64, i64, i64],
        "qo_matmul_mxfp4_f16": [p, p, p, p, i64, i64, i64],
        "qo_matmul_fp8_w8a8_f32": [p, p, p, i64, f32, p, i64, i64, i64],
        "qo_matmul_fp8_w8a8_f16": [p, p, p, i64, f32, p, i64, i64, i64],
        "qo_matmul_fp8_w8a8_dyn_f32": [p, p, p, i64, p, i64, i64, i64],
        "qo_matmul_fp8_w8a8_dyn_f16": [p, p, p, i64, p, i64, i64, i64],
        "qo_matmul_fp8_f32": [p, p, p, i64, p, i64, i64, i64],
        "qo_matmul_fp8_f16": [p, p, p, i64, p, i64, i64, i64],
        "qo_matmul_int8_f32": [p, p, p, i64, p, i64, i64, i64],
        "qo_matmul_int8_f16": [p, p, p, i64, p, i64, i64, i64],
        "qo_matmul_int8_w8a8_f32": [p, p, p, i64, f32, p, i64, i64, i64],
        "qo_matmul_int8_w8a8_f16": [p, p, p, i64, f32, p, i64, i64, i64],
        "qo_matmul_nvfp4_f32": [p, p, p, f32, p, i64, i64, i64],
        "qo_matmul_nvfp4_f16": [p, p, p, f32, p, i64, i64, i64],
        "qo_matmul_mxfp4_r16_f32": [p, p, p, p, i64, i64, i64],
        "qo_matmul_nvfp4_r16_f32": [p, p, p, f32, p, i64, i64, i64],
        "qo_matmul_bf16_f32": [p, p, p, i64, i64, i64],
        "qo_matmul_bf16_f16": [p, p, p, i64, i64, i64],
        "qo_matmul_int4_f32": [p, p, p, p, p, i64, i64, i64, i64],
        "qo_matmul_int4_f16": [p, p, p, p, p, i64, i64, i64, i64],
        "qo_matmul_int4_a8_f32": [p, p, p, p, p, i64, i64, i64, i64],
    }
    optional = {  # newer than some builds a benchmark may load (--library): declared where present
        "qo_gqa_fixed_order_f32": [p, p, p, p, p, i64, p, p, i64, p, i64, p, p, i64, i64, p, i64, i64, i64, i64, i64,
                                   f32, i64, p],
        "qo_qdq_fp8_f32": [p, f32, p, i64],
        "qo_qdq_mxfp4_act_f32": [p, p, i64, ctypes.c_int],
        "qo_qdq_nvfp4_act_f32": [p, f32, p, i64],
        "qo_qdq_nvfp4_act_rows_f32": [p, p, p, p, p, i64, i64],
    }
    for name, argtypes in {**signatures, **{n: t for n, t in optional.items() if hasattr(lib, n)}}.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
    lib.qo_abi_version.restype = ctypes.c_int
    lib.qo_abi_version.argtypes = []


def load_library(rebuild: bool = False) -> ctypes.CDLL:
    """Build if needed and load the CPU kernel library (cached per process)."""
    global _library
    if _library is None or rebuild:
        path = build(force=rebuild)
        lib = ctypes.CDLL(str(path))
        _declare(lib)
        if lib.qo_abi_version() != ABI_VERSION:
            raise NativeBuildError(f"{path}: ABI version {lib.qo_abi_version()}, expected {ABI_VERSION}; rebuild")
        _library = lib
    return _library


def _ptr(array: np.ndarray) -> int:
    return array.ctypes.data


def _activation(a: np.ndarray, k: int, op: str) -> tuple[np.ndarray, str]:
    a = np.asarray(a)
    if a.dtype not in (np.float32, np.float16):
        raise TypeError(f"{op}: A must be float32 or float16, got {a.dtype}")
    if a.ndim < 1 or a.shape[-1] != k:
        raise ValueError(f"{op}: A shape {a.shape} must end in K={k}")
    return np.ascontiguousarray(a), ("f32" if a.dtype == np.float32 else "f16")


def _check(status: int, op: str) -> None:
    if status != 0:
        raise RuntimeError(f"{op}: native kernel returned status {status} (1 bad argument, 2 out of memory)")


def matmul_mxfp4(a: np.ndarray, b_packed: np.ndarray, b_scale: np.ndarray) -> np.ndarray:
    """Y [..., N] = A [..., K] @ dequant_mxfp4(B [N, K/2], B_scale [N, K/32]).T, in A's dtype."""
    b_packed = np.ascontiguousarray(b_packed, dtype=np.uint8)
    b_scale = np.ascontiguousarray(b_scale, dtype=np.uint8)
    n, k = b_packed.shape[0], b_packed.shape[1] * 2
    if k % MXFP4_BLOCK_SIZE or b_scale.shape != (n, k // MXFP4_BLOCK_SIZE):
        raise ValueError(f"matmul_mxfp4: B {b_packed.shape} / B_scale {b_scale.shape} do not describe K % 32 == 0")
    a, suffix = _activation(a, k, "matmul_mxfp4")
    m = a.size // k
    y = np.empty(a.shape[:-1] + (n,), dtype=a.dtype)
    fn = getattr(load_library(), f"qo_matmul_mxfp4_{suffix}")
    _check(fn(_ptr(a), _ptr(b_packed), _ptr(b_scale), _ptr(y), m, n, k), "matmul_mxfp4")
    return y


def _fp8_weight(b_fp8: np.ndarray, b_scale) -> tuple[np.ndarray, np.ndarray]:
    b = np.asarray(b_fp8)
    if b.dtype == ml_dtypes.float8_e4m3fn:
        b = b.view(np.uint8)
    if b.dtype != np.uint8 or b.ndim != 2:
        raise TypeError(f"B must be float8_e4m3fn (or its uint8 codes) [N, K], got {b.dtype} {b.shape}")
    scale = np.ascontiguousarray(np.asarray(b_scale, dtype=np.float32).reshape(-1))
    if scale.size not in (1, b.shape[0]):
        raise ValueError(f"B_scale has {scale.size} values: want 1 (per-tensor) or N={b.shape[0]} (per-channel)")
    return np.ascontiguousarray(b), scale


def matmul_fp8_w8a8(a: np.ndarray, b_fp8: np.ndarray, b_scale, a_scale) -> np.ndarray:
    """Y = QDQ_e4m3fn(A, A_scale) @ (B * B_scale).T; B_scale scalar or [N]; A's dtype out."""
    b, scale = _fp8_weight(b_fp8, b_scale)
    n, k = b.shape
    a, suffix = _activation(a, k, "matmul_fp8_w8a8")
    y = np.empty(a.shape[:-1] + (n,), dtype=a.dtype)
    fn = getattr(load_library(), f"qo_matmul_fp8_w8a8_{suffix}")
    a_scale_value = float(np.asarray(a_scale, dtype=np.float32).reshape(()))
    _check(fn(_ptr(a), _ptr(b), _ptr(scale), scale.size, a_scale_value, _ptr(y), a.size // k, n, k), "matmul_fp8_w8a8")
    return y


def matmul_fp8_w8a8_dyn(a: np.ndarray, b_fp8: np.ndarray, b_scale) -> np.ndarray:
    """Like matmul_fp8_w8a8 with per-row activation scale max(max|row|/448, 1e-12)."""
    b, scale = _fp8_weight(b_fp8, b_scale)
    n, k = b.shape
    a, suffix = _activation(a, k, "matmul_fp8_w8a8_dyn")
    y = np.empty(a.shape[:-1] + (n,), dtype=a.dtype)
    fn = getattr(load_library(), f"qo_matmul_fp8_w8a8_dyn_{suffix}")
    _check(fn(_ptr(a), _ptr(b), _ptr(scale), scale.size, _ptr(y), a.size // k, n, k), "matmul_fp8_w8a8_dyn")
    return y


def _scaled_weight(b: np.ndarray, b_scale, dtype, code_dtype, op: str) -> tuple[np.ndarray, np.ndarray]:
    b = np.asarray(b)
    if b.dtype == dtype:
        b = b.view(code_dtype)
    if b.dtype != code_dtype or b.ndim != 2:
        raise TypeError(f"{op}: B must be {np.dtype(dtype).name} [N, K], got {b.dtype} {b.shape}")
    scale = np.ascontiguousarray(np.asarray(b_scale, dtype=np.float32).reshape(-1))
    if scale.size not in (1, b.shape[0]):
        raise ValueError(f"{op}: B_scale has {scale.size} values: want 1 (per-tensor) or N={b.shape[0]} (per-channel)")
    return np.ascontiguousarray(b), scale


def _matmul_scaled_weight(op: str, a: np.ndarray, b_codes: np.ndarray, b_scale, dtype, code_dtype) -> np.ndarray:
    """Y = A @ (f32(B) * B_scale).T through qo_{op}_{f32,f16}; B [N, K] in `dtype` (or its `code_dtype` bits)."""
    b, scale = _scaled_weight(b_codes, b_scale, dtype, code_dtype, op)
    n, k = b.shape
    a, suffix = _activation(a, k, op)
    y = np.empty(a.shape[:-1] + (n,), dtype=a.dtype)
    fn = getattr(load_library(), f"qo_{op}_{suffix}")
    _check(fn(_ptr(a), _ptr(b), _ptr(scale), scale.size, _ptr(y), a.size // k, n, k), op)
    return y


def matmul_fp8(a: np.ndarray, b_fp8: np.ndarray, b_scale) -> np.ndarray:
    """Weight-only FP8: Y = A @ (f32(B) * B_scale).T; B float8_e4m3fn (or uint8 codes) [N, K]; B_scale scalar or [N]."""
    return _matmul_scaled_weight("matmul_fp8", a, b_fp8, b_scale, ml_dtypes.float8_e4m3fn, np.uint8)


def matmul_int8(a: np.ndarray, b_int8: np.ndarray, b_scale) -> np.ndarray:
    """Weight-only INT8: Y = A @ (f32(B) * B_scale).T; B int8 [N, K]; B_scale scalar or [N]."""
    return _matmul_scaled_weight("matmul_int8", a, b_int8, b_scale, np.int8, np.int8)


def matmul_int8_w8a8(a: np.ndarray, b_int8: np.ndarray, b_scale, a_scale) -> np.ndarray:
    """INT8 W8A8: q = clamp(round_half_even(A * fp32(1 / A_scale)), -128, 127), Y = fp32(fp32(q @ B.T) * A_scale) *
    B_scale (the integer sum exact); B int8 [N, K]; B_scale scalar or [N]; A_scale a positive scalar."""
    b, scale = _scaled_weight(b_int8, b_scale, np.int8, np.int8, "matmul_int8_w8a8")
    n, k = b.shape
    a, suffix = _activation(a, k, "matmul_int8_w8a8")
    y = np.empty(a.shape[:-1] + (n,), dtype=a.dtype)
    fn = getattr(load_library(), f"qo_matmul_int8_w8a8_{suffix}")
    a_scale_value = float(np.asarray(a_scale, dtype=np.float32).reshape(()))
    _check(fn(_ptr(a), _ptr(b), _ptr(scale), scale.size, a_scale_value, _ptr(y), a.size // k, n, k),
           "matmul_int8_w8a8")
    return y


def matmul_nvfp4(a: np.ndarray, b_packed: np.ndarray, b_scale: np.ndarray, b_scale_2) -> np.ndarray:
    """NVFP4: Y = A @ (e2m1(B) * fp32(e4m3(B_scale) * B_scale_2)).T; B uint8 [N, K/2], B_scale e4m3 [N, K/16]."""
    b_packed = np.ascontiguousarray(b_packed, dtype=np.uint8)
    s = np.asarray(b_scale)
    if s.dtype == ml_dtypes.float8_e4m3fn:
        s = s.view(np.uint8)
    s = np.ascontiguousarray(s, dtype=np.uint8)
    n, k = b_packed.shape[0], b_packed.shape[1] * 2
    if k % 16 or s.shape != (n, k // 16):
        raise ValueError(f"matmul_nvfp4: B {b_packed.shape} / B_scale {s.shape} do not describe K % 16 == 0")
    a, suffix = _activation(a, k, "matmul_nvfp4")
    y = np.empty(a.shape[:-1] + (n,), dtype=a.dtype)
    fn = getattr(load_library(), f"qo_matmul_nvfp4_{suffix}")
    s2 = float(np.asarray(b_scale_2, dtype=np.float32).reshape(()))
    _check(fn(_ptr(a), _ptr(b_packed), _ptr(s), s2, _ptr(y), a.size // k, n, k), "matmul_nvfp4")
    return y


def _matmul_fp4_r16(name: str, a: np.ndarray, b_r16: np.ndarray, s_r16: np.ndarray, block: int, *scale_2):
    b_r16 = np.ascontiguousarray(b_r16, dtype=np.uint8)
    s = np.asarray(s_r16)
    s = np.ascontiguousarray(s.view(np.uint8) if s.dtype != np.uint8 else s)
    if b_r16.ndim != 3 or b_r16.shape[2] != 64 or s.ndim != 3 or s.shape[2] != 16:
        raise ValueError(f"{name}: B {b_r16.shape} / B_scale {s.shape} are not [N/16, K/8, 64] / [N/16, K/{block}, 16]")
    n, k = b_r16.shape[0] * 16, b_r16.shape[1] * 8
    if k % block or s.shape[:2] != (n // 16, k // block):
        raise ValueError(f"{name}: B {b_r16.shape} / B_scale {s.shape} do not describe K % {block} == 0")
    a = np.ascontiguousarray(a, dtype=np.float32)
    if a.shape[-1] != k:
        raise ValueError(f"{name}: A's last dimension {a.shape[-1]} != K {k}")
    y = np.empty(a.shape[:-1] + (n,), dtype=np.float32)
    fn = getattr(load_library(), f"qo_{name}_f32")
    _check(fn(_ptr(a), _ptr(b_r16), _ptr(s), *scale_2, _ptr(y), a.size // k, n, k), name)
    return y


def matmul_mxfp4_r16(a: np.ndarray, b_r16: np.ndarray, s_r16: np.ndarray) -> np.ndarray:
    """MXFP4 with the weight in 16-row tiles (custom_ops/fp4_r16.py pack): Y [..., N] float32."""
    return _matmul_fp4_r16("matmul_mxfp4_r16", a, b_r16, s_r16, MXFP4_BLOCK_SIZE)


def matmul_nvfp4_r16(a: np.ndarray, b_r16: np.ndarray, s_r16: np.ndarray, b_scale_2) -> np.ndarray:
    """NVFP4 with the weight in 16-row tiles: Y [..., N] float32."""
    s2 = float(np.asarray(b_scale_2, dtype=np.float32).reshape(()))
    return _matmul_fp4_r16("matmul_nvfp4_r16", a, b_r16, s_r16, 16, s2)


def matmul_bf16(a: np.ndarray, b_bits: np.ndarray) -> np.ndarray:
    """Y = A @ float32(B).T; B bfloat16 (or its uint16 bit patterns) [N, K]."""
    b = np.asarray(b_bits)
    if b.dtype == ml_dtypes.bfloat16:
        b = b.view(np.uint16)
    b = np.ascontiguousarray(b, dtype=np.uint16)
    n, k = b.shape
    a, suffix = _activation(a, k, "matmul_bf16")
    y = np.empty(a.shape[:-1] + (n,), dtype=a.dtype)
    fn = getattr(load_library(), f"qo_matmul_bf16_{suffix}")
    _check(fn(_ptr(a), _ptr(b), _ptr(y), a.size // k, n, k), "matmul_bf16")
    return y


def matmul_int4(a: np.ndarray, b_packed: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, k: int,
                block_size: int, accuracy_level: int = 1) -> np.ndarray:
    """Exact 4-bit per-group weight (MatMulUint4 / MatMulInt4): Y = A @ W.T, W[n, k] = f32((q - z) * s) with q the
    nibble of B uint8 [N, ceil(K/bs), bs/2] (even k low), s = scales [N, ceil(K/bs)], z from zero_points uint8
    [N, ceil(ceil(K/bs)/2)] packed uint4 (None: 8). accuracy_level=4: A quantized to int8 per block as MatMulNBits /
    QMoE at level 4 do (qo_cpu_int4_a8.c; float32 A only)."""
    b = np.ascontiguousarray(b_packed, dtype=np.uint8)
    n = b.shape[0]
    k_blocks = -(-k // block_size)
    if b.size != n * k_blocks * block_size // 2:
        raise ValueError(f"matmul_int4: B {b.shape} is not [N, {k_blocks}, {block_size // 2}]")
    s = np.ascontiguousarray(scales, dtype=np.float32).reshape(-1)
    if s.size != n * k_blocks:
        raise ValueError(f"matmul_int4: scales has {s.size} values, want {n * k_blocks}")
    zp = None
    if zero_points is not None:
        zp = np.ascontiguousarray(zero_points, dtype=np.uint8).reshape(-1)
        if zp.size != n * ((k_blocks + 1) // 2):
            raise ValueError(f"matmul_int4: zero_points has {zp.size} bytes, want {n * ((k_blocks + 1) // 2)}")
    a, suffix = _activation(a, k, "matmul_int4")
    if accuracy_level not in (1, 4) or (accuracy_level == 4 and suffix != "f32"):
        raise ValueError(f"matmul_int4: accuracy_level {accuracy_level} with {a.dtype} activations")
    y = np.empty(a.shape[:-1] + (n,), dtype=a.dtype)
    fn = getattr(load_library(), f"qo_matmul_int4_{'a8_' if accuracy_level == 4 else ''}{suffix}")
    _check(fn(_ptr(a), _ptr(b), _ptr(s), None if zp is None else _ptr(zp), _ptr(y), a.size // k, n, k, block_size),
           "matmul_int4")
    return y


def gqa_fixed_order(q: np.ndarray, k: np.ndarray, v: np.ndarray, past_k: np.ndarray, past_v: np.ndarray,
                    seqlens_k: np.ndarray, total_sequence_length: int, cos_cache: np.ndarray, sin_cache: np.ndarray,
                    num_heads: int, kv_num_heads: int, scale: float = 0.0, local_window: int = -1,
                    share_buffer: bool = False, head_sink: np.ndarray | None = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """com.quark_onnx GroupQueryAttentionFixedOrder (qo_cpu_attention.c): (out [B, S, H*D], present_k, present_v).
    share_buffer: past_k / past_v are the cache buffers themselves ([B, Hkv, max_length, D], written in place and
    returned), as onnxruntime-genai binds them; else present is a new [B, Hkv, max(total, P), D] array. head_sink
    [H]: each head's sink logit (GroupQueryAttentionFixedOrderSinks)."""
    f32 = np.float32
    q, k, v = (np.ascontiguousarray(x, dtype=f32) for x in (q, k, v))
    cos_cache, sin_cache = (np.ascontiguousarray(x, dtype=f32) for x in (cos_cache, sin_cache))
    seqlens = np.ascontiguousarray(seqlens_k, dtype=np.int32).reshape(-1)
    b, s, hd = q.shape
    d = hd // num_heads
    if share_buffer:
        if past_k.dtype != f32 or not past_k.flags.c_contiguous or past_v.dtype != f32 or not past_v.flags.c_contiguous:
            raise ValueError("gqa_fixed_order: shared past buffers must be C-contiguous float32 arrays")
        present_k, present_v = past_k, past_v
    else:
        past_k, past_v = (np.ascontiguousarray(x, dtype=f32) for x in (past_k, past_v))
        t = max(int(total_sequence_length), past_k.shape[2])
        present_k = np.empty((b, kv_num_heads, t, d), f32)
        present_v = np.empty((b, kv_num_heads, t, d), f32)
    out = np.empty((b, s, hd), f32)
    sinks = None if head_sink is None else np.ascontiguousarray(head_sink, dtype=f32).reshape(num_heads)
    fn = load_library().qo_gqa_fixed_order_f32
    _check(fn(_ptr(q), _ptr(k), _ptr(v), _ptr(past_k), _ptr(past_v), past_k.shape[2], _ptr(present_k),
              _ptr(present_v), present_k.shape[2], _ptr(seqlens), int(total_sequence_length), _ptr(cos_cache),
              _ptr(sin_cache), cos_cache.shape[0], cos_cache.shape[1], _ptr(out), b, s, num_heads, kv_num_heads, d,
              float(scale), int(local_window), None if sinks is None else _ptr(sinks)), "gqa_fixed_order")
    return out, present_k, present_v
