"""com.quark_onnx MatMulExperts{Mxfp4,Nvfp4,Fp8,Int8} (custom_ops/src/qo_cpu_experts.c): the chosen experts' stacked
compact weights read in place. One-node models built here, in ORT with the custom-op library (1 and 2 intra-op
threads) and without it (the ONNX-function fallback), against
  - an independent float64 reference: the numpy decoders of tests/test_cpu_kernel_formats.py on each chosen expert;
  - the dense op of the same format (MatMulMxfp4 / MatMulNvfp4 / MatMulFp8 / MatMulInt8) run on that one expert's
    weight: bit for bit, at decode (T = 1) and prefill shapes (an expert chosen by > 4 tokens takes the GEMM path).
"""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from custom_ops import functions
from custom_ops.single_op import profiled_nodes, session
from test_cpu_kernel_formats import REL_FP32, e4m3fn_values, mxfp4_weight, nvfp4_weight

from ort_library_fixture import ort_ops_library  # noqa: F401  (fixture)

FORMATS = ("Mxfp4", "Nvfp4", "Fp8", "Int8")


def _init(name, value, elem=None):
    value = np.asarray(value)
    if elem is not None:
        return helper.make_tensor(name, elem, value.shape, value.tobytes(), raw=True)
    return numpy_helper.from_array(value, name)


def stack(fmt: str, rng, e: int, n: int, k: int, per_channel: bool = True):
    """({input name: TensorProto}, [E] float64 weights [N, K] from the independent decoders, dense op inputs per e)"""
    if fmt == "Mxfp4":
        b = rng.integers(0, 256, (e, n, k // 2), dtype=np.uint8)
        s = rng.integers(118, 134, (e, n, k // 32), dtype=np.uint8)
        return ({"B": _init("B", b), "B_scale": _init("B_scale", s)}, [mxfp4_weight(b[i], s[i]) for i in range(e)],
                [({"B": _init("B", b[i]), "B_scale": _init("B_scale", s[i])}, {"K": k, "N": n}) for i in range(e)])
    if fmt == "Nvfp4":
        b = rng.integers(0, 256, (e, n, k // 2), dtype=np.uint8)
        s = rng.integers(0x08, 0x7E, (e, n, k // 16), dtype=np.uint8)
        s2 = rng.uniform(0.01, 0.03, e).astype(np.float32)
        f8 = TensorProto.FLOAT8E4M3FN
        return ({"B": _init("B", b), "B_scale": _init("B_scale", s, f8), "B_scale_2": _init("B_scale_2", s2)},
                [nvfp4_weight(b[i], s[i], s2[i]) for i in range(e)],
                [({"B": _init("B", b[i]), "B_scale": _init("B_scale", s[i], f8),
                   "B_scale_2": _init("B_scale_2", np.array(s2[i]))}, {"K": k, "N": n}) for i in range(e)])
    scale = rng.uniform(0.5, 2, (e, n) if per_channel else (e,)).astype(np.float32)
    if fmt == "Fp8":
        b = rng.integers(0, 0x7E, (e, n, k), dtype=np.uint8) | (rng.integers(0, 2, (e, n, k), dtype=np.uint8) << 7)
        values, elem = e4m3fn_values(b), TensorProto.FLOAT8E4M3FN
    else:
        b = rng.integers(-128, 128, (e, n, k), dtype=np.int8)
        values, elem = b.astype(np.float64), None
        scale = scale * np.float32(1e-3)
    w = [values[i] * np.asarray(scale[i], np.float64).reshape(-1, 1) for i in range(e)]
    dense = [({"B": _init("B", b[i], elem), "B_scale": _init("B_scale", scale[i])}, {}) for i in range(e)]
    return {"B": _init("B", b, elem), "B_scale": _init("B_scale", scale)}, w, dense


def experts_model(fmt: str, inits: dict, function: bool = True):
    op = f"MatMulExperts{fmt}"
    names = functions.OP_INPUTS[op]
    node = functions.make_node(op, list(names), ["Y"], name=f"{op}_node")
    graph = helper.make_graph([node], op, [helper.make_tensor_value_info("A", TensorProto.FLOAT, None),
                                           helper.make_tensor_value_info("expert_ids", TensorProto.INT64, None)],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
                              [inits[n] for n in names[2:]])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid(functions.DOMAIN, functions.DOMAIN_VERSION)])
    model.ir_version = 10
    if function:
        functions.attach_functions(model)
    return model


def dense_model(fmt: str, inits: dict, attrs: dict):
    op = f"MatMul{fmt}"
    names = functions.OP_INPUTS[op]
    node = functions.make_node(op, list(names), ["Y"], name=f"{op}_node", **attrs)
    graph = helper.make_graph([node], op, [helper.make_tensor_value_info("A", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
                              [inits[n] for n in names[1:]])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid(functions.DOMAIN, functions.DOMAIN_VERSION)])
    model.ir_version = 10
    return model


def route(rng, t: int, e: int, k: int) -> np.ndarray:
    return np.stack([rng.choice(e, k, replace=False) for _ in range(t)]).astype(np.int64)


def reference(a: np.ndarray, ids: np.ndarray, w: list) -> tuple[np.ndarray, np.ndarray]:
    """float64 Y [T, k, N] and the bound sum |a| |w| for the relative error."""
    t, k = ids.shape
    rows = lambda i, s: a[i] if a.ndim == 2 else a[i, s]  # noqa: E731
    y = np.stack([np.stack([w[ids[i, s]] @ rows(i, s).astype(np.float64) for s in range(k)]) for i in range(t)])
    bound = np.stack([np.stack([np.abs(w[ids[i, s]]) @ np.abs(rows(i, s).astype(np.float64)) for s in range(k)])
                      for i in range(t)])
    return y, bound + 1e-30


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("t,per_slot", [(1, False), (3, True), (24, False)])
def test_experts_op(fmt, t, per_slot, ort_ops_library):
    """Kernel (1 and 2 threads) vs float64 reference and bit for bit vs the dense op on each chosen expert; the
    fallback function (no library) vs the reference. T = 24 with 6 experts top-3: each expert gets > 4 rows (GEMM)."""
    rng = np.random.default_rng({"Mxfp4": 1, "Nvfp4": 2, "Fp8": 3, "Int8": 4}[fmt] * 10 + t)
    e, k, n, kk = 6, 3, 40, 96
    inits, w, dense = stack(fmt, rng, e, n, kk, per_channel=t != 3)
    ids = route(rng, t, e, k)
    a = rng.standard_normal((t, k, kk) if per_slot else (t, kk)).astype(np.float32)
    model = experts_model(fmt, inits)
    feeds = {"A": a, "expert_ids": ids}
    y_ref, bound = reference(a, ids, w)
    outs = {}
    for threads in (1, 2):
        sess = session(model, library=ort_ops_library, profile=True, threads=threads)
        outs[threads] = sess.run(None, feeds)[0]
        assert ("MatMulExperts" + fmt, "CPUExecutionProvider") in profiled_nodes(sess)
    assert np.array_equal(outs[1], outs[2])
    y = outs[1]
    # the portable C path (no SIMD) gives the same bits
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QO_CPU_KERNELS", "portable")
        assert np.array_equal(session(model, library=ort_ops_library, threads=2).run(None, feeds)[0], y)
    assert y.shape == (t, k, n) and y.dtype == np.float32
    assert np.max(np.abs(y - y_ref) / bound) <= REL_FP32
    # bit for bit: the dense op on each chosen expert's own weight
    for ex in np.unique(ids):
        d_inits, attrs = dense[ex]
        dsess = session(dense_model(fmt, d_inits, attrs), library=ort_ops_library, threads=1)
        for i, s in zip(*np.nonzero(ids == ex)):
            row = (a[i] if a.ndim == 2 else a[i, s])[None]
            assert np.array_equal(dsess.run(None, {"A": row})[0][0], y[i, s]), (fmt, ex, i, s)
    # the ONNX-function fallback (plain ORT): the routed standard-op form
    y_fn = session(model).run(None, feeds)[0]
    assert np.max(np.abs(y_fn - y_ref) / bound) <= REL_FP32


@pytest.mark.parametrize("t", [1, 3])
def test_fp8_experts_activations_out_of_the_fp16_routes_range(t, ort_ops_library):
    """The FP8 experts check the op's activations once per call for the AVX2 GEMV's fp16 route (qo_cpu_fp8_half_range)
    and hand the answer to every block of weight rows. One token near 2^-124 (scaled sums in the float32 subnormals:
    tests/test_cpu_kernel_formats.py) puts the whole call on the integer route: the portable path's bits."""
    rng = np.random.default_rng(31 + t)
    e, k, n, kk = 4, 2, 40, 96
    inits, _, _ = stack("Fp8", rng, e, n, kk)
    ids = route(rng, t, e, k)
    a = rng.standard_normal((t, kk)).astype(np.float32)
    a[t - 1] *= np.float32(2.0**-124)
    model = experts_model("Fp8", inits)
    feeds = {"A": a, "expert_ids": ids}
    y = session(model, library=ort_ops_library, threads=2).run(None, feeds)[0]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QO_CPU_KERNELS", "portable")
        want = session(model, library=ort_ops_library, threads=2).run(None, feeds)[0]
    assert np.array_equal(y.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("t", [1, 3])
def test_fp8_experts_nan_code_in_the_constant_weight(t, ort_ops_library):
    """The kernel scans its constant FP8 weight for NaN codes once, when ORT creates it, and the AVX2 GEMV's fp16
    route tests the codes itself only when the scan found one (qo_cpu_set_fp8_weight_nan_free). One 0x7F code in a
    chosen expert: that output is NaN on the AVX2 path (forced where AVX-512 is present), as on the portable path.
    With the scan's answer forced to "none", the fp16 route decodes 0x7F as a finite value and this fails."""
    rng = np.random.default_rng(41 + t)
    e, k, n, kk = 4, 2, 40, 96
    ids = route(rng, t, e, k)
    b = rng.integers(0, 0x7E, (e, n, kk), dtype=np.uint8) | (rng.integers(0, 2, (e, n, kk), dtype=np.uint8) << 7)
    b[ids[0, 0], 3, 50] = 0x7F
    scale = rng.uniform(0.5, 2, (e, n)).astype(np.float32)
    inits = {"B": _init("B", b, TensorProto.FLOAT8E4M3FN), "B_scale": _init("B_scale", scale)}
    model = experts_model("Fp8", inits)
    feeds = {"A": rng.standard_normal((t, kk)).astype(np.float32), "expert_ids": ids}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QO_CPU_KERNELS", "avx2")
        y = session(model, library=ort_ops_library, threads=2).run(None, feeds)[0]
        mp.setenv("QO_CPU_KERNELS", "portable")
        want = session(model, library=ort_ops_library, threads=2).run(None, feeds)[0]
    assert np.isnan(y[0, 0, 3]) and np.isnan(y).sum() == np.sum(ids == ids[0, 0])
    np.testing.assert_array_equal(y, want)


def test_experts_op_rejects_bad_ids(ort_ops_library):
    rng = np.random.default_rng(5)
    inits, _, _ = stack("Fp8", rng, 4, 8, 32)
    sess = session(experts_model("Fp8", inits), library=ort_ops_library)
    with pytest.raises(Exception, match="MatMulExpertsFp8"):
        sess.run(None, {"A": np.ones((1, 32), np.float32), "expert_ids": np.array([[1, 4]], np.int64)})
