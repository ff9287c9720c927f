"""Phi3ForCausalLM: fused self_attn.qkv_proj / mlp.gate_up_proj modules (tests/quark_factory.py "phi3").

Integer weight-only logits/greedy against Quark's own model are in test_int_weight_models.py (SHAPE_RECIPES). Here:
- W8A8 (int8, fp8): each fused module has its own input_scale; logits and og.Generator greedy vs Quark's model;
- graph layout: one quantized matmul per fused module, then a Split in transformers' order (q, k, v; gate, up);
- partial rotary: the export's config edited to partial_rotary_factor 0.5 (head_dim 32 -> rotary_dim 16) must
  match an fp32 transformers Phi3 on independently decoded weights (tests/independent_decode.py);
- refusals: longrope/su, rotary widths GroupQueryAttention cannot take, non-SiLU MLPs.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest

from builder.arch import family_for
from builder.errors import ConversionError
from onnx_helpers import NEW_TOKENS, build, decisive_prefix, genai_greedy, op_types, prompt_logits
from quark_factory import forward_logits, torch_greedy

LOGIT_TOL = 1e-4
QUARK_EXPORTS = [("phi3", "int8_w8a8"), ("phi3", "fp8_w8a8"), ("phi3", "uint4_g32"), ("phi3_hd32", "uint4_g32")]
LAYERS = 2


@pytest.mark.parametrize("recipe", ["int8_w8a8", "fp8_w8a8"])
def test_w8a8_logits_and_greedy_match_quark(quark_exports, tmp_path, recipe):
    export = quark_exports("phi3", recipe)
    out = build(export, tmp_path / "onnx", "cpu", "fp32", accuracy_level=1)
    ref = np.load(export / "reference.npz")
    diff = float(np.abs(prompt_logits(out, ref["input_ids"]) - ref["logits"]).max())
    assert diff <= LOGIT_TOL, diff
    assert decisive_prefix(ref["greedy_margins"], LOGIT_TOL) == NEW_TOKENS
    assert genai_greedy(out, ref["input_ids"]) == ref["greedy"].tolist()


def test_fused_modules_are_single_matmuls_then_split(quark_exports, tmp_path):
    out = build(quark_exports("phi3", "uint4_g32"), tmp_path / "onnx")
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    nodes = {n.name: n for n in model.graph.node}
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer if not t.external_data}
    assert op_types(out)["MatMulUint4"] == 4 * LAYERS  # qkv, o, gate_up, down (the cpu default's exact 4-bit op)
    for i in range(LAYERS):
        p = f"/model/layers.{i}"
        for proj, n_out, sizes in (("attn/qkv_proj", 128, [64, 32, 32]), ("mlp/gate_up_proj", 256, [128, 128])):
            mm = nodes[f"{p}/{proj}/MatMulUint4"]
            assert {a.name: a.i for a in mm.attribute}["N"] == n_out
            split = nodes[f"{p}/{proj}/Split"]
            assert split.input[0] == mm.output[0] and inits[split.input[1]].tolist() == sizes
        gqa = nodes[f"{p}/attn/GroupQueryAttentionFixedOrder"]  # the cpu default (custom-op library)
        assert list(gqa.input[:3]) == [f"{p}/attn/qkv_proj/Split/output_{j}" for j in range(3)]
        assert nodes[f"{p}/mlp/act_fn/Sigmoid"].input[0] == f"{p}/mlp/gate_up_proj/Split/output_0"  # gate first
        assert list(nodes[f"{p}/mlp/Mul"].input) == [f"{p}/mlp/act_fn/Mul/output_0",
                                                    f"{p}/mlp/gate_up_proj/Split/output_1"]
    cfg = json.loads((out / "genai_config.json").read_text())["model"]
    assert cfg["type"] == "phi3" and cfg["decoder"]["head_size"] == 16


def _with_partial_rotary(export, dst, factor):
    shutil.copytree(export / "quark", dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["rope_parameters"]["partial_rotary_factor"] = factor
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_partial_rotary_matches_transformers(quark_exports, tmp_path):
    import torch

    from independent_decode import load_reference_model
    export = quark_exports("phi3_hd32", "uint4_g32")
    src = _with_partial_rotary(export, tmp_path / "src", 0.5)
    ids = np.load(export / "reference.npz")["input_ids"]
    out = build(src, tmp_path / "onnx", "cpu", "fp32", accuracy_level=1)
    cos = next(t for t in onnx.load(str(out / "model.onnx"), load_external_data=False).graph.initializer
               if t.name == "cos_cache")
    assert list(cos.dims) == [256, 8]  # rotary_dim 16 of head_dim 32
    model = load_reference_model(src)
    assert model.model.rotary_emb.inv_freq.numel() == 8  # transformers really rotates 16 dims
    seq = torch.from_numpy(ids)
    ref_logits = forward_logits(model, seq).numpy()
    diff = float(np.abs(prompt_logits(out, ids) - ref_logits).max())
    assert diff <= LOGIT_TOL, diff
    # the same weights with full rotary are far from this reference: the test sees the rotary width
    full = build(export, tmp_path / "full", "cpu", "fp32", accuracy_level=1)
    assert float(np.abs(prompt_logits(full, ids) - ref_logits).max()) > 100 * LOGIT_TOL
    greedy, margins = torch_greedy(model, seq, NEW_TOKENS)
    assert decisive_prefix(margins, LOGIT_TOL) == NEW_TOKENS and 2 not in greedy  # eos would stop og.Generator
    assert genai_greedy(out, ids) == greedy


@pytest.mark.parametrize("ep", ["cuda", "migraphx"])
def test_gpu_builds_pass_their_ep_rules(quark_exports, tmp_path, ep):
    out = build(quark_exports("phi3", "uint4_g32"), tmp_path / ep, ep, "fp16")  # convert() runs the EP check
    assert op_types(out)["Split"] == 2 * LAYERS


PHI3_CFG = dict(architectures=["Phi3ForCausalLM"], hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, vocab_size=256, max_position_embeddings=256,
                hidden_act="silu", rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                    "partial_rotary_factor": 1.0})


def test_full_rotary_config_is_accepted():
    _family, hp = family_for(PHI3_CFG, "config.json")
    assert hp.model_type == "phi3" and hp.partial_rotary_factor == 1.0 and hp.rope_scaling is None


@pytest.mark.parametrize("overrides,message,field", [
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 8,
                          "long_factor": [2.0] * 8, "original_max_position_embeddings": 128}},
     "rope scaling is not supported", "rope_type='longrope'"),
    ({"rope_scaling": {"type": "su", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}},
     "rope scaling is not supported", "rope_type='su'"),
    # head_dim 16 * 0.5 = 8 rotary dims: cos_cache width 4, not a multiple of 8 (ORT refuses it at run time)
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}},
     "positive multiple of 8", "partial_rotary_factor=0.5"),
    ({"hidden_act": "gelu_new"}, "SiLU", "hidden_act='gelu_new'"),
])
def test_unsupported_configs_are_refused(overrides, message, field):
    with pytest.raises(ConversionError, match=message) as err:
        family_for(dict(PHI3_CFG, **overrides), "config.json")
    assert field in str(err.value)
