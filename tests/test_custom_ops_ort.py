"""The com.quark_onnx kernels inside ONNX Runtime: the library built by custom_ops/ort_library.py registered with
SessionOptions.register_custom_ops_library, each op x A dtype x scale layout against custom_ops/reference.py (float64,
shares no code with the kernels), the profiler showing the custom node (not the function body), the kernel preferred
over the model-local function, and bad attributes / inputs refused with a clean ORT error."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

from custom_ops import reference as ref
from custom_ops.single_op import profiled_nodes, session, single_op_model

from ort_library_fixture import ort_ops_library  # noqa: F401  (fixture)

FP8 = ml_dtypes.float8_e4m3fn
# Max |Y - reference| / (|A| @ |W|.T), measured on these cases (ORT 1.32 CPU, gcc 12 -O3): fp32 1.2e-7 (MXFP4,
# K=2048; float32 accumulation; FP8 <= 4.7e-8), fp16 1.8e-4 (the result rounded to fp16, the reference kept in
# float64). Bounds with ~2.5x headroom.
REL_BOUND = {np.float32: 3e-7, np.float16: 4e-4}
SHAPES = [((1,), 24, 256), ((7,), 40, 2048), ((2, 3), 17, 96)]  # (A batch dims, N, K): decode, prefill, batched


def fp8_weight(rng, n, k, layout):
    w = rng.standard_normal((n, k)).astype(np.float32)
    if layout == "per_channel":
        scale = (np.abs(w).max(axis=1) / 448 * rng.uniform(0.5, 2.0, n)).astype(np.float32)
    else:
        scale = np.float32(np.abs(w).max() / 448)
    b = ref.saturate_cast_e4m3fn(w / np.reshape(scale, (-1, 1)))
    return b, scale


def case(op, layout, dtype, batch, n, k, seed=0):
    """(weights by input name, A, float64 expected, float64 |A|@|W| bound)."""
    rng = np.random.default_rng(seed + n + k)
    a = (rng.standard_normal(batch + (k,)) * 3).astype(dtype)
    a64 = a.astype(np.float64)
    if op == "MatMulMxfp4":
        b, s = ref.random_mxfp4_weight(rng, n, k, scale_exponent_range=(118, 130))
        weights = {"B": b, "B_scale": s}
        expected = ref.matmul_mxfp4(a64, b, s)
        w = ref.dequantize_mxfp4(b, s)
    else:
        b, s = fp8_weight(rng, n, k, layout)
        weights = {"B": b, "B_scale": s}
        w = ref.dequantize_fp8_weight(b, s)
        if op == "MatMulFp8W8A8":
            # 0.7 x amax/448: the largest activations saturate at +-448, as they do past a calibrated scale
            weights["A_scale"] = np.float32(0.7 * np.abs(a.astype(np.float32)).max() / 448)
            expected = ref.matmul_fp8_w8a8(a64, b, s, weights["A_scale"])
        else:
            expected = ref.matmul_fp8_w8a8_dyn(a64, b, s)
    bound = np.abs(a64) @ np.abs(w).T
    return weights, a, expected, bound


OP_LAYOUTS = [("MatMulMxfp4", "e8m0_blocks"), ("MatMulFp8W8A8", "per_tensor"), ("MatMulFp8W8A8", "per_channel"),
              ("MatMulFp8W8A8Dyn", "per_tensor"), ("MatMulFp8W8A8Dyn", "per_channel")]


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("op,layout", OP_LAYOUTS)
def test_kernel_in_ort_matches_reference(ort_ops_library, op, layout, dtype):
    for batch, n, k in SHAPES:
        weights, a, expected, bound = case(op, layout, dtype, batch, n, k)
        sess = session(single_op_model(op, dtype, k, weights), library=ort_ops_library, profile=True)
        y = sess.run(None, {"A": a})[0]
        nodes = profiled_nodes(sess)
        assert nodes == [(op, "CPUExecutionProvider")], f"{op}: profile shows {nodes}, not the one custom node"
        assert y.dtype == dtype and y.shape == batch + (n,)
        rel = np.max(np.abs(y.astype(np.float64) - expected) / bound)
        assert rel <= REL_BOUND[dtype], f"{op} {layout} {np.dtype(dtype).name} {batch} N={n} K={k}: rel {rel:.3g}"


@pytest.mark.parametrize("op", ["MatMulFp8", "MatMulFp8W8A8Dyn", "MatMulFp8W8A8"])
def test_fp8_nan_code_in_the_constant_weight(ort_ops_library, op):
    """The FP8 ops scan their constant weight for NaN codes once, when ORT creates the kernel; the AVX2 GEMV's fp16
    route skips its own test only when the scan found none (qo_cpu_set_fp8_weight_nan_free). One 0x7F code in row 5:
    at decode (M = 1) on the AVX2 path (forced where AVX-512 is present) output 5 is NaN and every output has the
    portable path's bits; the same weight without the code gives them too. With the scan's answer forced to "none",
    the fp16 route decodes 0x7F as a finite value and this fails."""
    rng = np.random.default_rng(17)
    n, k = 24, 256
    b, s = fp8_weight(rng, n, k, "per_channel")
    a = rng.standard_normal((1, k)).astype(np.float32)
    b_nan = b.copy()
    b_nan.view(np.uint8)[5, 100] = 0x7F
    outs = {}
    for name, weight in (("clean", b), ("nan", b_nan)):
        weights = {"B": weight, "B_scale": s}
        if op == "MatMulFp8W8A8":
            weights["A_scale"] = np.float32(np.abs(a).max() / 448)
        model = single_op_model(op, np.float32, k, weights)
        for path in ("avx2", "portable"):
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("QO_CPU_KERNELS", path)
                outs[name, path] = session(model, library=ort_ops_library, threads=2).run(None, {"A": a})[0]
    assert np.isnan(outs["nan", "avx2"][0, 5]) and np.isnan(outs["nan", "avx2"]).sum() == 1
    assert np.all(np.isfinite(outs["clean", "avx2"]))
    for name in ("clean", "nan"):
        np.testing.assert_array_equal(outs[name, "avx2"], outs[name, "portable"])


@pytest.mark.parametrize("op,layout", [("MatMulMxfp4", "e8m0_blocks"), ("MatMulFp8W8A8", "per_channel"),
                                       ("MatMulFp8W8A8Dyn", "per_tensor")])
def test_kernel_preferred_over_function(ort_ops_library, op, layout):
    """The same model carries the FunctionProto: without the library ORT inlines it (standard ops in the profile, the
    weight decode constant-folded), with the library the kernel runs; both match the reference."""
    weights, a, expected, bound = case(op, layout, np.float32, (5,), 24, 256)
    model = single_op_model(op, np.float32, 256, weights)
    assert [f.name for f in model.functions] == [op]
    with_function = session(model, profile=True)
    y_function = with_function.run(None, {"A": a})[0]
    function_ops = {name for name, _ in profiled_nodes(with_function)}
    assert op not in function_ops and "MatMul" in function_ops, function_ops
    # ORT folds the body's weight decoding (all of its inputs are initializers) into a constant at load:
    # custom_ops/README.md's "memory, not speed"
    assert not function_ops & {"Transpose", "Gather", "Reshape"}, function_ops
    with_kernel = session(model, library=ort_ops_library, profile=True)
    y_kernel = with_kernel.run(None, {"A": a})[0]
    assert profiled_nodes(with_kernel) == [(op, "CPUExecutionProvider")]
    assert np.max(np.abs(y_kernel - expected) / bound) <= REL_BOUND[np.float32]
    # ORT's own fp32 MatMul in the function body: 3.1e-7 measured (MXFP4, K=256)
    assert np.max(np.abs(y_function - expected) / bound) <= 1e-6


def _ort_error(excinfo) -> str:
    assert isinstance(excinfo.value, (ort_state.Fail, ort_state.InvalidArgument, ort_state.RuntimeException)), \
        type(excinfo.value)
    return str(excinfo.value)


def test_wrong_mxfp4_attribute_is_a_clean_ort_error(ort_ops_library):
    weights, a, _, _ = case("MatMulMxfp4", "e8m0_blocks", np.float32, (2,), 24, 256)
    model = single_op_model("MatMulMxfp4", np.float32, 256, weights, attributes={"K": 256, "N": 25})
    session(model).run(None, {"A": a})  # the function ignores K/N: it accepts the wrong N
    sess = session(model, library=ort_ops_library)
    with pytest.raises(Exception) as excinfo:
        sess.run(None, {"A": a})
    assert "com.quark_onnx: MatMulMxfp4: attributes K/N do not match the tensors" in _ort_error(excinfo)


def test_missing_mxfp4_attribute_refused_at_session_creation(ort_ops_library):
    weights, a, _, _ = case("MatMulMxfp4", "e8m0_blocks", np.float32, (2,), 24, 256)
    model = single_op_model("MatMulMxfp4", np.float32, 256, weights, attributes={"K": 256})
    with pytest.raises(Exception) as excinfo:
        session(model, library=ort_ops_library).run(None, {"A": a})
    assert "No attribute with name:'N'" in _ort_error(excinfo)  # ORT's KernelInfoGetAttribute status, passed on


@pytest.mark.parametrize("bad,message", [
    ("b_scale_len", "MatMulFp8W8A8: B_scale must be a scalar or [N]"),
    ("a_scale_vector", "MatMulFp8W8A8: A_scale must be a scalar"),
    ("k_mismatch", "MatMulFp8W8A8: B must be [N, K]"),
])
def test_bad_fp8_inputs_are_clean_ort_errors(ort_ops_library, bad, message):
    weights, a, _, _ = case("MatMulFp8W8A8", "per_channel", np.float32, (2,), 24, 256)
    if bad == "b_scale_len":
        weights["B_scale"] = np.concatenate([weights["B_scale"], [1.0]]).astype(np.float32)
    elif bad == "a_scale_vector":
        weights["A_scale"] = np.full(2, weights["A_scale"], np.float32)
    else:
        a = a[:, :128].copy()
    sess = session(single_op_model("MatMulFp8W8A8", np.float32, 256, weights), library=ort_ops_library)
    with pytest.raises(Exception) as excinfo:
        sess.run(None, {"A": a})
    assert f"com.quark_onnx: {message}" in _ort_error(excinfo)


def test_library_exports_only_the_registration_and_kernel_abi(ort_ops_library):
    import ctypes
    lib = ctypes.CDLL(ort_ops_library)
    assert lib.qo_abi_version() == 1 and hasattr(lib, "RegisterCustomOps")
