"""NVFP4 end to end (fp4 g16 + e4m3 block scales + weight_scale_2, dynamic activations with input_scale_2)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from fp4_checks import LOGIT_TOL, check_weights_bit_exact
from onnx_helpers import build, cpu_library_has_kernel, genai_greedy, op_types, prompt_logits

QUARK_EXPORTS = [("llama_h64", "nvfp4")]


@pytest.fixture(scope="module")
def nvfp4_export(quark_exports):
    return quark_exports("llama_h64", "nvfp4")


def test_nvfp4_cpu_matches_quark(nvfp4_export, tmp_path):
    ref = np.load(nvfp4_export / "reference.npz")
    out = build(nvfp4_export, tmp_path / "m")
    logits = prompt_logits(out, ref["input_ids"])
    assert np.abs(logits - ref["logits"]).max() < LOGIT_TOL
    assert genai_greedy(out, ref["input_ids"]) == ref["greedy"].tolist()
    assert check_weights_bit_exact(nvfp4_export, out) == 14
    # the weight in 16-row tiles (builder/quant/fp4_tiles.py)
    assert op_types(out).get("MatMulNvfp4R16", 0) == (14 if cpu_library_has_kernel("MatMulNvfp4R16") else 0)
    nbits = build(nvfp4_export, tmp_path / "n", fp4_linear="matmul_nbits8", accuracy_level=1)
    assert check_weights_bit_exact(nvfp4_export, nbits) == 14
    assert np.abs(prompt_logits(nbits, ref["input_ids"]) - ref["logits"]).max() < LOGIT_TOL
    ops = op_types(out)  # the pair in the subgraph, or inside QuantizeDequantizeNvfp4 with the library
    assert ops.get("QuantizeLinear", 0) + ops.get("QuantizeDequantizeNvfp4", 0) == 8, \
        "one shared e4m3 scale fake-quant per distinct linear input"


def test_nvfp4_input_scale_2_is_used(nvfp4_export, tmp_path):
    """Without the e4m3 block-scale stage (input_scale_2 ignored) the logits move away from Quark's."""
    ref = np.load(nvfp4_export / "reference.npz")
    out = build(nvfp4_export, tmp_path / "m")
    model = onnx.load(str(out / "model.onnx"))
    for init in model.graph.initializer:
        if init.name.endswith(".input_scale_2"):
            init.CopyFrom(onnx.numpy_helper.from_array(np.array(1e-9, np.float32), init.name))
    onnx.save(model, str(out / "model.onnx"))
    assert np.abs(prompt_logits(out, ref["input_ids"]) - ref["logits"]).max() > 100 * LOGIT_TOL


def test_nvfp4_dq_fp8_path_runs_on_cpu(nvfp4_export, tmp_path):
    ref = np.load(nvfp4_export / "reference.npz")
    out = build(nvfp4_export, tmp_path / "m", ep="cpu", fp4_linear="dq_fp8")
    assert "MatMulNBits" not in op_types(out)
    assert np.abs(prompt_logits(out, ref["input_ids"]) - ref["logits"]).max() < LOGIT_TOL


def test_nvfp4_cuda_uses_contrib_op(nvfp4_export, tmp_path):
    """No CPU kernel exists for MatMulBlockQuantizedFp4Weight: check the graph against the op's schema only."""
    out = build(nvfp4_export, tmp_path / "m", ep="cuda", precision="fp16")
    model = onnx.load(str(out / "model.onnx"))
    inits = {t.name: t for t in model.graph.initializer}
    nodes = [n for n in model.graph.node if n.op_type == "MatMulBlockQuantizedFp4Weight"]
    assert len(nodes) == 14 and all(n.domain == "com.microsoft" for n in nodes)
    q = next(n for n in nodes if n.name == "/model/layers.0/attn/q_proj/MatMulBlockQuantizedFp4Weight")
    b, ws, ws2 = (inits[name] for name in q.input[1:4])
    assert (list(b.dims), b.data_type) == ([64, 32], onnx.TensorProto.UINT8)
    assert (list(ws.dims), ws.data_type) == ([64, 4], onnx.TensorProto.UINT8)   # raw e4m3 bytes
    assert (int(np.prod(ws2.dims)), ws2.data_type) == (1, onnx.TensorProto.FLOAT)  # kernel: Size() == 1
    assert onnx.helper.get_attribute_value(q.attribute[0]) == 16
    # fp32 io has no contrib kernel: falls back to the lossless 8-bit MatMulNBits
    out32 = build(nvfp4_export, tmp_path / "m32", ep="cuda", precision="fp32", accuracy_level=1)
    assert op_types(out32).get("MatMulNBits") == 14


def test_nvfp4_skip_activations(nvfp4_export, tmp_path):
    ref = np.load(nvfp4_export / "reference.npz")
    out = build(nvfp4_export, tmp_path / "m", mx_activations="skip")
    logits = prompt_logits(out, ref["input_ids"])
    assert "QuantizeLinear" not in op_types(out)
    assert np.abs(logits - ref["logits"]).max() > 100 * LOGIT_TOL
