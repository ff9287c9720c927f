"""MixtralForCausalLM: sparse MoE emitted densely (builder/ops/moe.py), tests/quark_factory.py "mixtral"
(4 experts, top-2; Quark quantizes the per-expert linears its preprocess_for_quantization makes).

Integer weight-only logits/greedy against Quark's own model (uint4_g32, int4_per_channel) are in
test_int_weight_models.py (SHAPE_RECIPES). Here:
- the float export/float/ checkpoint in the Hub layout (block_sparse_moe.experts.{e}.w1/w2/w3) against the logits of
  transformers' own MixtralForCausalLM (reference.npz float_logits, made before Quark touched the model);
- fp16 io (router softmax in fp32 as transformers does) against Quark's model;
- graph layout: all experts' gate/up in one MatMulNBits, one down_proj per expert, TopK routing;
- refusals: non-SiLU experts, top-k larger than the expert count.
"""
from __future__ import annotations

import numpy as np
import pytest

from builder.arch import family_for
from builder.errors import ConversionError
from onnx_helpers import build, genai_greedy, op_types, prompt_logits

QUARK_EXPORTS = [("mixtral", "uint4_g32")]
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


def test_dense_moe_graph_layout(export, tmp_path):
    ops = op_types(build(export, tmp_path / "onnx", "cpu", "fp32"))
    # per layer: q/k/v fused, o_proj, every expert's gate+up fused, one down_proj per expert; lm_head excluded
    assert ops["MatMulNBits"] == LAYERS * (3 + EXPERTS)
    assert ops["TopK"] == ops["Softmax"] == ops["ScatterElements"] == LAYERS
    assert ops["MatMul"] == LAYERS + 1  # float routers and lm_head


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
