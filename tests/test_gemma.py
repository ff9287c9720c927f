"""Gemma2ForCausalLM / Gemma3ForCausalLM (text): graph layout, config reading and refusals.

Logits/greedy against Quark's own model (uint4_g32, int4_per_channel) are in test_int_weight_models.py
(SHAPE_RECIPES "gemma2", "gemma3"). The tiny shapes (tests/quark_factory.py GEMMA_KWARGS) make each Gemma
difference visible: measured max |logit diff| vs Quark when one is dropped from the converter, uint4_g32:
no sliding window 1.8 / 2.2, no attention softcap 0.23, no final softcap 0.71, head_dim**-0.5 instead of
query_pre_attn_scalar**-0.5 0.33 / 0.34, one rope cache for Gemma3 0.19, exact GELU instead of tanh 7e-4 / 6e-4
(the converted models themselves: <= 2.1e-6).
"""
from __future__ import annotations

import json
import shutil

import onnx
import pytest

from builder.arch.base import read_hyper
from builder.errors import ConversionError
from onnx_helpers import build, op_types

QUARK_EXPORTS = [("gemma2", "uint4_g32"), ("gemma3", "uint4_g32")]
LAYERS = 2


def _gqa_attrs(out) -> list[dict]:
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    return [{a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} | {"inputs": list(n.input)}
            for n in model.graph.node if n.op_type == "GroupQueryAttention"]


@pytest.mark.parametrize("shape", ["gemma2", "gemma3"])
def test_graph_layout(quark_exports, tmp_path, shape):
    out = build(quark_exports(shape, "uint4_g32"), tmp_path / "onnx", "cpu", "fp32")
    ops = op_types(out)
    # per layer: post_attention + post_feedforward plain (+ q/k norms on Gemma3); input_layernorm of layer 0 plain
    assert ops["SimplifiedLayerNormalization"] == 1 + 2 * LAYERS + (2 * LAYERS if shape == "gemma3" else 0)
    assert ops["SkipSimplifiedLayerNormalization"] == 2 * LAYERS  # pre_feedforward, next input norm / model.norm
    assert ops["Gelu"] == LAYERS and ops.get("Tanh", 0) == (1 if shape == "gemma2" else 0)
    attrs = _gqa_attrs(out)
    assert [a["local_window_size"] for a in attrs] == [4, -1]
    assert all(abs(a["scale"] - 24 ** -0.5) < 1e-7 for a in attrs)
    assert [a["softcap"] for a in attrs] == ([2.0, 2.0] if shape == "gemma2" else [0.0, 0.0])
    caches = [a["inputs"][7] for a in attrs]
    assert caches == (["cos_cache", "cos_cache"] if shape == "gemma2" else ["cos_cache_local", "cos_cache"])
    genai = json.loads((out / "genai_config.json").read_text())
    assert genai["model"]["type"] == {"gemma2": "gemma2", "gemma3": "gemma3_text"}[shape]


@pytest.mark.parametrize("shape", ["gemma2", "gemma3"])
def test_cuda_build_passes_its_ep_rules(quark_exports, tmp_path, shape):
    out = build(quark_exports(shape, "uint4_g32"), tmp_path / "cuda", "cuda", "fp16")  # convert() runs the EP check
    assert op_types(out)["GroupQueryAttention"] == LAYERS


def _edited_export(quark_exports, tmp_path, shape, **changes):
    src = tmp_path / "src"
    shutil.copytree(quark_exports(shape, "uint4_g32") / "quark", src)
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(changes)
    (src / "config.json").write_text(json.dumps(cfg))
    return src


@pytest.mark.parametrize("shape,changes,match", [
    ("gemma2", {"hidden_activation": "silu"}, "activation not supported"),
    ("gemma3", {"use_bidirectional_attention": True}, "bidirectional"),
    ("gemma2", {"query_pre_attn_scalar": None}, "query_pre_attn_scalar"),
    ("gemma2", {"attn_logit_softcapping": -1.0}, "softcapping"),
    ("gemma3", {"rope_parameters": {"full_attention": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 1e3}}},
     "rope scaling type not supported"),
])
def test_unsupported_configs_are_refused(quark_exports, tmp_path, shape, changes, match):
    src = _edited_export(quark_exports, tmp_path, shape, **changes)
    with pytest.raises(ConversionError, match=match):
        build(src, tmp_path / "out")
    assert not (tmp_path / "out").exists()


GEMMA3_CFG = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=7, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, vocab_size=256, max_position_embeddings=256, sliding_window=4)


def test_older_gemma3_config_spelling():
    """No layer_types: every 6th layer global (sliding_window_pattern); rope_theta + rope_local_base_freq."""
    cfg = dict(GEMMA3_CFG, rope_theta=1e6, rope_local_base_freq=1e4, rope_scaling={"rope_type": "linear",
                                                                                    "factor": 8.0})
    hp = read_hyper(cfg, "Gemma3ForCausalLM", "gemma3_text", "config.json")
    assert [hp.layer_window(i) for i in range(7)] == [4, 4, 4, 4, 4, -1, 4]
    assert hp.rope_theta == 1e6 and hp.rope_scaling["factor"] == 8.0 and hp.sliding_rope == (1e4, None)


def test_transformers5_gemma3_rope_parameters():
    cfg = dict(GEMMA3_CFG, layer_types=["sliding_attention", "full_attention"] * 3 + ["full_attention"],
               rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    hp = read_hyper(cfg, "Gemma3ForCausalLM", "gemma3_text", "config.json")
    assert [hp.layer_window(i) for i in range(7)] == [4, -1, 4, -1, 4, -1, -1]
    assert hp.rope_theta == 1e6 and hp.rope_scaling is None and hp.sliding_rope == (1e4, None)


def test_gemma2_default_layer_types_alternate():
    cfg = dict(GEMMA3_CFG, num_hidden_layers=4)
    hp = read_hyper(cfg, "Gemma2ForCausalLM", "gemma2", "config.json")
    assert [hp.layer_window(i) for i in range(4)] == [4, -1, 4, -1] and hp.sliding_rope is None
