"""The MatMulNBits accuracy_level a model was built with is recorded in model.onnx's metadata and read back by
`verify` (builder/convert.py accuracy_levels, builder/verify.py built_accuracy_level); the CPU default and an
explicit accuracy_level=1 are both what the nodes carry."""
from __future__ import annotations

import onnx
import pytest

from builder import verify
from builder.convert import ACCURACY_LEVEL_KEY, convert
from builder.emit_context import BuildOptions

QUARK_EXPORTS = [("llama_h64", "uint4_g64")]


@pytest.mark.parametrize("level,expected", [(None, "4"), (1, "1")])
def test_accuracy_level_recorded_and_read_back(quark_exports, tmp_path, level, expected):
    out = tmp_path / "m"
    convert(quark_exports("llama_h64", "uint4_g64") / "quark", out, "cpu", options=BuildOptions(accuracy_level=level),
            log=lambda m: None)
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    nodes = {a.i for n in model.graph.node if n.op_type == "MatMulNBits" for a in n.attribute
             if a.name == "accuracy_level"}
    assert nodes == {int(expected)}
    assert {p.key: p.value for p in model.metadata_props}[ACCURACY_LEVEL_KEY] == expected
    assert verify.built_accuracy_level(str(out)) == expected


def test_accuracy_level_unknown_for_foreign_models(tmp_path):
    assert verify.built_accuracy_level(str(tmp_path)) == "unknown"
