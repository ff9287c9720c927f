"""The weight-only compact ops of docs/custom_op_contract.md (MatMulFp8, MatMulInt8, MatMulNvfp4): their ONNX-function fallbacks in
ORT against the numpy reference (custom_ops/reference.py), and the reference against hand-decoded values.
The C kernels of these ops are tested with the kernels (tests/test_custom_ops.py)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto

from custom_ops import functions
from custom_ops import reference as ref
from tests.test_custom_ops import ONNX_TYPE, assert_matches, run_single_node_model

FP8 = ml_dtypes.float8_e4m3fn


def _expected(a, w):
    a64 = np.asarray(a, np.float64)
    return a64 @ w.T, np.abs(a64) @ np.abs(w).T


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("m,n,k", [(1, 7, 96), (3, 17, 64), (5, 5, 33)])
def test_function_fp8_in_ort(m, n, k, per_channel, dtype):
    rng = np.random.default_rng(m * 100 + n)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = np.clip(rng.standard_normal((n, k)) * 80, -448, 448).astype(FP8)
    s = (rng.random(n).astype(np.float32) + 0.05) if per_channel else np.array(0.03, np.float32)
    y = run_single_node_model("MatMulFp8", {"A": a, "B": b, "B_scale": s},
                              [ONNX_TYPE[dtype], TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT], ONNX_TYPE[dtype],
                              (m, n))
    expected, bound = _expected(a, b.astype(np.float64) * np.broadcast_to(s.astype(np.float64), (n,))[:, None])
    assert_matches(y, expected, bound, "MatMulFp8 function")
    assert_matches(y, ref.matmul_fp8(a, b, s).astype(np.float64), bound, "MatMulFp8 reference")


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("per_channel", [False, True])
def test_function_int8_in_ort(per_channel, dtype):
    rng = np.random.default_rng(21)
    m, n, k = 4, 9, 80
    a = rng.standard_normal((2, m, k)).astype(dtype)
    b = rng.integers(-128, 128, size=(n, k), dtype=np.int8)
    s = (rng.random(n).astype(np.float32) * 0.01 + 1e-3) if per_channel else np.array(0.004, np.float32)
    y = run_single_node_model("MatMulInt8", {"A": a, "B": b, "B_scale": s},
                              [ONNX_TYPE[dtype], TensorProto.INT8, TensorProto.FLOAT], ONNX_TYPE[dtype], (2, m, n))
    w = b.astype(np.float64) * np.broadcast_to(s.astype(np.float64), (n,))[:, None]
    expected, bound = _expected(a, w)
    assert_matches(y, expected, bound, "MatMulInt8 function")
    assert_matches(y, ref.matmul_int8(a, b, s).astype(np.float64), bound, "MatMulInt8 reference")


def test_reference_nvfp4_decodes_by_hand():
    """Every 4-bit code in both nibbles, one block scale per 16 elements, times scale_2, as quark_format.md states."""
    codes = np.arange(32, dtype=np.uint8) % 16                    # [1, 32]: two blocks of 16
    packed = ref.pack_fp4_low_nibble_first(codes[None])
    assert packed[0, 0] == 0x10 and packed[0, 1] == 0x32           # element 2j in the low nibble of byte j
    block = np.array([[1.5, 0.25]], np.float32).astype(FP8)        # exact e4m3 values
    w = ref.dequantize_nvfp4(packed, block.view(np.uint8), np.float32(0.5))
    magnitudes = [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    values = np.array(magnitudes + [-v for v in magnitudes], np.float64)
    expected = np.concatenate([values * 1.5 * 0.5, values * 0.25 * 0.5])
    np.testing.assert_array_equal(w[0], expected)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("batch,n,k", [((1,), 8, 64), ((3,), 17, 128), ((2, 3), 5, 48)])
def test_function_nvfp4_in_ort(batch, n, k, dtype):
    rng = np.random.default_rng(n + k)
    a = rng.standard_normal(batch + (k,)).astype(dtype)
    b, bs, bs2 = ref.random_nvfp4_weight(rng, n, k)
    y = run_single_node_model("MatMulNvfp4", {"A": a, "B": b, "B_scale": bs.view(FP8),
                                              "B_scale_2": np.array(bs2, np.float32)},
                              [ONNX_TYPE[dtype], TensorProto.UINT8, TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT],
                              ONNX_TYPE[dtype], batch + (n,), attrs={"K": k, "N": n})
    assert y.dtype == dtype
    # independent decode: float64 products of the e4m3 block value and scale_2, rounded to float32 as Quark does
    codes = ref.unpack_fp4_low_nibble_first(b)
    block = (bs.view(FP8).astype(np.float32) * np.float32(bs2)).astype(np.float32)
    w = ref.e2m1_code_to_float(codes) * np.repeat(block.astype(np.float64), 16, axis=1)
    expected, bound = _expected(a, w)
    assert_matches(y, expected, bound, "MatMulNvfp4 function")
    assert_matches(y, ref.matmul_nvfp4(a, b, bs, bs2).astype(np.float64), bound, "MatMulNvfp4 reference")


def test_make_node_checks_new_ops():
    functions.make_node("MatMulFp8", ["A", "B", "S"], ["Y"])
    functions.make_node("MatMulNvfp4", ["A", "B", "S", "S2"], ["Y"], K=64, N=8)
    with pytest.raises(ValueError, match="multiple of 16"):
        functions.make_node("MatMulNvfp4", ["A", "B", "S", "S2"], ["Y"], K=40, N=8)
    with pytest.raises(ValueError, match="takes 3 inputs"):
        functions.make_node("MatMulInt8", ["A", "B"], ["Y"])
