"""Qwen3MoeForCausalLM and Qwen2MoeForCausalLM (builder/arch/qwen3_moe.py, qwen2_moe.py) against Quark's own model.

Shapes (tests/quark_factory.py): 8 experts top-2 of width 64, tiny Qwen3 attention with per-head q/k norms;
  qwen3_moe      3 layers, layer 1 a dense MLP (mlp_only_layers [1]), norm_topk_prob true;
  qwen3_moe_raw  3 layers, only layer 1 sparse (decoder_sparse_step 2), norm_topk_prob false (raw top-k softmax);
  qwen2_moe      2 layers, q/k/v bias, shared expert (width 96) weighted by sigmoid(shared_expert_gate).
Schemes: uint4 g32 and int4 per-channel (routed com.microsoft QMoE on CPU), int8 weight-only, MXFP4 (weights and
dynamic MXFP4 activations), MXFP4 with static FP8 activations (mxfp4_fp8), FP8 W8A8 per-tensor, one expert per
layer excluded (the non-routed ones run every expert, weighted by the routing); PTPC experts are refused
(builder/ops/moe.py check_expert_plans).
Reference: reference.npz of each export, Quark's frozen fake-quantized PyTorch model (logits of the 8-token prompt
and 16 greedy tokens without KV cache); the ONNX side is ORT CPU (prompt logits) and og.Generator (greedy, KV cache).
"""
from __future__ import annotations

import numpy as np
import pytest

from builder.arch import family_for
from builder.errors import ConversionError
from onnx_helpers import (NEW_TOKENS, build, decisive_prefix, genai_greedy, int4_experts_nodes, int4_linear_count,
                         op_types, prompt_logits)

LOGIT_TOL = 1e-4  # measured max |logit diff| over the cases below: 1.7e-6 (fp32 io, accuracy_level 1)
ROUTED = {"uint4_g32", "int4_per_channel"}  # 4-bit experts: one QMoE per sparse layer on CPU
CASES = [("qwen3_moe", r) for r in ("uint4_g32", "int4_per_channel", "int8_wo_g32", "mxfp4", "mxfp4_fp8",
                                    "fp8_w8a8", "uint4_g32_expert3_excluded")]
CASES += [(s, r) for s in ("qwen3_moe_raw", "qwen2_moe") for r in ("uint4_g32", "mxfp4", "fp8_w8a8")]
KV_CASES = [("qwen3_moe", "mxfp4_kv"), ("qwen3_moe", "fp8_w8a8_kv")]  # FP8 KV cache (Qwen3-235B MXFP4 + KV FP8)
QUARK_EXPORTS = CASES + KV_CASES + [("qwen3_moe", "ptpc_fp8"), ("qwen3_moe", "uint4_g32_router_not_excluded"),
                                     ("gpt_oss", "uint4_g32_router_not_excluded")]
QUARK_IMPORTER_REFERENCES = KV_CASES  # made in the session's quark_factory subprocess (tests/conftest.py)
SPARSE_LAYERS = {"qwen3_moe": 2, "qwen3_moe_raw": 1, "qwen2_moe": 2}
QWEN3_MOE_CFG = {"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
                 "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
                 "vocab_size": 256, "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "hidden_act": "silu",
                 "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "norm_topk_prob": True}


@pytest.fixture(scope="module")
def exports(quark_exports):
    return dict(zip(CASES, quark_exports.many(CASES)))


@pytest.mark.parametrize("shape,recipe", CASES, ids=[f"{s}-{r}" for s, r in CASES])
def test_logits_and_greedy_match_quark(exports, tmp_path, shape, recipe):
    export = exports[(shape, recipe)]
    out = build(export, tmp_path / "onnx", "cpu", "fp32", accuracy_level=1)
    ref = np.load(export / "reference.npz")
    diff = float(np.abs(prompt_logits(out, ref["input_ids"]) - ref["logits"]).max())
    assert diff <= LOGIT_TOL, f"max |logit diff| {diff:.3g} > {LOGIT_TOL}"
    assert decisive_prefix(ref["greedy_margins"], LOGIT_TOL) == NEW_TOKENS, "reference has a near-tie"
    assert genai_greedy(out, ref["input_ids"]) == ref["greedy"].tolist()
    ops = op_types(out)
    assert "QMoE" not in ops and ops["TopK"] == SPARSE_LAYERS[shape]
    # 4-bit experts: MatMulExpertsUint4 / Int4 for gate_up (fused) and down (the cpu default with the library)
    assert int4_experts_nodes(ops) == (2 * SPARSE_LAYERS[shape] if recipe in ROUTED else 0)


@pytest.mark.parametrize("shape", ["qwen3_moe", "qwen2_moe"])
def test_qmoe_form_matches_quark(exports, tmp_path, shape):
    """int4_experts=qmoe (the cpu form without the custom-op library): one QMoE per sparse layer."""
    export = exports[(shape, "uint4_g32")]
    out = build(export, tmp_path / "onnx", "cpu", "fp32", accuracy_level=1, int4_experts="qmoe")
    ref = np.load(export / "reference.npz")
    diff = float(np.abs(prompt_logits(out, ref["input_ids"]) - ref["logits"]).max())
    assert diff <= LOGIT_TOL, f"max |logit diff| {diff:.3g} > {LOGIT_TOL}"
    ops = op_types(out)
    assert ops["QMoE"] == SPARSE_LAYERS[shape] and "TopK" not in ops and not int4_experts_nodes(ops)


@pytest.mark.parametrize("shape,recipe", KV_CASES, ids=[r for _, r in KV_CASES])
def test_fp8_kv_cache_matches_quark_importer(quark_exports, tmp_path, shape, recipe):
    """FP8 KV cache with MoE experts: against Quark's importer on the export (tests/quark_importer_reference.py;
    Quark's in-memory model uses per-projection k/v scales that the export does not keep: 0.62 / 0.33 apart)."""
    from quark_importer_reference import importer_references
    export = quark_exports(shape, recipe)
    [ref] = importer_references([export])
    out = build(export, tmp_path / "onnx", "cpu", "fp32", accuracy_level=1)
    ids = np.load(export / "reference.npz")["input_ids"]
    diff = float(np.abs(prompt_logits(out, ids) - ref["logits"]).max())
    assert diff <= LOGIT_TOL, diff  # measured 7.2e-7 for both
    assert decisive_prefix(ref["greedy_margins"], LOGIT_TOL) == NEW_TOKENS
    assert genai_greedy(out, ids) == ref["greedy"].tolist()
    assert op_types(out)["GroupQueryAttentionFixedOrder"] == 3  # FP8 KV emulated (K/V Q/DQ) in front of the op


@pytest.mark.parametrize("shape", ["qwen3_moe", "qwen3_moe_raw", "qwen2_moe"])
def test_dense_form_matches_quark(exports, tmp_path, shape):
    export = exports[(shape, "uint4_g32")]
    out = build(export, tmp_path / "onnx", "cpu", "fp32", accuracy_level=1, moe="dense")
    ref = np.load(export / "reference.npz")
    diff = float(np.abs(prompt_logits(out, ref["input_ids"]) - ref["logits"]).max())
    assert diff <= LOGIT_TOL, diff  # measured 1.5e-6
    assert genai_greedy(out, ref["input_ids"]) == ref["greedy"].tolist()
    ops = op_types(out)
    assert "QMoE" not in ops and ops["TopK"] == SPARSE_LAYERS[shape]
    # norm_topk_prob false: no renormalizing ReduceSum/Div after TopK
    assert ("Div" in ops) == (shape == "qwen3_moe")


@pytest.mark.parametrize("shape", ["qwen3_moe", "qwen3_moe_raw"])
def test_fp16_io_routed_matches_quark(exports, tmp_path, shape):
    export = exports[(shape, "uint4_g32")]
    out = build(export, tmp_path / "onnx", "cpu", "fp16", accuracy_level=1)
    ref = np.load(export / "reference.npz")
    diff = float(np.abs(prompt_logits(out, ref["input_ids"]) - ref["logits"]).max())
    assert diff <= 2e-2, diff  # fp16 activations: measured 4.3e-3 (raw top-k weights through router_weights)
    assert op_types(out)["QMoE"] == SPARSE_LAYERS[shape]  # fp16 io: QMoE (the experts ops take fp32 io)


@pytest.mark.parametrize("shape", ["qwen3_moe", "qwen3_moe_raw", "qwen2_moe"])
def test_float_checkpoint_matches_transformers(exports, tmp_path, shape):
    """export/float/ (transformers 5 save_pretrained: per-expert Hub names) against the logits of transformers' own
    float model (reference.npz float_logits, made before Quark touched it)."""
    export = exports[(shape, "uint4_g32")]
    out = build(export / "float", tmp_path / "onnx", "cpu", "fp32")
    diff = float(np.abs(prompt_logits(out, np.load(export / "reference.npz")["input_ids"])
                        - np.load(export / "reference.npz")["float_logits"]).max())
    assert diff <= 1e-4, diff  # measured 1.0-1.7e-6


GPU_CASES = [("qwen3_moe", r) for r in ("uint4_g32", "int4_per_channel", "int8_wo_g32", "mxfp4", "mxfp4_fp8",
                                        "fp8_w8a8")] + [("qwen2_moe", r) for r in ("uint4_g32", "mxfp4", "fp8_w8a8")]


@pytest.mark.parametrize("ep", ["cuda", "migraphx"])
@pytest.mark.parametrize("shape,recipe", GPU_CASES, ids=[f"{s}-{r}" for s, r in GPU_CASES])
def test_gpu_eps_get_the_routed_standard_op_form(exports, tmp_path, ep, shape, recipe):
    """Built and passing the EP's static rules (not run on a GPU here): no QMoE, one If per sparse layer
    (builder/ops/routed_experts.py; tests/test_moe_routed.py runs these graphs on ORT CPU)."""
    ops = op_types(build(exports[(shape, recipe)], tmp_path / "onnx", ep, "fp16"))
    assert "QMoE" not in ops and ops["TopK"] == ops["If"] == SPARSE_LAYERS[shape]


@pytest.mark.parametrize("recipe,ep,extra,note", [
    ("uint4_g32", "cpu", {}, "2 sparse layer(s) routed through com.quark_onnx MatMulExperts*"),
    ("uint4_g32", "cpu", {"int4_experts": "qmoe"}, "MoE: 2 sparse layer(s) as one com.microsoft QMoE each (routed, "
                                                   "4-bit experts, block_size 32)"),
    ("uint4_g32", "cpu", {"moe": "dense"}, "because of --extra_options moe=dense"),
    ("uint4_g32", "cuda", {}, "2 sparse layer(s) routed in standard ops"),
    ("uint4_g32", "cpu", {"moe": "gather"}, "2 sparse layer(s) routed in standard ops"),
    ("mxfp4", "cpu", {}, "2 sparse layer(s) routed through com.quark_onnx MatMulExperts*"),
    ("mxfp4", "cpu", {"moe": "gather"}, "2 sparse layer(s) routed in standard ops"),
    ("uint4_g32_expert3_excluded", "cpu", {}, "because of experts that do not stack (layer 0: "
     "model.layers.0.mlp.experts.0.gate_proj and model.layers.0.mlp.experts.3.gate_proj differ in quantization "
     "(int/uint4/per_group/32 ["),
])
def test_plan_says_which_moe_form(exports, recipe, ep, extra, note):
    from builder.convert import plan_model
    from builder.emit_context import BuildOptions
    from custom_ops import ort_library
    plan, ckpt = plan_model(exports[("qwen3_moe", recipe)] / "quark", ep, None, BuildOptions(extra=extra))
    ckpt.close()
    if "MatMulExperts" in note and ort_library.available()[0] is None:  # no library: QMoE / the standard-op form
        note = "as one com.microsoft QMoE each" if recipe == "uint4_g32" else "2 sparse layer(s) routed in standard ops"
    assert any(note in n for n in plan.notes), plan.notes


@pytest.mark.parametrize("shape,router", [("qwen3_moe", "mlp.gate"), ("gpt_oss", "mlp.router")])
def test_routers_not_excluded_stay_float(quark_exports, tmp_path, shape, router):
    """exclude without the routers: Quark 0.13 still leaves them float (no weight_scale), so they stay float MatMuls,
    with a note, and the model matches Quark."""
    from builder.convert import plan_model
    export = quark_exports(shape, "uint4_g32_router_not_excluded")
    plan, ckpt = plan_model(export / "quark", "cpu")
    ckpt.close()
    assert plan.linears[f"model.layers.0.{router}"].scheme.name == "float"
    assert any(f"model.layers.0.{router}: config resolves to" in n and "kept float" in n for n in plan.notes)
    out = build(export, tmp_path / "onnx", "cpu", "fp32", accuracy_level=1)
    ref = np.load(export / "reference.npz")
    assert float(np.abs(prompt_logits(out, ref["input_ids"]) - ref["logits"]).max()) <= LOGIT_TOL  # 1.3e-6, 8.3e-7


def test_ptpc_experts_are_refused(quark_exports, tmp_path):
    """Quark 0.13 quantizes a 2-D expert input per hidden channel over the routed tokens (measured: the per-token
    dense emulation is 0.14 off Quark's logits); refused at plan time, nothing written."""
    with pytest.raises(ConversionError, match="PTPC") as err:
        build(quark_exports("qwen3_moe", "ptpc_fp8"), tmp_path / "onnx", "cpu", "fp32")
    assert "model.layers.0.mlp.experts.0.gate_proj" in str(err.value)
    assert not (tmp_path / "onnx").exists()


def test_excluded_expert_stays_float(exports, tmp_path):
    export = exports[("qwen3_moe", "uint4_g32_expert3_excluded")]
    ops = op_types(build(export, tmp_path / "onnx", "cpu", "fp32"))
    # per sparse layer: q/k/v fused, o_proj, the 7 quantized experts' gate, up and down (a float expert among them:
    # no gate/up fusion); the dense layer: q/k/v, o_proj, gate/up, down_proj
    assert int4_linear_count(ops) == 2 * (2 + 7 * 3) + 4
    assert ops["MatMul"] == 2 * 3 + 2 and ops["Gemm"] == 1  # expert 3's gate, up and down, the routers; lm_head


@pytest.mark.parametrize("overrides,sparse", [
    ({}, (True, True, True, True)),
    ({"mlp_only_layers": [0, 3]}, (False, True, True, False)),
    ({"decoder_sparse_step": 2}, (False, True, False, True)),
    ({"decoder_sparse_step": 2, "mlp_only_layers": [1]}, (False, False, False, True)),
])
def test_sparse_layers_follow_transformers(overrides, sparse):
    _family, hp = family_for(dict(QWEN3_MOE_CFG, **overrides), "config.json")
    assert hp.sparse_layers == sparse


def test_transformers5_expert_count_spelling():
    cfg = dict(QWEN3_MOE_CFG, num_local_experts=8)
    del cfg["num_experts"]
    assert family_for(cfg, "config.json")[1].num_experts == 8


@pytest.mark.parametrize("overrides,message,field", [
    ({"hidden_act": "gelu"}, "SiLU", "hidden_act='gelu'"),
    ({"num_experts_per_tok": 9}, "exceeds num_experts", "num_experts_per_tok=9"),
    ({"moe_intermediate_size": None}, "positive integer", "moe_intermediate_size=None"),
    ({"mlp_only_layers": [7]}, "layer indices", "mlp_only_layers=[7]"),
    ({"decoder_sparse_step": 0}, "positive integer", "decoder_sparse_step=0"),
    ({"norm_topk_prob": "yes"}, "true or false", "norm_topk_prob='yes'"),
])
def test_unsupported_configs_are_refused(overrides, message, field):
    with pytest.raises(ConversionError, match=message) as err:
        family_for(dict(QWEN3_MOE_CFG, **overrides), "config.json")
    assert field in str(err.value)


def test_qwen2_moe_needs_the_shared_expert_width():
    cfg = dict(QWEN3_MOE_CFG, architectures=["Qwen2MoeForCausalLM"])
    with pytest.raises(ConversionError, match="shared_expert_intermediate_size=None"):
        family_for(cfg, "config.json")
    hp = family_for(dict(cfg, shared_expert_intermediate_size=96), "config.json")[1]
    assert hp.shared_expert_size == 96 and hp.model_type == "qwen2"
