"""com.quark_onnx MatMulInt8W8A8 CPU kernel (custom_ops/src/qo_cpu_int8_w8a8.c) against a numpy model of the op written
here: q = clamp(round_half_even(float32(A * float32(1 / s_a))), -128, 127) with NaN -> -128 (Quark's int8 fake
quantizer, torch.fake_quantize_per_tensor_affine), P = q @ B^T in int64, Y = float32(float32(float32(P) * s_a) * s_w).

Every path (portable C, AVX2 int16 products, AVX-512 VNNI) and thread count must give exactly those bits: the sums are
integers, so nothing may depend on the order. Also: against the float64 product of the Q/DQ'd operands (Quark's model
up to its float32 roundings), through ORT (the library's kernel and the op's ONNX function), fp16 io, K past the int32
range of one accumulator, and the argument checks."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from custom_ops import native

REPO = Path(__file__).resolve().parents[1]
PATHS = ("", "portable", "avx2", "avx512-novbmi")  # "": the widest this CPU has (VNNI where present)


def reference(a, b, b_scale, a_scale):
    s = np.float32(a_scale)
    v = a.astype(np.float32) * (np.float32(1) / s)
    q = np.where(np.isnan(v), -128, np.clip(np.rint(v), -128, 127)).astype(np.int64)  # np.rint: half to even
    p = q @ b.astype(np.int64).T
    y = (p.astype(np.float32) * s).astype(np.float32)
    return (y * np.asarray(b_scale, np.float32).reshape(1, -1)).astype(np.float32), q


def run_paths(fn):
    out = {}
    for path in PATHS:
        if path:
            os.environ["QO_CPU_KERNELS"] = path
        try:
            out[path] = fn()
        finally:
            os.environ.pop("QO_CPU_KERNELS", None)
    return out


def make_case(rng, m, n, k, per_channel=True):
    a_scale = np.float32(0.0173)
    a = (rng.standard_normal((m, k)) * 0.8).astype(np.float32)
    a[0, : min(k, 5)] = [np.nan, np.inf, -np.inf, 1e30, -3.0][: min(k, 5)]  # NaN -> -128, saturation both ways
    if k > 8:  # exact halves: ties to even in both directions
        a[-1, 5:9] = np.float32([2.5, -2.5, 3.5, -0.5]) * a_scale
    b = rng.integers(-128, 128, (n, k), dtype=np.int8)
    b[0, :] = -128  # the +128 offset of the VNNI path at its extreme
    b_scale = rng.uniform(1e-3, 2e-2, n if per_channel else 1).astype(np.float32)
    return a, b, b_scale, a_scale


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 128])
@pytest.mark.parametrize("n,k", [(37, 200), (9, 17), (64, 4096 + 48), (8, 64)])
def test_int8_w8a8_matches_numpy_on_every_path(m, n, k):
    rng = np.random.default_rng(m * 1000 + n + k)
    a, b, b_scale, a_scale = make_case(rng, m, n, k, per_channel=(n % 2 == 1))
    want, _ = reference(a, b, b_scale, a_scale)
    for path, y in run_paths(lambda: native.matmul_int8_w8a8(a, b, b_scale, a_scale)).items():
        np.testing.assert_array_equal(y.view(np.uint32), want.view(np.uint32), err_msg=f"path {path or 'default'}")


def test_int8_w8a8_is_quark_math_up_to_float32_rounding():
    """Quark's model multiplies the Q/DQ'd operands in float32: against their float64 product the kernel is within a
    few float32 ulps of each output's magnitude sum (the float path of MatMulInt8 sums K rounded products)."""
    rng = np.random.default_rng(3)
    m, n, k = 16, 96, 1000
    a, b, b_scale, a_scale = make_case(rng, m, n, k)
    a[0, :5] = 0.1  # finite inputs only here
    y = native.matmul_int8_w8a8(a, b, b_scale, a_scale)
    _, q = reference(a, b, b_scale, a_scale)
    x_dq = q.astype(np.float64) * np.float64(a_scale)
    w_dq = b.astype(np.float64) * b_scale.astype(np.float64).reshape(-1, 1)
    exact = x_dq @ w_dq.T
    mag = np.abs(x_dq) @ np.abs(w_dq).T
    assert np.all(np.abs(y - exact) <= 4 * 2.0 ** -24 * mag + 1e-30)


def test_int8_w8a8_k_past_one_int32_accumulator():
    """K = 70000 (> one 32768-element int32 chunk) with every product at its extreme: P = K * 128 * 128 > 2^30."""
    k = 70000
    a_scale = np.float32(0.5)
    a = np.full((2, k), -1000.0, np.float32)  # q = -128
    a[1, ::2] = 1000.0  # q = 127
    b = np.full((3, k), -128, np.int8)
    b_scale = np.float32([1.0, 0.25, 3.0])
    want, _ = reference(a, b, b_scale, a_scale)
    assert float(want[0, 0]) == float(np.float32(k * 128 * 128) * np.float32(0.5))
    for path, y in run_paths(lambda: native.matmul_int8_w8a8(a, b, b_scale, a_scale)).items():
        np.testing.assert_array_equal(y, want, err_msg=f"path {path or 'default'}")


def test_int8_w8a8_fp16_io():
    rng = np.random.default_rng(5)
    a, b, b_scale, a_scale = make_case(rng, 3, 20, 300)
    a[0, :5] = 0.25
    a16 = a.astype(np.float16)
    want, _ = reference(a16.astype(np.float32), b, b_scale, a_scale)
    y = native.matmul_int8_w8a8(a16, b, b_scale, a_scale)
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y, want.astype(np.float16))


@pytest.mark.parametrize("a_scale", [0.0, -1.0, np.inf, np.nan])
def test_int8_w8a8_refuses_bad_scales(a_scale):
    a = np.ones((1, 16), np.float32)
    b = np.ones((4, 16), np.int8)
    with pytest.raises(RuntimeError, match="status 1"):
        native.matmul_int8_w8a8(a, b, np.ones(4, np.float32), a_scale)
    with pytest.raises(ValueError, match="B_scale"):
        native.matmul_int8_w8a8(a, b, np.ones(3, np.float32), 1.0)


_THREADS_SCRIPT = """
import json, sys, numpy as np
sys.path.insert(0, {repo!r}); sys.path.insert(0, {tests!r})
from custom_ops import native
from test_int8_w8a8_kernel import make_case
rng = np.random.default_rng(11)
out = {{}}
for m in (1, 3, 128):
    a, b, bs, s = make_case(rng, m, 300, 520)
    out[m] = native.matmul_int8_w8a8(a, b, bs, s).view(np.uint32).tolist()
print(json.dumps(out))
"""


def test_int8_w8a8_bits_do_not_depend_on_threads():
    from thread_runs import outputs_per_thread_count
    one, two = outputs_per_thread_count(_THREADS_SCRIPT.format(repo=str(REPO), tests=str(REPO / "tests")))
    assert one == two


def test_int8_w8a8_in_ort_kernel_and_function():
    """Through ORT's intra-op pool with 1 and 2 threads: the native bits; without the library ORT runs the op's ONNX
    function (Mul by 1/s, QuantizeLinear, float MatMul): the same q, so the same values up to float32 summation."""
    from custom_ops import ort_library
    from custom_ops.single_op import session, single_op_model

    rng = np.random.default_rng(12)
    n, k = 301, 520
    a, b, b_scale, a_scale = make_case(rng, 1, n, k)
    model = single_op_model("MatMulInt8W8A8", np.float32, k, {"B": b, "B_scale": b_scale,
                                                              "A_scale": np.float32(a_scale)})
    library = str(ort_library.build(log=lambda m: None))
    sessions = [session(model, library=library, threads=t) for t in (1, 2)]
    fallback = session(model)
    for m in (1, 2, 3, 128):
        a = (rng.standard_normal((m, k)) * 0.8).astype(np.float32)
        want, q = reference(a, b, b_scale, a_scale)
        for sess in sessions:
            np.testing.assert_array_equal(sess.run(None, {"A": a})[0].view(np.uint32), want.view(np.uint32))
        y_fn = fallback.run(None, {"A": a})[0]
        mag = (np.abs(q).astype(np.float64) * float(a_scale)) @ (np.abs(b.astype(np.float64)) * b_scale[:, None]).T
        assert np.all(np.abs(y_fn.astype(np.float64) - want) <= (k + 4) * 2.0 ** -24 * mag + 1e-30)
