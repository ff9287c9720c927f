"""INT8 W8A8 (Quark `int8` template: int8 per-tensor weights, static per-tensor int8 activations): converted QDQ graph
vs a PyTorch emulation of Quark's fake quantization (tests/w8a8_emulation.py), og.Generator greedy decoding,
emitted op types per EP, and which GEMM ORT CPU runs for each form.
CPU default (int8_linear=dequantized_weight): only the activation is Q/DQ'd, the weight is an fp32 initializer, so ORT
runs a float MatMul on every CPU; the opt-in qdq form is fused into MatMulIntegerToFloat, whose u8s8 kernel saturates
on x86 CPUs without VNNI (builder/quant/int8_w8a8.py).
Measured max |logit difference| ONNX cpu vs emulation: 8e-7 (llama_h64 fp32).
"""
from __future__ import annotations

import onnxruntime as ort
import pytest
from onnx_helpers import cpu_library_has_kernel, op_types
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


@pytest.mark.parametrize("ep,dq", [("cpu", 14), ("cuda", 28), ("migraphx", 28)])
def test_int8_emitted_ops(export, ep, dq, tmp_path):
    """GPU EPs: Q/DQ activation + DQ weight (28 DQ); CPU: MatMulInt8W8A8 on the int8 weights, the activation's
    quantizer inside the node (the Q/DQ activation + fp32 weights with a library without its kernel)."""
    convert(export / "quark", tmp_path / ep, ep, log=lambda m: None)
    ops = op_types(tmp_path / ep)
    compact = ep == "cpu" and cpu_library_has_kernel("MatMulInt8W8A8")  # the compact default: the checkpoint's bytes
    assert ops.get("QuantizeLinear", 0) == (0 if compact else 14) and ops.get("DequantizeLinear", 0) == (0 if compact else dq)
    # CPU: the explicit attention with the fixed-order softmax (issue 21; tests/test_isa_fixed_attention.py)
    assert ("GroupQueryAttention" in ops) == (ep != "cpu")
    assert ops.get("MatMulInt8W8A8", 0) == (14 if compact else 0) and "MatMulInt8" not in ops


INTEGER_GEMMS = ("MatMulIntegerToFloat", "DynamicQuantizeMatMul", "QLinearMatMul", "MatMulInteger")


def _optimized_ops(model_dir, tmp_path) -> list[str]:
    """Op types of the graph ORT CPU really runs (its optimizer's output at the default level)."""
    import onnx
    import json
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    library = json.loads((model_dir / "genai_config.json").read_text())["model"]["decoder"].get(
        "session_options", {}).get("custom_ops_library")
    if library:  # as og loads it
        so.register_custom_ops_library(str(model_dir / library))
    ort.InferenceSession(str(model_dir / "model.onnx"), so, providers=["CPUExecutionProvider"])
    return [n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx"), load_external_data=False).graph.node]


def test_int8_cpu_default_is_not_ort_integer_gemm(export, tmp_path):
    """The default CPU form never lands on ORT's integer GEMMs (whose u8s8 AVX2 kernel saturates without VNNI):
    without the library, 14 float MatMuls on Q/DQ'd activations; with it, 14 MatMulInt8W8A8 nodes (our exact integer
    GEMM, tests/test_int8_w8a8_kernel.py)."""
    out = tmp_path / "cpu"
    convert(export / "quark", out, "cpu", log=lambda m: None)
    ops = _optimized_ops(out, tmp_path)
    assert not set(ops) & set(INTEGER_GEMMS), sorted(set(ops))
    if cpu_library_has_kernel("MatMulInt8W8A8"):
        assert ops.count("MatMulInt8W8A8") == 14 and "QuantizeLinear" not in ops, sorted(set(ops))
    else:
        assert ops.count("QuantizeLinear") == 14 and ops.count("DequantizeLinear") == 14, sorted(set(ops))


def test_int8_qdq_option_lands_on_integer_matmul(export, tmp_path):
    """int8_linear=qdq: ORT CPU's graph optimizer rewrites the QDQ MatMuls into MatMulIntegerToFloat."""
    from builder.emit_context import BuildOptions
    out = tmp_path / "cpu_qdq"
    convert(export / "quark", out, "cpu", options=BuildOptions(extra={"int8_linear": "qdq"}), log=lambda m: None)
    ops = _optimized_ops(out, tmp_path)
    assert sum(ops.count(op) for op in INTEGER_GEMMS) >= 14, sorted(set(ops))


def test_int8_linear_option_refused_when_unknown(export, tmp_path):
    from builder.emit_context import BuildOptions
    from builder.errors import ConversionError
    with pytest.raises(ConversionError, match="int8_linear"):
        convert(export / "quark", tmp_path / "o", "cpu", options=BuildOptions(extra={"int8_linear": "u8u8"}),
                log=lambda m: None)
    assert not (tmp_path / "o").exists()


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
