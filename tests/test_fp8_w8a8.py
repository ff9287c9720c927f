"""FP8 W8A8 (+ FP8 KV cache, + FP8 attention) and PTPC FP8: tiny Llamas quantized by amd-quark, converted, run.

Reference: a PyTorch emulation of Quark's fake quantization (tests/w8a8_emulation.py, from Quark's source; fp8: clamp(x / s, +-448)
-> float8_e4m3fn -> * s; dynamic per-token s = amax / 448; the k/v/q_proj output quantizers; softmax output quantized
in eager attention) applied to an eager transformers model holding Quark's own dequantized weights, using the scales
*in the export*. Quark's in-memory model (reference.npz `logits`/`greedy`) is compared too: for KV-cache recipes it
uses per-projection k/v scales while the export writes max(k, v) per layer (quark_format.md, section 2), so it can
differ from any faithful conversion of the export; the figure is recorded, not asserted.
Measured max |logit difference| ONNX (cpu) vs emulation (llama_h64, fp32): see TOL_VS_EMULATION comments.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx_helpers import cpu_library_has_kernel, fp8_quantize_count, op_types, prompt_logits
from w8a8_emulation import TOL_VS_EMULATION, cpu_vs_references

from builder.convert import convert
from builder.emit_context import BuildOptions
from builder.emit_context import BuildOptions
from builder.errors import ConversionError

FP8_RECIPES = ("fp8_w8a8_kv", "fp8_w8a8_kv_attn", "ptpc_fp8")
QUARK_EXPORTS = [("llama_h64", r) for r in FP8_RECIPES] + [("llama_h64", "fp8_w8a8")]


@pytest.fixture(scope="module")
def exports(quark_exports):
    return dict(zip(FP8_RECIPES, quark_exports.many(QUARK_EXPORTS)))


def fp8_weight_dq_count(model_dir: Path) -> int:
    """DequantizeLinear nodes reading an fp8 initializer (the weight side of a QDQ MatMul): FLOAT8E4M3FN, or
    FLOAT8E4M3FNUZ on rocm/migraphx (builder/ops/fnuz.py)."""
    m = onnx.load(str(model_dir / "model.onnx"), load_external_data=False)
    fp8_types = (onnx.TensorProto.FLOAT8E4M3FN, onnx.TensorProto.FLOAT8E4M3FNUZ)
    fp8 = {t.name for t in m.graph.initializer if t.data_type in fp8_types and t.dims}
    return sum(1 for n in m.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in fp8)


# ---------------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("recipe", FP8_RECIPES)
def test_fp8_cpu_matches_quark_emulation(exports, recipe, tmp_path):
    r = cpu_vs_references(exports[recipe], tmp_path / "cpu")
    assert r["vs_emulation"] < TOL_VS_EMULATION, r
    assert r["greedy"] == r["emu_greedy"], r
    if recipe == "ptpc_fp8":  # no exported scale differs from Quark's in-memory ones
        assert r["greedy"] == r["quark_greedy"], r


def test_fp8_static_without_kv_matches_quark_emulation(quark_exports, tmp_path):
    """Static FP8 W8A8 with no KV-cache or attention quantization (Quark's plain `fp8` template)."""
    r = cpu_vs_references(quark_exports("llama_h64", "fp8_w8a8"), tmp_path / "cpu")
    assert r["vs_emulation"] < TOL_VS_EMULATION, r
    assert r["vs_quark_in_memory"] < TOL_VS_EMULATION, r
    assert r["greedy"] == r["emu_greedy"] == r["quark_greedy"], r


def test_qdq_form_equals_cpu_form(exports, tmp_path):
    """The QDQ graph (MIGraphX profile, fp32) run by ORT CPU gives the CPU fast form's logits."""
    src = exports["fp8_w8a8_kv"]
    ids = np.load(src / "reference.npz")["input_ids"]
    convert(src / "quark", tmp_path / "cpu", "cpu", options=BuildOptions(extra={"prefill_logits": "all"}),
            log=lambda m: None)
    convert(src / "quark", tmp_path / "qdq", "migraphx", "fp32", options=BuildOptions(extra={"prefill_logits": "all"}),
            log=lambda m: None)
    assert fp8_weight_dq_count(tmp_path / "qdq") == 14 and fp8_weight_dq_count(tmp_path / "cpu") == 0
    diff = np.abs(prompt_logits(tmp_path / "cpu", ids) - prompt_logits(tmp_path / "qdq", ids)).max()
    assert diff < 1e-5, diff


@pytest.mark.parametrize("recipe", FP8_RECIPES)
@pytest.mark.parametrize("ep,precision", [("cpu", None), ("cuda", None), ("cuda", "fp32"), ("migraphx", None)])
def test_fp8_emitted_ops(exports, recipe, ep, precision, tmp_path):
    src = exports[recipe]
    out = tmp_path / ep
    plan = convert(src / "quark", out, ep, precision, log=lambda m: None)
    ops = op_types(out)
    dynamic = recipe == "ptpc_fp8"
    block = ep == "cuda" and plan.io != "fp32" and not dynamic
    if block:
        assert ops.get("MatMulBlockQuantizedFp8Weight") == 14 and fp8_weight_dq_count(out) == 0
    elif ep == "cpu":  # the compact default (MatMulFp8 on the fp8 bytes) where the library has its kernel
        assert fp8_weight_dq_count(out) == 0 and fp8_quantize_count(ops) >= 14
        assert ops.get("MatMulFp8", 0) == (14 if cpu_library_has_kernel("MatMulFp8") else 0)
    else:
        assert fp8_weight_dq_count(out) == 14
    if not block:
        assert fp8_quantize_count(ops) >= 14
    attn = recipe == "fp8_w8a8_kv_attn"
    fixed = ep == "cpu"  # CPU: one summation order on every ISA (issue 21)
    # with the library: the fixed-order fused op; without (or FP8 attention): the explicit fixed-order subgraph
    fixed_op = fixed and not attn and cpu_library_has_kernel("GroupQueryAttentionFixedOrder")
    assert ("GroupQueryAttention" in ops) != (attn or fixed)
    if fixed_op:
        assert ops["GroupQueryAttentionFixedOrder"] == 2 and "Softmax" not in ops and "Exp" not in ops
    elif fixed:
        assert "Softmax" not in ops and ops["Exp"] == 2 and ops["MatMul"] >= 4
    elif attn:
        assert ops["Softmax"] == 2 and ops["MatMul"] >= 4
    if attn:
        cfg = json.loads((out / "genai_config.json").read_text())
        assert cfg["search"]["past_present_share_buffer"] is False
    if recipe != "ptpc_fp8":
        assert any("FP8 KV cache" in n or "FP8 attention" in n for n in plan.notes)


def test_fp8_attention_off_falls_back_to_gqa(exports, tmp_path):
    src = exports["fp8_w8a8_kv_attn"]
    plan = convert(src / "quark", tmp_path / "o", "cuda", options=BuildOptions(fp8_attention="off"),
                   log=lambda m: None)
    assert "GroupQueryAttention" in op_types(tmp_path / "o")  # on cpu: the fixed-order explicit form (issue 21)
    assert any(n.startswith("WARNING fp8_attention=off") for n in plan.notes)


@pytest.mark.parametrize("edit,needle", [
    (lambda g: g["weight"].update(qscheme="per_block", block_size=[128, 128]), "per-block"),
    (lambda g: g["weight"].update(symmetric=False), "asymmetric FP8"),
    (lambda g: g["input_tensors"].update(symmetric=False), "asymmetric FP8"),
])
def test_fp8_unsupported_one_line_error(exports, edit, needle, tmp_path):
    src = exports["fp8_w8a8_kv"] / "quark"
    dst = tmp_path / "m"
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    edit(cfg["quantization_config"]["global_quant_config"])
    cfg["quantization_config"]["kv_cache_quant_config"] = {}
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionError) as err:
        convert(dst, tmp_path / "o", "cpu", log=lambda m: None)
    assert needle in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "o").exists()
