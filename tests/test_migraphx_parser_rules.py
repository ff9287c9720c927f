"""MIGraphX parser-conformance rules (builder/ep_rules.py MIGRAPHX_PARSER_RULES): one hand-built graph breaking each
fact transcribed from AMDMIGraphX's onnx_parser.cpp / parse_*.cpp, and the form we emit passing it."""
from __future__ import annotations

import onnx
import pytest
from ep_graph_kit import matmul_nbits, model, tensor, vi
from onnx import TensorProto as T
from onnx import helper as h

from builder.__main__ import main
from builder.ep_check import check_findings
from builder.ep_configs import get_ep

NODE = "/model/layers.0/mlp/up_proj/node"


def errors(m, ep="migraphx") -> set[str]:
    return {f.rule for f in check_findings(m, get_ep(ep)) if f.severity == "error"}


def qdq_pair(zp_type=T.FLOAT8E4M3FNUZ, x_type=T.FLOAT, scale_type=T.FLOAT, output_dtype=None, zp_dims=()):
    attrs = {"output_dtype": output_dtype} if output_dtype is not None else {}
    q = h.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], NODE + "/Q", **attrs)
    dq = h.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"], NODE + "/DQ")
    return model([q, dq], [vi("x", x_type, [4])], [vi("y", scale_type, [4])],
                 [tensor("s", scale_type, []), tensor("zp", zp_type, list(zp_dims))])


@pytest.mark.parametrize("ep", ["migraphx", "rocm"])
def test_fnuz_qdq_pair_passes_and_e4m3fn_is_refused(ep):
    assert errors(qdq_pair(), ep) == set()
    bad = check_findings(qdq_pair(zp_type=T.FLOAT8E4M3FN), get_ep(ep))
    assert {f.rule for f in bad if f.severity == "error"} == {"migraphx-parser-type", "migraphx-parser-graph-types"}
    assert "Prototensor data type 17 not supported" in next(f.message for f in bad if f.rule == "migraphx-parser-type")
    for t in (T.FLOAT8E5M2, T.FLOAT8E5M2FNUZ):
        assert "migraphx-parser-type" in errors(qdq_pair(zp_type=t), ep)


def test_quantize_output_dtype_attribute_is_read_by_get_type():
    assert errors(qdq_pair(output_dtype=T.FLOAT8E4M3FNUZ)) == set()
    assert "migraphx-parser-type" in errors(qdq_pair(output_dtype=T.FLOAT8E4M3FN))
    # output_dtype must equal the zero point's type (parse_quantizelinear.cpp)
    assert errors(qdq_pair(zp_type=T.INT8, output_dtype=T.UINT8)) == {"migraphx-qdq-types"}


def test_quantize_x_and_scale_same_type_from_opset_19():
    assert errors(qdq_pair(x_type=T.FLOAT16, scale_type=T.FLOAT)) == {"migraphx-qdq-types"}
    assert errors(qdq_pair(x_type=T.FLOAT16, scale_type=T.FLOAT16)) == set()


def test_zero_point_shape_must_equal_scale_shape():
    assert errors(qdq_pair(zp_dims=(1,))) == {"migraphx-qdq-types"}


def test_cast_to_and_constant_value_and_graph_output_types():
    cast = model([h.make_node("Cast", ["x"], ["y"], NODE + "/Cast", to=T.FLOAT8E4M3FN)],
                 [vi("x", T.FLOAT, [4])], [vi("y", T.FLOAT, [4])])
    assert errors(cast) == {"migraphx-parser-type"}
    const = model([h.make_node("Constant", [], ["c"], NODE + "/Const",
                               value=tensor("v", T.FLOAT8E4M3FN, [2])),
                   h.make_node("Identity", ["x"], ["y"], NODE + "/Id")],
                  [vi("x", T.FLOAT, [4])], [vi("y", T.FLOAT, [4])])
    assert "migraphx-parser-type" in errors(const)
    out = model([h.make_node("Identity", ["x"], ["y"], NODE + "/Id")], [vi("x", T.FLOAT, [4])],
                [vi("y", T.FLOAT8E4M3FN, [4])])
    assert "migraphx-parser-graph-types" in errors(out)
    vinfo = model([h.make_node("Identity", ["x"], ["y"], NODE + "/Id")], [vi("x", T.FLOAT, [4])],
                  [vi("y", T.FLOAT, [4])])
    vinfo.graph.value_info.append(vi("x_fp4", T.FLOAT4E2M1, [4]))
    findings = [f for f in check_findings(vinfo, get_ep("migraphx")) if f.rule == "migraphx-parser-graph-types"]
    assert findings and "misread" in findings[0].message


def test_packed_int4_initializer_needs_even_last_dim():
    def dq(dims):
        node = h.make_node("DequantizeLinear", ["w", "s"], ["y"], NODE + "/DQ")
        return model([node], [], [vi("y", T.FLOAT, dims)], [tensor("w", T.INT4, dims), tensor("s", T.FLOAT, [])])
    assert errors(dq([4, 8])) == set()
    assert errors(dq([4, 7])) == {"migraphx-parser-graph-types"}


def blocked_dq(k=64, n=8, blocks=2, block_size=32, axis=0, scale_dims=None):
    node = h.make_node("DequantizeLinear", ["w", "s"], ["y"], NODE + "/DQ", axis=axis,
                       **({"block_size": block_size} if block_size else {}))
    return model([node], [], [vi("y", T.FLOAT16, [k, n])],
                 [tensor("w", T.INT8, [k, n]), tensor("s", T.FLOAT16, scale_dims or [blocks, n])])


def test_blocked_dequantize_granularity():
    assert errors(blocked_dq()) == set()                           # what quant/fp4_int8_dq.py emits
    assert errors(blocked_dq(k=32, blocks=1)) == {"migraphx-qdq-granularity"}   # one block: MIGraphX throws
    assert errors(blocked_dq(block_size=16)) == {"migraphx-qdq-granularity"}    # 64 / 2 blocks needs 32
    assert errors(blocked_dq(scale_dims=[2, 4])) == {"migraphx-qdq-granularity"}  # differs off axis
    assert errors(blocked_dq(scale_dims=[8], axis=1, block_size=0)) == set()     # per-axis along N
    assert errors(blocked_dq(scale_dims=[7], axis=1, block_size=0)) == {"migraphx-qdq-granularity"}


def test_input_counts_and_matmulnbits_scales():
    sln = h.make_node("SimplifiedLayerNormalization", ["x", "w", "b"], ["y"], NODE + "/SLN", epsilon=1e-5)
    m = model([sln], [vi("x", T.FLOAT, [1, 4])], [vi("y", T.FLOAT, [1, 4])],
              [tensor("w", T.FLOAT, [4]), tensor("b", T.FLOAT, [4])])
    assert errors(m) == {"migraphx-parser-input-count"}
    good = matmul_nbits()
    assert errors(good) == set()
    bad = matmul_nbits()
    scales = next(t for t in bad.graph.initializer if t.name == "scales")
    scales.CopyFrom(tensor("scales", T.FLOAT, [16]))
    assert errors(bad) == {"migraphx-matmulnbits-attrs"}


@pytest.mark.parametrize("attrs,ok", [
    (dict(axis=-1, block_size=32, element_dtype="fp4_e2m1", rounding_mode=2), True),
    (dict(axis=-1, block_size=16, element_dtype="fp4_e2m1", rounding_mode=2), False),
    (dict(axis=-1, block_size=32, element_dtype="fp6_e3m2", rounding_mode=2), False),
    (dict(axis=-1, block_size=32, element_dtype="fp4_e2m1", rounding_mode=0), False),
])
def test_mx_quantize_dequantize_attributes(attrs, ok):
    node = h.make_node("MXQuantizeDequantize", ["x"], ["y"], NODE + "/MXQDQ", domain="com.amd.quark", **attrs)
    m = model([node], [vi("x", T.FLOAT, [1, 64])], [vi("y", T.FLOAT, [1, 64])])
    assert (errors(m) == set()) == ok


def test_check_subcommand_reports_a_broken_graph(tmp_path, capsys):
    m = qdq_pair(zp_type=T.FLOAT8E4M3FN)
    (tmp_path / "m").mkdir()
    onnx.save(m, str(tmp_path / "m" / "model.onnx"))
    assert main(["check", str(tmp_path / "m"), "-e", "migraphx"]) == 1
    out = capsys.readouterr()
    assert "migraphx-parser-type" in out.out + out.err
    assert main(["check", str(tmp_path / "m"), "-e", "cpu"]) == 0
