"""CPU kernels of every compact weight format (custom_ops/src/qo_cpu_kernels.c) against an independent numpy float64
decoding of each format written here (not custom_ops/reference.py), and their one fixed summation order: the AVX-512
path, the AVX2 path, the portable C path (QO_CPU_KERNELS=avx512 / avx2 / portable; a path the CPU lacks runs the
next narrower one), builds with no SIMD at all and with -march=native, 1 and 2 threads, and every row count M give
the same bits (qo_kernels.h)."""
from __future__ import annotations

import ctypes
import ctypes.util
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from custom_ops import native

SRC = Path(native.SOURCE_DIR)
# float32 sums of K products against float64, relative to sum |a||w| (measured in this file's shapes: <= 1.3e-7)
REL_FP32 = 3e-7
REL_FP16 = 4e-4  # plus the fp16 rounding of Y


# ---------------- independent decoders (float64) ----------------
def e4m3fn_values(codes: np.ndarray) -> np.ndarray:
    c = np.asarray(codes, np.uint8).astype(np.int64)
    sign = np.where(c & 0x80, -1.0, 1.0)
    e, m = (c >> 3) & 0xF, c & 0x7
    mag = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e - 7.0))
    return np.where((c & 0x7F) == 0x7F, np.nan, sign * mag)


E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6])


def e2m1_unpack(packed: np.ndarray) -> np.ndarray:
    p = np.asarray(packed, np.uint8)
    codes = np.empty(p.shape[:-1] + (p.shape[-1] * 2,), np.uint8)
    codes[..., 0::2], codes[..., 1::2] = p & 0xF, p >> 4
    return E2M1[codes]


def mxfp4_weight(packed, scales):
    s = np.asarray(scales, np.float64)
    return e2m1_unpack(packed) * np.repeat(np.where(s == 255, np.nan, 2.0 ** (s - 127)), 32, axis=1)


def nvfp4_weight(packed, scales, scale_2):
    # Quark's order: block scale rounded once to float32, then e2m1 * block scale rounded to float32
    block = (e4m3fn_values(scales).astype(np.float32) * np.float32(scale_2)).astype(np.float32)
    return (e2m1_unpack(packed).astype(np.float32) * np.repeat(block, 16, axis=1)).astype(np.float64)


def bf16_weight(bits):
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


# ---------------- random inputs per format: (kernel call, float64 weight, post scale [N]) ----------------
def make_case(fmt: str, rng, n: int, k: int):
    if fmt == "fp8":
        codes = rng.integers(0, 256, (n, k), dtype=np.uint8)
        codes[(codes & 0x7F) == 0x7F] = 0x42  # NaN codes tested separately
        scale = rng.uniform(0.5, 2, n).astype(np.float32)
        return (lambda a: native.matmul_fp8(a, codes, scale)), e4m3fn_values(codes) * scale[:, None].astype(np.float64)
    if fmt == "fp8_normal":  # only normal codes (magnitude 8..0x7E): the decode's integer route throughout
        codes = (rng.integers(8, 0x7F, (n, k), dtype=np.uint8) | (rng.integers(0, 2, (n, k)) << 7)).astype(np.uint8)
        scale = rng.uniform(0.5, 2, n).astype(np.float32)
        return (lambda a: native.matmul_fp8(a, codes, scale)), e4m3fn_values(codes) * scale[:, None].astype(np.float64)
    if fmt == "int8":
        q = rng.integers(-128, 128, (n, k), dtype=np.int8)
        scale = np.float32(0.01)
        return (lambda a: native.matmul_int8(a, q, scale)), q.astype(np.float64) * np.float64(scale)
    if fmt == "bf16":
        bits = (rng.standard_normal((n, k)) * 0.05).astype(ml_dtypes.bfloat16).view(np.uint16)
        return (lambda a: native.matmul_bf16(a, bits)), bf16_weight(bits)
    if fmt == "mxfp4":
        packed = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
        scales = rng.integers(118, 136, (n, k // 32), dtype=np.uint8)
        return (lambda a: native.matmul_mxfp4(a, packed, scales)), mxfp4_weight(packed, scales)
    if fmt == "nvfp4":
        packed = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
        scales = rng.integers(0x08, 0x7E, (n, k // 16), dtype=np.uint8)  # positive e4m3, no NaN
        s2 = np.float32(0.0123)
        return (lambda a: native.matmul_nvfp4(a, packed, scales, s2)), nvfp4_weight(packed, scales, s2)
    raise ValueError(fmt)


FORMATS = ["fp8", "fp8_normal", "int8", "bf16", "mxfp4", "nvfp4"]
# (N, K): K not a multiple of 8 / 32 where the format allows, N not a multiple of the 4 / 3 / 48-row tiles
SHAPES = {"fp8": [(37, 203), (130, 1000)], "fp8_normal": [(37, 203), (130, 1000)], "int8": [(37, 203), (130, 1000)], "bf16": [(37, 203), (130, 1000)],
          "mxfp4": [(37, 224), (130, 1024)], "nvfp4": [(37, 208), (130, 1040)]}


def rel_error(y, a, w):
    a64 = a.astype(np.float64).reshape(-1, a.shape[-1])
    bound = np.abs(a64) @ np.abs(w).T + 1e-30
    return float(np.max(np.abs(y.reshape(bound.shape).astype(np.float64) - a64 @ w.T) / bound))


PATHS = ("avx512", "avx512-novbmi", "avx2", "portable")


@pytest.fixture
def path(monkeypatch):
    """path(name) forces a SIMD path (QO_CPU_KERNELS, read at every call); path(None) restores the default."""
    def set_path(name):
        if name:
            monkeypatch.setenv("QO_CPU_KERNELS", name)
        else:
            monkeypatch.delenv("QO_CPU_KERNELS", raising=False)
    return set_path


def omp_threads(n: int) -> None:
    native.load_library()
    gomp = ctypes.CDLL(ctypes.util.find_library("gomp") or "libgomp.so.1")
    gomp.omp_set_num_threads(n)


@pytest.mark.parametrize("fmt", FORMATS)
def test_matches_float64_decoding_and_one_order(fmt, path):
    rng = np.random.default_rng(hash(fmt) % 2**32)
    for n, k in SHAPES[fmt]:
        call, w = make_case(fmt, rng, n, k)
        a = (rng.standard_normal((128, k)) * np.logspace(-2, 2, k)).astype(np.float32)
        omp_threads(2)
        path("avx2")
        y = call(a)
        assert y.dtype == np.float32 and y.shape == (128, n)
        rel = rel_error(y, a, w)
        assert rel <= REL_FP32, f"{fmt} N={n} K={k}: rel {rel:.3g}"
        for p in PATHS:
            path(p)
            # GEMV (M <= 4: weight-row pairs on AVX-512, an odd N's last row alone) and panel tiles (8 x 6 on
            # AVX-512: M = 11 leaves an odd 4-row micro-panel, N = 37 an odd 3-row group): the rows' bits do not change
            for m in (1, 2, 3, 4, 5, 7, 11):
                assert np.array_equal(call(a[:m]), y[:m]), f"{fmt} {p} M={m}"
            assert np.array_equal(call(a[61:64]), y[61:64]), f"{fmt} {p}"
            for threads in (2, 1):
                omp_threads(threads)
                assert np.array_equal(call(a), y), f"{fmt} {p}: {threads} thread(s), M=128"
        path(None)
        assert np.array_equal(call(a[:3]), y[:3]), f"{fmt}: default path"
        omp_threads(2)


@pytest.mark.parametrize("fmt", FORMATS)
def test_fp16_activations(fmt):
    rng = np.random.default_rng(7)
    n, k = SHAPES[fmt][0]
    call, w = make_case(fmt, rng, n, k)
    a = rng.standard_normal((3, k)).astype(np.float16)
    y = call(a)
    assert y.dtype == np.float16
    assert rel_error(y, a, w) <= REL_FP16
    assert np.array_equal(y, call(a.astype(np.float32)).astype(np.float16))  # widen exactly, round Y once


def test_nan_and_special_codes(path):
    rng = np.random.default_rng(3)
    n, k = 9, 72
    a = rng.standard_normal((3, k)).astype(np.float32)
    # FP8: NaN codes 0x7F / 0xFF poison their row; subnormals, -0 and +-448 decode exactly
    codes = rng.integers(0, 256, (n, k), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0
    codes[0, :16] = np.arange(16, dtype=np.uint8) | 0x80 * (np.arange(16) % 2).astype(np.uint8)  # subnormals, -0
    codes[1, 5], codes[2, 70], codes[3, 0] = 0x7F, 0xFF, 0x7E
    y = native.matmul_fp8(a, codes, np.float32(1))
    assert np.isnan(y[:, 1]).all() and np.isnan(y[:, 2]).all() and not np.isnan(np.delete(y, [1, 2], 1)).any()
    a6 = np.concatenate([a, a])  # M = 6: the decoded-panel path
    for p in PATHS:
        path(p)
        assert np.array_equal(native.matmul_fp8(a, codes, np.float32(1)), y, equal_nan=True), p
        assert np.array_equal(native.matmul_fp8(a6, codes, np.float32(1))[:3], y, equal_nan=True), p
    path(None)
    # the same NaN bits (+qNaN) on every path, the NaN codes inside the GEMV's 32-element steps (the AVX512_VBMI
    # byte-table decode ORs the sign into byte 3 and must not make 0xFF a -qNaN), a step with a subnormal among
    # normal codes (the AVX-512 integer route's fallback) and one with only normal codes
    c2 = rng.integers(8, 0x7F, (4, 96), dtype=np.uint8) | (rng.integers(0, 2, (4, 96)) << 7).astype(np.uint8)
    c2[1, 40], c2[2, 3], c2[3, 70] = 0xFF, 0x7F, 0x81
    a1 = rng.standard_normal((1, 96)).astype(np.float32)
    bits = native.matmul_fp8(a1, c2, np.float32(1)).view(np.uint32)
    assert bits[0, 1] == bits[0, 2] == 0x7FC00000
    for p in PATHS:
        path(p)
        assert np.array_equal(native.matmul_fp8(a1, c2, np.float32(1)).view(np.uint32), bits), p
    path(None)
    w2 = e4m3fn_values(c2)
    assert rel_error(native.matmul_fp8(a1, c2, np.float32(1))[:, [0, 3]], a1, w2[[0, 3]]) <= REL_FP32
    # the AVX2 GEMV runs normal steps in a loop of their own and leaves it for a step with a special code: 4 rows of
    # 6 steps, specials in steps 2 and 3 only (a subnormal, a zero, a -0), so the loop breaks, decodes two steps the
    # other way and resumes; M = 1 and 3
    c3 = rng.integers(8, 0x7F, (4, 192), dtype=np.uint8) | (rng.integers(0, 2, (4, 192)) << 7).astype(np.uint8)
    c3[2, 70], c3[0, 100], c3[3, 127] = 0x83, 0x00, 0x80
    a3 = rng.standard_normal((3, 192)).astype(np.float32)
    ref3 = [native.matmul_fp8(a3[:m], c3, np.float32(1)).view(np.uint32) for m in (1, 3)]
    for p in PATHS:
        path(p)
        for m, want in zip((1, 3), ref3):
            assert np.array_equal(native.matmul_fp8(a3[:m], c3, np.float32(1)).view(np.uint32), want), (p, m)
    path(None)
    assert rel_error(native.matmul_fp8(a3, c3, np.float32(1)), a3, e4m3fn_values(c3)) <= REL_FP32
    w = e4m3fn_values(codes)
    ok = [i for i in range(n) if i not in (1, 2)]
    assert rel_error(y[:, ok], a, w[ok]) <= REL_FP32
    # MXFP4: a NaN e8m0 block (255) poisons its row; every e2m1 code in both nibbles
    packed = np.tile(np.arange(256, dtype=np.uint8), (n, 1))[:, : k // 2 * 2][:, :64]
    a64 = rng.standard_normal((2, 128)).astype(np.float32)
    scales = np.full((n, 4), 127, np.uint8)
    scales[4, 2] = 255
    scales[5, :] = 0  # 2^-127: the smallest scale, a float32 subnormal
    y = native.matmul_mxfp4(a64, packed, scales)
    assert np.isnan(y[:, 4]).all() and not np.isnan(np.delete(y, 4, 1)).any()
    w = mxfp4_weight(packed, scales)
    keep = [i for i in range(n) if i not in (4, 5)]
    assert rel_error(y[:, keep], a64, w[keep]) <= REL_FP32
    assert np.allclose(y[:, 5], (a64.astype(np.float64) @ w[5]), rtol=1e-6, atol=0)
    # NVFP4: a NaN block scale poisons its row
    packed = rng.integers(0, 256, (n, 64), dtype=np.uint8)
    scales = rng.integers(0x08, 0x7E, (n, 8), dtype=np.uint8)
    scales[6, 1] = 0x7F
    y = native.matmul_nvfp4(a64, packed, scales, np.float32(0.5))
    assert np.isnan(y[:, 6]).all() and not np.isnan(np.delete(y, 6, 1)).any()


def test_fp8_gemv_activations_out_of_the_fp16_routes_range(path):
    """The AVX2 FP8 GEMV accumulates 2^-8 times the products (the fp16 route) only while every nonzero |a| lies in
    [2^-100, 2^120 / (448 K)]; outside it the integer route runs. Activations near 2^-124 make the scaled sums float32
    subnormals (bits lost against the unscaled sums), and huge ones overflow differently: each case gives the
    portable path's bits at M = 1..4, and so do a NaN and an infinity. Without the range test (fp8_half_range
    returning 1) both the tiny and the huge case fail."""
    rng = np.random.default_rng(23)
    n, k = 11, 200
    codes = (rng.integers(8, 0x7F, (n, k), dtype=np.uint8) | (rng.integers(0, 2, (n, k)) << 7)).astype(np.uint8)
    scale = rng.uniform(0.5, 2, n).astype(np.float32)
    base = rng.standard_normal((4, k)).astype(np.float32)
    # 2^-124: unguarded, 14 of the 44 outputs differed from the portable path's (2^-121: 1, 2^-112 and above: 0)
    cases = {"tiny": base * np.float32(2.0**-124), "huge": base * np.float32(2.0**118)}
    nan = base.copy()
    nan[1, 7], nan[2, 9] = np.nan, np.inf
    cases["nan_inf"] = nan
    for name, a in cases.items():
        a = a.astype(np.float32)
        path("portable")
        want = [native.matmul_fp8(a[:m], codes, scale).view(np.uint32) for m in (1, 2, 3, 4)]
        path("avx2")
        for m, w in zip((1, 2, 3, 4), want):
            assert np.array_equal(native.matmul_fp8(a[:m], codes, scale).view(np.uint32), w), (name, m)
    path(None)


def test_w8a8_quantizes_like_quark_fp8():
    """MatMulFp8W8A8: a_q = e4m3(A / s) (Quark's FP8 fake quantizer divides; see qo_kernels.h), not A * (1/s)."""
    rng = np.random.default_rng(5)
    n, k, s = 16, 512, np.float32(0.0371)
    # activations next to the e4m3 rounding midpoints, where x / s and x * fp32(1/s) can round to different codes
    grid = np.unique(np.abs(e4m3fn_values(np.arange(0x08, 0x7F, dtype=np.uint8))))
    mids = ((grid[1:] + grid[:-1]) / 2 * np.float64(s)).astype(np.float32)
    near = np.concatenate([mids + d * np.spacing(mids) for d in range(-3, 4)]).astype(np.float32)
    q = lambda x: np.clip(x, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    tell = near[q(near / s) != q(near * (np.float32(1) / s))]
    assert tell.size >= 4  # the two forms differ on these inputs, so the test can tell them apart
    a = rng.choice(np.concatenate([tell, -tell]), (2, k)).astype(np.float32)
    div, mul = q(a / s), q(a * (np.float32(1) / s))
    codes = rng.integers(0, 0x7E, (n, k), dtype=np.uint8)
    w = e4m3fn_values(codes)
    y = native.matmul_fp8_w8a8(a, codes, np.float32(1), s).astype(np.float64)
    ref_div = (div @ w.T) * np.float64(s)
    ref_mul = (mul @ w.T) * np.float64(s)
    bound = (np.abs(div) @ np.abs(w).T) * np.float64(s)
    assert np.max(np.abs(y - ref_div) / bound) <= REL_FP32
    assert np.max(np.abs(y - ref_mul) / bound) > 10 * REL_FP32


def _build_variant(tmp_path: Path, label: str, flags: list[str]) -> str:
    lib = tmp_path / f"libqo_{label}.so"
    subprocess.run(["cc", "-O3", "-fPIC", "-shared", "-fopenmp", "-std=c99", *flags, "-I", str(SRC),
                    str(SRC / "qo_cpu_kernels.c"), str(SRC / "qo_version.c"), "-lm", "-o", str(lib)], check=True)
    return str(lib)


def test_same_bits_from_builds_without_simd_and_native(tmp_path):
    """A build with no x86 SIMD dispatch at all (-DQO_PORTABLE_ONLY: baseline x86-64, fmaf in libm) and one with
    -march=native (fmaf inlined as vfmadd) give the bits of the shipped library's AVX2 path."""
    rng = np.random.default_rng(11)
    n, k = 53, 1000
    codes = rng.integers(0, 0x7E, (n, k), dtype=np.uint8)
    scale = rng.uniform(0.5, 2, n).astype(np.float32)
    a = (rng.standard_normal((6, k)) * np.logspace(-3, 3, k)).astype(np.float32)
    y = native.matmul_fp8(a, codes, scale)
    f32p, i64 = ctypes.c_void_p, ctypes.c_int64
    for label, flags in {"portable": ["-DQO_PORTABLE_ONLY"], "native": ["-DQO_PORTABLE_ONLY", "-march=native"]}.items():
        fn = ctypes.CDLL(_build_variant(tmp_path, label, flags)).qo_matmul_fp8_f32
        fn.argtypes = [f32p, f32p, f32p, i64, f32p, i64, i64, i64]
        out = np.empty_like(y)
        assert fn(a.ctypes.data, codes.ctypes.data, scale.ctypes.data, n, out.ctypes.data, 6, n, k) == 0
        assert np.array_equal(out, y), label


@pytest.mark.parametrize("fmt", ["fp8", "int8", "bf16"])
def test_tiny_shapes(fmt, path):
    """K below one 8-lane step, exactly one step, one 32-element chunk plus a tail; N = 1; M on both paths."""
    rng = np.random.default_rng(13)
    for n, k in [(1, 5), (5, 8), (4, 39), (2, 1), (3, 72)]:
        call, w = make_case(fmt, rng, n, k)
        a = rng.standard_normal((6, k)).astype(np.float32)
        path("portable")
        y = call(a)
        assert rel_error(y, a, w) <= REL_FP32, f"{fmt} N={n} K={k}"
        for p in PATHS:
            path(p)
            assert np.array_equal(call(a), y), f"{fmt} N={n} K={k}: {p}"
            assert np.array_equal(call(a[:1]), y[:1]) and np.array_equal(call(a[:3]), y[:3]), f"{fmt} {p}"
        path(None)


def test_fp4_value_tables_follow_the_weight(path):
    """The AVX512_VBMI FP4 GEMV keeps its 2 * e2m1 x half-block-scale tables per thread, rebuilt when the weight kind
    changes (MXFP4 / NVFP4, NVFP4's scale_2): GEMVs alternating formats and scale_2 values, each against the float64
    decoding and the portable path's bits; M = 1 and 3, 1 and 2 threads, N off the 8-row tile."""
    rng = np.random.default_rng(17)
    n, k = 19, 224
    packed = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    nv_scales = rng.integers(0x08, 0x7E, (n, k // 16), dtype=np.uint8)
    mx_scales = rng.integers(118, 136, (n, k // 32), dtype=np.uint8)
    a = (rng.standard_normal((3, k)) * np.logspace(-2, 2, k)).astype(np.float32)
    cases = [(lambda x, s2=s2: native.matmul_nvfp4(x, packed, nv_scales, s2), nvfp4_weight(packed, nv_scales, s2))
             for s2 in (np.float32(0.0123), np.float32(3.5), np.float32(-0.75))]
    cases.insert(1, ((lambda x: native.matmul_mxfp4(x, packed, mx_scales)), mxfp4_weight(packed, mx_scales)))
    path("portable")
    want = [call(a) for call, _ in cases]
    for (_, w), y in zip(cases, want):
        assert rel_error(y, a, w) <= REL_FP32
    for threads in (1, 2):
        omp_threads(threads)
        for p in ("avx512", "avx512-novbmi", "avx2"):
            path(p)
            for _ in range(2):  # every switch of weight kind, twice round
                for (call, _), y in zip(cases, want):
                    assert np.array_equal(call(a[:1]), y[:1]) and np.array_equal(call(a), y), f"{p} {threads}t"
    path(None)
    omp_threads(2)
