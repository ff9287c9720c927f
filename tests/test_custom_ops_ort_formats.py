"""The weight-only ops MatMulFp8, MatMulInt8, MatMulNvfp4 (and MatMulBf16, MatMulMxfp4 on the same kernels) inside an
ONNX Runtime session with the custom-op library: one-node models built here, results against the independent numpy
decoders of tests/test_cpu_kernel_formats.py, the kernel (not a fallback) in the profile, the same bits with 1 and 2
intra-op threads (ORT's pool through KernelContext_ParallelFor) and as the ctypes library (OpenMP), and the ops'
argument errors."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from custom_ops.single_op import profiled_nodes, session
from test_cpu_kernel_formats import REL_FP16, REL_FP32, e2m1_unpack, e4m3fn_values, nvfp4_weight, rel_error

from ort_library_fixture import ort_ops_library  # noqa: F401  (fixture)

DOMAIN = "com.quark_onnx"
ELEM = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16}


def _tensor(name, value, elem=None):
    value = np.asarray(value)
    if elem is not None:  # raw bytes of a float8 / bfloat16 tensor
        return helper.make_tensor(name, elem, value.shape, value.tobytes(), raw=True)
    return numpy_helper.from_array(value, name)


def one_node(op: str, dtype, inits: list, attrs: dict | None = None):
    node = helper.make_node(op, ["A"] + [t.name for t in inits], ["Y"], name=f"{op}_node", domain=DOMAIN,
                            **(attrs or {}))
    graph = helper.make_graph([node], op, [helper.make_tensor_value_info("A", ELEM[dtype], None)],
                              [helper.make_tensor_value_info("Y", ELEM[dtype], None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(DOMAIN, 1)])
    model.ir_version = 10
    return model


def case(op: str, rng, n: int, k: int, per_channel: bool = True):
    """(initializers, attributes, float64 weight [N, K])"""
    if op == "MatMulFp8":
        codes = rng.integers(0, 0x7E, (n, k), dtype=np.uint8) | (rng.integers(0, 2, (n, k), dtype=np.uint8) << 7)
        s = rng.uniform(0.5, 2, n if per_channel else 1).astype(np.float32)
        s = s if per_channel else s.reshape(())
        return [_tensor("B", codes, TensorProto.FLOAT8E4M3FN), _tensor("B_scale", s)], {}, \
            e4m3fn_values(codes) * np.asarray(s, np.float64).reshape(-1, 1)
    if op == "MatMulInt8":
        q = rng.integers(-128, 128, (n, k), dtype=np.int8)
        s = rng.uniform(1e-3, 2e-3, n if per_channel else 1).astype(np.float32)
        s = s if per_channel else s.reshape(())
        return [_tensor("B", q), _tensor("B_scale", s)], {}, q * np.asarray(s, np.float64).reshape(-1, 1)
    if op == "MatMulNvfp4":
        packed = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
        scales = rng.integers(0x08, 0x7E, (n, k // 16), dtype=np.uint8)
        s2 = np.float32(0.0173)
        return [_tensor("B", packed), _tensor("B_scale", scales, TensorProto.FLOAT8E4M3FN),
                _tensor("B_scale_2", np.array(s2))], {"K": k, "N": n}, nvfp4_weight(packed, scales, s2)
    if op == "MatMulMxfp4":
        packed = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
        scales = rng.integers(120, 134, (n, k // 32), dtype=np.uint8)
        w = e2m1_unpack(packed) * np.repeat(2.0 ** (scales.astype(np.float64) - 127), 32, axis=1)
        return [_tensor("B", packed), _tensor("B_scale", scales)], {"K": k, "N": n}, w
    if op == "MatMulBf16":
        w = (rng.standard_normal((n, k)) * 0.05).astype(ml_dtypes.bfloat16)
        bits = w.view(np.uint16)
        return [_tensor("B", bits, TensorProto.BFLOAT16)], {}, \
            (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    raise ValueError(op)


NEW_OPS = ["MatMulFp8", "MatMulInt8", "MatMulNvfp4"]
SHAPES = {"MatMulNvfp4": [(37, 208), (130, 1040)], "MatMulMxfp4": [(37, 224), (130, 1024)]}


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("op", NEW_OPS)
def test_new_op_in_ort_matches_decoding(ort_ops_library, op, dtype):
    rng = np.random.default_rng(len(op))
    for (n, k), per_channel in zip(SHAPES.get(op, [(37, 203), (130, 1000)]), (True, False)):
        inits, attrs, w = case(op, rng, n, k, per_channel)
        sess = session(one_node(op, dtype, inits, attrs), library=ort_ops_library, profile=True)
        for batch in [(1,), (3,), (2, 64)]:
            a = rng.standard_normal(batch + (k,)).astype(dtype)
            y = sess.run(None, {"A": a})[0]
            assert y.dtype == dtype and y.shape == batch + (n,)
            rel = rel_error(y, a, w)
            assert rel <= (REL_FP32 if dtype == np.float32 else REL_FP16), f"{op} {batch} N={n} K={k}: {rel:.3g}"
        assert set(profiled_nodes(sess)) == {(op, "CPUExecutionProvider")}


@pytest.mark.parametrize("op", NEW_OPS + ["MatMulMxfp4", "MatMulBf16"])
def test_same_bits_with_one_and_two_threads_and_every_m(ort_ops_library, op):
    rng = np.random.default_rng(9)
    n, k = SHAPES.get(op, [(0, 0), (130, 1000)])[1]
    inits, attrs, _ = case(op, rng, n, k)
    model = one_node(op, np.float32, inits, attrs)
    s1, s2 = (session(model, library=ort_ops_library, threads=t) for t in (1, 2))
    a = (rng.standard_normal((128, k)) * np.logspace(-2, 2, k)).astype(np.float32)
    y = s1.run(None, {"A": a})[0]
    assert np.array_equal(s2.run(None, {"A": a})[0], y)
    for m in (1, 3):
        assert np.array_equal(s1.run(None, {"A": a[:m]})[0], y[:m])
        assert np.array_equal(s2.run(None, {"A": a[:m]})[0], y[:m])


@pytest.mark.parametrize("op,bad,message", [
    ("MatMulFp8", "B_scale", "MatMulFp8: B_scale must be a scalar or [N]"),
    ("MatMulInt8", "B_scale", "MatMulInt8: B_scale must be a scalar or [N]"),
    ("MatMulNvfp4", "B_scale", "MatMulNvfp4: B_scale must be [N, K/16]"),
    ("MatMulNvfp4", "N", "MatMulNvfp4: attributes K/N do not match the tensors"),
])
def test_argument_errors(ort_ops_library, op, bad, message):
    rng = np.random.default_rng(1)
    n, k = 8, 64
    inits, attrs, _ = case(op, rng, n, k)
    if bad == "N":
        attrs["N"] = n + 1
    else:
        i = [t.name for t in inits].index("B_scale")
        if op == "MatMulNvfp4":
            inits[i] = _tensor("B_scale", np.zeros((n, k // 32), np.uint8), TensorProto.FLOAT8E4M3FN)
        else:
            inits[i] = _tensor("B_scale", np.ones(n + 1, np.float32))
    sess = session(one_node(op, np.float32, inits, attrs), library=ort_ops_library)
    with pytest.raises(Exception, match=message.replace("[", r"\[").replace("]", r"\]")):
        sess.run(None, {"A": np.ones((1, k), np.float32)})
