"""com.quark_onnx MatMulUint4 / MatMulInt4 CPU kernel (custom_ops/src/qo_cpu_int4.c) against a numpy decoding of the
format written here: W[n, k] = float32((q - z) * s), q the nibble k of row n (even k in the low nibble of byte k/2
of MatMulNBits' [N, k_blocks, bs/2] layout), z the packed uint4 zero point of its block (8 when absent).

Exactness of the decode: a one-hot activation row returns one weight value, bit for bit. Exactness of the sum: the
float64 product bounds the float32 result. Bit identity: portable C, AVX2 and AVX-512 paths, M = 1 against the
GEMV's chunks and the prefill panel (M = 7 .. 128), 1 and 2 threads (a subprocess per thread count)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from custom_ops import native

REPO = Path(__file__).resolve().parents[1]


def make_case(rng, n, k, bs, asym):
    """Random uint4 codes, scales, zero points; packed the MatMulNBits way, written out here (not the builder's)."""
    k_blocks = -(-k // bs)
    q = rng.integers(0, 16, size=(n, k_blocks * bs), dtype=np.uint8)
    q[:, k:] = 0  # padding past K is zero nibbles
    s = (rng.standard_normal((n, k_blocks)) * 0.02).astype(np.float32)
    z = rng.integers(0, 16, size=(n, k_blocks), dtype=np.uint8) if asym else np.full((n, k_blocks), 8, np.uint8)
    b = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8).reshape(n, k_blocks, bs // 2)
    zp = None
    if asym:
        zpad = np.concatenate([z, np.zeros((n, k_blocks % 2), np.uint8)], axis=1)
        zp = (zpad[:, 0::2] | (zpad[:, 1::2] << 4)).astype(np.uint8)
    # Quark: (q - z) * s in float32 (an integer times the float32 scale, one rounding)
    w = ((q[:, :k].astype(np.float32) - np.repeat(z, bs, axis=1)[:, :k].astype(np.float32))
         * np.repeat(s, bs, axis=1)[:, :k])
    return b, s, zp, w.astype(np.float32)


def check_close(y, a, w):
    exact = a.astype(np.float64) @ w.astype(np.float64).T
    bound = (np.abs(a).astype(np.float64) @ np.abs(w).astype(np.float64).T) * (a.shape[-1] + 2) * 2.0 ** -24
    assert np.all(np.abs(y.astype(np.float64) - exact) <= bound + 1e-30)


def on_path(path, call, halves=None):
    """call() with the CPU kernels forced to path (QO_CPU_KERNELS) and, if given, the AVX2 M = 1 GEMV on 128-bit
    registers or not (QO_AVX2_HALVES, the default on AMD Zen 1 / Zen+)."""
    os.environ["QO_CPU_KERNELS"] = path
    if halves is not None:
        os.environ["QO_AVX2_HALVES"] = halves
    try:
        return call()
    finally:
        del os.environ["QO_CPU_KERNELS"]
        os.environ.pop("QO_AVX2_HALVES", None)


def assert_same_bits_on_paths(y, a, b, s, zp, k, bs):
    """The portable C and AVX2 paths (the M = 1 GEMV on 256-bit and on 128-bit registers) give y's bits."""
    for path, halves in (("portable", None), ("avx2", "0"), ("avx2", "1")):
        y_path = on_path(path, lambda: native.matmul_int4(a, b, s, zp, k, bs), halves)
        np.testing.assert_array_equal(y.view(np.uint32), y_path.view(np.uint32), err_msg=f"{path} halves={halves}")


@pytest.mark.parametrize("bs", [32, 64, 128])
@pytest.mark.parametrize("asym", [True, False])
# M: the GEMV (<= 4), its chunks (5..16: AVX-512 block 32 runs 7 and 8 rows as one chunk where K <= 1024, 12 as
# 6 + 6, 16 as 8 + 8), the panel (> 16: 12-row AVX-512 and 6-row AVX2 tiles, 29 = 2 x 12 + 5 and 4 x 6 + 5 leave a
# remainder tile on both)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 7, 8, 12, 16, 29, 128])
def test_int4_matches_numpy(bs, asym, m):
    rng = np.random.default_rng(bs * 7 + m + asym)
    n, k = 37, 3 * bs + 40 if bs > 32 else 200  # K and N not multiples of any tile; K padded to the block
    b, s, zp, w = make_case(rng, n, k, bs, asym)
    a = rng.standard_normal((m, k)).astype(np.float32)
    y = native.matmul_int4(a, b, s, zp, k, bs)
    check_close(y, a, w)
    assert_same_bits_on_paths(y, a, b, s, zp, k, bs)
    # a row's result does not depend on M (GEMV up to 16 rows, the panel above)
    y1 = native.matmul_int4(a[:1], b, s, zp, k, bs)
    np.testing.assert_array_equal(y[:1].view(np.uint32), y1.view(np.uint32))


@pytest.mark.parametrize("m", [7, 8, 16])
def test_int4_chunks_past_the_8_row_limit(m):
    """K > 1024 at block 32: the GEMV chunks stay at 6 rows on AVX-512 (8 rows' activations would leave L1); the same
    bits as the portable path and as M = 1."""
    rng = np.random.default_rng(m)
    n, k, bs = 21, 1100, 32
    b, s, zp, w = make_case(rng, n, k, bs, True)
    a = rng.standard_normal((m, k)).astype(np.float32)
    y = native.matmul_int4(a, b, s, zp, k, bs)
    check_close(y, a, w)
    y_portable = on_path("portable", lambda: native.matmul_int4(a, b, s, zp, k, bs))
    np.testing.assert_array_equal(y.view(np.uint32), y_portable.view(np.uint32))
    np.testing.assert_array_equal(y[2:3].view(np.uint32), native.matmul_int4(a[2:3], b, s, zp, k, bs).view(np.uint32))


@pytest.mark.parametrize("bs", [32, 64])
@pytest.mark.parametrize("m", [1, 3])
def test_int4_gemv_past_one_zero_point_segment(bs, m):
    """The AVX2 GEMV spreads the zero points of 256 groups at a time (I4_ZSEG) and walks 4 chunks a step: a row of
    300 + groups (K = 300 * bs + 40) crosses a segment, ends on a partial step and a partial 32-group spread; within
    the float64 bound of numpy's weights and the same bits on every path."""
    rng = np.random.default_rng(bs + m)
    n, k = 9, 300 * bs + 40
    b, s, zp, w = make_case(rng, n, k, bs, True)
    a = rng.standard_normal((m, k)).astype(np.float32)
    y = native.matmul_int4(a, b, s, zp, k, bs)
    check_close(y, a, w)
    assert_same_bits_on_paths(y, a, b, s, zp, k, bs)


@pytest.mark.parametrize("groups", [9, 15, 16, 17, 18, 33])
@pytest.mark.parametrize("asym", [True, False])
def test_int4_gemv_zero_point_spread_steps(groups, asym):
    """The AVX2 GEMV spreads 16 zero points a step and the rest one at a time, and tables the scales 8 a step with a
    masked last step: rows of 9 .. 33 groups of 32 (K = 576, the hidden size of SmolLM2-135M, is 18) give the same
    bits on every path, within numpy's float64 bound."""
    rng = np.random.default_rng(groups * 2 + asym)
    n, k, bs = 21, 32 * groups, 32
    b, s, zp, w = make_case(rng, n, k, bs, asym)
    a = rng.standard_normal((1, k)).astype(np.float32)
    y = native.matmul_int4(a, b, s, zp, k, bs)
    check_close(y, a, w)
    assert_same_bits_on_paths(y, a, b, s, zp, k, bs)


@pytest.mark.parametrize("m", [1, 3])
def test_int4_gemv_tiny_scales(m):
    """The AVX2 GEMV multiplies (q - z) * 2^24 by s * 2^-24; a segment with a scale of 0 < |s| < 2^-102 (where
    s * 2^-24 would lose bits) multiplies by 2^-24 and then by s. Rows whose every product is tiny (scales near
    1e-35, tiny in the second segment of 256 groups only, subnormal, 2^-102, 0): the same bits as the portable path,
    within numpy's float64 bound."""
    rng = np.random.default_rng(11 + m)
    n, k, bs = 6, 300 * 32 + 40, 32
    b, s, zp, _ = make_case(rng, n, k, bs, True)
    # each row's sum made of tiny products only, so that a lost bit shows in the result
    s[0] *= np.float32(1e-33)                                  # every group tiny
    s[1, :256], s[1, 256:] = 0.0, s[1, 256:] * np.float32(-1e-31)  # tiny in the second segment only
    s[2] *= np.float32(1e-38)                                  # subnormal scales
    s[3, :] = 0.0
    s[3, 7] = 2.0 ** -102                                      # the smallest scale that keeps s * 2^-24 normal
    s[4, :] = 0.0
    s[5, :] = 0.0
    s[5, 300] = 1e-36  # tiny in the masked last step of the second segment's scale table (groups 296..301)
    q = np.zeros((n, b.shape[1] * bs), np.uint8)
    q[:, 0::2], q[:, 1::2] = b.reshape(n, -1) & 15, b.reshape(n, -1) >> 4
    zpad = np.stack([zp & 15, zp >> 4], axis=2).reshape(n, -1)[:, :b.shape[1]]
    w = ((q[:, :k].astype(np.float32) - np.repeat(zpad, bs, axis=1)[:, :k].astype(np.float32))
         * np.repeat(s, bs, axis=1)[:, :k])
    a = rng.standard_normal((m, k)).astype(np.float32)
    y = native.matmul_int4(a, b, s, zp, k, bs)
    check_close(y, a, w)
    assert_same_bits_on_paths(y, a, b, s, zp, k, bs)


@pytest.mark.parametrize("bs", [16, 32, 128])
@pytest.mark.parametrize("asym", [True, False])
def test_int4_decode_is_exact(bs, asym):
    """A one-hot row k returns W[:, k] exactly: every decoded weight equals numpy's float32 (q - z) * s."""
    rng = np.random.default_rng(bs + asym)
    n, k = 19, 2 * bs + 16
    b, s, zp, w = make_case(rng, n, k, bs, asym)
    for path in ("", "portable", "avx2"):
        if path:
            os.environ["QO_CPU_KERNELS"] = path
        try:
            y = native.matmul_int4(np.eye(k, dtype=np.float32), b, s, zp, k, bs)  # M = K: the tiled path
            y3 = native.matmul_int4(np.eye(k, dtype=np.float32)[:3], b, s, zp, k, bs)  # GEMV
        finally:
            os.environ.pop("QO_CPU_KERNELS", None)
        w0 = w + np.float32(0)  # a sum of +0 lanes: -0 weights come back +0
        np.testing.assert_array_equal(y.T.view(np.uint32), w0.view(np.uint32))
        np.testing.assert_array_equal(y3.T.view(np.uint32), w0[:, :3].view(np.uint32))


def test_int4_block16_and_f16():
    rng = np.random.default_rng(3)
    n, k = 9, 48
    b, s, zp, w = make_case(rng, n, k, 16, True)
    a = rng.standard_normal((2, k)).astype(np.float32)
    check_close(native.matmul_int4(a, b, s, zp, k, 16), a, w)
    y16 = native.matmul_int4(a.astype(np.float16), b, s, zp, k, 16)
    assert y16.dtype == np.float16
    np.testing.assert_allclose(y16.astype(np.float32), a.astype(np.float16).astype(np.float32) @ w.T, rtol=2e-2,
                               atol=2e-2)


_THREADS_SCRIPT = """
import json, sys, numpy as np
sys.path.insert(0, {repo!r}); sys.path.insert(0, {tests!r})
from custom_ops import native
from test_int4_custom_op import make_case
rng = np.random.default_rng(11)
out = {{}}
for m in (1, 3, 128):
    b, s, zp, w = make_case(rng, 300, 520, 64, True)
    a = rng.standard_normal((m, 520)).astype(np.float32)
    out[m] = native.matmul_int4(a, b, s, zp, 520, 64).view(np.uint32).tolist()
print(json.dumps(out))
"""


def test_int4_bits_do_not_depend_on_threads():
    from thread_runs import outputs_per_thread_count
    one, two = outputs_per_thread_count(_THREADS_SCRIPT.format(repo=str(REPO), tests=str(REPO / "tests")))
    assert one == two


def _single_node(op_type, n, k, bs, b, s, zp):
    import onnx
    from onnx import TensorProto, helper

    from custom_ops.functions import DOMAIN, function_proto

    inits = [onnx.numpy_helper.from_array(b, "B"), onnx.numpy_helper.from_array(s.reshape(-1), "S")]
    inputs = ["A", "B", "S"]
    if zp is not None:
        inits.append(onnx.numpy_helper.from_array(zp.reshape(-1), "Z"))
        inputs.append("Z")
    node = helper.make_node(op_type, inputs, ["Y"], domain=DOMAIN, K=k, N=n, block_size=bs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", k])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(DOMAIN, 1)],
                              functions=[function_proto(op_type)])
    return model.SerializeToString()


@pytest.mark.parametrize("asym", [True, False])
@pytest.mark.parametrize("bs", [32, 128])
def test_int4_function_fallback_and_ort_kernel(asym, bs):
    """The ONNX-function body (no library) decodes the same weights; with the library ORT runs our kernel, whose bits
    equal the native call's."""
    import onnxruntime as ort

    from custom_ops import ort_library

    rng = np.random.default_rng(5 + bs)
    n, k = 45, 3 * bs + 64 if bs == 32 else 2 * bs + 96  # K padded inside the last block
    b, s, zp, w = make_case(rng, n, k, bs, asym)
    a = rng.standard_normal((3, k)).astype(np.float32)
    model = _single_node("MatMulUint4" if asym else "MatMulInt4", n, k, bs, b, s, zp)
    y_fn = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"A": a})[0]
    check_close(y_fn, a, w)
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(ort_library.build(log=lambda m: None)))
    y_lib = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, {"A": a})[0]
    np.testing.assert_array_equal(y_lib.view(np.uint32), native.matmul_int4(a, b, s, zp, k, bs).view(np.uint32))


@pytest.mark.parametrize("bs", [32, 128])
def test_int4_k_blocks_of_the_tiles(bs):
    """A long K (one chain of the panel kernel runs K / 32 steps) and N over two 32-row panels, the second partial:
    the same bits on every path and for M = 1 and M = 19 (the panel)."""
    rng = np.random.default_rng(bs)
    n, k = 53, 2 * 1024 + 3 * bs
    b, s, zp, w = make_case(rng, n, k, bs, True)
    a = rng.standard_normal((19, k)).astype(np.float32)
    outs = []
    for path in ("", "avx2", "portable"):
        if path:
            os.environ["QO_CPU_KERNELS"] = path
        try:
            outs.append((native.matmul_int4(a, b, s, zp, k, bs), native.matmul_int4(a[2:3], b, s, zp, k, bs)))
        finally:
            os.environ.pop("QO_CPU_KERNELS", None)
    check_close(outs[0][0], a, w)
    for y, y1 in outs:
        np.testing.assert_array_equal(y.view(np.uint32), outs[0][0].view(np.uint32))
        np.testing.assert_array_equal(y1.view(np.uint32), outs[0][0][2:3].view(np.uint32))


def test_int4_ort_pool_threads_same_bits():
    """Through ORT's intra-op pool (KernelContext_ParallelFor, the way og runs the op): 1 and 2 threads give the bits
    of the native call, at M = 1, 2, 3 and 128, N over several tasks and not a multiple of the 8-row GEMV tile."""
    import onnxruntime as ort

    from custom_ops import ort_library

    rng = np.random.default_rng(12)
    n, k, bs = 301, 520, 64
    b, s, zp, w = make_case(rng, n, k, bs, True)
    model = _single_node("MatMulUint4", n, k, bs, b, s, zp)
    sessions = []
    for threads in (1, 2):
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.register_custom_ops_library(str(ort_library.build(log=lambda m: None)))
        sessions.append(ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]))
    for m in (1, 2, 3, 128):
        a = rng.standard_normal((m, k)).astype(np.float32)
        want = native.matmul_int4(a, b, s, zp, k, bs)
        check_close(want, a, w)
        for sess in sessions:
            np.testing.assert_array_equal(sess.run(None, {"A": a})[0].view(np.uint32), want.view(np.uint32))
