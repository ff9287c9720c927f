"""The CPU MoE form of MXFP4 / MXFP4+FP8 / FP8 experts: com.quark_onnx MatMulExperts* (builder/ops/routed_experts.py,
emit_experts_op; kernel custom_ops/src/qo_cpu_experts.c), the default on -e cpu when the custom-op library is found or
built. Against Quark's own model (reference.npz of each tiny export, as tests/test_moe_routed.py):
  - prompt logits with the library, 1 and 2 intra-op threads (the same bits), the nodes run by the kernel;
  - prompt logits without the library (the nodes' ONNX-function fallback: the routed standard-op form);
  - 16 og.Generator greedy tokens (the KV cache, one token a step: T = 1 through the kernel).
"""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from onnx_helpers import NEW_TOKENS, build, decisive_prefix, genai_greedy, op_types, prompt_logits, shipped_library

LOGIT_TOL = 1e-4  # as the other MoE tests
SPARSE = {"qwen3_moe": 2, "qwen2_moe": 2, "mixtral": 2, "gpt_oss": 2, "deepseek_v3": 1}
PROJECTIONS = {"gpt_oss": 2}
CASES = ([("qwen3_moe", r) for r in ("mxfp4", "mxfp4_fp8", "fp8_w8a8")]
         + [("qwen2_moe", r) for r in ("mxfp4", "fp8_w8a8")]
         + [("mixtral", "mxfp4"), ("deepseek_v3", "mxfp4")]
         + [("gpt_oss", r) for r in ("mxfp4", "mxfp4_fp8", "fp8_w8a8")])
OP = {"mxfp4": "MatMulExpertsMxfp4", "mxfp4_fp8": "MatMulExpertsMxfp4", "fp8_w8a8": "MatMulExpertsFp8"}


@pytest.fixture(scope="module")
def exports(quark_exports):
    return dict(zip(CASES, quark_exports.many(CASES)))


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
    assert ops.get(OP[recipe]) == SPARSE[shape] * PROJECTIONS.get(shape, 3), ops
    assert "If" not in ops and "QMoE" not in ops
    ids = ref["input_ids"]
    one, two = (_logits(out, ids, t, library) for t in (1, 2))
    assert np.array_equal(one, two)
    profiled: list = []
    diffs = {"kernel": float(np.abs(prompt_logits(out, ids, profile_nodes=profiled) - ref["logits"]).max()),
             "kernel 1 thread": float(np.abs(one - ref["logits"]).max()),
             "function fallback": float(np.abs(prompt_logits(out, ids, custom_ops_library="") - ref["logits"]).max())}
    print(f"\n{shape} {recipe}: max logit diff vs Quark {diffs}")  # docs/moe.md's table (pytest -s)
    assert max(diffs.values()) <= LOGIT_TOL, diffs
    assert (OP[recipe], "CPUExecutionProvider") in profiled
    assert decisive_prefix(ref["greedy_margins"], LOGIT_TOL) == NEW_TOKENS, "reference has a near-tie"
    assert genai_greedy(out, ids) == ref["greedy"].tolist()


def test_moe_gather_keeps_the_standard_op_form(exports, tmp_path):
    out = build(exports[("qwen3_moe", "mxfp4")], tmp_path / "onnx", "cpu", "fp32", accuracy_level=1, moe="gather")
    ops = op_types(out)
    assert "MatMulExpertsMxfp4" not in ops and ops["If"] == SPARSE["qwen3_moe"]
