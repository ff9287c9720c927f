"""CPU kernels and ONNX-function fallbacks of custom_ops, each against the independent numpy reference."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from custom_ops import functions, native
from custom_ops import reference as ref

FP8 = ml_dtypes.float8_e4m3fn


def assert_matches(y, expected, bound, what):
    """NaNs at the same places; elsewhere |y - expected| within float32 accumulation error of the |A||W| bound,
    plus half-precision rounding of the result when y is float16."""
    y64 = np.asarray(y).astype(np.float64)
    nan_y, nan_ref = np.isnan(y64), np.isnan(expected)
    assert np.array_equal(nan_y, nan_ref), f"{what}: NaN positions differ ({nan_y.sum()} vs {nan_ref.sum()})"
    ok = ~nan_ref
    if np.asarray(y).dtype == np.float16:  # results beyond the fp16 range must come out as the same infinity
        overflow = ok & (np.abs(expected) >= 65520)
        with np.errstate(over="ignore"):
            assert np.array_equal(y64[overflow], expected[overflow].astype(np.float16)), f"{what}: fp16 overflow"
        ok &= ~overflow
    tolerance = 1e-5 * bound[ok] + 1e-30
    if np.asarray(y).dtype == np.float16:
        tolerance = tolerance + 1e-3 * np.abs(expected[ok])
    error = np.abs(y64[ok] - expected.astype(np.float64)[ok])
    assert np.all(error <= tolerance), f"{what}: max error {error.max():.3g}, worst ratio {np.max(error / tolerance):.3g}"


def mxfp4_case(rng, batch_shape, n, k, nan_block=False):
    a = rng.standard_normal(batch_shape + (k,)).astype(np.float32)
    b, scale = ref.random_mxfp4_weight(rng, n, k, scale_exponent_range=(118, 130))
    scale[0, 0] = 0  # 2^-127: a float32 subnormal
    if nan_block:
        scale[n - 1, k // 32 - 1] = 255
    return a, b, scale


def mxfp4_expected(a, b, scale):
    weight = ref.dequantize_mxfp4(b, scale)
    expected = a.astype(np.float64) @ weight.T
    bound = np.abs(a.astype(np.float64)) @ np.abs(np.nan_to_num(weight)).T
    return expected, bound


MXFP4_SHAPES = [((1,), 8, 64), ((3,), 17, 128), ((2, 3), 5, 96), ((4,), 6, 4096), ((9,), 40, 256)]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("batch_shape,n,k", MXFP4_SHAPES)
def test_cpu_mxfp4_matches_reference(batch_shape, n, k, dtype):
    rng = np.random.default_rng(k + n)
    a, b, scale = mxfp4_case(rng, batch_shape, n, k, nan_block=True)
    a = a.astype(dtype)
    y = native.matmul_mxfp4(a, b, scale)
    assert y.dtype == dtype and y.shape == batch_shape + (n,)
    expected, bound = mxfp4_expected(a, b, scale)
    assert_matches(y, expected, bound, f"mxfp4 {batch_shape} N={n} K={k} {np.dtype(dtype).name}")
    assert np.isnan(y[..., n - 1]).all() and not np.isnan(y[..., : n - 1]).any()  # e8m0 255 poisons its column


def test_cpu_mxfp4_every_code_and_nibble_order():
    # One row per code: weight row c holds code c at k=0 only (low nibble of byte 0), code 0 elsewhere.
    codes = np.zeros((16, 32), dtype=np.uint8)
    codes[:, 0] = np.arange(16)
    codes_odd = np.zeros((16, 32), dtype=np.uint8)
    codes_odd[:, 1] = np.arange(16)
    scale = np.full((16, 1), 127, dtype=np.uint8)
    a = np.zeros((2, 32), dtype=np.float32)
    a[0, 0] = 1.0
    a[1, 1] = 1.0
    expected = np.array(ref.E2M1_MAGNITUDES.tolist() + (-ref.E2M1_MAGNITUDES).tolist(), dtype=np.float32)
    y_even = native.matmul_mxfp4(a, ref.pack_fp4_low_nibble_first(codes), scale)
    y_odd = native.matmul_mxfp4(a, ref.pack_fp4_low_nibble_first(codes_odd), scale)
    np.testing.assert_array_equal(y_even[0], expected)
    np.testing.assert_array_equal(y_odd[1], expected)
    np.testing.assert_array_equal(y_even[1], 0)


def fp8_weight(rng, n, k):
    b = (rng.standard_normal((n, k)) * 40).astype(FP8)
    b.view(np.uint8)[0, :4] = [0x80, 0x00, 0x7E, 0xFE]  # -0, +0, 448, -448
    return b


def fp8_expected(a, b, b_scale, a_scale=None):
    a_dq = ref.quantize_dequantize_e4m3fn(a, ref.dynamic_row_scale(a) if a_scale is None else a_scale)
    weight = ref.dequantize_fp8_weight(b, b_scale)
    a64 = a_dq.astype(np.float64)
    with np.errstate(invalid="ignore"):
        return a64 @ weight.T, np.abs(np.nan_to_num(a64)) @ np.abs(np.nan_to_num(weight)).T


def edge_activations(rng, m, k, dtype):
    a = (rng.standard_normal((m, k)) * 60).astype(np.float32)
    big = 6e4 if dtype == np.float16 else 1e6
    a[0, :6] = [big, -big, np.inf, -0.0, 447.9, 464.0]  # saturation, -0, round-to-448 and ties
    if m > 2:
        a[2, 5] = np.nan
    if m > 3:
        a[3] = 0.0  # dynamic scale clamps at 1e-12
    return a.astype(dtype)


FP8_SHAPES = [(1, 8, 64), (4, 12, 128), (5, 3, 4096), (17, 33, 80)]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("m,n,k", FP8_SHAPES)
def test_cpu_fp8_w8a8_matches_reference(m, n, k, per_channel, dtype):
    rng = np.random.default_rng(m * n + k)
    a = edge_activations(rng, m, k, dtype)
    b = fp8_weight(rng, n, k)
    b_scale = (rng.random(n).astype(np.float32) + 0.05) if per_channel else np.float32(0.03)
    a_scale = np.float32(0.37)
    y = native.matmul_fp8_w8a8(a, b, b_scale, a_scale)
    expected, bound = fp8_expected(a, b, b_scale, a_scale)
    assert y.dtype == dtype
    assert_matches(y, expected, bound, f"fp8 static M={m} N={n} K={k}")
    y_dyn = native.matmul_fp8_w8a8_dyn(a, b, b_scale)
    expected_dyn, bound_dyn = fp8_expected(a, b, b_scale)
    assert_matches(y_dyn, expected_dyn, bound_dyn, f"fp8 dynamic M={m} N={n} K={k}")


def test_cpu_fp8_activation_rounding_is_exact():
    """With B = identity and unit scales, Y is the quantize-dequantized A itself: compare bit for bit."""
    k = 64
    rng = np.random.default_rng(7)
    a = (rng.standard_normal((3, k)) * 200).astype(np.float32)
    # every e4m3fn midpoint (ties), values around the saturation limit, subnormals
    grid = np.array(sorted(set(np.arange(256, dtype=np.uint8).view(FP8).astype(np.float32)) - {np.nan}))
    grid = grid[np.isfinite(grid) & (grid >= 0)]
    midpoints = (grid[:-1] + grid[1:]) / 2
    a[1, :] = midpoints[: k]
    a[2, :32] = midpoints[-32:]
    a[2, 32:36] = [448.0, 449.0, 1e9, -1e9]
    eye = np.eye(k, dtype=np.float32).astype(FP8)
    y = native.matmul_fp8_w8a8(a, eye, np.float32(1.0), np.float32(1.0))
    expected = ref.saturate_cast_e4m3fn(a).astype(np.float32)
    np.testing.assert_array_equal(y, expected)


def test_cpu_fp8_weight_nan_code_poisons_column():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((2, 32)).astype(np.float32)
    b = fp8_weight(rng, 4, 32)
    b.view(np.uint8)[2, 5] = 0x7F
    y = native.matmul_fp8_w8a8(a, b, np.float32(1.0), np.float32(0.1))
    assert np.isnan(y[:, 2]).all() and not np.isnan(y[:, [0, 1, 3]]).any()


def test_native_rejects_bad_shapes():
    rng = np.random.default_rng(0)
    b, scale = ref.random_mxfp4_weight(rng, 4, 64)
    with pytest.raises(ValueError, match="must end in K=64"):
        native.matmul_mxfp4(np.zeros((1, 32), np.float32), b, scale)
    with pytest.raises(ValueError, match="B_scale"):
        native.matmul_mxfp4(np.zeros((1, 64), np.float32), b, scale[:, :1])
    with pytest.raises(ValueError, match="per-channel"):
        native.matmul_fp8_w8a8(np.zeros((1, 8), np.float32), np.zeros((4, 8), np.uint8), np.ones(3, np.float32), 1.0)


def test_direct_compiler_build(tmp_path, monkeypatch):
    """The no-cmake fallback (one cc call) builds a library that loads and computes."""
    monkeypatch.setattr(native, "BUILD_DIR", tmp_path)
    monkeypatch.setattr(native, "_library", None)
    path = native.build(use_cmake=False)
    assert path.parent == tmp_path and path.exists()
    rng = np.random.default_rng(1)
    a, b, scale = mxfp4_case(rng, (2,), 3, 64)
    expected, bound = mxfp4_expected(a, b, scale)
    assert_matches(native.matmul_mxfp4(a, b, scale), expected, bound, "cc-built library")


# ---------------- ONNX-function fallbacks in ORT CPU (no custom-op library loaded) ----------------

def _value_info(name, elem_type, shape):
    return helper.make_tensor_value_info(name, elem_type, list(shape))


def run_single_node_model(op_type, feeds, input_types, out_type, out_shape, attrs=None, opset=21):
    names = list(feeds)
    node = functions.make_node(op_type, names, ["Y"], **(attrs or {}))
    graph = helper.make_graph([node], f"{op_type}_test",
                              [_value_info(n, t, feeds[n].shape) for n, t in zip(names, input_types)],
                              [_value_info("Y", out_type, out_shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    assert functions.attach_functions(model) == [op_type]
    onnx.checker.check_model(model)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    ort_feeds = {}
    for name, value in feeds.items():
        if value.dtype == FP8:
            value = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(value.view(np.uint8), TensorProto.FLOAT8E4M3FN)
        ort_feeds[name] = value
    return session.run(None, ort_feeds)[0]


ONNX_TYPE = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16}


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_function_mxfp4_in_ort(dtype):
    rng = np.random.default_rng(11)
    n, k = 6, 128
    a, b, scale = mxfp4_case(rng, (2, 3), n, k, nan_block=True)
    a = a.astype(dtype)
    y = run_single_node_model("MatMulMxfp4", {"A": a, "B": b, "B_scale": scale},
                              [ONNX_TYPE[dtype], TensorProto.UINT8, TensorProto.UINT8], ONNX_TYPE[dtype],
                              (2, 3, n), attrs={"K": k, "N": n})
    assert y.dtype == dtype
    expected, bound = mxfp4_expected(a, b, scale)
    assert_matches(y, expected, bound, "MatMulMxfp4 function")


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("dynamic", [False, True])
def test_function_fp8_in_ort(dynamic, per_channel, dtype):
    rng = np.random.default_rng(12)
    m, n, k = 5, 7, 96
    a = edge_activations(rng, m, k, dtype)
    b = fp8_weight(rng, n, k)
    b_scale = (rng.random(n).astype(np.float32) + 0.05) if per_channel else np.array(0.03, np.float32)
    feeds = {"A": a, "B": b, "B_scale": b_scale}
    types = [ONNX_TYPE[dtype], TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT]
    if not dynamic:
        feeds["A_scale"] = np.array(0.37, np.float32)
        types.append(TensorProto.FLOAT)
    op_type = "MatMulFp8W8A8Dyn" if dynamic else "MatMulFp8W8A8"
    y = run_single_node_model(op_type, feeds, types, ONNX_TYPE[dtype], (m, n))
    expected, bound = fp8_expected(a, b, b_scale, None if dynamic else np.float32(0.37))
    assert_matches(y, expected, bound, f"{op_type} function")


def test_function_fp8_activation_qdq_is_bit_exact_in_ort():
    k = 32
    a = (np.random.default_rng(5).standard_normal((4, k)) * 300).astype(np.float32)
    a[0, :4] = [1e9, -1e9, -0.0, 464.0]
    eye = np.eye(k, dtype=np.float32).astype(FP8)
    y = run_single_node_model("MatMulFp8W8A8", {"A": a, "B": eye, "B_scale": np.array(1.0, np.float32),
                                                "A_scale": np.array(1.0, np.float32)},
                              [TensorProto.FLOAT, TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT, TensorProto.FLOAT],
                              TensorProto.FLOAT, (4, k))
    np.testing.assert_array_equal(y, ref.saturate_cast_e4m3fn(a).astype(np.float32))


def test_model_with_weights_as_initializers_runs_without_library():
    """The shape the converter emits: weights are initializers, A is the only graph input."""
    rng = np.random.default_rng(13)
    k, n = 64, 10
    b, scale = ref.random_mxfp4_weight(rng, n, k)
    node = functions.make_node("MatMulMxfp4", ["A", "w.B", "w.B_scale"], ["Y"], name="proj", K=k, N=n)
    graph = helper.make_graph([node], "g", [_value_info("A", TensorProto.FLOAT, ["batch", k])],
                              [_value_info("Y", TensorProto.FLOAT, ["batch", n])],
                              initializer=[onnx.numpy_helper.from_array(b, "w.B"),
                                           onnx.numpy_helper.from_array(scale, "w.B_scale")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    functions.attach_functions(model)
    onnx.checker.check_model(model, full_check=True)
    a = rng.standard_normal((3, k)).astype(np.float32)
    y = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"A": a})[0]
    expected, bound = mxfp4_expected(a, b, scale)
    assert_matches(y, expected, bound, "initializer model")


def test_make_node_validates():
    with pytest.raises(ValueError, match="missing"):
        functions.make_node("MatMulMxfp4", ["A", "B", "S"], ["Y"], K=64)
    with pytest.raises(ValueError, match="multiple of 32"):
        functions.make_node("MatMulMxfp4", ["A", "B", "S"], ["Y"], K=48, N=4)
    with pytest.raises(ValueError, match="unknown"):
        functions.make_node("MatMulInt3", ["A"], ["Y"])
    with pytest.raises(ValueError, match="takes 4 inputs"):
        functions.make_node("MatMulFp8W8A8", ["A", "B", "S"], ["Y"])
    node = functions.make_node("MatMulFp8W8A8Dyn", ["A", "B", "S"], ["Y"])
    assert node.domain == functions.DOMAIN == "com.quark_onnx"
    assert set(functions.FUNCTIONS) == {"MatMulMxfp4", "MatMulFp8W8A8", "MatMulFp8W8A8Dyn", "MatMulBf16", "MatMulFp8",
                                        "MatMulInt8", "MatMulInt8W8A8", "MatMulNvfp4", "MatMulMxfp4R16", "MatMulNvfp4R16",
                                        "MatMulExpertsMxfp4R16", "MatMulExpertsNvfp4R16",
                                        "MatMulExpertsMxfp4", "MatMulExpertsNvfp4",
                                        "MatMulExpertsFp8", "MatMulExpertsInt8", "MatMulUint4", "MatMulInt4",
                                        "MatMulExpertsUint4", "MatMulExpertsInt4", "GroupQueryAttentionFixedOrder",
                                        "GroupQueryAttentionFixedOrderSinks", "QuantizeDequantizeFp8",
                                        "QuantizeDequantizeMxfp4", "QuantizeDequantizeNvfp4"}
    with pytest.raises(ValueError, match="opset >= 19"):
        functions.matmul_fp8_w8a8_function(onnx_opset=17)
