"""The cases every GPU kernel runs, their inputs, and an independent float64 answer for each.

Shared by tests/test_gpu_kernels_hip_cpu.py (the kernels on the CPU through HIP-CPU, in CI) and gpu_check.py (the
same cases on a real GPU). The decoders here are plain numpy written from the format definitions (OCP MX for e2m1
and e8m0, OCP FP8 for e4m3fn, IEEE for bf16/fp16, Quark's NVFP4 order from qo_kernels.h); they share no code with
the kernels, custom_ops/reference.py or the ONNX functions, and the test checks them against ml_dtypes code by code.

A `Memory` moves arrays to the device and back: HostMemory for HIP-CPU (device pointers are host pointers),
gpu_check.py's CUDA/HIP runtimes for a GPU.
"""

from __future__ import annotations

import ctypes
import zlib
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

OPS = ("mxfp4", "fp8_w8a8", "fp8_w8a8_dyn", "fp8", "int8", "nvfp4", "bf16")
ENTRY_POINT = {"mxfp4": "qo_gpu_matmul_mxfp4", "fp8_w8a8": "qo_gpu_matmul_fp8_w8a8",
               "fp8_w8a8_dyn": "qo_gpu_matmul_fp8_w8a8_dyn", "fp8": "qo_gpu_matmul_fp8", "int8": "qo_gpu_matmul_int8",
               "nvfp4": "qo_gpu_matmul_nvfp4", "bf16": "qo_gpu_matmul_bf16"}
IO_DTYPES = {"f32": np.float32, "f16": np.float16}
# K multiple each format needs (block size of its scales).
K_MULTIPLE = {"mxfp4": 32, "nvfp4": 16}

# Asserted error bound of a float32 output: |Y - Y_ref| <= SUM_RTOL * (|A| @ |W|^T), per element. fp16 outputs also
# get the output rounding: + 2^-11 |Y_ref| + 2^-25 (half an ulp, relative, and of the smallest subnormal).
SUM_RTOL = 1e-6
F16_ROUNDING = 2.0 ** -11
F16_SUBNORMAL_HALF = 2.0 ** -25
F16_OVERFLOW = 65520.0  # float32 values at or above this round to fp16 inf


# ---------------- independent float64 decoders ----------------

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float64)


def decode_e2m1(codes: np.ndarray) -> np.ndarray:
    codes = np.asarray(codes).astype(np.int64)
    return np.where(codes & 8, -E2M1[codes & 7], E2M1[codes & 7])


def unpack_nibbles(packed: np.ndarray) -> np.ndarray:
    """uint8 [N, K/2] -> codes [N, K]: element 2j is the low nibble of byte j."""
    packed = np.asarray(packed, dtype=np.uint8)
    return np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(packed.shape[0], -1)


def decode_e8m0(s: np.ndarray) -> np.ndarray:
    s = np.asarray(s).astype(np.float64)
    return np.where(s == 255, np.nan, np.exp2(s - 127.0))


def decode_e4m3fn(codes: np.ndarray) -> np.ndarray:
    """OCP e4m3fn: bias 7, subnormals m * 2^-9, S.1111.111 NaN, no infinities."""
    c = np.asarray(codes).astype(np.int64)
    exponent, mantissa = (c >> 3) & 0xF, c & 7
    magnitude = np.where(exponent == 0, mantissa * 2.0 ** -9, (1.0 + mantissa / 8.0) * np.exp2(exponent - 7.0))
    magnitude = np.where((c & 0x7F) == 0x7F, np.nan, magnitude)
    return np.where(c & 0x80, -magnitude, magnitude)


def decode_bf16(bits: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # signalling NaN patterns widen to quiet NaNs
        return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def quantize_e4m3fn(x32: np.ndarray) -> np.ndarray:
    """float32 -> e4m3fn value (float64): round half to even, saturate at +-448, NaN stays NaN (ml_dtypes rounds)."""
    return np.clip(x32, -448.0, 448.0).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)


def nvfp4_weight(codes_packed, scale_codes, scale_2: float, dtype=np.float64) -> np.ndarray:
    """Quark's order: the block scale times the global scale rounded to float32 first, then times e2m1."""
    block = decode_e4m3fn(scale_codes).astype(np.float32) * np.float32(scale_2)
    return decode_e2m1(unpack_nibbles(codes_packed)).astype(dtype) * np.repeat(block, 16, axis=1).astype(dtype)


# ---------------- cases ----------------

@dataclass(frozen=True)
class Case:
    op: str
    io: str  # "f32" | "f16": A and Y
    M: int
    N: int
    K: int
    per_channel: bool = True  # B_scale [N] (else a scalar): fp8*, int8
    special: bool = True      # NaN / Inf codes and saturating activations

    @property
    def name(self) -> str:
        scale = "" if self.op not in ("fp8_w8a8", "fp8_w8a8_dyn", "fp8", "int8") else \
            ("-perchannel" if self.per_channel else "-pertensor")
        return f"{self.op}-{self.io}-M{self.M}-N{self.N}-K{self.K}{scale}"


# (M, N, K) per op: M = 1, a few (3, 8) and many (65: tiled path, M tail); N tails (33, 67 = 64 + 3, 131); K tails
# of the warp step (8 lanes x warp size: 256 / 512) and of the 32-wide tile; K % 8 != 0 takes the tiled path at M <= 8.
SHAPES = {
    "mxfp4": [(1, 33, 96), (3, 67, 544), (8, 131, 288), (65, 67, 96), (2, 1, 32)],
    "nvfp4": [(1, 33, 48), (3, 67, 528), (8, 131, 272), (65, 67, 80), (2, 1, 16)],
    "fp8_w8a8": [(1, 33, 264), (3, 67, 520), (8, 131, 100), (65, 67, 40), (2, 1, 8)],
    "fp8_w8a8_dyn": [(1, 33, 264), (3, 67, 520), (8, 131, 100), (65, 67, 40), (2, 1, 8)],
    "fp8": [(1, 33, 264), (3, 67, 520), (8, 131, 100), (65, 67, 40), (2, 1, 8)],
    "int8": [(1, 33, 264), (3, 67, 520), (8, 131, 100), (65, 67, 40), (2, 1, 8)],
    "bf16": [(1, 33, 264), (3, 67, 520), (8, 131, 100), (65, 67, 40), (2, 1, 8)],
}


def cases(ops=OPS) -> list[Case]:
    out = []
    for op in ops:
        for io in IO_DTYPES:
            for i, (m, n, k) in enumerate(SHAPES[op]):
                out.append(Case(op, io, m, n, k, per_channel=(i % 2 == 0)))
    return out


@dataclass
class Inputs:
    arrays: dict            # host arrays by input name (A, B, B_scale, A_scale)
    scalars: dict           # host scalars passed by value (B_scale_2)
    expected: np.ndarray    # float64 [M, N]
    bound: np.ndarray       # |A| @ |W|^T, float64 [M, N]
    weight_bytes: int       # bytes of B and its scales: what one call streams
    notes: list = field(default_factory=list)


def _weight_scale(rng, case: Case) -> np.ndarray:
    if case.per_channel and case.N > 1:
        return (rng.random(case.N) * 0.01 + 0.0005).astype(np.float32)
    return np.array([0.004], dtype=np.float32)


def make_inputs(case: Case, seed: int | None = None) -> Inputs:
    """Random inputs of one case with its NaN/Inf codes, and the float64 answer."""
    m, n, k = case.M, case.N, case.K
    rng = np.random.default_rng(seed if seed is not None else zlib.crc32(case.name.encode()))
    io = IO_DTYPES[case.io]
    a = rng.standard_normal((m, k)).astype(np.float32)
    arrays, scalars = {}, {}
    if case.op in ("mxfp4", "nvfp4"):
        b = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
        if case.op == "mxfp4":
            s = rng.integers(118, 131, (n, k // 32), dtype=np.uint8)
            if case.special:
                s[n - 1, 0] = 255  # NaN block: column N-1 is NaN
                s[0, -1] = 0       # 2^-127, a float32 subnormal
            w = decode_e2m1(unpack_nibbles(b)) * np.repeat(decode_e8m0(s), 32, axis=1)
        else:
            s = rng.integers(0, 0x7F, (n, k // 16), dtype=np.uint8)  # positive e4m3 codes, subnormals included
            scale_2 = float(np.float32(rng.random() * 1e-2 + 1e-4))
            if case.special:
                s[n - 1, 0] = 0x7F  # NaN block scale
            scalars["B_scale_2"] = scale_2
            w = nvfp4_weight(b, s, scale_2)
        arrays.update(B=b, B_scale=s)
    elif case.op == "bf16":
        b = (rng.standard_normal((n, k)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        if case.special:
            b[0, k // 2] = 0x7FC1            # NaN
            b[n // 2, 1] = 0x7F80            # +inf
            b[n - 1, k - 1] = 0xFF80 if n > 1 else b[n - 1, k - 1]  # -inf (on a column of its own when N > 1)
            b[n // 3, 2] = 0x0001            # subnormal
        arrays["B"] = b
        w = decode_bf16(b)
    else:  # fp8 codes or int8 with a per-tensor / per-channel scale
        if case.op == "int8":
            codes = rng.integers(-128, 128, (n, k), dtype=np.int8)
            codes[0, 0], codes[n - 1, k - 1] = -128, 127
            values = codes.astype(np.float64)
        else:
            codes = rng.integers(0, 256, (n, k), dtype=np.uint8)
            codes[(codes & 0x7F) == 0x7F] = 0x7E   # no NaN except where placed
            if case.special:
                codes[0, k - 1] = 0x7F               # NaN codes: columns 0 and N-1
                codes[n - 1, 0] = 0xFF
            values = decode_e4m3fn(codes)
        b_scale = _weight_scale(rng, case)
        arrays.update(B=codes, B_scale=b_scale)
        w = values * (b_scale.astype(np.float64)[:, None] if b_scale.size == n and n > 1 else float(b_scale[0]))
    # Activations (fp8 W8A8: quantized to e4m3fn on load, with saturation at |a / scale| >= 448).
    if case.op == "fp8_w8a8":
        a_scale = np.array([0.37], dtype=np.float32)
        a = a * 50
        if case.special:
            a[0, 0] = np.inf  # saturates to 448 * scale
        a_io = a.astype(io)
        arrays.update(A=a_io, A_scale=a_scale)
        with np.errstate(divide="ignore", invalid="ignore"):
            a_used = quantize_e4m3fn(a_io.astype(np.float32) / a_scale[0]) * float(a_scale[0])
    elif case.op == "fp8_w8a8_dyn":
        a = a * 50
        if case.special and m > 1:
            a[m - 1, 0] = np.inf  # row scale inf: inf / inf = NaN, the whole row is NaN
        a_io = a.astype(io)
        arrays["A"] = a_io
        a32 = a_io.astype(np.float32)
        row_scale = np.maximum(np.max(np.abs(a32), axis=1) / np.float32(448.0), np.float32(1e-12))
        with np.errstate(divide="ignore", invalid="ignore"):
            a_used = quantize_e4m3fn(a32 / row_scale[:, None]) * row_scale[:, None].astype(np.float64)
    else:
        a_io = a.astype(io)
        arrays["A"] = a_io
        a_used = a_io.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        expected = a_used @ w.T
        bound = np.abs(np.nan_to_num(a_used, posinf=0, neginf=0)) @ np.abs(np.nan_to_num(w, posinf=0, neginf=0)).T
    weight_bytes = sum(arrays[key].nbytes for key in ("B", "B_scale") if key in arrays)
    return Inputs(arrays, scalars, expected, bound, weight_bytes)


ONE_HOT_COLUMNS = (0, 1, 15, 16, 17, 31, -2, -1, 33)


def one_hot_case(op: str, io: str, rows: int = 8, n: int = 67, k: int = 64, seed: int = 5):
    """A case whose answer is exact: A's rows are one-hot (value 1; W8A8: the value that quantizes to 1 or 448), so
    Y[m, n] is one decoded weight times the epilogue scale, with no sum to round. rows <= 8 takes the gemv path,
    9 the tiled one. Returns (case, inputs, expected float32 computed in the op's order, Quark's for NVFP4). Pins
    nibble order, block-scale indexing, per-channel indexing and the NVFP4 multiplication order bit for bit."""
    case = Case(op, io, rows, n, k, per_channel=True, special=False)
    inputs = make_inputs(case, seed)
    picks = [c % k for c in ONE_HOT_COLUMNS[:rows]]
    a = np.zeros((rows, k), dtype=np.float32)
    a[np.arange(rows), picks] = 1.0
    arrays = inputs.arrays
    f32 = np.float32
    if op in ("mxfp4", "nvfp4"):
        codes = unpack_nibbles(arrays["B"])[:, picks].T                       # [8, N]
        e2m1 = decode_e2m1(codes).astype(f32)
        if op == "mxfp4":
            block = decode_e8m0(arrays["B_scale"][:, [p // 32 for p in picks]].T).astype(f32)
            expected = e2m1 * block
        else:
            s = decode_e4m3fn(arrays["B_scale"][:, [p // 16 for p in picks]].T).astype(f32)
            expected = e2m1 * (s * f32(inputs.scalars["B_scale_2"]))
    elif op == "bf16":
        expected = decode_bf16(arrays["B"][:, picks].T).astype(f32)
    else:
        codes = arrays["B"][:, picks].T
        values = (codes.astype(f32) if op == "int8" else decode_e4m3fn(codes).astype(f32))
        b_scale = arrays["B_scale"].astype(f32)
        if op == "fp8_w8a8":
            a *= arrays["A_scale"][0]                          # a / A_scale == 1 exactly: a_q = 1
            expected = values * (arrays["A_scale"][0] * b_scale)
        elif op == "fp8_w8a8_dyn":
            a *= 448.0                                         # row scale 448 / 448 = 1: a_q = 448, 448 * w exact
            expected = (values * f32(448.0)) * (f32(1.0) * b_scale)
        else:
            expected = values * b_scale
    arrays["A"] = a.astype(IO_DTYPES[io])
    return case, inputs, expected.astype(f32)


# ---------------- running one case ----------------

_P, _I64, _F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
# argtypes of every kernel entry point (qo_kernels.h), by name: A, weights..., Y, M, N, K, stream.
SIGNATURES = {
    "qo_gpu_matmul_mxfp4": [_P, _P, _P, _P, _I64, _I64, _I64, _P],
    "qo_gpu_matmul_fp8_w8a8": [_P, _P, _P, _I64, _P, _P, _I64, _I64, _I64, _P],
    "qo_gpu_matmul_fp8_w8a8_dyn": [_P, _P, _P, _I64, _P, _P, _I64, _I64, _I64, _P],
    "qo_gpu_matmul_fp8": [_P, _P, _P, _I64, _P, _I64, _I64, _I64, _P],
    "qo_gpu_matmul_int8": [_P, _P, _P, _I64, _P, _I64, _I64, _I64, _P],
    "qo_gpu_matmul_nvfp4": [_P, _P, _P, _F32, _P, _I64, _I64, _I64, _P],
    "qo_gpu_matmul_bf16": [_P, _P, _P, _I64, _I64, _I64, _P],
}


def declare_kernels(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Sets argtypes/restype of every qo_gpu_* kernel entry point of a loaded library."""
    for name, argtypes in SIGNATURES.items():
        for suffix in ("_f32", "_f16"):
            fn = getattr(lib, name + suffix)
            fn.argtypes, fn.restype = argtypes, ctypes.c_int
    lib.qo_gpu_backend.restype = ctypes.c_char_p
    return lib


class HostMemory:
    """HIP-CPU: device pointers are host pointers; keeps the arrays alive until free_all()."""

    def __init__(self, synchronize):
        self._arrays: dict[int, np.ndarray] = {}
        self._synchronize = synchronize

    def upload(self, array: np.ndarray) -> int:
        copy = np.array(array, copy=True, order="C")
        if copy.nbytes == 0:
            copy = np.zeros(1, dtype=np.uint8)
        self._arrays[copy.ctypes.data] = copy
        return copy.ctypes.data

    def empty(self, nbytes: int) -> int:
        return self.upload(np.full(max(nbytes, 1), 0xFF, dtype=np.uint8))  # NaN-poisoned: unwritten outputs show

    def synchronize(self) -> None:
        if self._synchronize() != 0:
            raise RuntimeError("hipDeviceSynchronize failed")

    def download(self, pointer: int, like: np.ndarray) -> np.ndarray:
        self.synchronize()
        return self._arrays[pointer][:like.nbytes].view(like.dtype).reshape(like.shape).copy()

    def free_all(self) -> None:
        self._arrays.clear()


def prepare(lib, memory, case: Case, inputs: Inputs):
    """(launch, y pointer, y template): launch() enqueues the kernel and returns its status."""
    arrays = inputs.arrays
    fn = getattr(lib, ENTRY_POINT[case.op] + "_" + case.io)
    d = {name: memory.upload(array) for name, array in arrays.items()}
    y_like = np.empty((case.M, case.N), dtype=IO_DTYPES[case.io])
    y = memory.empty(y_like.nbytes)
    m, n, k = case.M, case.N, case.K
    if case.op == "mxfp4":
        args = (d["A"], d["B"], d["B_scale"], y, m, n, k, None)
    elif case.op == "nvfp4":
        args = (d["A"], d["B"], d["B_scale"], ctypes.c_float(inputs.scalars["B_scale_2"]), y, m, n, k, None)
    elif case.op == "bf16":
        args = (d["A"], d["B"], y, m, n, k, None)
    elif case.op == "fp8_w8a8":
        args = (d["A"], d["B"], d["B_scale"], arrays["B_scale"].size, d["A_scale"], y, m, n, k, None)
    elif case.op == "fp8_w8a8_dyn":
        workspace = memory.empty(4 * max(m, 1))
        args = (d["A"], d["B"], d["B_scale"], arrays["B_scale"].size, workspace, y, m, n, k, None)
    else:  # fp8, int8 weight-only
        args = (d["A"], d["B"], d["B_scale"], arrays["B_scale"].size, y, m, n, k, None)
    return (lambda: fn(*args)), y, y_like


def compare(y: np.ndarray, inputs: Inputs) -> dict:
    """NaN and Inf where the answer has them, elsewhere |Y - ref| within the bound. Returns the figures."""
    expected, bound = inputs.expected, inputs.bound
    y64 = y.astype(np.float64)
    f16 = y.dtype == np.float16
    if f16:  # the answer as fp16 would hold it
        with np.errstate(over="ignore", invalid="ignore"):
            expected = np.where(np.abs(expected) >= F16_OVERFLOW, np.sign(expected) * np.inf, expected)
    nan_match = bool(np.array_equal(np.isnan(y64), np.isnan(expected)))
    inf_expected = np.isinf(expected)
    inf_match = bool(np.array_equal(np.isinf(y64), inf_expected)) and bool(
        np.all(y64[inf_expected] == expected[inf_expected]))
    finite = np.isfinite(expected) & np.isfinite(y64)
    error = np.abs(y64[finite] - expected[finite])
    tolerance = SUM_RTOL * bound[finite] + (F16_ROUNDING * np.abs(expected[finite]) + F16_SUBNORMAL_HALF if f16 else 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        relative = np.where(bound[finite] > 0, error / bound[finite], np.where(error > 0, np.inf, 0.0))
        ratio = np.where(tolerance > 0, error / tolerance, np.where(error > 0, np.inf, 0.0))
    worst = float(ratio.max()) if ratio.size else 0.0
    return {"pass": nan_match and inf_match and worst <= 1.0, "nan_match": nan_match, "inf_match": inf_match,
            "worst_error_over_tolerance": worst,
            "max_error_over_sum_abs": float(relative.max()) if relative.size else 0.0,
            "max_abs_error": float(error.max()) if error.size else 0.0}


def run_case(lib, memory, case: Case, inputs: Inputs | None = None) -> dict:
    inputs = inputs or make_inputs(case)
    try:
        launch, y_pointer, y_like = prepare(lib, memory, case, inputs)
        status = launch()
        if status != 0:
            return {"case": case.name, "pass": False, "error": f"launcher returned status {status}"}
        y = memory.download(y_pointer, y_like)
        return {"case": case.name, **compare(y, inputs)}
    finally:
        memory.free_all()
