"""MatMulMxfp4 / MatMulExpertsMxfp4 when A is on the MXFP4 grid (custom_ops/src/qo_cpu_kernels.c, block-integer
path): against a float64 numpy reference decoding e2m1 / e8m0 independently (tests/test_cpu_kernel_formats.py's
decoders), and against a numpy float32 emulation of the documented summation order (16 lanes; lane 4 * (b % 4) + j
adds the exact quad sum P(b, j) * 2^(e_b + s_b - 128) in increasing b; the lanes folded as qo_cpu_kernels.c says).
Every SIMD path, 1 and 2 threads and every row count give the same bits; rows off the grid, and outputs whose
exponents leave the exact range, keep the float path."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from custom_ops import native
from test_cpu_kernel_formats import E2M1, PATHS, REL_FP32, mxfp4_weight, omp_threads, path, rel_error  # noqa: F401

E2M1_CODES = np.arange(16)


def grid_rows(rng, m: int, k: int, zero_blocks: bool = True) -> np.ndarray:
    """A [m, k] with every 32-block e2m1 * 2^e (e varying per block, as Quark's MXFP4 activations), some blocks 0."""
    codes = rng.integers(0, 16, (m, k))
    e = rng.integers(-12, 6, (m, k // 32, 1))
    a = (E2M1[codes].reshape(m, k // 32, 32) * 2.0 ** e).reshape(m, k)
    if zero_blocks:
        a[:, 32:64] = 0.0
    return a.astype(np.float32)


def order_emulation(a: np.ndarray, packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The block-integer path's float32 result, from the order in qo_cpu_kernels.c (numpy float32, each step one
    rounding: the products are exact in float32 by construction)."""
    m, k = a.shape
    n, nb = scales.shape[0], k // 32
    w2 = (E2M1[np.stack([packed & 15, packed >> 4], -1).reshape(n, k)] * 2).astype(np.int64)  # 2 * e2m1
    lanes = np.zeros((16, m, n), np.float32)
    for b in range(nb):
        blk = a[:, 32 * b:32 * b + 32].astype(np.float64)
        amax = np.abs(blk).max(1)
        e = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1))) - 6, 0)  # q in [64, 128) at the max
        q = np.rint(blk / 2.0 ** e[:, None]).astype(np.int64)
        assert np.array_equal(q * 2.0 ** e[:, None], blk) and np.abs(q).max() < 128
        for j in range(4):
            P = q[:, 8 * j:8 * j + 8] @ w2[:, 32 * b + 8 * j:32 * b + 8 * j + 8].T  # exact integers
            scale = 2.0 ** (e[:, None] + scales[None, :, b].astype(np.float64) - 128)
            L = 4 * (b % 4) + j
            lanes[L] = lanes[L] + (P * scale).astype(np.float32)  # float32 + float32: one rounding
    with np.errstate(invalid="ignore"):  # a NaN scale's column (the kernel takes the float path there)
        s = lanes[:8] + lanes[8:]
        return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]))


SHAPES = [(37, 224), (130, 1024), (19, 96), (53, 2880)]  # 7, 32, 3 and 90 blocks (chunks of 4 with tails)


@pytest.mark.parametrize("n,k", SHAPES)
def test_grid_rows_exact_order_every_path(n, k, path):
    rng = np.random.default_rng(n * 7 + k)
    packed = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    scales = rng.integers(112, 140, (n, k // 32), dtype=np.uint8)
    w = mxfp4_weight(packed, scales)
    a = grid_rows(rng, 128, k)
    off = [1, 6, 77]  # float rows mixed in: they keep the float path
    a[off] = (rng.standard_normal((3, k)) * np.logspace(-2, 2, k)).astype(np.float32)
    on = [i for i in range(128) if i not in off]
    omp_threads(2)
    path("portable")
    y = native.matmul_mxfp4(a, packed, scales)
    assert rel_error(y, a, w) <= REL_FP32
    assert np.array_equal(y[on], order_emulation(a[on], packed, scales)), "grid rows: not the documented order"
    for r in off:  # an off-grid row's bits do not depend on the other rows (the float path, as before)
        assert np.array_equal(native.matmul_mxfp4(a[r:r + 1], packed, scales), y[r:r + 1])
    for p in PATHS:
        path(p)
        for m in (1, 2, 3, 4, 5, 8, 13, 33):  # GEMV tiles, small-M tiles, the prefill panels (> 12 rows)
            assert np.array_equal(native.matmul_mxfp4(a[:m], packed, scales), y[:m]), f"{p} M={m}"
        assert np.array_equal(native.matmul_mxfp4(a[60:63], packed, scales), y[60:63]), p
        for threads in (2, 1):
            omp_threads(threads)
            assert np.array_equal(native.matmul_mxfp4(a, packed, scales), y), f"{p}: {threads} thread(s), M=128"
    path(None)
    omp_threads(2)


def test_graph_quantized_activations_take_the_integer_path(tmp_path):
    """A fake-quantized by the builder's MXFP4 activation subgraph (ops/mx_activation.py, Quark's even mode; run by
    ORT) is on the grid: every row follows the block-integer order."""
    from activation_probe import onnx_qdq

    rng = np.random.default_rng(4)
    n, k = 40, 512
    packed = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    scales = rng.integers(115, 130, (n, k // 32), dtype=np.uint8)
    x = (rng.standard_normal((6, k)) * np.logspace(-3, 1, k)).astype(np.float32)
    a = onnx_qdq(x, "mxfp4", tmp_path)
    y = native.matmul_mxfp4(a, packed, scales)
    assert np.array_equal(y, order_emulation(a, packed, scales))
    assert rel_error(y, a, mxfp4_weight(packed, scales)) <= REL_FP32


def test_exponent_edges_fall_back_to_the_float_path(path):
    """Outputs whose scales could leave float32's exact range (e8m0 0 / 254 against small / large blocks of A) or
    hit a NaN scale (255) take the float path: a float path result does not change when a block of A whose weights
    are all zero is replaced by non-grid values (that row then takes the float path), the integer one would."""
    rng = np.random.default_rng(9)
    n, k = 12, 128
    packed = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    packed[:, 48:64] = 0  # block 3: all-zero weights
    scales = rng.integers(120, 130, (n, k // 32), dtype=np.uint8)
    scales[1, 0], scales[2, 1], scales[3, 2] = 0, 238, 255
    packed[2, 16:32] = 0
    packed[2, 16] = 0x77  # weight row 2, block 1: two elements 6 * 2^111, the rest 0 (finite float sums)
    a = grid_rows(rng, 3, k, zero_blocks=False)
    a[1, :32] *= np.float32(2.0 ** -60)  # against scale code 0: below 2^-126
    a[2, 32:64] = (E2M1[rng.integers(0, 16, 32)] * 2.0 ** 10).astype(np.float32)
    a[2, 32] = 6 * 2.0 ** 10  # e_b - 1 = 5 against code 238: 2^115 * |P| could pass 2^127
    a_off = a.copy()
    a_off[:, 96:128] = rng.standard_normal((3, 32)).astype(np.float32)  # off the grid, against zero weights
    w = mxfp4_weight(packed, scales)
    # the documented rule: every block's biased exponent s_b + e_b - 1 in [1, 240] (bounded by the row's and the
    # weight row's ranges), no scale code 255
    amax = np.abs(a.astype(np.float64)).reshape(3, -1, 32).max(2)
    eb = np.floor(np.log2(amax)) - 7
    ok = ((scales.max(1)[None] <= 254) & (scales.min(1)[None] + eb.min(1)[:, None] >= 1)
          & (scales.max(1)[None] + eb.max(1)[:, None] <= 240))
    fallback = ~ok
    assert fallback[1, 1] and fallback[2, 2] and ok.sum() >= 20  # both edges and many integer outputs
    for p in PATHS:
        path(p)
        y, y_off = native.matmul_mxfp4(a, packed, scales), native.matmul_mxfp4(a_off, packed, scales)
        assert np.isnan(y[:, 3]).all() and not np.isnan(np.delete(y, 3, 1)).any(), p
        integer = order_emulation(a, packed, scales)
        for i in range(3):
            for j in range(n):
                if j == 3:
                    continue
                if fallback[i, j]:
                    assert y[i, j] == y_off[i, j], (p, i, j)
                else:
                    assert y[i, j] == integer[i, j], (p, i, j)
        ok = [j for j in range(n) if j != 3]
        assert rel_error(y[:, ok], a, w[ok]) <= REL_FP32
    path(None)


def test_experts_equal_the_dense_op(path):
    """MatMulExpertsMxfp4 (qo_matmul_experts_mxfp4_f32: A prepared once per expert) gives each slot the dense
    MatMulMxfp4's bits on its expert, grid and float rows mixed, decode (T = 1) and prefill (T = 40)."""
    lib = native.load_library()
    fn = lib.qo_matmul_experts_mxfp4_f32
    p_, i64 = ctypes.c_void_p, ctypes.c_int64
    fn.argtypes = [p_, p_, p_, p_, p_, i64, i64, i64, i64, i64, i64]
    rng = np.random.default_rng(12)
    E, n, k, top = 4, 37, 320, 2
    packed = rng.integers(0, 256, (E, n, k // 2), dtype=np.uint8)
    scales = rng.integers(115, 130, (E, n, k // 32), dtype=np.uint8)
    for T in (1, 40):
        a = grid_rows(rng, T, k)
        if T > 1:
            a[3] = rng.standard_normal(k).astype(np.float32)
        ids = np.stack([rng.permutation(E)[:top] for _ in range(T)]).astype(np.int64)
        for p in PATHS:
            path(p)
            y = np.empty((T, top, n), np.float32)
            assert fn(a.ctypes.data, ids.ctypes.data, packed.ctypes.data, scales.ctypes.data, y.ctypes.data,
                      T, top, 1, E, n, k) == 0
            for e in range(E):
                t, s = np.nonzero(ids == e)
                if t.size:
                    assert np.array_equal(y[t, s], native.matmul_mxfp4(a[t], packed[e], scales[e])), (p, T, e)
        path(None)


def test_nan_in_a_block_of_zeros_poisons_the_output(path):
    """A NaN in an A block whose other elements are 0 (before or after it) takes the row off the grid, so every
    output of the row is NaN, as the float path and Quark's fp32 MatMul give (the NaN was once dropped as a zero
    block when zeros followed it)."""
    rng = np.random.default_rng(21)
    n, k = 9, 128
    packed = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    scales = rng.integers(120, 130, (n, k // 32), dtype=np.uint8)
    a = grid_rows(rng, 3, k)  # block 1 all zero
    a[0, 32], a[1, 63], a[2, 40] = np.nan, np.nan, np.nan
    for p in PATHS:
        path(p)
        for m in (1, 3):
            y = native.matmul_mxfp4(a[:m], packed, scales)
            assert np.isnan(y).all(), (p, m)
        assert not np.isnan(native.matmul_mxfp4(grid_rows(rng, 1, k), packed, scales)).any(), p
    path(None)


def test_grid_check_edges_same_on_every_path(path):
    """The grid check of A (scalar on the portable / AVX2 paths, AVX-512 on its own) decides alike at its edges: block
    exponents e = +-100 (on the grid, the integer path: the order emulation's bits) and +-101 (off: the float path),
    a subnormal block max, -0.0 and subnormal elements in a block, an inf; M = 1 and 3."""
    rng = np.random.default_rng(23)
    n, k = 10, 128
    packed = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    scales = rng.integers(110, 131, (n, k // 32), dtype=np.uint8)
    rows = []
    for e in (-100, 100, -101, 101):
        q = rng.integers(-127, 128, (k // 32, 32)).astype(np.float64)
        q[:, 0] = 127  # the block max: 127 * 2^e, so e is the block's exponent - 6
        rows.append((q * 2.0 ** e).reshape(k))
    tiny = grid_rows(rng, 1, k)[0].astype(np.float64)
    tiny[32:64] = rng.integers(-3, 4, 32) * 2.0 ** -140  # a subnormal block max: off the grid
    rows.append(tiny)
    signed_zero = grid_rows(rng, 1, k)[0].astype(np.float64)
    signed_zero[64:96] = -0.0  # an all-zero block of -0.0: on the grid
    rows.append(signed_zero)
    inf = grid_rows(rng, 1, k)[0].astype(np.float64)
    inf[100] = np.inf
    rows.append(inf)
    a = np.array(rows).astype(np.float32)
    on = [0, 1, 5]
    path("portable")
    want = native.matmul_mxfp4(a, packed, scales)
    assert np.array_equal(want[on], order_emulation(a[on], packed, scales))
    assert rel_error(want[[2, 3]], a[[2, 3]], mxfp4_weight(packed, scales)) <= REL_FP32
    for i in (2, 3):  # off the grid: the float path's order, not the integer one's
        assert not np.array_equal(want[i], order_emulation(a[i:i + 1], packed, scales)[0]), i
    for p in PATHS:
        path(p)
        assert np.array_equal(native.matmul_mxfp4(a, packed, scales), want, equal_nan=True), p
        for i in range(len(rows)):
            assert np.array_equal(native.matmul_mxfp4(a[i:i + 1], packed, scales), want[i:i + 1], equal_nan=True), p
    path(None)
