"""GptOssForCausalLM (builder/arch/gpt_oss.py, builder/ops/moe_clamped_swiglu.py) against Quark's own model.

Shape "gpt_oss" (tests/quark_factory.py): 2 layers, 4 experts top-2 of width 64, head_dim 16, sliding window 4 on
layer 0 only (layer_types), random attention sinks and biases everywhere (q/k/v/o, router, experts),
swiglu_limit 1.0 so that the clamps act. Each of those changes the logits by 0.6-1.0 when left out of the graph
(measured by leaving out the head_sink input, the window, the clamp: 0.96, 1.04, 0.62).
Schemes: uint4 g32 and int4 per-channel (routed com.microsoft QMoE on CPU with swiglu_limit/alpha/beta and expert
biases), int8 weight-only, MXFP4 (weights and dynamic MXFP4 activations), MXFP4 weights with static FP8 activations
(Quark mxfp4_fp8, as amd/gpt-oss-120b-w-mxfp4-a-fp8) and FP8 W8A8 per-tensor (dense form).
Reference: reference.npz, Quark's frozen fake-quantized PyTorch model (QuarkGptOssExperts); ONNX: ORT CPU prompt
logits and 16 greedy tokens through og.Generator.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest

from builder.arch import family_for
from builder.errors import ConversionError
from onnx_helpers import (NEW_TOKENS, build, decisive_prefix, genai_greedy, int4_experts_nodes, op_types,
                          prompt_logits)

LOGIT_TOL = 1e-4  # measured max |logit diff| 8.3e-7 (fp32 io, accuracy_level 1)
ROUTED = {"uint4_g32", "int4_per_channel"}
CASES = [("gpt_oss", r) for r in ("uint4_g32", "int4_per_channel", "int8_wo_g32", "mxfp4", "mxfp4_fp8", "fp8_w8a8")]
CASES += [("gpt_oss_yarn", r) for r in ("uint4_g32", "mxfp4")]  # + yarn rope, truncate false (0.14 without it)
QUARK_EXPORTS = CASES
LAYERS = 2
GPT_OSS_CFG = {"architectures": ["GptOssForCausalLM"], "hidden_size": 64, "intermediate_size": 64,
               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
               "vocab_size": 256, "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "num_local_experts": 4,
               "num_experts_per_tok": 2, "sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"],
               "attention_bias": True, "swiglu_limit": 7.0}


@pytest.fixture(scope="module")
def exports(quark_exports):
    return dict(zip(CASES, quark_exports.many(CASES)))


def _check(out, ref, tol=LOGIT_TOL):
    diff = float(np.abs(prompt_logits(out, ref["input_ids"]).astype(np.float32) - ref["logits"]).max())
    assert diff <= tol, f"max |logit diff| {diff:.3g} > {tol}"
    return diff


@pytest.mark.parametrize("shape,recipe", CASES, ids=[f"{s}-{r}" for s, r in CASES])
def test_logits_and_greedy_match_quark(exports, tmp_path, shape, recipe):
    export = exports[(shape, recipe)]
    out = build(export, tmp_path / "onnx", "cpu", "fp32", accuracy_level=1)
    ref = np.load(export / "reference.npz")
    _check(out, ref)
    assert decisive_prefix(ref["greedy_margins"], LOGIT_TOL) == NEW_TOKENS, "reference has a near-tie"
    assert genai_greedy(out, ref["input_ids"]) == ref["greedy"].tolist()
    ops = op_types(out)  # 4-bit experts: MatMulExpertsUint4 / Int4 for gate_up and down (the cpu default)
    assert int4_experts_nodes(ops) == (2 * LAYERS if recipe in ROUTED else 0) and "QMoE" not in ops
    assert ops.get("TopK", 0) == LAYERS


def test_dense_form_matches_quark(exports, tmp_path):
    export = exports[("gpt_oss", "uint4_g32")]
    out = build(export, tmp_path / "onnx", "cpu", "fp32", accuracy_level=1, moe="dense")
    ref = np.load(export / "reference.npz")
    _check(out, ref)  # measured 8.3e-7
    assert genai_greedy(out, ref["input_ids"]) == ref["greedy"].tolist()
    assert "QMoE" not in op_types(out)


@pytest.mark.parametrize("recipe", ["uint4_g32", "fp8_w8a8"])
def test_fp16_io_matches_quark(exports, tmp_path, recipe):
    export = exports[("gpt_oss", recipe)]
    out = build(export, tmp_path / "onnx", "cpu", "fp16", accuracy_level=1)
    _check(out, np.load(export / "reference.npz"), tol=0.1)  # fp16 activations: measured 2.4e-3 (uint4), 4.8e-2 (fp8)


@pytest.mark.parametrize("attention", ["fused", "auto"])
def test_graph_has_sinks_windows_and_qmoe_attributes(exports, tmp_path, attention):
    """int4_experts=qmoe (the cpu form without the custom-op library): QMoE with gpt-oss's clamped SwiGLU and
    biases, against Quark's logits; the sinks and windows on ORT's GroupQueryAttention (attention=fused) and on the
    cpu default's GroupQueryAttentionFixedOrderSinks."""
    export = exports[("gpt_oss", "uint4_g32")]
    out = build(export, tmp_path / "onnx", "cpu", "fp32", accuracy_level=1, int4_experts="qmoe", attention=attention)
    _check(out, np.load(export / "reference.npz"))
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    op, sink_slot = ("GroupQueryAttention", 11) if attention == "fused" else ("GroupQueryAttentionFixedOrderSinks", 9)
    gqa = [n for n in model.graph.node if n.op_type == op]
    windows = [next(a.i for a in n.attribute if a.name == "local_window_size") for n in gqa]
    assert windows == [4, -1]
    assert all(len(n.input) == sink_slot + 1 and n.input[sink_slot] == f"model.layers.{i}.self_attn.sinks"
               for i, n in enumerate(gqa))
    qmoe = [n for n in model.graph.node if n.op_type == "QMoE"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in qmoe[0].attribute}
    assert (attrs["swiglu_fusion"], attrs["activation_beta"], attrs["swiglu_limit"]) == (1, 1.0, 1.0)
    assert abs(attrs["activation_alpha"] - 1.702) < 1e-6
    assert qmoe[0].input[4] and qmoe[0].input[7]  # fc1 / fc2 expert biases
    assert json.loads((out / "genai_config.json").read_text())["model"]["type"] == "gptoss"


@pytest.mark.parametrize("recipe", ["uint4_g32", "int4_per_channel", "int8_wo_g32", "mxfp4", "mxfp4_fp8", "fp8_w8a8"])
def test_cuda_gets_the_routed_standard_op_form(exports, tmp_path, recipe):
    """Built and passing CUDA's static rules (not run on a GPU here): one If per layer (builder/ops/routed_experts.py)."""
    ops = op_types(build(exports[("gpt_oss", recipe)], tmp_path / "onnx", "cuda", "fp16"))
    assert "QMoE" not in ops and ops["TopK"] == LAYERS and ops["GroupQueryAttention"] == LAYERS
    assert ops["If"] == LAYERS


AMD_CASES = [(s, r, ep) for s, r in (("gpt_oss", "uint4_g32"), ("gpt_oss", "mxfp4"), ("gpt_oss_yarn", "mxfp4"))
             for ep in ("migraphx", "rocm")]


@pytest.mark.parametrize("shape,recipe,ep", AMD_CASES, ids=[f"{s}-{r}-{e}" for s, r, e in AMD_CASES])
def test_amd_eps_run_sinks_and_windows_in_explicit_attention(exports, tmp_path, shape, recipe, ep):
    """rocm/migraphx: no GroupQueryAttention (MIGraphX's has no head_sink), the explicit subgraph of
    builder/ops/sink_attention.py with the routed standard-op MoE; the fp32 graph run on ORT CPU (logits and og
    greedy with the cache as genai feeds it: past_present_share_buffer false) against Quark's model, and the
    MIGraphX parser rules (builder/ep_rules.py) pass on the fp16 graph."""
    from builder.ep_check import check_findings
    from builder.ep_configs import get_ep
    from test_migraphx_forms import CPU_DQ_EXACT, cpu_provider_copy
    export = exports[(shape, recipe)]
    ref = np.load(export / "reference.npz")
    out = build(export, tmp_path / "onnx", ep, "fp32")
    ops = op_types(out)
    assert "GroupQueryAttention" not in ops and ops["Softmax"] == 2 * LAYERS and ops["If"] == LAYERS
    diff = float(np.abs(prompt_logits(out, ref["input_ids"], CPU_DQ_EXACT) - ref["logits"]).max())
    assert diff <= LOGIT_TOL, diff  # measured 6.0e-7 (MXFP4), 7.2e-7 (uint4)
    cfg = json.loads((out / "genai_config.json").read_text())
    assert cfg["search"]["past_present_share_buffer"] is False
    assert genai_greedy(cpu_provider_copy(out, tmp_path / "on_cpu"), ref["input_ids"]) == ref["greedy"].tolist()
    fp16 = build(export, tmp_path / "fp16", ep, "fp16")
    assert [f for f in check_findings(fp16 / "model.onnx", get_ep("migraphx")) if f.severity == "error"] == []


def test_separate_gate_up_layout_is_refused(exports, tmp_path):
    """A checkpoint with per-expert gate_proj/up_proj (not what Quark 0.13 + transformers 5 writes) is refused."""
    src = tmp_path / "src"
    shutil.copytree(exports[("gpt_oss", "uint4_g32")] / "quark", src)
    from safetensors.numpy import load_file, save_file
    [shard] = src.glob("*.safetensors")
    tensors = load_file(shard)
    prefix = "model.layers.0.mlp.experts.0."
    tensors[prefix + "gate_proj.weight"] = tensors.pop(prefix + "gate_up_proj.weight")
    save_file(tensors, shard)
    with pytest.raises(ConversionError, match="separate per-expert gate_proj/up_proj"):
        build(src, tmp_path / "onnx", "cpu", "fp32")


@pytest.mark.parametrize("overrides,message,field", [
    ({"num_experts_per_tok": 5}, "exceeds num_local_experts", "num_experts_per_tok=5"),
    ({"num_local_experts": None}, "positive integer", "num_local_experts=None"),
    ({"swiglu_limit": -1}, "positive number", "swiglu_limit=-1"),
    ({"attention_bias": False}, "attention biases", "attention_bias=False"),
    ({"layer_types": ["sliding_attention"]}, "layer_types", "layer_types"),
])
def test_unsupported_configs_are_refused(tmp_path, overrides, message, field):
    with pytest.raises(ConversionError, match=message) as err:
        family_for(dict(GPT_OSS_CFG, **overrides), str(tmp_path / "config.json"))
    assert field in str(err.value)


def test_layer_types_give_per_layer_windows(tmp_path):
    _family, hp = family_for(GPT_OSS_CFG, str(tmp_path / "config.json"))
    assert [hp.layer_window(i) for i in range(2)] == [4, -1]
    assert (hp.num_experts, hp.experts_per_token, hp.swiglu_limit, hp.swiglu_alpha) == (4, 2, 7.0, 1.702)
