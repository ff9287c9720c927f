"""--extra_options prefill_logits=last: the lm_head runs on each sequence's last valid position only, and
onnxruntime-genai reads the [B, 1, V] logits (its "pruned" model path: src/models/model.cpp Model::IsPruned)."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx_helpers import build, genai_greedy

QUARK_EXPORTS = [("llama_h64", "fp8_w8a8")]


@pytest.fixture(scope="module")
def export(quark_exports):
    return quark_exports("llama_h64", "fp8_w8a8")


def _run(model_dir, ids, mask):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(model_dir / "model.onnx"), so, providers=["CPUExecutionProvider"])
    feeds = {"input_ids": ids, "attention_mask": mask}
    for inp in sess.get_inputs():
        if inp.name.startswith("past_key_values"):
            feeds[inp.name] = np.zeros((ids.shape[0], inp.shape[1], 0, inp.shape[3]), np.float32)
    return sess.run(["logits"], feeds)[0]


def test_last_position_logits_equal_the_full_ones(export, tmp_path):
    full = build(export, tmp_path / "all", custom_ops_library="none")
    last = build(export, tmp_path / "last", custom_ops_library="none", prefill_logits="last")
    outputs = {o.name: o for o in onnx.load(str(last / "model.onnx"), load_external_data=False).graph.output}
    dims = [d.dim_param or d.dim_value for d in outputs["logits"].type.tensor_type.shape.dim]
    assert dims[1] == 1  # what og's IsPruned() reads
    ref = np.load(export / "reference.npz")
    ids = np.concatenate([ref["input_ids"], ref["input_ids"]], axis=0)
    mask = np.ones_like(ids)
    mask[1, -3:] = 0  # row 1 right-padded by 3 tokens
    all_logits, last_logits = _run(full, ids, mask), _run(last, ids, mask)
    assert last_logits.shape == (2, 1, all_logits.shape[2])
    for row, valid in enumerate(mask.sum(axis=1)):
        np.testing.assert_allclose(last_logits[row, 0], all_logits[row, valid - 1], rtol=0, atol=1e-5)
    assert np.abs(last_logits[1, 0] - all_logits[1, -1]).max() > 1e-3  # the padded row's own token, not the end
    assert genai_greedy(last, ref["input_ids"]) == genai_greedy(full, ref["input_ids"]) == ref["greedy"].tolist()


def _logits_dim1(model_dir):
    outputs = {o.name: o for o in onnx.load(str(model_dir / "model.onnx"), load_external_data=False).graph.output}
    d = outputs["logits"].type.tensor_type.shape.dim[1]
    return d.dim_param or d.dim_value


def test_default_is_the_last_position_but_on_cuda(export, tmp_path):
    """The default of `quark-onnx -e cpu / rocm / migraphx` (not tests' build(), which asks for every position; the
    AMD graphs of this form are compared in MIGraphX ref by tests/test_migraphx_ref.py), cuda's, and the plan note."""
    from builder.convert import convert, plan_model
    from builder.emit_context import BuildOptions
    for ep, dim in (("cpu", 1), ("rocm", 1), ("migraphx", 1), ("cuda", "sequence_length")):
        convert(export / "quark", tmp_path / ep, ep, None, BuildOptions(), log=lambda _m: None)
        assert _logits_dim1(tmp_path / ep) == dim, ep
    plan, ckpt = plan_model(export / "quark", "cpu")
    ckpt.close()
    assert any(n.startswith("logits: each sequence's last position only") for n in plan.notes), plan.notes
    ref = np.load(export / "reference.npz")
    assert genai_greedy(tmp_path / "cpu", ref["input_ids"]) == ref["greedy"].tolist()


def test_verify_reads_a_pruned_output_one_position_at_a_time(export, tmp_path):
    """builder/verify.py's teacher-forced logits (verify, tools/isa_eval.py) from a last-position output: stepped
    through the KV cache, equal to the every-position output's prompt logits."""
    from builder.verify import load_onnx_model, onnx_sequence_logits
    full = build(export, tmp_path / "all", custom_ops_library="none")
    last = build(export, tmp_path / "last", custom_ops_library="none", prefill_logits="last")
    ids = np.load(export / "reference.npz")["input_ids"].reshape(-1)
    stepped = onnx_sequence_logits(load_onnx_model(str(last), None), ids)
    whole = onnx_sequence_logits(load_onnx_model(str(full), None), ids)
    assert stepped.shape == whole.shape == (ids.size, whole.shape[1])
    np.testing.assert_allclose(stepped, whole, rtol=0, atol=1e-5)
