"""DeepseekV3ForCausalLM: MLA with materialised per-head K/V in GroupQueryAttention, grouped sigmoid top-k routing,
shared experts, first dense layers (builder/arch/deepseek_v3.py), tests/quark_factory.py "deepseek_v3" (q LoRA,
interleaved rope, qk head 32 > v head 16) and "deepseek_v3_qproj_yarn" (q_proj, rotate-half rope, yarn with mscale,
qk head 16 < v head 32). Quark's deepseek_v3 template keeps self_attn, the routers and lm_head float.

- the float checkpoint each export was made from against transformers' own DeepseekV3ForCausalLM logits;
- uint4 g32, MXFP4 (weights + dynamic MXFP4 activations) and FP8 W8A8 with Quark's FP8 KV cache on kv_b_proj,
  against Quark's own model: prompt logits, and 16 greedy tokens through og.Generator (KV cache, one token a step);
- graph layout per EP; refusals of what the family cannot express.
"""
from __future__ import annotations

import numpy as np
import pytest

from builder.arch import family_for
from builder.errors import ConversionError
from onnx_helpers import (build, fp8_quantize_count, genai_greedy, int4_experts_nodes, int4_linear_count, op_types,
                          prompt_logits)

QUARK_EXPORTS = [("deepseek_v3", "uint4_g32"), ("deepseek_v3", "mxfp4"), ("deepseek_v3", "fp8_w8a8_kv"),
                 ("deepseek_v3", "mxfp4_attn_kv"), ("deepseek_v3_qproj_yarn", "uint4_g32"),
                 ("deepseek_v3_qproj_yarn", "mxfp4_attn_kv")]
LAYERS, MOE_LAYERS, EXPERTS = 2, 1, 8
EOS_ID = 2  # og.Generator stops there; Quark's reference greedy (tests/quark_factory.py) does not

# max |logit diff| bound against Quark's model (fp32 io, CPU, accuracy_level=1); measured in the comments
LOGIT_BOUNDS = {("deepseek_v3", "uint4_g32"): 2e-5,                # 1.8e-6 (routed QMoE and dense form)
                ("deepseek_v3", "mxfp4"): 2e-5,                    # 9.5e-7
                ("deepseek_v3", "fp8_w8a8_kv"): 2e-5,              # 7.2e-7
                ("deepseek_v3", "mxfp4_attn_kv"): 2e-5,            # 9.5e-7
                ("deepseek_v3_qproj_yarn", "uint4_g32"): 2e-5,     # 2.0e-6
                ("deepseek_v3_qproj_yarn", "mxfp4_attn_kv"): 2e-5}  # 4.8e-7


def expected_greedy(ref) -> list[int]:
    """Quark's greedy tokens up to and including the first eos (where og.Generator stops)."""
    tokens = ref["greedy"].tolist()
    return tokens[:tokens.index(EOS_ID) + 1] if EOS_ID in tokens else tokens


def check_against_quark(out, ref, bound):
    diff = float(np.abs(prompt_logits(out, ref["input_ids"]) - ref["logits"]).max())
    assert diff <= bound, diff
    assert genai_greedy(out, ref["input_ids"]) == expected_greedy(ref)


@pytest.mark.parametrize("shape", ["deepseek_v3", "deepseek_v3_qproj_yarn"])
def test_float_checkpoint_matches_transformers(quark_exports, tmp_path, shape):
    export = quark_exports(shape, "uint4_g32")
    out = build(export / "float", tmp_path / "onnx", "cpu", "fp32")
    ref = np.load(export / "reference.npz")
    diff = float(np.abs(prompt_logits(out, ref["input_ids"]) - ref["float_logits"]).max())
    assert diff <= 2e-5, diff  # measured 1.9e-6 (deepseek_v3), 1.8e-6 (qproj_yarn)
    assert op_types(out).get("MatMulNBits", 0) == 0


@pytest.mark.parametrize("shape,recipe", QUARK_EXPORTS)
def test_quantized_matches_quark(quark_exports, tmp_path, shape, recipe):
    """The default form (routed MatMulExpertsUint4 on CPU for the uint4 experts: gate_up fused, down; QMoE with
    int4_experts=qmoe; dense-with-routing for MXFP4/FP8)."""
    export = quark_exports(shape, recipe)
    out = build(export, tmp_path / "onnx", "cpu", "fp32", accuracy_level=1)
    assert int4_experts_nodes(op_types(out)) == (2 * MOE_LAYERS if recipe == "uint4_g32" else 0)
    check_against_quark(out, np.load(export / "reference.npz"), LOGIT_BOUNDS[(shape, recipe)])
    if recipe == "uint4_g32":
        out = build(export, tmp_path / "qmoe", "cpu", "fp32", accuracy_level=1, int4_experts="qmoe")
        assert op_types(out)["QMoE"] == MOE_LAYERS
    check_against_quark(out, np.load(export / "reference.npz"), LOGIT_BOUNDS[(shape, recipe)])


@pytest.mark.parametrize("shape", ["deepseek_v3", "deepseek_v3_qproj_yarn"])
def test_dense_form_matches_quark(quark_exports, tmp_path, shape):
    export = quark_exports(shape, "uint4_g32")
    out = build(export, tmp_path / "onnx", "cpu", "fp32", accuracy_level=1, moe="dense")
    assert op_types(out).get("QMoE", 0) == 0
    check_against_quark(out, np.load(export / "reference.npz"), 2e-5)  # measured 1.8e-6, 1.9e-6


def test_routed_default_accuracy_level(quark_exports, tmp_path):
    """CPU default accuracy_level 4 (int8 activations in MatMulNBits and QMoE): near Quark, same greedy tokens."""
    export = quark_exports("deepseek_v3", "uint4_g32")
    check_against_quark(build(export, tmp_path / "onnx", "cpu", "fp32"), np.load(export / "reference.npz"),
                        0.2)  # measured 0.041


def test_fp16_io_matches_quark(quark_exports, tmp_path):
    export = quark_exports("deepseek_v3", "uint4_g32")
    out = build(export, tmp_path / "onnx", "cpu", "fp16", accuracy_level=1)
    ref = np.load(export / "reference.npz")
    diff = float(np.abs(prompt_logits(out, ref["input_ids"]) - ref["logits"]).max())
    assert diff <= 2e-2, diff  # measured 5.1e-3 (fp16 activations; router in fp32)
    assert genai_greedy(out, ref["input_ids"]) == expected_greedy(ref)


@pytest.mark.parametrize("ep,precision,extra", [("cpu", "fp32", {}), ("cpu", "fp32", {"moe": "dense"}),
                                                ("cuda", "fp16", {}), ("migraphx", "fp16", {})])
def test_graph_layout(quark_exports, tmp_path, ep, precision, extra):
    ops = op_types(build(quark_exports("deepseek_v3", "uint4_g32"), tmp_path / "onnx", ep, precision, **extra))
    assert ops["GroupQueryAttention"] == LAYERS
    gather = ep != "cpu"  # the GPU EPs: the routed standard-op form (builder/ops/routed_experts.py)
    # group top-2, top groups, top experts (+ the routed forms' TopK of the dense weights; not moe=dense's)
    assert ops["TopK"] == (3 if extra else 4) * MOE_LAYERS
    # per layer q_a, q_b, kv_a, kv_b, o_proj (float in Quark's template); routers; lm_head
    # (on cpu fp32 the lm_head is a Gemm on the row-order weight: builder/quant/float_linear.py)
    assert ops["MatMul"] + ops.get("Gemm", 0) == 5 * LAYERS + MOE_LAYERS + 1
    assert ops.get("Gemm", 0) == (1 if ep == "cpu" else 0)
    dense_mlp = (LAYERS - MOE_LAYERS) * 2  # gate/up fused + down
    if ep == "cpu" and not extra:  # routed experts: MatMulExpertsUint4 gate_up, down; shared expert gate/up + down
        assert int4_experts_nodes(ops) == 2 * MOE_LAYERS and "QMoE" not in ops
        assert int4_linear_count(ops) == dense_mlp + MOE_LAYERS * 2
    elif gather:  # experts inside one If per layer; shared expert gate/up fused + down
        assert "QMoE" not in ops and ops["If"] == MOE_LAYERS
        assert int4_linear_count(ops) == dense_mlp + MOE_LAYERS * 2
    else:  # every expert's and the shared expert's gate/up fused, one down_proj per expert + the shared one
        assert "QMoE" not in ops
        assert int4_linear_count(ops) == dense_mlp + MOE_LAYERS * (1 + EXPERTS + 1)


@pytest.mark.parametrize("recipe", ["mxfp4_attn_kv", "fp8_w8a8_kv"])
@pytest.mark.parametrize("ep", ["cuda", "migraphx"])
def test_gpu_graphs_build(quark_exports, tmp_path, recipe, ep):
    """Built and passing the EP's static rules (not run: no GPU here)."""
    ops = op_types(build(quark_exports("deepseek_v3", recipe), tmp_path / "onnx", ep, "fp16"))
    assert ops["GroupQueryAttention"] == LAYERS and "QMoE" not in ops


def test_fp8_kv_cache_is_quark_quantizer_on_kv_b_proj(quark_exports, tmp_path):
    """The emulated FP8 cache matters: without kv_b_proj's output Q/DQ the logits leave Quark's by far more."""
    export = quark_exports("deepseek_v3", "fp8_w8a8_kv")
    ref = np.load(export / "reference.npz")
    on = build(export, tmp_path / "on", "cpu", "fp32")
    off = build(export, tmp_path / "off", "cpu", "fp32", kv_cache="off")
    assert fp8_quantize_count(op_types(on)) - fp8_quantize_count(op_types(off)) == LAYERS
    diff_off = float(np.abs(prompt_logits(off, ref["input_ids"]) - ref["logits"]).max())
    diff_on = float(np.abs(prompt_logits(on, ref["input_ids"]) - ref["logits"]).max())
    assert diff_off > 100 * max(diff_on, 1e-6), (diff_on, diff_off)
    with pytest.raises(ConversionError, match="materialised K/V") as err:
        build(export, tmp_path / "native", "cuda", "fp16", kv_cache="native")
    assert "kv_cache='native'" in str(err.value)
    assert not (tmp_path / "native").exists()


CFG = {"architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
       "moe_intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
       "vocab_size": 256, "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "hidden_act": "silu",
       "n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": 4, "topk_group": 2, "n_shared_experts": 1,
       "first_k_dense_replace": 1, "q_lora_rank": 32, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
       "qk_rope_head_dim": 16, "v_head_dim": 16, "routed_scaling_factor": 2.5,
       "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}


def test_hyper_parameters():
    _family, hp = family_for(CFG, "config.json")
    assert (hp.head_dim, hp.num_kv_heads, hp.softmax_scale) == (32, 4, 32 ** -0.5)
    assert (hp.num_experts, hp.n_group, hp.topk_group, hp.first_k_dense_replace) == (8, 4, 2, 1)


@pytest.mark.parametrize("overrides,message,field", [
    ({"num_key_value_heads": 2}, "must equal num_attention_heads", "num_key_value_heads=2"),
    ({"hidden_act": "gelu"}, "SiLU", "hidden_act='gelu'"),
    ({"scoring_func": "softmax"}, "routing not supported", "scoring_func='softmax'"),
    ({"topk_method": "greedy"}, "routing not supported", "topk_method='greedy'"),
    ({"n_group": 3}, "groups of at least 2", "n_group=3"),
    ({"topk_group": 5}, "exceeds n_group", "topk_group=5"),
    ({"num_experts_per_tok": 5}, "exceeds the experts", "num_experts_per_tok=5"),
    ({"qk_rope_head_dim": 15}, "even", "qk_rope_head_dim=15"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4}}, "rope type", "rope_type='llama3'"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "original_max_position",
     "original_max_position_embeddings=None"),
])
def test_unsupported_configs_are_refused(overrides, message, field):
    with pytest.raises(ConversionError, match=message) as err:
        family_for(dict(CFG, **overrides), "config.json")
    assert field in str(err.value)
