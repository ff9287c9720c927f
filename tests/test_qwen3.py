"""Qwen3ForCausalLM: per-head q/k RMSNorm before RoPE, head_dim 32 != hidden/heads (tests/quark_factory.py "qwen3").

Integer weight-only logits/greedy against Quark's own model are in test_int_weight_models.py (SHAPE_RECIPES). Here:
- q_norm/k_norm weights are ones after HF init; with random weights written into the export the ONNX model must
  still match an fp32 transformers Qwen3 on independently decoded weights (tests/independent_decode.py);
- FP8 KV cache / FP8 attention: Quark's q/k_proj output quantizers observe the projection outputs, i.e. BEFORE
  q_norm/k_norm; reference: tests/w8a8_emulation.py (hooks on the transformers model's q/k/v_proj outputs);
- graph layout, EP static rules, and refusals (bad norm shape, mixed sliding-window layers).
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest

from builder.arch.base import read_hyper
from builder.errors import ConversionError
from onnx_helpers import NEW_TOKENS, build, genai_greedy, op_types, prompt_logits
from quark_factory import forward_logits, torch_greedy
from w8a8_emulation import TOL_VS_EMULATION, emulate

LOGIT_TOL = 1e-4
QUARK_EXPORTS = [("qwen3", "uint4_g32"), ("qwen3", "int4_per_channel"), ("qwen3", "uint4_g64_kv"),
                 ("qwen3", "uint4_g64_kv_attn")]
LAYERS = 2


def _with_random_head_norms(export, dst):
    """Copy of the export's quark/ folder whose q_norm/k_norm weights are random (not HF's ones)."""
    from safetensors.numpy import load_file, save_file
    shutil.copytree(export / "quark", dst)
    tensors = load_file(str(dst / "model.safetensors"))
    rng = np.random.default_rng(7)
    for name in [n for n in tensors if n.endswith(("q_norm.weight", "k_norm.weight"))]:
        tensors[name] = (1.0 + 0.5 * rng.standard_normal(tensors[name].shape)).astype(np.float32)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.mark.parametrize("recipe", ["uint4_g32", "int4_per_channel"])
def test_random_head_norm_weights_match_transformers(quark_exports, tmp_path, recipe):
    import torch

    from independent_decode import load_reference_model
    src = _with_random_head_norms(quark_exports("qwen3", recipe), tmp_path / "src")
    ids = np.load(quark_exports("qwen3", recipe) / "reference.npz")["input_ids"]
    out = build(src, tmp_path / "onnx", "cpu", "fp32", accuracy_level=1)
    model = load_reference_model(src)
    seq = torch.from_numpy(ids)
    diff = float(np.abs(prompt_logits(out, ids) - forward_logits(model, seq).numpy()).max())
    assert diff <= LOGIT_TOL, diff
    greedy, margins = torch_greedy(model, seq, NEW_TOKENS)
    assert min(margins) > LOGIT_TOL
    assert genai_greedy(out, ids) == greedy


@pytest.mark.parametrize("recipe", ["uint4_g64_kv", "uint4_g64_kv_attn"])
def test_fp8_kv_and_attention_quantize_before_the_head_norms(quark_exports, tmp_path, recipe):
    export = quark_exports("qwen3", recipe)
    out = build(export, tmp_path / "onnx", "cpu", "fp32", accuracy_level=1)
    ops = op_types(out)
    assert ops["SimplifiedLayerNormalization"] == 1 + 2 * LAYERS  # first input_layernorm + q/k norms
    if recipe.endswith("attn"):
        # cpu: the fixed-order softmax in front of the probability quantizer (issue 21)
        assert "GroupQueryAttention" not in ops and "Softmax" not in ops and ops["Exp"] == LAYERS
    else:
        assert ops["GroupQueryAttentionFixedOrder"] == LAYERS  # the cpu default's fixed-order fused op
    # each layer: QDQ(k_proj output) feeds k_norm's Reshape (the norm follows the quantizer, as in Quark)
    nodes = {n.name: n for n in onnx.load(str(out / "model.onnx"), load_external_data=False).graph.node}
    for i in range(LAYERS):
        k_in = nodes[f"/model/layers.{i}/attn/k_norm/Reshape"].input[0]
        assert k_in in (f"/model/layers.{i}/attn/k_quant/DequantizeLinear/output_0",
                        f"/model/layers.{i}/attn/k_quant/QuantizeDequantizeFp8/output_0")  # the pair as one node
    ids = np.load(export / "reference.npz")["input_ids"]
    emu_logits, emu_greedy = emulate(export, ids)
    diff = float(np.abs(prompt_logits(out, ids) - emu_logits).max())
    assert diff <= TOL_VS_EMULATION, diff
    assert genai_greedy(out, ids) == list(emu_greedy)


def test_head_norm_layout(quark_exports, tmp_path):
    out = build(quark_exports("qwen3", "uint4_g32"), tmp_path / "onnx")
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    nodes = {n.name: n for n in model.graph.node}
    inits = {t.name: list(t.dims) for t in model.graph.initializer}
    for i in range(LAYERS):
        p = f"/model/layers.{i}/attn"
        for proj, heads, slot in (("q", 4, 0), ("k", 2, 1)):
            norm = nodes[f"{p}/{proj}_norm/SimplifiedLayerNorm"]
            assert inits[norm.input[1]] == [32]  # weight [head_dim]
            assert norm.input[1] == f"model.layers.{i}.self_attn.{proj}_norm.weight"
            assert [a.f for a in norm.attribute if a.name == "epsilon"] == [pytest.approx(1e-5)]
            assert nodes[f"{p}/GroupQueryAttentionFixedOrder"].input[slot] == f"{p}/{proj}_norm/Reshape_back/output_0"
            assert nodes[f"{p}/{proj}_norm/Reshape"].input[0] == f"{p}/qkv_proj/Split/output_{slot}"
        assert nodes[f"{p}/GroupQueryAttentionFixedOrder"].input[2] == f"{p}/qkv_proj/Split/output_2"  # v: no norm
    cfg = json.loads((out / "genai_config.json").read_text())["model"]
    assert cfg["type"] == "qwen3" and cfg["decoder"]["head_size"] == 32 and cfg["decoder"]["hidden_size"] == 64


@pytest.mark.parametrize("ep", ["cuda", "migraphx"])
def test_gpu_builds_pass_their_ep_rules(quark_exports, tmp_path, ep):
    out = build(quark_exports("qwen3", "uint4_g32"), tmp_path / ep, ep, "fp16")  # convert() runs the EP check
    assert op_types(out)["SimplifiedLayerNormalization"] == 1 + 2 * LAYERS


def test_wrong_head_norm_shape_is_refused(quark_exports, tmp_path):
    from safetensors.numpy import load_file, save_file
    src = tmp_path / "src"
    shutil.copytree(quark_exports("qwen3", "uint4_g32") / "quark", src)
    tensors = load_file(str(src / "model.safetensors"))
    tensors["model.layers.1.self_attn.k_norm.weight"] = np.ones(16, np.float32)
    save_file(tensors, str(src / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ConversionError, match="shape does not match config.json") as err:
        build(src, tmp_path / "out")
    assert "model.layers.1.self_attn.k_norm.weight" in str(err.value) and "[32]" in str(err.value)
    assert not (tmp_path / "out").exists()


QWEN3_CFG = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, vocab_size=256, max_position_embeddings=256,
                 sliding_window=48, max_window_layers=28)


@pytest.mark.parametrize("overrides,window", [
    ({"use_sliding_window": False}, -1),
    ({}, -1),                                                           # transformers' default: false
    ({"use_sliding_window": True, "max_window_layers": 0}, 48),         # every layer windowed
    ({"use_sliding_window": True, "layer_types": ["sliding_attention"] * 4}, 48),
    ({"use_sliding_window": True, "layer_types": ["full_attention"] * 4}, -1),
    ({"use_sliding_window": False, "layer_types": ["sliding_attention"] * 4}, -1),  # window is None then
])
def test_sliding_window_follows_transformers(overrides, window):
    hp = read_hyper(dict(QWEN3_CFG, **overrides), "Qwen3ForCausalLM", "qwen3", "config.json")
    assert hp.sliding_window == window and hp.head_dim == 32


@pytest.mark.parametrize("overrides", [{"use_sliding_window": True},  # layers >= max_window_layers=2 windowed
                                       {"use_sliding_window": True,
                                        "layer_types": ["full_attention", "full_attention", "sliding_attention",
                                                        "sliding_attention"]}])
def test_mixed_sliding_window_layers_get_their_own_window(overrides):
    cfg = dict(QWEN3_CFG, max_window_layers=2, **{k: v for k, v in overrides.items()})
    hp = read_hyper(cfg, "Qwen3ForCausalLM", "qwen3", "config.json")
    assert [hp.layer_window(i) for i in range(4)] == [-1, -1, 48, 48] and not hp.uniform_window


def test_bad_layer_types_are_refused():
    cfg = dict(QWEN3_CFG, use_sliding_window=True, layer_types=["sliding_attention", "chunked"])
    with pytest.raises(ConversionError, match="layer_types"):
        read_hyper(cfg, "Qwen3ForCausalLM", "qwen3", "config.json")
