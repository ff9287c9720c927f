"""INT8 W8A8 (Quark `int8` template: int8 per-tensor weights, static per-tensor int8 activations): converted QDQ graph
vs a PyTorch emulation of Quark's fake quantization (helpers in test_fp8_w8a8.py), og.Generator greedy decoding,
emitted op types per EP, and ORT CPU's fusion into the integer path.
Measured max |logit difference| ONNX cpu vs emulation: 8e-7 (llama_h64 fp32).
"""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from test_fp8_w8a8 import (TOL_VS_EMULATION, check_against_references, convert, export_for, op_types)


def test_int8_cpu_matches_quark_emulation(tmp_path):
    src = export_for("int8_w8a8")
    out = tmp_path / "cpu"
    convert(src / "quark", out, "cpu", log=lambda m: None)
    r = check_against_references(src, out)
    print(f"int8_w8a8: max|logit diff| vs emulation {r['vs_emulation']:.2e}, vs Quark in-memory "
          f"{r['vs_quark_in_memory']:.2e}")
    assert r["vs_emulation"] < TOL_VS_EMULATION, r
    assert r["greedy"] == r["emu_greedy"] == r["quark_greedy"], r


@pytest.mark.parametrize("ep", ["cpu", "cuda", "migraphx"])
def test_int8_emitted_ops(ep, tmp_path):
    src = export_for("int8_w8a8")
    convert(src / "quark", tmp_path / ep, ep, log=lambda m: None)
    ops = op_types(tmp_path / ep)
    assert ops["QuantizeLinear"] == 14 and ops["DequantizeLinear"] == 28 and "GroupQueryAttention" in ops


def test_int8_cpu_lands_on_integer_matmul(tmp_path):
    """ORT CPU's graph optimizer rewrites the QDQ MatMuls into MatMulIntegerToFloat (integer GEMM)."""
    src = export_for("int8_w8a8")
    out = tmp_path / "cpu"
    convert(src / "quark", out, "cpu", log=lambda m: None)
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(out / "model.onnx"), so, providers=["CPUExecutionProvider"])
    import onnx
    ops = [n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx"), load_external_data=False).graph.node]
    assert ops.count("MatMulIntegerToFloat") + ops.count("DynamicQuantizeMatMul") + ops.count("QLinearMatMul") \
        + ops.count("MatMulInteger") >= 14, sorted(set(ops))


def test_int8_dynamic_activation_rejected(tmp_path):
    import json, shutil
    from builder.errors import ConversionError
    dst = tmp_path / "m"
    shutil.copytree(export_for("int8_w8a8") / "quark", dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization_config"]["global_quant_config"]["input_tensors"]["is_dynamic"] = True
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionError, match="dynamic INT8 activations"):
        convert(dst, tmp_path / "o", "cpu", log=lambda m: None)
