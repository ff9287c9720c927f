"""MXFP4 / NVFP4 with the weight in 16-row tiles (custom_ops/src/qo_cpu_fp4_r16.c, custom_ops/fp4_r16.py; ops
com.quark_onnx MatMulMxfp4R16 / MatMulNvfp4R16).

References are independent of the kernel: the checkpoint-layout bytes decoded by numpy (e2m1 table, e8m0 powers of
two, e4m3fn through ml_dtypes), the product in float64. The kernel's contract is one fmaf chain per output in
increasing k, so its error against float64 is bounded by K * 2^-24 * sum_k |w_k a_k| (a sequential sum's bound); the
tests assert that bound. Every SIMD path, thread count and M gives the same bits (the portable path is the chain
written out in C)."""
from __future__ import annotations

import ctypes
import ctypes.util
import os

import ml_dtypes
import numpy as np
import pytest

from custom_ops import fp4_r16, native
from custom_ops.single_op import session, single_op_model
from ort_library_fixture import ort_ops_library  # noqa: F401  (fixture)
from test_cpu_kernel_formats import mxfp4_weight, nvfp4_weight

PATHS = ("avx512", "avx2", "portable")


def _weights(nv: bool, codes: np.ndarray, scales: np.ndarray, s2: float) -> np.ndarray:
    """Quark's dequantized weight [N, K] from the checkpoint's bytes (tests/test_cpu_kernel_formats.py's decoders)."""
    return nvfp4_weight(codes, scales, s2) if nv else mxfp4_weight(codes, scales)


def _case(nv: bool, n: int, k: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    if nv:
        scales = rng.uniform(2**-8, 300, (n, k // 16)).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    else:
        scales = rng.integers(100, 140, (n, k // 32), dtype=np.uint8)
    return codes, scales


def _run(nv: bool, a, b_r16, s_r16, s2=0.0371):
    return native.matmul_nvfp4_r16(a, b_r16, s_r16, s2) if nv else native.matmul_mxfp4_r16(a, b_r16, s_r16)


@pytest.fixture
def path_env():
    old = os.environ.get("QO_CPU_KERNELS")
    yield
    if old is None:
        os.environ.pop("QO_CPU_KERNELS", None)
    else:
        os.environ["QO_CPU_KERNELS"] = old


def test_pack_is_a_permutation_of_the_checkpoint_bytes():
    codes, scales = _case(True, 48, 64)
    b, s = fp4_r16.pack(codes, scales)
    assert b.shape == (3, 8, 64) and s.shape == (3, 4, 16)
    assert b.nbytes == codes.nbytes and s.nbytes == scales.nbytes
    assert b[1, 2, 4 * 5 + 3] == codes[16 + 5, 4 * 2 + 3] and s[2, 3, 7] == scales[32 + 7, 3]
    for got, want in zip(fp4_r16.unpack(b, s), (codes, scales)):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError):
        fp4_r16.pack(codes[:40], scales[:40])


@pytest.mark.parametrize("nv", [False, True], ids=["mxfp4", "nvfp4"])
@pytest.mark.parametrize("n,k", [(16, 32), (48, 96 + 32), (144, 256), (272, 512), (2 * 16 * 9, 1024)])
def test_every_path_and_m_same_bits_within_the_chain_bound(nv, n, k, path_env):
    if not nv and k % 32:
        pytest.skip("MXFP4 needs K % 32")
    codes, scales = _case(nv, n, k, seed=n + k)
    b, s = fp4_r16.pack(codes, scales)
    w = _weights(nv, codes, scales, 0.0371).astype(np.float64)
    rng = np.random.default_rng(1)
    for m in (1, 2, 3, 5, 8, 9, 17, 128):
        a = rng.standard_normal((m, k)).astype(np.float32)
        ref = a.astype(np.float64) @ w.T
        bound = k * 2.0**-24 * (np.abs(a).astype(np.float64) @ np.abs(w).T)
        outs = {}
        for p in PATHS:
            os.environ["QO_CPU_KERNELS"] = p
            outs[p] = _run(nv, a, b, s)
        for p in PATHS:
            np.testing.assert_array_equal(outs[p], outs["portable"], err_msg=f"path {p}, M = {m}")
        assert np.all(np.abs(outs["portable"] - ref) <= bound), f"M = {m}"


@pytest.mark.parametrize("nv", [False, True], ids=["mxfp4", "nvfp4"])
def test_one_and_two_threads_same_bits(nv):
    codes, scales = _case(nv, 16 * 40, 256)
    b, s = fp4_r16.pack(codes, scales)
    a = np.random.default_rng(2).standard_normal((3, 256)).astype(np.float32)
    omp = ctypes.CDLL(ctypes.util.find_library("gomp") or "libgomp.so.1").omp_set_num_threads
    try:
        omp(1)
        one = [_run(nv, a[:m], b, s) for m in (1, 3)]
        omp(2)
        two = [_run(nv, a[:m], b, s) for m in (1, 3)]
    finally:
        omp(os.cpu_count() or 1)
    for x, y in zip(one, two):
        np.testing.assert_array_equal(x, y)


def test_special_scales_and_values(path_env):
    """e8m0 0 (2^-127, a float32 subnormal) and 255 (NaN); e4m3fn subnormal codes and NaN (0x7F): same bits on every
    path, NaN exactly in the rows with a NaN scale, the rest against float64."""
    k = 64
    for nv in (False, True):
        codes, scales = _case(nv, 32, k, seed=5)
        if nv:
            scales[0, :] = np.arange(1, 1 + k // 16)  # subnormal e4m3fn codes
            scales[3, 1] = 0x7F
            scales[4, 2] = 0xFF
        else:
            scales[0, :] = 0
            scales[3, 1] = 255
        b, s = fp4_r16.pack(codes, scales)
        a = np.random.default_rng(3).standard_normal((2, k)).astype(np.float32)
        if not nv:
            a[:, :32] *= 2.0**100  # so that 2^-127-scaled products are not lost under the others
        outs = []
        for p in PATHS:
            os.environ["QO_CPU_KERNELS"] = p
            outs.append(_run(nv, a, b, s, s2=1.0 if nv else 0.0))
        for o in outs[1:]:
            np.testing.assert_array_equal(o, outs[0])
        nan_rows = {3, 4} if nv else {3}
        assert set(np.nonzero(np.isnan(outs[0]).any(0))[0]) == nan_rows
        w = _weights(nv, codes, scales, 1.0).astype(np.float64)
        ok = [r for r in range(32) if r not in nan_rows]
        ref = a.astype(np.float64) @ w[ok].T
        bound = k * 2.0**-24 * (np.abs(a).astype(np.float64) @ np.abs(w[ok]).T) + 2.0**-149
        assert np.all(np.abs(outs[0][:, ok] - ref) <= bound)


@pytest.mark.parametrize("nv,s2,a_scale", [(True, 1e-33, 2.0**60), (True, 2.0**-92, 2.0**60),
                                             (True, 2.0**119, 2.0**-100), (True, 0.0, 1.0), (False, 0.0, 2.0**100)],
                         ids=["nv_tiny_s2", "nv_s2_2^-92", "nv_huge_s2", "nv_s2_0", "mx_small_exponents"])
def test_scales_near_the_float_range(nv, s2, a_scale, path_env):
    """The AVX2 path multiplies 2 v * 2^24 by S * 2^-25 where that is exact, else takes (2 v * 2^24 * 2^-25) * S:
    NVFP4 with B_scale_2 below 2^-92 or above 2^118 (and at the edge, 2^-92), MXFP4 blocks with exponents 1..30 (the
    first 25 below the edge); products scaled into the normal range by the activations. Same bits on every path and
    M (the GEMV and the prefill panel), within the chain bound of numpy's float64 product."""
    n, k = 48, 256
    codes, scales = _case(nv, n, k, seed=9)
    if not nv:
        scales[:] = np.random.default_rng(4).integers(1, 31, scales.shape, dtype=np.uint8)
    if s2 > 1.0:  # e4m3 codes up to 0.5, so that S = e4m3 * 2^119 stays finite
        scales[:] = np.random.default_rng(4).uniform(2**-8, 0.5, scales.shape).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    b, s = fp4_r16.pack(codes, scales)
    w = _weights(nv, codes, scales, s2).astype(np.float64)
    rng = np.random.default_rng(6)
    for m in (1, 3, 17):  # 17: the prefill panels (AVX-512, AVX2)
        a = (rng.standard_normal((m, k)) * a_scale).astype(np.float32)
        outs = {}
        for p in PATHS:
            os.environ["QO_CPU_KERNELS"] = p
            outs[p] = _run(nv, a, b, s, s2=s2)
        for p in PATHS:
            np.testing.assert_array_equal(outs[p], outs["portable"], err_msg=f"path {p}, M = {m}")
        ref = a.astype(np.float64) @ w.T
        bound = k * 2.0**-24 * (np.abs(a).astype(np.float64) @ np.abs(w).T) + 2.0**-149
        assert np.all(np.abs(outs["portable"] - ref) <= bound)
        if s2 == 0.0 and nv:
            assert not outs["portable"].any()


def test_bad_arguments():
    codes, scales = _case(True, 32, 64)
    b, s = fp4_r16.pack(codes, scales)
    with pytest.raises(ValueError):
        native.matmul_nvfp4_r16(np.zeros((1, 64), np.float32), b, s[:, :2], 1.0)
    with pytest.raises(ValueError):
        native.matmul_nvfp4_r16(np.zeros((1, 48), np.float32), b, s, 1.0)


@pytest.mark.parametrize("nv", [False, True], ids=["mxfp4", "nvfp4"])
def test_ort_op_equals_the_kernel_and_the_function(ort_ops_library, nv):
    """In ORT: the op (the library registered) gives the C kernel's bits; the ONNX-function fallback (no library:
    Transpose / Reshape back to the checkpoint layout, then MatMulMxfp4 / MatMulNvfp4's function) the same values up
    to summation order."""
    n, k = 64, 128
    codes, scales = _case(nv, n, k, seed=11)
    b, s = fp4_r16.pack(codes, scales)
    s2 = np.float32(0.0371)
    op = "MatMulNvfp4R16" if nv else "MatMulMxfp4R16"
    weights = {"B": b, "B_scale": s.view(ml_dtypes.float8_e4m3fn) if nv else s}
    if nv:
        weights["B_scale_2"] = np.array(s2, np.float32)
    model = single_op_model(op, np.float32, k, weights, attributes={"K": k, "N": n})
    a = np.random.default_rng(4).standard_normal((2, 5, k)).astype(np.float32)
    with_lib = session(model, library=ort_ops_library).run(None, {"A": a})[0]
    fallback = session(model).run(None, {"A": a})[0]
    np.testing.assert_array_equal(with_lib, _run(nv, a, b, s, s2=s2))
    w = _weights(nv, codes, scales, s2).astype(np.float64)
    ref = a.astype(np.float64) @ w.T
    bound = k * 2.0**-24 * (np.abs(a).astype(np.float64) @ np.abs(w).T)
    assert np.all(np.abs(fallback - ref) <= bound)
    assert with_lib.shape == (2, 5, n)


@pytest.mark.parametrize("fmt", ["Mxfp4", "Nvfp4"])
@pytest.mark.parametrize("t,per_slot", [(1, False), (3, True), (24, False)])
def test_experts_r16_op(fmt, t, per_slot, ort_ops_library):
    """MatMulExperts{Mxfp4,Nvfp4}R16 (stacks of 16-row tiles): 1 and 2 threads and the portable path the same bits;
    each output bit for bit the dense MatMul*R16 on that chosen expert's weight; within the sequential-sum bound of
    a float64 product of numpy's decoding (tests/test_cpu_kernel_formats.py's decoders, on the checkpoint bytes);
    the ONNX-function fallback too. T = 24 with 6 experts top-3: experts with > 4 rows."""
    from onnx import TensorProto
    from test_matmul_experts import _init, dense_model, experts_model, reference, route

    rng = np.random.default_rng(7 * t + (fmt == "Nvfp4"))
    e, k, n, kk = 6, 3, 48, 96
    nv = fmt == "Nvfp4"
    b = rng.integers(0, 256, (e, n, kk // 2), dtype=np.uint8)
    s = (rng.integers(0x08, 0x7E, (e, n, kk // 16), dtype=np.uint8) if nv
         else rng.integers(118, 134, (e, n, kk // 32), dtype=np.uint8))
    s2 = rng.uniform(0.01, 0.03, e).astype(np.float32)
    w = [_weights(nv, b[i], s[i], s2[i]) for i in range(e)]
    packed = [fp4_r16.pack(b[i], s[i]) for i in range(e)]
    elem = TensorProto.FLOAT8E4M3FN if nv else None

    def inits(bb, ss, s2v):
        out = {"B": _init("B", bb), "B_scale": _init("B_scale", ss, elem)}
        if nv:
            out["B_scale_2"] = _init("B_scale_2", s2v)
        return out

    model = experts_model(fmt + "R16", inits(np.stack([p[0] for p in packed]), np.stack([p[1] for p in packed]), s2))
    ids = route(rng, t, e, k)
    a = rng.standard_normal((t, k, kk) if per_slot else (t, kk)).astype(np.float32)
    feeds = {"A": a, "expert_ids": ids}
    y_ref, bound = reference(a, ids, w)
    outs = [session(model, library=ort_ops_library, threads=th).run(None, feeds)[0] for th in (1, 2)]
    np.testing.assert_array_equal(outs[0], outs[1])
    y = outs[0]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QO_CPU_KERNELS", "portable")
        np.testing.assert_array_equal(session(model, library=ort_ops_library, threads=2).run(None, feeds)[0], y)
    assert y.shape == (t, k, n)
    assert np.all(np.abs(y - y_ref) <= kk * 2.0**-24 * bound)
    for ex in np.unique(ids):
        dense = dense_model(fmt + "R16", inits(packed[ex][0], packed[ex][1], np.array(s2[ex])), {"K": kk, "N": n})
        dsess = session(dense, library=ort_ops_library, threads=1)
        for i, slot in zip(*np.nonzero(ids == ex)):
            row = (a[i] if a.ndim == 2 else a[i, slot])[None]
            np.testing.assert_array_equal(dsess.run(None, {"A": row})[0][0], y[i, slot])
    y_fn = session(model).run(None, feeds)[0]
    assert np.all(np.abs(y_fn - y_ref) <= kk * 2.0**-24 * bound)
