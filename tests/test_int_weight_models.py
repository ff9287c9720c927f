"""Integer weight-only exports end to end: real amd-quark exports -> ONNX -> ORT and og.Generator.

Covers every integer layout (uint4/int4 per-group and per-channel, pack_method reorder and order,
fake_quantized, int8/uint8 per-group and per-channel), per-layer overrides (lm_head g32, `*down_proj` wildcard),
exclusions, a separately quantized lm_head next to tied embeddings, several shapes (q/kv heads differing,
MHA, hidden 96 not a multiple of 128, q/k/v bias, Qwen2, Mistral, Qwen3 with head_dim != hidden/heads, Phi-3
with fused qkv_proj/gate_up_proj modules, Gemma2/Gemma3) and bf16/fp16 checkpoints.

References, none computed by the converter:
  fp32 checkpoints: reference.npz logits/greedy of Quark's frozen fake-quantized model (tests/quark_factory.py);
  bf16/fp16 checkpoints: Quark dequantizes in the model dtype while the ONNX model multiplies q*scale in fp32, so
    the reference is an fp32 PyTorch model on weights from tests/independent_decode.py (a decoder written from
    the format description, shown equal to Quark's own dequantization in test_factory.py).
"""
from __future__ import annotations

import numpy as np
import pytest

from independent_decode import dequantize_export
from onnx_helpers import (INT4_COMPACT_OPS, NEW_TOKENS, build, decisive_prefix, genai_greedy, int4_linear_count,
                         matmul_nbits_dequantized, onnx_layer_name, op_types, prompt_logits)
from quark_factory import RECIPES, SHAPES, combo_problem, forward_logits, torch_greedy

LOGIT_TOL = 1e-4  # fp32 io, accuracy_level 1: only the summation order differs from PyTorch

# Layouts the onnxruntime-genai 0.18 builder gets wrong are marked (anchor_ortgenai.md).
FP32_RECIPES = ["uint4_g64", "uint4_g32", "uint4_g32_order",  # order: genai silently wrong
                "uint4_g64_fake",                              # fake_quantized: genai crashes
                "int4_g64", "int4_g32",                        # signed int4: genai silently wrong
                "int4_per_channel", "uint4_per_channel",       # per_channel: genai crashes
                "int8_wo_g64", "int8_wo_per_channel", "uint8_wo_g64", "uint8_wo_per_channel",
                "lmhead_g32", "down_proj_wildcard_g32",        # wildcard override: genai shape error
                "excluded_layers",                             # exclude: genai re-quantizes lm_head
                "tied_lmhead"]
SHAPE_RECIPES = [(shape, recipe) for shape in ("llama_h96", "llama_mha", "llama_bias", "qwen2", "mistral", "qwen3",
                                                "phi3")
                 for recipe in ("uint4_g32", "int4_g32", "int4_per_channel", "int8_wo_g32")]
SHAPE_RECIPES += [(shape, recipe) for shape in ("gemma2", "gemma3") for recipe in ("uint4_g32", "int4_per_channel")]
SHAPE_RECIPES += [("mixtral", "uint4_g32"), ("mixtral", "int4_per_channel")]  # dense MoE (builder/ops/moe.py)
LOW_PRECISION = [("llama_h64_bf16", "uint4_g64"), ("llama_h64_bf16", "int4_g64"), ("llama_h64_fp16", "uint4_g64"),
                 ("llama_h64_fp16", "int8_wo_per_channel")]
CASES = [("llama_h64", r) for r in FP32_RECIPES] + SHAPE_RECIPES + LOW_PRECISION
CASES = [(s, r) for s, r in CASES if combo_problem(SHAPES[s], RECIPES[r]) is None]
QUARK_EXPORTS = CASES


@pytest.fixture(scope="module")
def exports(quark_exports):
    paths = quark_exports.many(CASES)
    return dict(zip(CASES, paths))


@pytest.mark.parametrize("shape,recipe", CASES, ids=[f"{s}-{r}" for s, r in CASES])
def test_logits_and_greedy_match_quark(exports, tmp_path, shape, recipe):
    export = exports[(shape, recipe)]
    out = build(export, tmp_path / "onnx", "cpu", "fp32", accuracy_level=1)
    ref = np.load(export / "reference.npz")
    ids = ref["input_ids"]
    if SHAPES[shape].dtype == "float32":
        ref_logits, ref_greedy, margins = ref["logits"], ref["greedy"], ref["greedy_margins"]
    else:
        ref_logits, ref_greedy, margins = independent_reference(export, ids)
    diff = float(np.abs(prompt_logits(out, ids) - ref_logits).max())
    assert diff <= LOGIT_TOL, f"max |logit diff| {diff:.3g} > {LOGIT_TOL}"
    tokens = genai_greedy(out, ids)
    # Every case has top-2 margins above the numeric error at all 16 steps, so all 16 tokens must agree
    # (measured on the 40 cases: max |logit diff| 3.7e-6, 16/16 greedy tokens equal everywhere).
    assert decisive_prefix(margins, LOGIT_TOL) == NEW_TOKENS, "reference has a near-tie; pick another seed"
    assert tokens == ref_greedy.tolist()


def independent_reference(export, ids: np.ndarray):
    """fp32 PyTorch on independently decoded weights: prompt logits, 16 greedy ids (no KV cache), margins."""
    import torch

    from independent_decode import load_reference_model
    model = load_reference_model(export / "quark")
    seq = torch.from_numpy(ids)
    greedy, margins = torch_greedy(model, seq, NEW_TOKENS)
    return forward_logits(model, seq).numpy(), np.array(greedy), np.array(margins)


@pytest.mark.parametrize("recipe", ["uint4_g32_order", "int4_g64", "int4_per_channel", "uint4_g64_fake",
                                    "int8_wo_g64", "uint8_wo_per_channel", "lmhead_g32",
                                    "down_proj_wildcard_g32"])
def test_matmulnbits_weights_equal_independent_decoder(exports, tmp_path, recipe):
    export = exports[("llama_h64", recipe)]
    out = build(export, tmp_path / "onnx", "cpu", "fp32")
    decoded = matmul_nbits_dequantized(out)
    independent = dequantize_export(export / "quark")
    assert independent
    for module, w in independent.items():
        np.testing.assert_allclose(decoded[onnx_layer_name(module)], w, rtol=0, atol=1e-6, err_msg=module)


def test_overrides_reach_the_graph(exports, tmp_path):
    import onnx
    out = build(exports[("llama_h64", "down_proj_wildcard_g32")], tmp_path / "onnx")
    block = {n.name.rsplit("/", 1)[0]: {a.name: a.i for a in n.attribute}["block_size"]
             for n in onnx.load(str(out / "model.onnx"), load_external_data=False).graph.node
             if n.op_type in ("MatMulNBits", *INT4_COMPACT_OPS)}
    assert block["/model/layers.0/mlp/down_proj"] == 32
    assert block["/model/layers.0/mlp/gate_up_proj"] == 64  # gate and up agree: fused


def test_excluded_layers_stay_float(exports, tmp_path):
    out = build(exports[("llama_h64", "excluded_layers")], tmp_path / "onnx")
    ops = op_types(out)
    # per layer: qkv (fused), o, gate_up (fused), down = 4 MatMulNBits; layer 0's down_proj and lm_head are
    # excluded -> 7 MatMulNBits and 2 float matmuls (the lm_head as a Gemm on the row-order weight on cpu fp32)
    assert int4_linear_count(ops) == 7 and ops["MatMul"] == 1 and ops["Gemm"] == 1


def test_unfused_projections_give_the_same_logits(exports, tmp_path):
    export = exports[("llama_bias", "uint4_g32")]
    ids = np.load(export / "reference.npz")["input_ids"]
    fused = build(export, tmp_path / "fused", accuracy_level=1)
    unfused = build(export, tmp_path / "unfused", accuracy_level=1, fuse_projections=False)
    assert int4_linear_count(op_types(fused)) == 4 * 2 and int4_linear_count(op_types(unfused)) == 7 * 2
    np.testing.assert_allclose(prompt_logits(fused, ids), prompt_logits(unfused, ids), atol=1e-5, rtol=0)


def test_tied_embeddings_keep_quantized_lm_head(exports, tmp_path):
    out = build(exports[("llama_h64", "tied_lmhead")], tmp_path / "onnx")
    decoded = matmul_nbits_dequantized(out)
    assert "/lm_head" in decoded  # the separately quantized lm_head.weight, not the float embedding


@pytest.mark.parametrize("recipe", ["int8_wo_g64", "uint8_wo_per_channel"])
def test_8bit_weights_on_migraphx_use_dequantize_linear(exports, tmp_path, recipe):
    """MIGraphX parses only 4-bit MatMulNBits: 8-bit weight-only layers become DequantizeLinear -> MatMul.
    Run here on ORT CPU, whose DQ->MatMul fusion must be held at accuracy_level 1 to stay fp32-exact."""
    export = exports[("llama_h64", recipe)]
    out = build(export, tmp_path / "onnx", "migraphx", "fp32")
    ops = op_types(out)
    assert ops.get("MatMulNBits", 0) == 0 and ops["DequantizeLinear"] == 14
    ref = np.load(export / "reference.npz")
    got = prompt_logits(out, ref["input_ids"], {"session.qdq_matmulnbits_accuracy_level": "1"})
    assert float(np.abs(got - ref["logits"]).max()) <= LOGIT_TOL


INT4_COMPACT = [c for c in [("llama_h64", "uint4_g64"), ("llama_h64", "int4_g32"), ("llama_h64", "uint4_per_channel"),
                            ("llama_h64", "uint4_g32_order"), ("llama_h64_fp16", "uint4_g64")] if c in CASES]


@pytest.mark.parametrize("shape,recipe", INT4_COMPACT, ids=[f"{s}-{r}" for s, r in INT4_COMPACT])
def test_int4_compact_matches_quark(exports, tmp_path, shape, recipe):
    """int4_linear=compact: com.quark_onnx MatMulUint4 / MatMulInt4 (fp32 activations, exact decode) in place of every
    MatMulNBits; Quark's logits within the accuracy_level=1 bound, with the library and through the ONNX functions."""
    export = exports[(shape, recipe)]
    precision = "fp16" if shape.endswith("fp16") else "fp32"
    out = build(export, tmp_path / "onnx", "cpu", precision, int4_linear="compact")
    ops = op_types(out)
    assert "MatMulNBits" not in ops and ops.get("MatMulUint4", 0) + ops.get("MatMulInt4", 0) > 0, ops
    ref = np.load(export / "reference.npz")
    ids = ref["input_ids"]
    if precision == "fp32":
        ref_logits = ref["logits"]
        tol = LOGIT_TOL
    else:  # fp16 io: the same output at accuracy_level 1 is the reference (fp16 roundings of the activations)
        ref_logits = prompt_logits(build(export, tmp_path / "al1", "cpu", precision, accuracy_level=1), ids)
        tol = 2e-2
    with_library = prompt_logits(out, ids)
    without = prompt_logits(out, ids, custom_ops_library="")
    assert float(np.abs(with_library - ref_logits).max()) <= tol
    assert float(np.abs(without - ref_logits).max()) <= tol
    if precision == "fp32":
        assert genai_greedy(out, ids) == ref["greedy"].tolist()
