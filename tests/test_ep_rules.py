"""Every EP rule, fed a hand-built graph that breaks it (named node + rule reported) and one that keeps it."""
from __future__ import annotations

import pytest
from ep_graph_kit import MS, chain, dequantize, gqa, local_function, matmul_nbits
from onnx import TensorProto as T

from builder.ep_check import check_findings, check_model
from builder.ep_configs import EP_NAMES, get_ep
from builder.ep_rules import MIGRAPHX_CPU_FALLBACK_LIMIT, ModelRule, Rule

MNB = "/model/layers.0/mlp/up_proj/MatMulNBits"
GQA = "/model/layers.0/attn/GroupQueryAttention"


def rules_hit(model, ep_name: str) -> dict[str, tuple[str, str]]:
    """{rule: (node name, severity)} of every finding."""
    return {f.rule: (f.node, f.severity) for f in check_findings(model, get_ep(ep_name))}


def test_every_ep_module_lists_named_rules():
    for name in EP_NAMES:
        ep = get_ep(name)
        assert ep.constraints, name
        assert all(isinstance(r, Rule) and r.name and r.source for r in ep.constraints), name
        assert all(isinstance(r, ModelRule) for r in ep.model_constraints), name
    assert get_ep("rocm").constraints == get_ep("migraphx").constraints


# ------------------------------------------------------------------------------------------------ MatMulNBits

@pytest.mark.parametrize("ep", EP_NAMES)
def test_matmulnbits_4bit_with_packed_1d_zero_points_passes_everywhere(ep):
    assert rules_hit(matmul_nbits(zero_points="packed-1d"), ep) == {}


@pytest.mark.parametrize("ep,bits,broken", [("migraphx", 8, True), ("rocm", 2, True), ("cpu", 8, False),
                                            ("cuda", 2, False)])
def test_matmulnbits_bits(ep, bits, broken):
    hits = rules_hit(matmul_nbits(bits=bits), ep)
    assert (hits.get("matmulnbits-bits") == (MNB, "error")) is broken


@pytest.mark.parametrize("ep", EP_NAMES)
def test_matmulnbits_block_size_and_b_shape(ep):
    assert rules_hit(matmul_nbits(block=24, b_dims=[16, 3, 12]), ep)["matmulnbits-block-size"] == (MNB, "error")
    assert rules_hit(matmul_nbits(b_dims=[16, 4, 16]), ep)["matmulnbits-b-shape"] == (MNB, "error")


@pytest.mark.parametrize("ep", ["migraphx", "rocm"])
@pytest.mark.parametrize("zp", ["packed-2d", "float"])
def test_migraphx_zero_points_must_be_packed_1d(ep, zp):
    assert rules_hit(matmul_nbits(zero_points=zp), ep) == {"migraphx-matmulnbits-zero-points": (MNB, "error")}
    assert rules_hit(matmul_nbits(zero_points=zp), "cpu") == {}


def test_migraphx_matmulnbits_bias_input_is_an_error():
    findings = check_findings(matmul_nbits(bias=True), get_ep("migraphx"))
    assert [(f.node, f.rule) for f in findings] == [(MNB, "migraphx-matmulnbits-ignored-inputs")]
    assert "bias" in findings[0].message and "Add" in findings[0].message
    assert rules_hit(matmul_nbits(bias=True), "cuda") == {}


# ------------------------------------------------------------------------------------------------ GQA

@pytest.mark.parametrize("ep", ["cuda", "migraphx", "rocm"])
def test_gqa_as_the_builder_emits_it_passes_on_gpus(ep):
    assert rules_hit(gqa(), ep) == {}


def test_migraphx_gqa_kv_scales_and_quant_type():
    hits = rules_hit(gqa(cache=T.INT8, kv_scales=True, k_quant_type="PER_TENSOR", v_quant_type="PER_TENSOR"),
                     "migraphx")
    assert hits == {"migraphx-gqa-inputs": (GQA, "error"), "migraphx-gqa-kv-quant": (GQA, "error")}


def test_migraphx_gqa_softcap():
    assert rules_hit(gqa(softcap=30.0), "rocm") == {"migraphx-gqa-softcap": (GQA, "error")}
    assert rules_hit(gqa(softcap=0.0), "rocm") == {}


def test_cuda_gqa_fp32_is_only_a_warning():
    assert rules_hit(gqa(io=T.FLOAT), "cuda") == {"cuda-gqa-dtype": (GQA, "warning")}
    assert check_model(gqa(io=T.FLOAT), get_ep("cuda"), warn=None) == []


# ------------------------------------------------------------------------------------------------ CPU kernels

def test_cpu_gqa_bf16_and_fp8_cache():
    assert rules_hit(gqa(io=T.BFLOAT16), "cpu") == {"cpu-no-bf16": (GQA, "error")}
    assert rules_hit(gqa(io=T.FLOAT16, cache=T.FLOAT8E4M3FN), "cpu") == {"cpu-gqa-no-fp8-cache": (GQA, "error")}
    assert rules_hit(gqa(io=T.FLOAT16), "cpu") == {}


def test_cpu_matmulnbits_bf16():
    assert rules_hit(matmul_nbits(io=T.BFLOAT16), "cpu") == {"cpu-no-bf16": (MNB, "error")}
    assert rules_hit(matmul_nbits(io=T.BFLOAT16), "cuda") == {}


def test_cpu_fp4_and_bf16_scale_dequantize():
    name = "/model/layers.0/mlp/up_proj/weight/DequantizeLinear"
    assert rules_hit(dequantize(x_type=T.FLOAT4E2M1, block=4), "cpu") == {"cpu-no-fp4-qdq": (name, "error")}
    assert rules_hit(dequantize(scale_type=T.BFLOAT16), "cpu") == {"cpu-no-bf16": (name, "error")}
    assert rules_hit(dequantize(), "cpu") == {}
    # MIGraphX's parser misreads float4e2m1 (onnx_parser.cpp parse_tensor_shape): an error there, not a CPU issue
    assert set(rules_hit(dequantize(x_type=T.FLOAT4E2M1, block=4), "migraphx")) == {
        "migraphx-parser-type", "migraphx-parser-graph-types"}


def test_cpu_no_kernel_ops():
    from onnx import helper as h
    from ep_graph_kit import model, vi
    node = h.make_node("MatMulBlockQuantizedFp8Weight", ["A", "B", "S"], ["Y"], "/lm_head/Fp8MatMul", domain=MS,
                       block_size=128)
    m = model([node], [vi("A", T.FLOAT16, [1, 128])], [vi("Y", T.FLOAT16, [1, 8])])
    assert rules_hit(m, "cpu") == {"cpu-no-kernel": ("/lm_head/Fp8MatMul", "error")}
    assert rules_hit(m, "cuda") == {}
    errors = check_model(m, get_ep("cpu"))
    assert errors == ["/lm_head/Fp8MatMul (MatMulBlockQuantizedFp8Weight): [cpu-no-kernel] no CPU kernel in "
                      "onnxruntime (CUDA only)"]


# ------------------------------------------------------------------------------------------------ MIGraphX op list

def test_migraphx_unsupported_ops_warn_and_more_than_ten_hand_the_model_to_cpu():
    limit = MIGRAPHX_CPU_FALLBACK_LIMIT
    at_limit = chain([("", "Det")] * limit)
    hits = check_findings(at_limit, get_ep("migraphx"))
    assert [f.rule for f in hits] == ["migraphx-supported-op"] * limit
    assert hits[0].node == "/model/x/0/Det" and "no parser for Det" in hits[0].message
    over = check_findings(chain([("", "Det")] * (limit + 1)), get_ep("migraphx"))
    assert over[-1].rule == "migraphx-cpu-fallback" and over[-1].severity == "warning"
    assert "WHOLE model runs on the CPU" in over[-1].message
    warned = []
    assert check_model(chain([("", "Det")] * (limit + 1)), get_ep("rocm"), warn=warned.append) == []
    assert len(warned) == limit + 2


def test_migraphx_supported_standard_and_contrib_ops_pass():
    ops = [("", "Sigmoid"), ("", "Sqrt"), ("", "Identity"), (MS, "FastGelu"), ("", "Neg")]
    assert rules_hit(chain(ops), "migraphx") == {}


def test_migraphx_op_only_in_rocm_7_2_list_warns():
    hits = rules_hit(chain([("", "IsNaN")], io=T.FLOAT), "migraphx")
    assert hits == {"migraphx-op-needs-rocm-7.2": ("/model/x/0/IsNaN", "warning")}


def test_migraphx_unsupported_tensor_type():
    m = dequantize(x_type=T.FLOAT8E8M0)
    hits = rules_hit(m, "migraphx")
    assert hits["migraphx-supported-op"][1] == "warning"   # the EP leaves it to CPU (IsTypeSupported) ...
    assert hits["migraphx-parser-type"][1] == "error"      # ... and MIGraphX's parser could not read it anyway
    found = {f.rule: f.message for f in check_findings(m, get_ep("migraphx"))}
    assert "float8e8m0" in found["migraphx-supported-op"] and "float8e8m0" in found["migraphx-parser-type"]


def test_custom_domain_node_with_local_function_is_judged_by_its_body():
    ok = local_function("quark.custom", "Gelu4", ["Sigmoid", "Sqrt"])
    bad = local_function("quark.custom", "Gelu4", ["Sigmoid", "Det"])
    assert rules_hit(chain([("quark.custom", "Gelu4")], functions=[ok]), "migraphx") == {}
    hits = check_findings(chain([("quark.custom", "Gelu4")], functions=[bad]), get_ep("migraphx"))
    assert [(f.node, f.rule) for f in hits] == [("/model/x/0/Gelu4", "migraphx-supported-op")]
    assert "['Det']" in hits[0].message


@pytest.mark.parametrize("ep", EP_NAMES)
def test_custom_domain_without_function_needs_a_library(ep):
    hits = rules_hit(chain([("quark.custom", "Mxfp4MatMul")]), ep)
    assert hits["custom-op-needs-library"] == ("/model/x/0/Mxfp4MatMul", "warning")


def test_plain_callable_constraints_still_work():
    """Other modules may append a bare `node -> message|None`; it counts as an error."""
    from dataclasses import replace

    def no_sigmoid(node):
        return "no Sigmoid here" if node.op_type == "Sigmoid" else None
    ep = replace(get_ep("cpu"), constraints=get_ep("cpu").constraints + (no_sigmoid,))
    assert check_model(chain([("", "Sigmoid")]), ep) == ["/model/x/0/Sigmoid (Sigmoid): [no_sigmoid] no Sigmoid here"]
