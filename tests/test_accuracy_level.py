"""The accuracy_level a model was built with is recorded in model.onnx's metadata and read back by `verify`
(builder/convert.py accuracy_levels, builder/verify.py built_accuracy_level). On cpu the 4-bit linears default to the
exact com.quark_onnx MatMulUint4 (recorded as level 1); an explicit accuracy_level other than 1, or
int4_linear=matmul_nbits, gives MatMulNBits at that level (4 by default)."""
from __future__ import annotations

import onnx
import pytest

from builder import verify
from builder.convert import ACCURACY_LEVEL_KEY, convert
from builder.emit_context import BuildOptions
from ort_library_fixture import ort_ops_library  # noqa: F401  (fixture)

QUARK_EXPORTS = [("llama_h64", "uint4_g64")]


@pytest.mark.parametrize("extra,level,op,expected", [
    ({}, None, "MatMulUint4", "1"),  # the cpu default: exact
    ({}, 1, "MatMulUint4", "1"),
    ({}, 4, "MatMulNBits", "4"),  # an explicit level other than 1 asks for MatMulNBits
    ({"int4_linear": "matmul_nbits"}, None, "MatMulNBits", "4"),
    ({"int4_linear": "matmul_nbits"}, 1, "MatMulNBits", "1"),
])
def test_accuracy_level_recorded_and_read_back(quark_exports, tmp_path, ort_ops_library, extra, level, op, expected):
    out = tmp_path / "m"
    convert(quark_exports("llama_h64", "uint4_g64") / "quark", out, "cpu",
            options=BuildOptions(accuracy_level=level, extra=dict(extra)), log=lambda m: None)
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count(op) >= 4 and ("MatMulNBits" in ops) == (op == "MatMulNBits")
    nodes = {a.i for n in model.graph.node if n.op_type == "MatMulNBits" for a in n.attribute
             if a.name == "accuracy_level"}
    assert nodes == ({int(expected)} if op == "MatMulNBits" else set())
    assert {p.key: p.value for p in model.metadata_props}[ACCURACY_LEVEL_KEY] == expected
    assert verify.built_accuracy_level(str(out)) == expected


def test_accuracy_level_unknown_for_foreign_models(tmp_path):
    assert verify.built_accuracy_level(str(tmp_path)) == "unknown"
