"""MXFP4 weights with static per-tensor FP8 activations (Quark's `mxfp4_fp8` scheme, builder/quant/mxfp4_fp8.py) on a
dense tiny Llama; the MoE families run it in tests/test_qwen3_moe.py and tests/test_gpt_oss.py.
Reference: Quark's own frozen model (reference.npz): prompt logits and 16 og.Generator greedy tokens."""
from __future__ import annotations

import numpy as np
import pytest

from onnx_helpers import build, fp8_quantize_count, genai_greedy, op_types, prompt_logits

QUARK_EXPORTS = [("llama_h64", "mxfp4_fp8")]


@pytest.fixture(scope="module")
def export(quark_exports):
    return quark_exports("llama_h64", "mxfp4_fp8")


def test_cpu_matches_quark(export, tmp_path):
    out = build(export, tmp_path / "onnx", "cpu", "fp32")
    ref = np.load(export / "reference.npz")
    diff = float(np.abs(prompt_logits(out, ref["input_ids"]) - ref["logits"]).max())
    assert diff <= 1e-4, diff  # measured 7.2e-7
    assert genai_greedy(out, ref["input_ids"]) == ref["greedy"].tolist()
    ops = op_types(out)
    # one activation Q/DQ per linear (lm_head float): a pair, or one QuantizeDequantizeFp8 with the library
    assert ops.get("QuantizeLinear", 0) == ops.get("DequantizeLinear", 0)
    assert fp8_quantize_count(ops) == 14


@pytest.mark.parametrize("ep", ["cuda", "migraphx"])
def test_gpu_graphs_build(export, tmp_path, ep):
    """Built and passing the EP's static rules (not run on a GPU here)."""
    ops = op_types(build(export, tmp_path / "onnx", ep, "fp16"))
    assert ops["QuantizeLinear"] >= 14


def test_migraphx_form_runs_on_cpu(export, tmp_path):
    """The MIGraphX graph (fp8-coded DequantizeLinear weights, fp32 io) run by ORT CPU gives Quark's logits."""
    out = build(export, tmp_path / "onnx", "migraphx", "fp32")
    ref = np.load(export / "reference.npz")
    diff = float(np.abs(prompt_logits(out, ref["input_ids"]) - ref["logits"]).max())
    assert diff <= 1e-4, diff
