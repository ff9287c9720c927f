"""The routed MoE form in standard ops (builder/ops/routed_experts.py) against Quark's own model, per family x expert
scheme x EP graph, every graph run on ORT CPU (the cuda/migraphx graphs are fp32 builds of what those EPs get: same
ops; their FP8 Q/DQ is float8e4m3fnuz on migraphx, which ORT CPU runs).

Each case checks both branches of the If:
  - prompt logits with moe_routed_tokens=64: the 8-token prompt takes the routed (Gather) branch;
  - prompt logits with the default threshold (E/k = 4 tokens): the prompt takes the every-expert branch;
  - 16 og.Generator greedy tokens: decoding one token per step takes the routed branch.
Reference: reference.npz of each export (Quark's frozen fake-quantized model). And the expert bytes a decoded token
reads, from the graph: bytes of the Gathered stacked initializers x k/E, against the scheme's size counted here.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from builder.ops.routed_experts import gathered_bytes_per_token
from onnx_helpers import NEW_TOKENS, build, decisive_prefix, genai_greedy, op_types, prompt_logits
from test_migraphx_forms import CPU_DQ_EXACT, cpu_provider_copy

LOGIT_TOL = 1e-4  # as the other MoE tests; measured max over the cases below: 1.3e-6
SPARSE = {"qwen3_moe": 2, "qwen2_moe": 2, "mixtral": 2, "gpt_oss": 2, "deepseek_v3": 1}
CASES = ([("qwen3_moe", r, ep) for r in ("int8_wo_g32", "mxfp4", "mxfp4_fp8", "fp8_w8a8") for ep in ("cpu", "migraphx")]
         + [("qwen3_moe", r, "cuda") for r in ("uint4_g32", "mxfp4", "fp8_w8a8")]
         + [("qwen3_moe", r, "cpu") for r in ("uint4_g32", "int4_per_channel")]   # moe=gather on CPU 4-bit
         + [("qwen2_moe", r, "cpu") for r in ("mxfp4", "fp8_w8a8")]
         + [("mixtral", r, ep) for r in ("uint4_g32", "mxfp4") for ep in ("cpu", "migraphx")]
         + [("gpt_oss", r, "cpu") for r in ("uint4_g32", "int8_wo_g32", "mxfp4", "mxfp4_fp8", "fp8_w8a8")]
         + [("gpt_oss", "mxfp4", "cuda")]
         + [("deepseek_v3", r, ep) for r in ("uint4_g32", "mxfp4") for ep in ("cpu", "migraphx")]
         # NVFP4 and INT8 W8A8 experts (Quark's activation quantization per chosen expert)
         + [("qwen3_moe", "nvfp4", ep) for ep in ("cpu", "migraphx", "cuda")]
         + [("qwen3_moe", "int8_w8a8", ep) for ep in ("migraphx", "cuda")]
         + [("qwen2_moe", "int8_w8a8", "cpu"), ("mixtral", "nvfp4", "migraphx"), ("mixtral", "int8_w8a8", "cpu")]
         + [("gpt_oss", r, ep) for r in ("nvfp4", "int8_w8a8") for ep in ("cpu", "migraphx")])


@pytest.fixture(scope="module")
def exports(quark_exports):
    keys = sorted({(s, r) for s, r, _ in CASES})
    return dict(zip(keys, quark_exports.many(keys)))


def _build(export, out, ep, **extra):
    extra = {"moe": "gather", **extra}  # CPU 4-bit would take QMoE by default
    return build(export, out, ep, "fp32", accuracy_level=1 if ep == "cpu" else None, **extra)


@pytest.mark.parametrize("shape,recipe,ep", CASES, ids=[f"{s}-{r}-{e}" for s, r, e in CASES])
def test_routed_form_matches_quark(exports, tmp_path, shape, recipe, ep):
    export = exports[(shape, recipe)]
    ref = np.load(export / "reference.npz")
    routed = _build(export, tmp_path / "routed", ep, moe_routed_tokens="64")
    ops = op_types(routed)
    assert ops["If"] == SPARSE[shape] and "QMoE" not in ops
    ids = ref["input_ids"]
    # ORT CPU would fuse a GPU graph's DequantizeLinear(int8) -> MatMul into MatMulNBits at accuracy level 4
    exact = CPU_DQ_EXACT if ep != "cpu" else None
    diffs = {"routed prompt": float(np.abs(prompt_logits(routed, ids, exact) - ref["logits"]).max())}
    default = _build(export, tmp_path / "default", ep)
    diffs["every-expert prompt"] = float(np.abs(prompt_logits(default, ids, exact) - ref["logits"]).max())
    assert max(diffs.values()) <= LOGIT_TOL, diffs
    assert decisive_prefix(ref["greedy_margins"], LOGIT_TOL) == NEW_TOKENS, "reference has a near-tie"
    if ep != "cpu":
        default = cpu_provider_copy(default, tmp_path / "default_on_cpu")
    assert genai_greedy(default, ids) == ref["greedy"].tolist()


def _expert_bytes(shape: str, recipe: str) -> int:
    """Bytes one expert's weights take in the stack layout, counted from the tiny models' shapes
    (tests/quark_factory.py: hidden 64, expert width 64, gpt-oss gate_up 128 + biases; DeepSeek width 32)."""
    h, i = 64, (32 if shape == "deepseek_v3" else 64)
    projections = [(h, 2 * i), (i, h)] if shape == "gpt_oss" else [(h, i), (h, i), (i, h)]
    total = 0
    for k, n in projections:
        if recipe == "uint4_g32":      # 4-bit codes, u8 zero point and fp32 scale per 32-group
            total += k * n // 2 + (k // 32) * n * (1 + 4)
        elif recipe == "mxfp4":        # e2m1 codes, e8m0 byte per 32-block
            total += k * n // 2 + (k // 32) * n
        elif recipe == "fp8_w8a8":     # fp8 bytes, fp32 per-tensor weight scale and static input scale
            total += k * n + 4 + 4
        elif recipe == "nvfp4":        # e2m1 codes, e4m3 byte per 16-block, fp32 weight_scale_2 and input_scale_2
            total += k * n // 2 + (k // 16) * n + 4 + 4
        elif recipe == "int8_w8a8":    # int8 bytes, per-tensor fp32 scale and int8 zero point; the input's fp32
            total += k * n + 4 + 1 + 3 * 4  # scale, reciprocal and zero point
        if shape == "gpt_oss":
            total += n * 4             # fp32 bias
    return total


BYTE_CASES = [("qwen3_moe", "uint4_g32"), ("qwen3_moe", "mxfp4"), ("qwen3_moe", "fp8_w8a8"), ("gpt_oss", "mxfp4"),
              ("deepseek_v3", "mxfp4"), ("qwen3_moe", "nvfp4"), ("qwen3_moe", "int8_w8a8"), ("gpt_oss", "nvfp4")]
TOP_K = {"qwen3_moe": 2, "gpt_oss": 2, "deepseek_v3": 3}
EXPERTS = {"qwen3_moe": 8, "gpt_oss": 4, "deepseek_v3": 8}


@pytest.mark.parametrize("shape,recipe", BYTE_CASES)
def test_decoded_token_reads_k_of_e_experts(quark_exports, tmp_path, shape, recipe):
    out = _build(quark_exports(shape, recipe), tmp_path / "onnx", "migraphx")
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    per_layer = gathered_bytes_per_token(model)
    assert len(per_layer) == SPARSE[shape]
    stacked = {}
    for t in model.graph.initializer:
        if ".experts." in t.name and ".routed." in t.name:  # the stacks [E, ...]
            layer = t.name.split(".mlp.")[0]
            stacked[layer] = stacked.get(layer, 0) + int(np.prod(t.dims)) * \
                onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    for name, got in per_layer.items():
        assert got == TOP_K[shape] * _expert_bytes(shape, recipe), (name, got)
    # k/E of every stacked byte of the layer
    assert sorted(per_layer.values()) == sorted(round(b * TOP_K[shape] / EXPERTS[shape]) for b in stacked.values())


@pytest.mark.parametrize("recipe", ["nvfp4", "int8_w8a8"])
def test_rocm_routes_nvfp4_and_int8_experts(quark_exports, tmp_path, recipe):
    """-e rocm gets the routed standard-op form of NVFP4 / INT8 W8A8 experts (the graph -e migraphx gets; its
    numerics: the migraphx cases above), not the dense form; the MIGraphX parser rules (If branches included) pass on
    the fp16 graph the EP gets by default."""
    from builder.ep_check import check_findings
    from builder.ep_configs import get_ep
    export = quark_exports("qwen3_moe", recipe)
    ops = {ep: op_types(_build(export, tmp_path / ep, ep)) for ep in ("rocm", "migraphx")}
    assert ops["rocm"] == ops["migraphx"] and ops["rocm"]["If"] == SPARSE["qwen3_moe"], ops
    fp16 = build(export, tmp_path / "fp16", "rocm", "fp16")
    assert [f for f in check_findings(fp16 / "model.onnx", get_ep("migraphx")) if f.severity == "error"] == []


def test_branch_threshold_is_an_option(quark_exports, tmp_path):
    out = _build(quark_exports("qwen3_moe", "mxfp4"), tmp_path / "onnx", "cpu", moe_routed_tokens="3")
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    limits = [onnx.numpy_helper.to_array(t).tolist() for t in model.graph.initializer if t.name.endswith(
        ".routed.max_tokens")]
    assert limits == [[3]] * SPARSE["qwen3_moe"]


@pytest.mark.parametrize("shape,recipe,widest", [("qwen3_moe", "mxfp4_fp8", 64 * 64), ("gpt_oss", "uint4_g32", 64 * 128)])
def test_every_expert_branch_in_chunks(exports, tmp_path, monkeypatch, shape, recipe, widest):
    """Real shapes decode the every-expert branch in chunks (CHUNK_BYTES); here 3 experts a chunk, the last one
    shorter: the prompt (8 tokens > E/k) takes that branch."""
    from builder.ops import routed_experts
    monkeypatch.setattr(routed_experts, "CHUNK_BYTES", 3 * 4 * widest)
    export = exports[(shape, recipe)]
    ref = np.load(export / "reference.npz")
    out = _build(export, tmp_path / "onnx", "cpu")
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    node = next(n for n in model.graph.node if n.op_type == "If")
    else_g = next(a.g for a in node.attribute if a.name == "else_branch")
    experts = {"qwen3_moe": 8, "gpt_oss": 4}[shape]
    assert sum(n.op_type == "ReduceSum" and n.name.endswith("/SumExperts") for n in else_g.node) == -(-experts // 3)
    diff = float(np.abs(prompt_logits(out, ref["input_ids"]) - ref["logits"]).max())
    assert diff <= LOGIT_TOL, diff


def test_every_expert_branch_indices_are_not_provably_constant(exports, tmp_path):
    """MIGraphX's simplify_algebra replaces Mul(x, literal 0) by the literal (src/simplify_algebra.cpp find_zero_ops,
    f729a52) and find_unit_ops drops + 0, after which the every-expert branch's Gather indices would be constant and
    propagate_constant would fold the decoded experts into fp32 literals. The indices must reach the Gathers through
    an op with a run-time operand that is neither Mul nor Div by a zero constant."""
    out = _build(exports[("mixtral", "mxfp4")], tmp_path / "onnx", "migraphx")
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    zeros = {t.name for t in model.graph.initializer if t.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.FLOAT)
             and not t.external_data and not onnx.numpy_helper.to_array(t).any()}
    node = next(n for n in model.graph.node if n.op_type == "If")
    else_g = next(a.g for a in node.attribute if a.name == "else_branch")
    nodes = list(model.graph.node) + list(else_g.node)
    producer = {o: n for n in nodes for o in n.output}
    experts = [n for n in else_g.node if n.name.endswith("/Experts")]
    assert experts
    for n in experts:
        zero = producer[next(i for i in n.input if i in producer)]
        assert zero.name.endswith("/RunTimeZero"), zero.name
        assert not (zero.op_type in ("Mul", "Div") and any(i in zeros for i in zero.input)), zero
        assert any(producer.get(i) is not None and producer[i].op_type == "ReduceMin" for i in zero.input)
