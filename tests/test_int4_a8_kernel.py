"""The int8-activation 4-bit kernel (custom_ops/src/qo_cpu_int4_a8.c; accuracy_level 4 of MatMulExpertsUint4 /
Int4) against two independent references:

- numpy, written here from the arithmetic onnxruntime's MLAS uses at accuracy_level 4 (per weight block: amax,
  scale amax / 127, inverse 127 / amax, round half to even; exact integer dots; the float sum in float64);
- onnxruntime's own MatMulNBits at accuracy_level 4 on the same bytes (MLAS CompInt8): equal up to float summation
  order (and, where MLAS's quantizer rounds a product the other way, one unit of one activation code).

Bit identity: portable C, AVX2 and AVX-512 VNNI paths, M = 1 against M = 3 and 128."""
from __future__ import annotations

import os

import numpy as np
import pytest

from custom_ops import native
from tests.test_int4_custom_op import make_case


def quantize_a(a: np.ndarray, k: int, bs: int):
    """Per row and block: int8 codes [M, k_blocks, bs] (zero past K) and float32 scales [M, k_blocks]."""
    m = a.shape[0]
    k_blocks = -(-k // bs)
    ap = np.zeros((m, k_blocks * bs), np.float32)
    ap[:, :k] = a
    ap = ap.reshape(m, k_blocks, bs)
    amax = np.abs(ap).max(axis=2)
    inv = np.where(amax != 0, np.float32(127.0) / np.where(amax != 0, amax, 1).astype(np.float32), 0).astype(np.float32)
    q = np.clip(np.rint((ap * inv[:, :, None]).astype(np.float32)), -127, 127).astype(np.int64)
    return q, (amax / np.float32(127.0)).astype(np.float32)


def reference(a, b, s, zp, k, bs):
    n = b.shape[0]
    k_blocks = -(-k // bs)
    codes = np.empty((n, k_blocks * bs), np.int64)
    flat = b.reshape(n, -1)
    codes[:, 0::2] = flat & 15
    codes[:, 1::2] = flat >> 4
    if zp is None:
        z = np.full((n, k_blocks), 8, np.int64)
    else:
        z = np.stack([zp & 15, zp >> 4], axis=2).reshape(n, -1)[:, :k_blocks].astype(np.int64)
    w = codes.reshape(n, k_blocks, bs) - z[:, :, None]
    qa, sa = quantize_a(a, k, bs)
    v = np.einsum("mbk,nbk->mnb", qa, w)  # exact integers
    t = (sa[:, None, :] * s.reshape(n, k_blocks)[None, :, :]).astype(np.float32)  # float32 product, as the kernel
    return (v.astype(np.float64) * t.astype(np.float64)).sum(axis=2), (np.abs(v) * np.abs(t)).sum(axis=2)


def _run(a, b, s, zp, k, bs, path=""):
    if path:
        os.environ["QO_CPU_KERNELS"] = path
    try:
        return native.matmul_int4(a, b, s, zp, k, bs, accuracy_level=4)
    finally:
        os.environ.pop("QO_CPU_KERNELS", None)


def check_random_case(rng, n, k, bs, asym, m):
    """Random weights and activations: the best path within float rounding of the reference (the integers exact),
    the portable and AVX2 paths bit for bit equal to it. Returns (y, a, b, s, zp)."""
    b, s, zp, _ = make_case(rng, n, k, bs, asym)
    a = rng.standard_normal((m, k)).astype(np.float32)
    y = _run(a, b, s, zp, k, bs)
    exact, mag = reference(a, b, s, zp, k, bs)
    assert np.all(np.abs(y - exact) <= mag * 40 * 2.0 ** -24 + 1e-30)
    for path in ("portable", "avx2"):
        np.testing.assert_array_equal(y.view(np.uint32), _run(a, b, s, zp, k, bs, path).view(np.uint32), err_msg=path)
    return y, a, b, s, zp


@pytest.mark.parametrize("bs", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("asym", [True, False])
@pytest.mark.parametrize("m", [1, 3, 128])
def test_int4_a8_matches_reference_on_every_path(bs, asym, m):
    rng = np.random.default_rng(bs * 11 + m + asym)
    n = 37
    k = 21 * bs + 40 if bs <= 64 else 3 * bs + 40  # k_blocks not a multiple of 16 (a tail group), K padded
    y, a, b, s, zp = check_random_case(rng, n, k, bs, asym, m)
    np.testing.assert_array_equal(y[:1].view(np.uint32), _run(a[:1], b, s, zp, k, bs).view(np.uint32))


def test_int4_a8_one_group_exactly():
    """K = 16 blocks of 32, integer-valued scales: every float step is exact, so the result is the reference's."""
    rng = np.random.default_rng(5)
    n, k, bs = 24, 512, 32
    b, _, zp, _ = make_case(rng, n, k, bs, True)
    s = rng.integers(1, 4, size=(n, 16)).astype(np.float32)
    a = rng.integers(-127, 128, size=(2, k)).astype(np.float32)
    a[:, ::bs] = 127.0  # amax 127 in every block: scale 1, codes = a
    y = _run(a, b, s, zp, k, bs)
    exact, _ = reference(a, b, s, zp, k, bs)
    np.testing.assert_array_equal(y, exact.astype(np.float32))


@pytest.mark.parametrize("bs", [32, 128])
@pytest.mark.parametrize("asym", [True, False])
def test_int4_a8_matches_onnxruntime_matmulnbits_level4(bs, asym):
    from onnx import TensorProto, helper, numpy_helper
    import onnxruntime as ort

    rng = np.random.default_rng(bs + 3 * asym)
    n, k, m = 96, 1024, 5
    b, s, zp, _ = make_case(rng, n, k, bs, asym)
    a = rng.standard_normal((m, k)).astype(np.float32)
    inits = [numpy_helper.from_array(b, "B"), numpy_helper.from_array(s.reshape(n, -1), "scales")]
    inputs = ["A", "B", "scales"]
    if zp is not None:
        inits.append(numpy_helper.from_array(zp, "zp"))
        inputs.append("zp")
    node = helper.make_node("MatMulNBits", inputs, ["Y"], domain="com.microsoft", K=k, N=n, bits=4,
                            block_size=bs, accuracy_level=4)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [m, k])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [m, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    y_ort = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"A": a})[0]
    y = _run(a, b, s, zp, k, bs)
    exact, mag = reference(a, b, s, zp, k, bs)
    # one activation code off by one in a block moves the sum by at most sa * max|q - z| * s
    _, sa = quantize_a(a, k, bs)
    one_code = (sa.max(axis=1)[:, None] * 15 * np.abs(s).max()).astype(np.float64)
    assert np.abs(y - y_ort).max() <= (mag * 200 * 2.0 ** -24 + 2 * one_code).max()
    # and much closer to MLAS than to the exact fp32-activation product
    w_exact = native.matmul_int4(a, b, s, zp, k, bs)
    assert np.abs(y - y_ort).max() < 0.1 * np.abs(w_exact - y_ort).max()


def test_int4_a8_rounds_half_to_even_on_every_path():
    """Activations whose scaled values are exact halves (amax 127: inverse 1) round half to even on the SIMD
    quantizers too: every path equals the reference exactly (integer-valued scales keep every float step exact)."""
    rng = np.random.default_rng(11)
    n, k, bs = 16, 1024, 32
    b, _, zp, _ = make_case(rng, n, k, bs, True)
    s = np.ones((n, k // bs), np.float32)
    a = (rng.integers(-126, 126, size=(3, k)) + 0.5).astype(np.float32)
    a[:, ::bs] = 127.0
    exact, _ = reference(a, b, s, zp, k, bs)
    for path in ("", "portable", "avx2"):
        np.testing.assert_array_equal(_run(a, b, s, zp, k, bs, path), exact.astype(np.float32), err_msg=path)


@pytest.mark.parametrize("k", [768, 1280])  # k_blocks 16 g + 8: the paired 8-block tails of the AVX-512 GEMV
@pytest.mark.parametrize("asym", [True, False])
@pytest.mark.parametrize("m", [1, 2, 5])
def test_int4_a8_eight_block_tails(k, asym, m):
    rng = np.random.default_rng(k + m + asym)
    n, bs = 37, 32  # odd: the last row has no partner
    check_random_case(rng, n, k, bs, asym, m)
