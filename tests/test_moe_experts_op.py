"""The CPU MoE form of MXFP4 / MXFP4+FP8 / FP8 experts: com.quark_onnx MatMulExperts* (builder/ops/routed_experts.py,
emit_experts_op; kernel custom_ops/src/qo_cpu_experts.c), the default on -e cpu when the custom-op library is found or
built. Against Quark's own model (reference.npz of each tiny export, as tests/test_moe_routed.py):
  - prompt logits with the library, 1 and 2 intra-op threads (the same bits), the nodes run by the kernel;
  - prompt logits without the library (the nodes' ONNX-function fallback: the routed standard-op form);
  - 16 og.Generator greedy tokens (the KV cache, one token a step: T = 1 through the kernel).
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnx_helpers import NEW_TOKENS, build, decisive_prefix, genai_greedy, op_types, prompt_logits, shipped_library

LOGIT_TOL = 1e-4  # as the other MoE tests
SPARSE = {"qwen3_moe": 2, "qwen2_moe": 2, "mixtral": 2, "gpt_oss": 2, "deepseek_v3": 1}
PROJECTIONS = {"gpt_oss": 2}


def nodes_per_layer(shape: str, recipe: str) -> int:
    """Experts-op nodes per sparse layer: gate_up (gpt-oss's own, or gate and up fused: 4-bit integer and MXFP4
    experts, and MXFP4 + FP8, FP8 and INT8 W8A8 ones whose gate and up input scales are equal, as amd-quark writes
    them: builder/ops/routed_experts.py FUSED_GATE_UP_KEYS) and down; else (NVFP4: a weight_scale_2 per projection)
    gate, up, down."""
    return 3 if shape not in PROJECTIONS and recipe == "nvfp4" else 2
CASES = ([("qwen3_moe", r) for r in ("mxfp4", "mxfp4_fp8", "fp8_w8a8", "nvfp4")]
         + [("qwen2_moe", r) for r in ("mxfp4", "fp8_w8a8", "nvfp4", "int8_w8a8")]
         + [("mixtral", "mxfp4"), ("deepseek_v3", "mxfp4"), ("mixtral", "nvfp4"), ("mixtral", "int8_w8a8")]
         + [("gpt_oss", r) for r in ("mxfp4", "mxfp4_fp8", "fp8_w8a8", "nvfp4", "int8_w8a8")])
# mxfp4 (A on the MXFP4 grid) keeps the checkpoint's order; FP4 experts with float A take 16-row tiles
# (builder/ops/routed_experts.py _tiled_experts_op)
OP = {"mxfp4": "MatMulExpertsMxfp4", "mxfp4_fp8": "MatMulExpertsMxfp4R16", "fp8_w8a8": "MatMulExpertsFp8",
      "nvfp4": "MatMulExpertsNvfp4R16", "int8_w8a8": "MatMulExpertsInt8"}


# qwen3_moe INT8 W8A8: with the library its logits are 1.6e-2 from Quark's in every MoE form that runs after
# MatMulInt8 layers (the dense form too), 1.3e-6 through the ONNX-function fallbacks (test below)
INT8_FLIP = ("qwen3_moe", "int8_w8a8")


# 4-bit integer experts: MatMulExpertsUint4 (zero points) / MatMulExpertsInt4 (symmetric: every zero point 8) by
# default on cpu with the library (accuracy_level 1, the default since 2026-12-05: Quark's exact product; 4: int8
# activations); QMoE without it
# or with --extra_options int4_experts=qmoe (tests/test_moe_routed.py)
INT4_CASES = [("qwen3_moe", "uint4_g32"), ("qwen3_moe", "int4_per_channel"), ("mixtral", "uint4_g32"),
              ("gpt_oss", "uint4_g32")]
INT4_OP = {"uint4_g32": "MatMulExpertsUint4", "int4_per_channel": "MatMulExpertsInt4"}


QUARK_EXPORTS = CASES + [INT8_FLIP] + INT4_CASES  # made with the session's other exports (tests/conftest.py)


@pytest.fixture(scope="module")
def exports(quark_exports):
    return dict(zip(QUARK_EXPORTS, quark_exports.many(QUARK_EXPORTS)))


def _check_against_quark(out, ref, library: str, op: str, label: str) -> None:
    """The experts op's model against Quark's logits and greedy tokens: 1 and 2 threads the same bits, the kernel
    (profiled: `op` ran on CPU) and the ONNX-function fallback within LOGIT_TOL, og greedy equal."""
    ids = ref["input_ids"]
    one, two = (_logits(out, ids, t, library) for t in (1, 2))
    assert np.array_equal(one, two)
    profiled: list = []
    diffs = {"kernel": float(np.abs(prompt_logits(out, ids, profile_nodes=profiled) - ref["logits"]).max()),
             "kernel 1 thread": float(np.abs(one - ref["logits"]).max()),
             "function fallback": float(np.abs(prompt_logits(out, ids, custom_ops_library="") - ref["logits"]).max())}
    print(f"\n{label}: max logit diff vs Quark {diffs}")  # docs/moe.md's table (pytest -s)
    assert max(diffs.values()) <= LOGIT_TOL, diffs
    assert (op, "CPUExecutionProvider") in profiled
    assert decisive_prefix(ref["greedy_margins"], LOGIT_TOL) == NEW_TOKENS, "reference has a near-tie"
    assert genai_greedy(out, ids) == ref["greedy"].tolist()


def _check_inspect(export, ops: dict, op: str) -> None:
    """`inspect` says what the graph holds: each expert line names the experts op, whose kernel note counts the
    built graph's nodes of it; the other com.quark_onnx notes count the linears whose lines name their op (until
    2026-12-05 the experts' lines and counts named the dense layers' op)."""
    import re

    from builder.convert import describe_plan, plan_model
    from builder.options import BuildOptions
    plan, ckpt = plan_model(export / "quark", "cpu", "fp32", BuildOptions(extra={"accuracy_level": 1}))
    ckpt.close()
    text = describe_plan(plan)
    experts = [ln for ln in text.splitlines() if ".experts." in ln and ln.startswith("  ")]
    assert experts and all(f"routed expert: com.quark_onnx {op} (" in ln for ln in experts), experts[:2]
    notes = {k: int(v) for k, v in re.findall(r"^note: com\.quark_onnx\.(\w+) x(\d+) on cpu", text, re.M)}
    assert notes.get(op) == ops[op], (notes, ops)
    lines = [ln for ln in text.splitlines() if ln.startswith("  ") and ".experts." not in ln]
    assert {k: sum(bool(re.search(rf"com\.quark_onnx {k}\b", ln)) for ln in lines) for k in notes if k != op} == \
        {k: v for k, v in notes.items() if k != op}


def _logits(model_dir, ids, threads: int, library: str) -> np.ndarray:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = threads
    so.register_custom_ops_library(library)
    sess = ort.InferenceSession(str(model_dir / "model.onnx"), so, providers=["CPUExecutionProvider"])
    feeds = {"input_ids": ids.astype(np.int64), "attention_mask": np.ones_like(ids, dtype=np.int64)}
    for inp in sess.get_inputs():
        if inp.name.startswith("past_key_values"):
            feeds[inp.name] = np.zeros((ids.shape[0], inp.shape[1], 0, inp.shape[3]), np.float32)
    return sess.run(["logits"], feeds)[0]


@pytest.mark.parametrize("shape,recipe", CASES, ids=[f"{s}-{r}" for s, r in CASES])
def test_experts_op_form_matches_quark(exports, tmp_path, shape, recipe):
    export = exports[(shape, recipe)]
    ref = np.load(export / "reference.npz")
    out = build(export, tmp_path / "onnx", "cpu", "fp32", accuracy_level=1)
    library = shipped_library(out)
    if library is None:
        pytest.skip("no custom-op library: the conversion wrote the fp32 forms")
    ops = op_types(out)
    assert ops.get(OP[recipe]) == SPARSE[shape] * nodes_per_layer(shape, recipe), ops
    assert "If" not in ops and "QMoE" not in ops
    _check_inspect(export, ops, OP[recipe])
    if recipe in ("nvfp4", "int8_w8a8"):  # the routed node's inputs: the stacked initializers in the dense op's layout
        _check_stacks(out, OP[recipe], SPARSE[shape] * nodes_per_layer(shape, recipe))
    _check_against_quark(out, ref, library, OP[recipe], f"{shape} {recipe}")


@pytest.mark.parametrize("shape,recipe", INT4_CASES, ids=[f"{s}-{r}" for s, r in INT4_CASES])
def test_int4_experts_compact_matches_quark(exports, tmp_path, shape, recipe):
    """The cpu default: the 4-bit experts through MatMulExpertsUint4 / Int4 at accuracy_level 1 (no QMoE), against
    Quark's logits and greedy tokens; 1 and 2 threads the same bits; the ONNX-function fallback too."""
    export = exports[(shape, recipe)]
    ref = np.load(export / "reference.npz")
    out = build(export, tmp_path / "onnx", "cpu", "fp32")
    library = shipped_library(out)
    if library is None:
        pytest.skip("no custom-op library: the conversion wrote the QMoE form")
    ops = op_types(out)
    assert ops.get(INT4_OP[recipe]) == SPARSE[shape] * nodes_per_layer(shape, recipe), ops
    assert "If" not in ops and "QMoE" not in ops
    _check_inspect(export, ops, INT4_OP[recipe])
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    assert {a.i for n in model.graph.node if n.op_type == INT4_OP[recipe] for a in n.attribute
            if a.name == "accuracy_level"} == {1}  # exact
    _check_against_quark(out, ref, library, INT4_OP[recipe], f"{shape} {recipe} cpu default")


@pytest.mark.parametrize("shape,recipe", INT4_CASES, ids=[f"{s}-{r}" for s, r in INT4_CASES])
def test_int4_experts_level4_is_qmoe_arithmetic(exports, tmp_path, shape, recipe):
    """accuracy_level=4 (the cpu default before 2026-12-05; now the default is level 1, exact, as the dense 4-bit
    linears): MatMulExpertsUint4 / Int4 with int8 activations against onnxruntime's
    own QMoE at level 4 on the same export (int4_experts=qmoe; MLAS CompInt8, an independent implementation of the
    same arithmetic): their logits differ by float summation order (and the odd activation code MLAS rounds the
    other way), far less than either differs from Quark's fp32 model. The ONNX-function fallback's level-4
    activations (standard ops) agree with the kernel as closely."""
    export = exports[(shape, recipe)]
    ref = np.load(export / "reference.npz")
    ids = ref["input_ids"]
    out = build(export, tmp_path / "onnx", "cpu", "fp32", accuracy_level=4)
    if shipped_library(out) is None:
        pytest.skip("no custom-op library: the conversion wrote the QMoE form")
    ops = op_types(out)
    assert ops.get(INT4_OP[recipe]) == SPARSE[shape] * nodes_per_layer(shape, recipe) and "QMoE" not in ops, ops
    qmoe = build(export, tmp_path / "qmoe", "cpu", "fp32", int4_experts="qmoe", accuracy_level=4)
    assert op_types(qmoe)["QMoE"] == SPARSE[shape]
    ours, theirs = prompt_logits(out, ids), prompt_logits(qmoe, ids)
    fallback = prompt_logits(out, ids, custom_ops_library="")
    to_qmoe = float(np.abs(ours - theirs).max())
    to_fallback = float(np.abs(ours - fallback).max())
    to_quark = float(np.abs(theirs - ref["logits"]).max())
    print(f"\n{shape} {recipe} level 4: ours vs QMoE {to_qmoe:.3g}, vs its fallback {to_fallback:.3g}; "
          f"QMoE vs Quark {to_quark:.3g}")
    # measured (Xeon, AVX-512 VNNI): ours vs QMoE 0.8-1.3e-6, vs the fallback 0.7-1.6e-6; QMoE vs Quark 0.021-0.042
    assert to_qmoe <= 1e-5 and to_fallback <= 1e-5 and to_quark >= 1e-3, (to_qmoe, to_fallback, to_quark)


def test_moe_gather_keeps_the_standard_op_form(exports, tmp_path):
    out = build(exports[("qwen3_moe", "mxfp4")], tmp_path / "onnx", "cpu", "fp32", accuracy_level=1, moe="gather")
    ops = op_types(out)
    assert "MatMulExpertsMxfp4" not in ops and ops["If"] == SPARSE["qwen3_moe"]


def test_gate_up_with_different_input_scales_stay_apart(exports, tmp_path):
    """MXFP4 + FP8 experts fuse gate and up only where their static input scales are equal (amd-quark's exports):
    one expert's up_proj input_scale doubled gives that layer three nodes again, and the kernel still agrees with the
    nodes' ONNX-function fallback (the routed standard-op form) on the changed model."""
    import shutil

    from safetensors.numpy import load_file, save_file
    src = exports[("qwen3_moe", "mxfp4_fp8")]
    export = tmp_path / "export"
    shutil.copytree(src, export)
    changed = 0
    for f in sorted((export / "quark").glob("*.safetensors")):
        tensors = load_file(f)
        name = "model.layers.0.mlp.experts.1.up_proj.input_scale"
        if name in tensors:
            tensors[name] = np.asarray(tensors[name] * np.float32(2), np.float32)
            save_file(tensors, f, metadata={"format": "pt"})
            changed += 1
    assert changed == 1
    out = build(export, tmp_path / "onnx", "cpu", "fp32", accuracy_level=1)
    library = shipped_library(out)
    if library is None:
        pytest.skip("no custom-op library: the conversion wrote the fp32 forms")
    assert op_types(out).get(OP["mxfp4_fp8"]) == 3 + 2  # layer 0 apart, layer 1 fused
    ids = np.load(src / "reference.npz")["input_ids"]
    kernel = prompt_logits(out, ids)
    fallback = prompt_logits(out, ids, custom_ops_library="")
    assert float(np.abs(kernel - fallback).max()) <= LOGIT_TOL


def test_mxfp4_fp8_takes_fp4_linear_compact_rows(exports, tmp_path):
    """`fp4_linear` applies to MXFP4 weights with FP8 activations (no "does not apply" warning: it was given one
    until 2026-12-05 although it took effect): compact_rows gives the checkpoint-order MatMulExpertsMxfp4 /
    MatMulMxfp4 instead of the tiles, within LOGIT_TOL of Quark's model."""
    from builder.convert import plan_model
    from builder.options import options_not_applying, parse_extra_options
    export = exports[("qwen3_moe", "mxfp4_fp8")]
    plan, ckpt = plan_model(export / "quark", "cpu", None, parse_extra_options(["fp4_linear=compact_rows"]))
    ckpt.close()
    assert options_not_applying(plan) == []
    out = build(export, tmp_path / "onnx", "cpu", "fp32", accuracy_level=1, fp4_linear="compact_rows")
    if shipped_library(out) is None:
        pytest.skip("no custom-op library: the conversion wrote the fp32 forms")
    ops = op_types(out)
    assert ops.get("MatMulExpertsMxfp4") == SPARSE["qwen3_moe"] * 2 and "MatMulExpertsMxfp4R16" not in ops, ops
    assert ops.get("MatMulMxfp4") and "MatMulMxfp4R16" not in ops, ops
    ref = np.load(export / "reference.npz")
    assert float(np.abs(prompt_logits(out, ref["input_ids"]) - ref["logits"]).max()) <= LOGIT_TOL


def _check_stacks(out, op: str, nodes: int) -> None:
    """Each node reads [E, N, ...] stacks in the dense op's layout: NVFP4 e2m1 bytes, e4m3fn block scales and the
    experts' weight_scale_2 [E]; INT8 int8 bytes and [E] or [E, N] fp32 scales."""
    import onnx
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    inits = {t.name: t for t in model.graph.initializer}
    found = [n for n in model.graph.node if n.op_type == op]
    assert len(found) == nodes
    for n in found:
        b, scale = inits[n.input[2]], inits[n.input[3]]
        e = b.dims[0]
        if op == "MatMulExpertsNvfp4R16":  # [E, N/16, K/8, 64] codes, [E, N/16, K/16, 16] e4m3fn block scales
            assert b.data_type == onnx.TensorProto.UINT8 and scale.data_type == onnx.TensorProto.FLOAT8E4M3FN
            assert b.dims[3] == 64 and list(scale.dims) == [e, b.dims[1], b.dims[2] * 8 // 16, 16]
            assert list(inits[n.input[4]].dims) == [e]
        else:
            assert b.data_type == onnx.TensorProto.INT8 and list(scale.dims) in ([e], [e, b.dims[1]])


def test_int8_experts_op_after_matmul_int8_layers(exports, tmp_path):
    """qwen3_moe INT8 W8A8 (its MLP-only layer 1 and the attention run MatMulInt8 with the library): the routed
    MatMulExpertsInt8 graph gives the logits of the dense form (every expert through MatMulInt8) built with the same
    library, and through the ONNX-function fallbacks both match Quark's model. Measured: 1.6e-2 from Quark with the
    library for both forms (one int8 step of one element of layer 2's q_proj input quantization, which the kernels'
    last-bit differences put on the other side: docs/moe.md), 1.3e-6 / 8.3e-7 through the fallbacks."""
    export = exports[INT8_FLIP]
    ref = np.load(export / "reference.npz")
    routed = build(export, tmp_path / "routed", "cpu", "fp32", accuracy_level=1)
    library = shipped_library(routed)
    if library is None:
        pytest.skip("no custom-op library")
    assert op_types(routed).get("MatMulExpertsInt8") == SPARSE["qwen3_moe"] * nodes_per_layer("qwen3_moe", "int8_w8a8")
    dense = build(export, tmp_path / "dense", "cpu", "fp32", accuracy_level=1, moe="dense")
    ids = ref["input_ids"]
    assert float(np.abs(prompt_logits(routed, ids) - prompt_logits(dense, ids)).max()) <= 1e-5
    for out in (routed, dense):
        diff = float(np.abs(prompt_logits(out, ids, custom_ops_library="") - ref["logits"]).max())
        assert diff <= LOGIT_TOL, diff
