"""The CPU default attention is the same on every CPU (issue 21, and since 2026-12-05 for every scheme): with the
custom-op library, com.quark_onnx GroupQueryAttentionFixedOrder (one summation order on every ISA, in-place cache);
without it, for every scheme with quantized activations (INT8, per-token FP8 (PTPC), static FP8 with and without FP8
KV, MXFP4, NVFP4), an explicit MatMul subgraph whose softmax is ReduceMax/Sub/Exp/ReduceSum/Div; FP8 attention
(probabilities quantized) always takes that explicit subgraph. Never GroupQueryAttention or ORT's Softmax.

Why: GroupQueryAttention's softmax (MLAS MlasComputeSoftmax, also ORT's Softmax) sums the exponentials in 16 lanes on
AVX-512 and 8 on AVX2, so rows longer than 16 keys differ by a few ulp between CPUs (tools/isa_op_outputs.py, native
AVX-512 vs QEMU Haswell); an INT8 or per-token FP8 activation quantizer after the attention turned those ulps into
other codes, and the real SmolLM2-135M logits differed by 9.25 (INT8) and 2.72 (PTPC) between the two
(tools/isa_op_diff.py found GroupQueryAttention as the first differing node; docs/real_model_numerics.md); weight-only
schemes differed by 3.1e-5. These tests hold the graph to the forms measured bit-identical; the op's own numerics
are in tests/test_gqa_fixed_order_kernel.py, the numerics against Quark's emulation in the scheme's own tests
(test_int8_w8a8.py, test_fp8_w8a8.py, test_mxfp4_model.py, test_nvfp4_model.py, test_real_model.py).
"""
from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx_helpers import op_types, prompt_logits

from builder.convert import convert
from builder.emit_context import BuildOptions
from builder.errors import ConversionError

ACTIVATION_QUANTIZED = ("int8_w8a8", "ptpc_fp8", "fp8_w8a8", "fp8_w8a8_kv", "fp8_w8a8_kv_attn", "mxfp4", "nvfp4")
RECIPES = ACTIVATION_QUANTIZED + ("uint4_g64_kv",)
QUARK_EXPORTS = [("llama_h64", r) for r in RECIPES]
ISA_DEPENDENT = ("GroupQueryAttention", "Softmax")  # ORT CPU ops whose softmax sum order depends on the ISA
FIXED_ORDER = "GroupQueryAttentionFixedOrder"
NO_LIBRARY = BuildOptions(custom_ops_library="none")
# ORT CPU ops that run on MLAS's integer GEMM (MlasGemmQuantDispatch / MlasSymmQgemm), whose kernel is picked per CPU:
# AVX2 vpmaddubsw (saturating u8s8 pairs), AVX-512/AVX-VNNI, and AMX tiles (onnxruntime core/mlas/lib/platform.cpp:
# GemmU8S8Dispatch = &MlasGemmU8S8DispatchAmx when AMX-TILE and AMX-INT8 are present; qgemm_kernel_amx.cpp). AMX is
# reached only through these, so a graph without them runs the same kernels on an AMX CPU as on AVX-512.
INTEGER_GEMM = ("MatMulInteger", "MatMulIntegerToFloat", "QLinearMatMul", "DynamicQuantizeMatMul", "QGemm",
                "ConvInteger", "QLinearConv", "QAttention", "DynamicQuantizeLSTM")


@pytest.fixture(scope="module")
def exports(quark_exports):
    return dict(zip(RECIPES, quark_exports.many(QUARK_EXPORTS)))


def _optimized_ops(model_dir, tmp_path) -> set[str]:
    """Op types of the graph ORT CPU runs after its optimizer (no fusion back into an attention op)."""
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    lib = json.loads((model_dir / "genai_config.json").read_text())["model"]["decoder"]["session_options"].get(
        "custom_ops_library")
    if lib:
        so.register_custom_ops_library(str(model_dir / lib))
    ort.InferenceSession(str(model_dir / "model.onnx"), so, providers=["CPUExecutionProvider"])
    return {n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx"), load_external_data=False).graph.node}


@pytest.mark.parametrize("recipe", RECIPES)
def test_cpu_default_has_no_isa_dependent_attention(exports, recipe, tmp_path):
    out = tmp_path / "cpu"
    plan = convert(exports[recipe] / "quark", out, "cpu", log=lambda m: None)
    ops = op_types(out)
    assert not set(ops) & set(ISA_DEPENDENT), sorted(ops)
    assert not _optimized_ops(out, tmp_path) & set(ISA_DEPENDENT + INTEGER_GEMM)
    share = json.loads((out / "genai_config.json").read_text())["search"]["past_present_share_buffer"]
    if recipe == "fp8_w8a8_kv_attn":  # FP8 attention: the explicit subgraph, probabilities quantized
        assert ops["ReduceSum"] >= 2 and ops["Exp"] == 2 and ops["MatMul"] >= 4 and FIXED_ORDER not in ops
        assert share is False and any("fixed-order softmax" in n for n in plan.notes)
    else:
        assert ops[FIXED_ORDER] == 2 and "Exp" not in ops  # 2 layers
        assert share is True and any(FIXED_ORDER in n for n in plan.notes)


@pytest.mark.parametrize("recipe", ["int8_w8a8", "uint4_g64_kv"])
def test_without_the_library_as_before(exports, recipe, tmp_path):
    """custom_ops_library=none: activation-quantized schemes keep the explicit fixed-order subgraph, weight-only ones
    GroupQueryAttention (no library, no kernel for the fixed-order op)."""
    convert(exports[recipe] / "quark", tmp_path / "o", "cpu", options=NO_LIBRARY, log=lambda m: None)
    ops = op_types(tmp_path / "o")
    assert FIXED_ORDER not in ops
    if recipe == "int8_w8a8":
        assert ops["Exp"] == 2 and not set(ops) & set(ISA_DEPENDENT)
    else:
        assert "GroupQueryAttention" in ops


@pytest.mark.parametrize("recipe", ["int8_w8a8", "ptpc_fp8"])
def test_fused_option_keeps_gqa_and_agrees(exports, recipe, tmp_path):
    """attention=fused: GroupQueryAttention again; the two forms agree to float roundoff on a short prompt. Measured
    max |logit diff| (llama_h64, 20 tokens, Zen 5): 0 (INT8), 7e-7 (PTPC); the bound leaves room for one activation
    code that the fused form's CPU-dependent softmax flips on another CPU (|logits| up to 2.6)."""
    src = exports[recipe] / "quark"
    convert(src, tmp_path / "fixed", "cpu", log=lambda m: None)
    convert(src, tmp_path / "fused", "cpu", options=BuildOptions(extra={"attention": "fused"}, given=("attention",)),
            log=lambda m: None)
    assert "GroupQueryAttention" in op_types(tmp_path / "fused")
    ids = np.array([[1, 17, 42, 99, 7, 250, 3, 64, 11, 5, 80, 33, 21, 9, 120, 48, 2, 77, 15, 6]], np.int64)
    a, b = prompt_logits(tmp_path / "fixed", ids), prompt_logits(tmp_path / "fused", ids)
    assert np.abs(a - b).max() < 0.02, np.abs(a - b).max()


def test_fused_option_keeps_ort_attention(exports, tmp_path):
    """attention=fused: GroupQueryAttention for static FP8 + KV, ORT's Softmax in the FP8 attention subgraph."""
    fused = BuildOptions(extra={"attention": "fused"}, given=("attention",))
    convert(exports["fp8_w8a8_kv"] / "quark", tmp_path / "kv", "cpu", options=fused, log=lambda m: None)
    assert "GroupQueryAttention" in op_types(tmp_path / "kv")
    convert(exports["fp8_w8a8_kv_attn"] / "quark", tmp_path / "attn", "cpu", options=fused, log=lambda m: None)
    ops = op_types(tmp_path / "attn")
    assert ops.get("Softmax") == 2 and "GroupQueryAttention" not in ops and "Exp" not in ops


def test_fp8_kv_keeps_quantizers(exports, tmp_path):
    """static FP8 + KV on cpu: K and V still quantize-dequantized (before RoPE), in front of the fixed-order op."""
    convert(exports["fp8_w8a8_kv"] / "quark", tmp_path / "o", "cpu", log=lambda m: None)
    names = [n.name for n in onnx.load(str(tmp_path / "o" / "model.onnx"), load_external_data=False).graph.node]
    for i in range(2):
        for proj in ("k", "v"):
            assert any(n.startswith(f"/model/layers.{i}/attn/{proj}_quant") for n in names), (i, proj)


def test_attention_options(exports, tmp_path):
    """fused: GroupQueryAttention; explicit: the fixed-order subgraph; fixed: the fixed-order op (the cpu default),
    refused where it cannot run (another EP, FP8 attention)."""
    src = exports["uint4_g64_kv"] / "quark"

    def form(value, recipe_src=src, ep="cpu"):
        out = tmp_path / f"{value}-{ep}-{recipe_src.parent.name}"
        convert(recipe_src, out, ep, options=BuildOptions(extra={"attention": value}, given=("attention",)),
                log=lambda m: None)
        return op_types(out)
    assert "GroupQueryAttention" in form("fused")
    ops = form("explicit")
    assert not set(ops) & set(ISA_DEPENDENT) and ops["Exp"] == 2 and FIXED_ORDER not in ops
    assert form("fixed")[FIXED_ORDER] == 2
    with pytest.raises(ConversionError, match="attention=fixed is not available here"):
        form("fixed", ep="cuda")
    with pytest.raises(ConversionError, match="attention=fixed cannot quantize the attention probabilities"):
        form("fixed", exports["fp8_w8a8_kv_attn"] / "quark")


def test_unknown_attention_value_refused(exports, tmp_path):
    with pytest.raises(ConversionError, match="attention"):
        convert(exports["int8_w8a8"] / "quark", tmp_path / "o", "cpu",
                options=BuildOptions(extra={"attention": "sdpa"}, given=("attention",)), log=lambda m: None)
