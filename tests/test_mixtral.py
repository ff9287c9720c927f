"""MixtralForCausalLM: sparse MoE (builder/ops/moe.py: routed QMoE on CPU for 4-bit experts, dense elsewhere),
tests/quark_factory.py "mixtral" (4 experts, top-2; Quark quantizes the per-expert linears its
preprocess_for_quantization makes).

Integer weight-only logits/greedy against Quark's own model (uint4_g32, int4_per_channel) are in
test_int_weight_models.py (SHAPE_RECIPES). Here:
- the float export/float/ checkpoint in the Hub layout (block_sparse_moe.experts.{e}.w1/w2/w3) against the logits of
  transformers' own MixtralForCausalLM (reference.npz float_logits, made before Quark touched the model);
- fp16 io (router softmax in fp32 as transformers does) against Quark's model;
- the dense form (--extra_options moe=dense) against Quark's model too, so the fallback stays exact;
- graph layout: QMoE per layer on cpu; dense with moe=dense (all experts' gate/up in one
  MatMulNBits, one down_proj per expert, TopK routing);
- MXFP4 and FP8 W8A8 experts (dense form) against Quark's model;
- refusals: non-SiLU experts, top-k larger than the expert count.
"""
from __future__ import annotations

import numpy as np
import pytest

from builder.arch import family_for
from builder.errors import ConversionError
from onnx_helpers import build, genai_greedy, int4_experts_nodes, int4_linear_count, op_types, prompt_logits

# end-to-end cases of this module (tests/test_architecture_coverage.py); the integer ones are in
# test_int_weight_models.py
CASES = [("mixtral", "mxfp4"), ("mixtral", "fp8_w8a8")]
QUARK_EXPORTS = [("mixtral", "uint4_g32"), ("mixtral", "int4_per_channel")] + CASES
LAYERS, EXPERTS = 2, 4
MIXTRAL_CFG = {"architectures": ["MixtralForCausalLM"], "hidden_size": 64, "intermediate_size": 64,
               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
               "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "hidden_act": "silu",
               "num_local_experts": EXPERTS, "num_experts_per_tok": 2}


@pytest.fixture(scope="module")
def export(quark_exports):
    return quark_exports("mixtral", "uint4_g32")


def test_float_hub_layout_matches_transformers(export, tmp_path):
    out = build(export / "float", tmp_path / "onnx", "cpu", "fp32")
    ref = np.load(export / "reference.npz")
    diff = float(np.abs(prompt_logits(out, ref["input_ids"]) - ref["float_logits"]).max())
    assert diff <= 1e-4, diff  # measured 1.2e-6
    assert op_types(out).get("MatMulNBits", 0) == 0


def test_fp16_io_matches_quark(export, tmp_path):
    out = build(export, tmp_path / "onnx", "cpu", "fp16", accuracy_level=1)
    ref = np.load(export / "reference.npz")
    diff = float(np.abs(prompt_logits(out, ref["input_ids"]).astype(np.float32) - ref["logits"]).max())
    assert diff <= 2e-2, diff  # measured 3.5e-3 (fp16 activations)
    assert genai_greedy(out, ref["input_ids"]) == ref["greedy"].tolist()


@pytest.mark.parametrize("shape,recipe", CASES)
def test_mxfp4_and_fp8_experts_match_quark(quark_exports, tmp_path, shape, recipe):
    """Dense form (MXFP4 with dynamic MXFP4 activations, FP8 W8A8 per-tensor: no routed kernel reproduces them)."""
    export = quark_exports(shape, recipe)
    out = build(export, tmp_path / "onnx", "cpu", "fp32", accuracy_level=1)
    ref = np.load(export / "reference.npz")
    diff = float(np.abs(prompt_logits(out, ref["input_ids"]) - ref["logits"]).max())
    assert diff <= 1e-4, diff  # measured 9.5e-7 (mxfp4), 6.0e-7 (fp8)
    assert genai_greedy(out, ref["input_ids"]) == ref["greedy"].tolist()
    assert "QMoE" not in op_types(out)


@pytest.mark.parametrize("recipe", ["uint4_g32", "int4_per_channel"])
def test_dense_form_matches_quark(quark_exports, tmp_path, recipe):
    export = quark_exports("mixtral", recipe)
    out = build(export, tmp_path / "onnx", "cpu", "fp32", accuracy_level=1, moe="dense")
    ref = np.load(export / "reference.npz")
    diff = float(np.abs(prompt_logits(out, ref["input_ids"]) - ref["logits"]).max())
    assert diff <= 1e-4, diff  # measured 1.3e-6 (the routed default: 1.5e-6, test_int_weight_models.py)
    assert genai_greedy(out, ref["input_ids"]) == ref["greedy"].tolist()
    assert op_types(out).get("QMoE", 0) == 0


@pytest.mark.parametrize("recipe", ["uint4_g32", "int4_per_channel"])
def test_routed_qmoe_graph_on_cpu(quark_exports, tmp_path, recipe):
    ops = op_types(build(quark_exports("mixtral", recipe), tmp_path / "onnx", "cpu", "fp32"))
    assert int4_experts_nodes(ops) == 2 * LAYERS and "QMoE" not in ops  # the default: w1 + w3 fused, w2 per layer
    assert int4_linear_count(ops) == LAYERS * 2  # q/k/v fused and o_proj only: no expert MatMulNBits
    ops = op_types(build(quark_exports("mixtral", recipe), tmp_path / "qmoe", "cpu", "fp32", int4_experts="qmoe"))
    assert ops["QMoE"] == LAYERS
    assert int4_linear_count(ops) == LAYERS * 2  # q/k/v fused and o_proj only: no expert MatMulNBits
    assert "TopK" not in ops and "ScatterElements" not in ops


@pytest.mark.parametrize("ep,extra", [("cpu", {"moe": "dense"}), ("cuda", {"moe": "dense"}),
                                      ("migraphx", {"moe": "dense"})])
def test_dense_moe_graph_layout(export, tmp_path, ep, extra):
    ops = op_types(build(export, tmp_path / "onnx", ep, "fp16" if ep != "cpu" else "fp32", **extra))
    assert "QMoE" not in ops
    # per layer: q/k/v fused, o_proj, every expert's gate+up fused, one down_proj per expert; lm_head excluded
    assert int4_linear_count(ops) == LAYERS * (3 + EXPERTS)
    assert ops["TopK"] == ops["Softmax"] == ops["ScatterElements"] == LAYERS
    assert ops["MatMul"] + ops.get("Gemm", 0) == LAYERS + 1  # float routers and lm_head (a Gemm on cpu fp32)


def test_unknown_moe_form_is_refused(export, tmp_path):
    with pytest.raises(ConversionError, match="unknown moe form"):
        build(export, tmp_path / "onnx", "cpu", "fp32", moe="sparse")


@pytest.mark.parametrize("folder,layout,names", [
    ("quark", "quark", ("mlp.experts.3.gate_proj", "mlp.experts.3.up_proj", "mlp.experts.3.down_proj")),
    ("float", "hf", tuple(f"block_sparse_moe.experts.3.{w}" for w in ("w1", "w3", "w2"))),
])
def test_checkpoint_layout_is_detected(export, folder, layout, names):
    _family, hp = family_for(MIXTRAL_CFG, str(export / folder / "config.json"))
    assert (hp.num_experts, hp.experts_per_token, hp.layout) == (EXPERTS, 2, layout)
    assert hp.expert_linears(1, 3) == tuple(f"model.layers.1.{n}" for n in names)


@pytest.mark.parametrize("overrides,message,field", [
    ({"hidden_act": "gelu"}, "SiLU", "hidden_act='gelu'"),
    ({"num_experts_per_tok": 5}, "exceeds num_local_experts", "num_experts_per_tok=5"),
    ({"num_local_experts": None}, "positive integer", "num_local_experts=None"),
])
def test_unsupported_configs_are_refused(overrides, message, field):
    with pytest.raises(ConversionError, match=message) as err:
        family_for(dict(MIXTRAL_CFG, **overrides), "config.json")
    assert field in str(err.value)
