"""com.quark_onnx MatMulExpertsUint4 / MatMulExpertsInt4 (custom_ops/src/qo_cpu_experts.c over qo_cpu_int4.c): the
chosen experts' stacked 4-bit weights (MatMulNBits' layout per expert, [E, N, k_blocks, block/2]) read in place.
One-node models built here, in ORT with the custom-op library and without it (the ONNX-function fallback), against
  - an independent numpy decode written here: W[n, k] = fp32((q - z) * s) with (q - z) * s formed in float64 and
    rounded once to float32 (Quark's dequantization: the integer difference and the float32 scale are exact, so the
    float64 product rounds to the float32 product), z = 8 for the symmetric (Int4) form; the sum in float64;
  - the dense MatMulUint4 / MatMulInt4 on each chosen expert's own weight: bit for bit;
  - itself across QO_CPU_KERNELS paths (portable C, AVX2, the best the CPU has) and 1 / 2 intra-op threads.
K and N are not multiples of any tile; T = 1, 3, 12, 24, 128 (an expert's rows: <= 4 one GEMV, 5-16 GEMVs of <= 4
rows, more the decoded-panel tiles; the dense op takes the panel above 4 rows, so each path is checked against
another); k = 1, 2 and 8.
"""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from custom_ops import functions
from custom_ops.single_op import profiled_nodes, session

from ort_library_fixture import ort_ops_library  # noqa: F401  (fixture)

E, N, K = 10, 37, 200
FP32_REL = (K + 2) * 2.0 ** -24  # |y - exact| <= (K + 2) u sum |a| |w|: float32 fma accumulation of K terms


def stack(rng, block: int, asym: bool):
    """(B [E, N, kb, bs/2], scales [E, N, kb], zero_points [E, N, ceil(kb/2)] or None, W [E, N, K] float32)"""
    kb = -(-K // block)
    q = rng.integers(0, 16, (E, N, kb * block), dtype=np.uint8)
    q[:, :, K:] = 0  # the last block's padding: zero nibbles
    s = (rng.standard_normal((E, N, kb)) * 0.02).astype(np.float32)
    z = rng.integers(0, 16, (E, N, kb), dtype=np.uint8) if asym else np.full((E, N, kb), 8, np.uint8)
    b = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8).reshape(E, N, kb, block // 2)
    zp = None
    if asym:
        zpad = np.concatenate([z, np.zeros((E, N, kb % 2), np.uint8)], axis=2)
        zp = (zpad[..., 0::2] | (zpad[..., 1::2] << 4)).astype(np.uint8)
    diff = q[..., :K].astype(np.float64) - np.repeat(z, block, axis=2)[..., :K].astype(np.float64)
    w = (diff * np.repeat(s, block, axis=2)[..., :K].astype(np.float64)).astype(np.float32)
    return b, s, zp, w


def _model(op: str, inits: list, inputs: list, attrs: dict):
    names = list(functions.OP_INPUTS[op])
    node = functions.make_node(op, names, ["Y"], name=f"{op}_node", **attrs)
    graph = helper.make_graph([node], op, [helper.make_tensor_value_info(n, TensorProto.INT64 if n == "expert_ids"
                                                                         else TensorProto.FLOAT, None)
                                           for n in inputs],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid(functions.DOMAIN, functions.DOMAIN_VERSION)])
    model.ir_version = 10
    functions.attach_functions(model)
    return model


def experts_model(b, s, zp, **attrs):
    op = "MatMulExpertsUint4" if zp is not None else "MatMulExpertsInt4"
    inits = [numpy_helper.from_array(b, "B"), numpy_helper.from_array(s, "scales")]
    if zp is not None:
        inits.append(numpy_helper.from_array(zp, "zero_points"))
    return _model(op, inits, ["A", "expert_ids"], attrs)


def dense_model(b, s, zp, block):
    op = "MatMulUint4" if zp is not None else "MatMulInt4"
    inits = [numpy_helper.from_array(b, "B"), numpy_helper.from_array(s.reshape(-1), "scales")]
    if zp is not None:
        inits.append(numpy_helper.from_array(zp, "zero_points"))
    return _model(op, inits, ["A"], {"K": K, "N": N, "block_size": block})


def route(rng, t: int, k: int) -> np.ndarray:
    return np.stack([rng.choice(E, k, replace=False) for _ in range(t)]).astype(np.int64)


def rows_of(a, i, s):
    return a[i] if a.ndim == 2 else a[i, s]


def check_close(y, a, ids, w):
    t, k = ids.shape
    for i in range(t):
        for s in range(k):
            row, wt = rows_of(a, i, s).astype(np.float64), w[ids[i, s]].astype(np.float64)
            err = np.abs(y[i, s].astype(np.float64) - wt @ row)
            assert np.all(err <= FP32_REL * (np.abs(wt) @ np.abs(row)) + 1e-30), (i, s)


@pytest.mark.parametrize("block,asym", [(32, True), (32, False), (128, True)])
# experts' rows per call: <= 4 (GEMV), 5-16 (GEMVs of <= 4 rows; T = 12 / 24), > 16 (the decoded panel; T = 128)
@pytest.mark.parametrize("t,k,per_slot", [(1, 8, False), (3, 1, True), (3, 8, False), (12, 8, False), (24, 2, True),
                                          (128, 8, False)])
def test_int4_experts_op(block, asym, t, k, per_slot, ort_ops_library, monkeypatch):
    rng = np.random.default_rng(block * 1000 + t * 10 + k + asym)
    b, s, zp, w = stack(rng, block, asym)
    ids = route(rng, t, k)
    if t in (12, 24):
        assert np.any((np.bincount(ids.ravel()) > 4) & (np.bincount(ids.ravel()) <= 16))
    a = rng.standard_normal((t, k, K) if per_slot else (t, K)).astype(np.float32)
    feeds = {"A": a, "expert_ids": ids}
    model = experts_model(b, s, zp)
    op = model.graph.node[0].op_type
    outs = {}
    for threads in (1, 2):
        sess = session(model, library=ort_ops_library, profile=True, threads=threads)
        outs[threads] = sess.run(None, feeds)[0]
        assert (op, "CPUExecutionProvider") in profiled_nodes(sess)
    y = outs[1]
    assert y.shape == (t, k, N) and y.dtype == np.float32
    np.testing.assert_array_equal(outs[2].view(np.uint32), y.view(np.uint32))
    for path in ("portable", "avx2", "avx512"):  # each falls back to what the CPU has; the same bits on every one
        monkeypatch.setenv("QO_CPU_KERNELS", path)
        y_path = session(model, library=ort_ops_library, threads=2).run(None, feeds)[0]
        np.testing.assert_array_equal(y_path.view(np.uint32), y.view(np.uint32), err_msg=path)
    monkeypatch.delenv("QO_CPU_KERNELS")
    check_close(y, a, ids, w)
    # bit for bit: the dense op on each chosen expert's weight, its rows in one batch (a row's result is M-free)
    for ex in np.unique(ids):
        dsess = session(dense_model(b[ex], s[ex], None if zp is None else zp[ex], block), library=ort_ops_library)
        pairs = list(zip(*np.nonzero(ids == ex)))
        rows = np.stack([rows_of(a, i, sl) for i, sl in pairs])
        y_dense = dsess.run(None, {"A": rows})[0]
        got = np.stack([y[i, sl] for i, sl in pairs])
        np.testing.assert_array_equal(got.view(np.uint32), y_dense.view(np.uint32), err_msg=f"expert {ex}")
    # the ONNX-function fallback (plain ORT): the routed standard-op decode, equal within float32 rounding
    y_fn = session(model).run(None, feeds)[0]
    check_close(y_fn, a, ids, w)


def test_int4_experts_rejects_bad_input(ort_ops_library):
    rng = np.random.default_rng(7)
    b, s, zp, _ = stack(rng, 32, True)
    sess = session(experts_model(b, s, zp), library=ort_ops_library)
    with pytest.raises(Exception, match="MatMulExpertsUint4"):
        sess.run(None, {"A": np.ones((1, K), np.float32), "expert_ids": np.array([[1, E]], np.int64)})
    with pytest.raises(Exception, match="MatMulExpertsUint4"):
        sess.run(None, {"A": np.ones((1, K + 40), np.float32), "expert_ids": np.array([[1, 2]], np.int64)})


@pytest.mark.parametrize("block,asym", [(32, True), (32, False), (64, True), (128, True)])
@pytest.mark.parametrize("t,k,per_slot", [(1, 8, False), (3, 2, True), (12, 8, False), (128, 8, False)])
def test_int4_experts_op_level4(block, asym, t, k, per_slot, ort_ops_library, monkeypatch):
    """accuracy_level=4: each (token, slot) equals the dense int8-activation kernel (qo_matmul_int4_a8_f32, itself
    checked against numpy and onnxruntime's MatMulNBits level 4 in tests/test_int4_a8_kernel.py) on that expert, bit
    for bit, on every path and thread count; the ONNX-function fallback (the same activation codes in standard ops,
    float products) within float rounding of it."""
    from custom_ops import native
    from tests.test_int4_a8_kernel import reference

    rng = np.random.default_rng(block * 100 + t * 10 + k + asym)
    b, s, zp, _ = stack(rng, block, asym)
    ids = route(rng, t, k)
    a = rng.standard_normal((t, k, K) if per_slot else (t, K)).astype(np.float32)
    feeds = {"A": a, "expert_ids": ids}
    model = experts_model(b, s, zp, accuracy_level=4)
    sess = session(model, library=ort_ops_library, profile=True, threads=1)
    y = sess.run(None, feeds)[0]
    assert (model.graph.node[0].op_type, "CPUExecutionProvider") in profiled_nodes(sess)
    for threads, path in ((2, None), (2, "portable"), (1, "avx2")):
        if path:
            monkeypatch.setenv("QO_CPU_KERNELS", path)
        y_other = session(model, library=ort_ops_library, threads=threads).run(None, feeds)[0]
        np.testing.assert_array_equal(y_other.view(np.uint32), y.view(np.uint32), err_msg=f"{threads} {path}")
    monkeypatch.delenv("QO_CPU_KERNELS", raising=False)
    mag_max = 0.0
    for i in range(t):
        for sl in range(k):
            e = ids[i, sl]
            row = rows_of(a, i, sl)[None]
            zp_e = None if zp is None else zp[e]
            dense = native.matmul_int4(row, b[e], s[e], zp_e, K, block, accuracy_level=4)[0]
            np.testing.assert_array_equal(y[i, sl].view(np.uint32), dense.view(np.uint32), err_msg=f"{i} {sl}")
            mag_max = max(mag_max, float(reference(row, b[e], s[e], zp_e, K, block)[1].max()))
    y_fn = session(model).run(None, feeds)[0]  # the function fallback: float32 products of the same codes
    assert np.abs(y_fn - y).max() <= mag_max * 64 * 2.0 ** -24


def test_int4_experts_refuses_other_accuracy_levels(ort_ops_library):
    rng = np.random.default_rng(3)
    b, s, zp, _ = stack(rng, 32, True)
    with pytest.raises(ValueError, match="accuracy_level must be one of"):
        experts_model(b, s, zp, accuracy_level=2)
