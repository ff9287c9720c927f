"""INT8 W8A8 (Quark `int8` template: int8 per-tensor weights, static per-tensor int8 activations): converted QDQ graph
vs a PyTorch emulation of Quark's fake quantization (tests/w8a8_emulation.py), og.Generator greedy decoding,
emitted op types per EP, and ORT CPU's fusion into the integer path.
Measured max |logit difference| ONNX cpu vs emulation: 8e-7 (llama_h64 fp32).
"""
from __future__ import annotations

import onnxruntime as ort
import pytest
from onnx_helpers import op_types
from w8a8_emulation import TOL_VS_EMULATION, cpu_vs_references

from builder.convert import convert

QUARK_EXPORTS = [("llama_h64", "int8_w8a8")]


@pytest.fixture(scope="module")
def export(quark_exports):
    return quark_exports("llama_h64", "int8_w8a8")


def test_int8_cpu_matches_quark_emulation(export, tmp_path):
    r = cpu_vs_references(export, tmp_path / "cpu")
    assert r["vs_emulation"] < TOL_VS_EMULATION, r
    assert r["greedy"] == r["emu_greedy"] == r["quark_greedy"], r


@pytest.mark.parametrize("ep", ["cpu", "cuda", "migraphx"])
def test_int8_emitted_ops(export, ep, tmp_path):
    convert(export / "quark", tmp_path / ep, ep, log=lambda m: None)
    ops = op_types(tmp_path / ep)
    assert ops["QuantizeLinear"] == 14 and ops["DequantizeLinear"] == 28 and "GroupQueryAttention" in ops


def test_int8_cpu_lands_on_integer_matmul(export, tmp_path):
    """ORT CPU's graph optimizer rewrites the QDQ MatMuls into MatMulIntegerToFloat (integer GEMM)."""
    out = tmp_path / "cpu"
    convert(export / "quark", out, "cpu", log=lambda m: None)
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(out / "model.onnx"), so, providers=["CPUExecutionProvider"])
    import onnx
    ops = [n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx"), load_external_data=False).graph.node]
    assert ops.count("MatMulIntegerToFloat") + ops.count("DynamicQuantizeMatMul") + ops.count("QLinearMatMul") \
        + ops.count("MatMulInteger") >= 14, sorted(set(ops))


def test_int8_dynamic_activation_rejected(export, tmp_path):
    import json, shutil
    from builder.errors import ConversionError
    dst = tmp_path / "m"
    shutil.copytree(export / "quark", dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization_config"]["global_quant_config"]["input_tensors"]["is_dynamic"] = True
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionError, match="dynamic INT8 activations"):
        convert(dst, tmp_path / "o", "cpu", log=lambda m: None)
