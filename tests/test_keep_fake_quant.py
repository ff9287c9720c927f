"""builder/ops/keep_fake_quant.py: Q/DQ pairs that MIGraphX's GPU pipeline would drop (simplify_qdq
remove_qdq_pairs) are rewritten to an equal-valued form it keeps; pairs feeding a quantizable MatMul are left alone.

Independent checks: ONNX Runtime computes bit-identical outputs before and after the rewrite (fp32 and fp16), and
tools/migraphx_gpu_qdq_sim.py (MIGraphX's rule applied to the ONNX graph) drops pairs from the graph before the
rewrite and none after; on a built -e rocm model, none either.
"""
from __future__ import annotations

import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))


class _Graph:  # the two GraphBuilder attributes keep_fake_quant uses
    def __init__(self, model):
        self.nodes = list(model.graph.node)
        self.initializers = list(model.graph.initializer)
        self.op_counts = {}
        self.outputs = list(model.graph.output)


def _model(io: int):
    np_io = np.float32 if io == T.FLOAT else np.float16
    w = np.random.default_rng(0).integers(-100, 100, (16, 8)).astype(np.int8)
    zp = nh.from_array(np.zeros((), ml_dtypes.float8_e4m3fnuz), "zp")
    zp.data_type = T.FLOAT8E4M3FNUZ
    nodes = [  # a: fake quantization feeding Relu (dropped on the GPU); b: feeding a quantizable MatMul (kept)
        h.make_node("QuantizeLinear", ["x", "s", "zp"], ["qa"], name="qa"),
        h.make_node("DequantizeLinear", ["qa", "s", "zp"], ["da"], name="da"),
        h.make_node("Relu", ["da"], ["ra"]),
        h.make_node("QuantizeLinear", ["x", "s", "zp"], ["qb"], name="qb"),
        h.make_node("DequantizeLinear", ["qb", "s", "zp"], ["db"], name="db"),
        h.make_node("DequantizeLinear", ["w", "sw"], ["dw"], name="dw"),
        h.make_node("MatMul", ["db", "dw"], ["mb"]),
        h.make_node("MatMul", ["ra", "dw"], ["ma"]),
        h.make_node("Add", ["ma", "mb"], ["y"])]
    inits = [nh.from_array(np.array(0.037, np_io), "s"), zp, nh.from_array(w, "w"),
             nh.from_array(np.array(0.01, np_io), "sw")]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", io, [4, 16])], [h.make_tensor_value_info("y", io, [4, 8])],
                     inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 21)])
    m.ir_version = 10
    return m


def _run(m, x):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.mark.parametrize("io", [T.FLOAT, T.FLOAT16])
def test_rewrite_is_exact_and_only_where_the_gpu_would_drop_the_pair(io):
    from builder.ops.keep_fake_quant import keep_fake_quant
    from migraphx_gpu_qdq_sim import simulate
    m = _model(io)
    x = (np.random.default_rng(1).standard_normal((4, 16)) * 5).astype(np.float32 if io == T.FLOAT else np.float16)
    before = _run(m, x)
    _, dropped = simulate(m)
    assert dropped == 1                       # the Relu use of `da`; `db` feeds MatMul(DQ, DQ): quant_dot
    g = _Graph(m)
    assert keep_fake_quant(g) == 1
    del m.graph.node[:]
    m.graph.node.extend(g.nodes)
    onnx.checker.check_model(m)
    qa = next(n for n in m.graph.node if n.name == "qa")
    qb = next(n for n in m.graph.node if n.name == "qb")
    assert list(qa.input[:2]) == ["qa/keep_x2", "qa/keep_s2"] and list(qb.input[:2]) == ["x", "s"]
    assert simulate(m)[1] == 0
    np.testing.assert_array_equal(_run(m, x), before)


def test_built_rocm_graph_keeps_every_fake_quantization(quark_exports, tmp_path):
    """FP8 W8A8 + FP8 KV cache + FP8 attention on -e rocm: no Q/DQ pair MIGraphX's GPU would drop."""
    from migraphx_gpu_qdq_sim import simulate
    from onnx_helpers import build
    out = build(quark_exports("llama_h64", "fp8_w8a8_kv_attn"), tmp_path / "onnx", "rocm", "fp32")
    model = onnx.load(str(out / "model.onnx"))
    assert sum(n.name.endswith("/KeepX2") for n in model.graph.node) > 0
    assert simulate(model)[1] == 0


QUARK_EXPORTS = [("llama_h64", "fp8_w8a8_kv_attn")]


def test_a_pair_returned_by_the_graph_or_read_in_a_branch_is_kept():
    """remove_qdq_pairs rewrites every use of the DequantizeLinear, the graph's return included; an If branch that
    reads it from the outer scope is a use too."""
    from builder.ops.keep_fake_quant import keep_fake_quant
    s = nh.from_array(np.array(0.5, np.float32), "s")
    branch = h.make_graph([h.make_node("Relu", ["d"], ["r"])], "b", [], [h.make_tensor_value_info("r", T.FLOAT, [4])])
    for nodes, outs in (([], ["d"]), ([h.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)],
                                      ["y"])):
        g = h.make_graph([h.make_node("QuantizeLinear", ["x", "s"], ["q"], name="q"),
                          h.make_node("DequantizeLinear", ["q", "s"], ["d"], name="d")] + nodes, "g",
                         [h.make_tensor_value_info("x", T.FLOAT, [4]), h.make_tensor_value_info("c", T.BOOL, [])],
                         [h.make_tensor_value_info(o, T.FLOAT, [4]) for o in outs], [s])
        gb = _Graph(h.make_model(g))
        assert keep_fake_quant(gb) == 1, outs


def test_check_warns_about_a_graph_whose_pairs_the_gpu_drops():
    """`python -m builder check` (ep_rules migraphx-gpu-drops-fake-quant): a warning for a graph built without the
    rewrite, none after it."""
    from builder.ep_check import check_findings
    from builder.ep_configs import get_ep
    from builder.ops.keep_fake_quant import keep_fake_quant
    m = _model(T.FLOAT)
    rule = "migraphx-gpu-drops-fake-quant"
    found = [f for f in check_findings(m, get_ep("rocm")) if f.rule == rule]
    assert len(found) == 1 and found[0].message.startswith("1 QuantizeLinear"), found
    g = _Graph(m)
    keep_fake_quant(g)
    del m.graph.node[:]
    m.graph.node.extend(g.nodes)
    assert not [f for f in check_findings(m, get_ep("rocm")) if f.rule == rule]
