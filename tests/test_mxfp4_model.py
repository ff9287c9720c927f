"""MXFP4 end to end: real amd-quark exports of a tiny Llama -> ONNX -> ORT / og.Generator vs Quark's own model.

References (tests/quark_factory.py, made by Quark itself, not by the converter):
  reference.npz logits / greedy : Quark's frozen fake-quantized model (weights AND dynamic MXFP4 activations)
  reference.npz dequant_logits  : fp32 PyTorch model on Quark's dequantized weights (no activation quantization)
  quark_dequant.npz             : Quark's dequantized weight per Linear
and tests/independent_decode.py (a decoder written from docs, sharing no code with builder/).
Helpers shared with test_nvfp4_model.py: tests/fp4_checks.py, tests/onnx_helpers.py.
"""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from fp4_checks import LOGIT_TOL, check_weights_bit_exact
from onnx_helpers import build, genai_greedy, op_types, prompt_logits

QUARK_EXPORTS = [("llama_h64", "mxfp4")]


@pytest.fixture(scope="module")
def mxfp4_export(quark_exports):
    return quark_exports("llama_h64", "mxfp4")


def test_mxfp4_cpu_matches_quark(mxfp4_export, tmp_path):
    ref = np.load(mxfp4_export / "reference.npz")
    out = build(mxfp4_export, tmp_path / "m")
    cfg = json.loads((out / "genai_config.json").read_text())
    assert cfg["model"]["decoder"]["filename"] == "model.onnx"
    logits = prompt_logits(out, ref["input_ids"])
    assert np.abs(logits - ref["logits"]).max() < LOGIT_TOL
    assert genai_greedy(out, ref["input_ids"]) == ref["greedy"].tolist()
    assert check_weights_bit_exact(mxfp4_export, out) == 14          # CPU default: the checkpoint's bytes
    assert op_types(out).get("MatMulMxfp4") == 14


def test_mxfp4_matmul_nbits8_lossless(mxfp4_export, tmp_path):
    """8-bit MatMulNBits re-encoding: bit-exact weights; Quark-exact at accuracy_level 1, not at 4 (docs/fp4.md)."""
    ref = np.load(mxfp4_export / "reference.npz")
    out = build(mxfp4_export, tmp_path / "m", fp4_linear="matmul_nbits8", accuracy_level=1)
    assert op_types(out).get("MatMulNBits") == 14
    assert check_weights_bit_exact(mxfp4_export, out) == 14
    assert np.abs(prompt_logits(out, ref["input_ids"]) - ref["logits"]).max() < LOGIT_TOL
    assert genai_greedy(out, ref["input_ids"]) == ref["greedy"].tolist()


def test_mxfp4_skip_activations_is_weight_only(mxfp4_export, tmp_path):
    """mx_activations=skip: the ONNX model equals PyTorch on Quark's dequantized weights, and differs from Quark."""
    ref = np.load(mxfp4_export / "reference.npz")
    out = build(mxfp4_export, tmp_path / "m", mx_activations="skip")
    logits = prompt_logits(out, ref["input_ids"])
    assert np.abs(logits - ref["dequant_logits"]).max() < LOGIT_TOL
    assert np.abs(logits - ref["logits"]).max() > 100 * LOGIT_TOL, "activation emulation should matter"
    assert "Round" not in op_types(out)


def test_mxfp4_dq_fp8_path_runs_on_cpu(mxfp4_export, tmp_path):
    """fp4_linear=dq_fp8 (DequantizeLinear of e2m1 coded as float8e4m3fn, blocked scales) is exact too. MIGraphX's
    parser refuses float8e4m3fn, so rocm/migraphx use dq_int8 instead (tests/test_migraphx_forms.py)."""
    ref = np.load(mxfp4_export / "reference.npz")
    out = build(mxfp4_export, tmp_path / "m", ep="cpu", fp4_linear="dq_fp8")
    counts = op_types(out)
    assert counts.get("DequantizeLinear", 0) >= 14 and "MatMulNBits" not in counts
    logits = prompt_logits(out, ref["input_ids"])
    assert np.abs(logits - ref["logits"]).max() < LOGIT_TOL


def test_mxfp4_cuda_graph(mxfp4_export, tmp_path):
    out = build(mxfp4_export, tmp_path / "m", ep="cuda", precision="fp16")
    counts = op_types(out)
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    try:
        import custom_ops.functions  # noqa: F401
    except ImportError:
        assert counts.get("MatMulNBits") == 14
        return
    assert counts.get("MatMulMxfp4") == 14
    assert any(f.name == "MatMulMxfp4" and f.domain == "com.quark_onnx" for f in model.functions)
    node = next(n for n in model.graph.node if n.op_type == "MatMulMxfp4")
    inits = {t.name: t for t in model.graph.initializer}
    assert list(inits[node.input[1]].dims) == [64, 32] and list(inits[node.input[2]].dims) == [64, 2]
    # without the custom-op library ORT runs the model-local function: check its numerics on CPU (fp32 io)
    ref = np.load(mxfp4_export / "reference.npz")
    out32 = build(mxfp4_export, tmp_path / "m32", ep="cuda", precision="fp32")
    assert op_types(out32).get("MatMulMxfp4") == 14
    assert np.abs(prompt_logits(out32, ref["input_ids"]) - ref["logits"]).max() < LOGIT_TOL
