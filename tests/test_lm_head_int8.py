"""Opt-in `--extra_options lm_head=int8`: the float lm_head re-quantized to 8-bit MatMulNBits.

References: the checkpoint's own float lm_head (read with safetensors, not the converter) for the weights, and
Quark's frozen model (reference.npz of the amd-quark export) for the logits."""
from __future__ import annotations

import json

import numpy as np
from safetensors.numpy import load_file

from builder.convert import plan_model
from builder.emit_context import BuildOptions
from builder.quant.float_int8 import FloatToInt8Linear
from onnx_helpers import build, decisive_prefix, genai_greedy, matmul_nbits_dequantized, op_types, prompt_logits
from synthetic_export import write_synthetic_export
from test_cli_errors import run_builder

QUARK_EXPORTS = [("llama_h64", "uint4_g64"),  # lm_head excluded by Quark's template: float in the checkpoint
                 ("llama_h64", "lmhead_g32")]  # lm_head quantized by Quark (uint4 g32)
# Measured on this export at accuracy_level 1: max |logit diff| vs Quark 0.0176 on logits of std 0.77 (float lm_head:
# 1.3e-6; the CPU default accuracy_level 4 alone, float lm_head: 0.056).
INT8_LOGIT_TOL = 0.035


def checkpoint_tensor(folder, name):
    for f in sorted(folder.glob("*.safetensors")):
        tensors = load_file(str(f))
        if name in tensors:
            return tensors[name].astype(np.float32)
    raise KeyError(name)


def assert_within_half_step(decoded: np.ndarray, w: np.ndarray, block: int):
    """Symmetric 8-bit per block: |w' - w| <= max|w_block| / 254 (half a quantization step), plus fp32 slack."""
    step = np.repeat(np.abs(w.reshape(w.shape[0], -1, block)).max(axis=2) / 127.0, block, axis=1)
    assert np.all(np.abs(decoded - w) <= step / 2 * (1 + 1e-5) + 1e-9)
    assert np.abs(decoded - w).max() > 0  # really re-quantized, not copied


def test_int8_lm_head_weights_and_logits(quark_exports, tmp_path):
    export = quark_exports("llama_h64", "uint4_g64")
    out = build(export, tmp_path / "onnx", "cpu", "fp32", accuracy_level=1, lm_head="int8")
    assert op_types(out).get("MatMul", 0) == 0  # no float MatMul left
    w = checkpoint_tensor(export / "quark", "lm_head.weight")
    assert_within_half_step(matmul_nbits_dequantized(out)["/lm_head"], w, 64)  # hidden 64: block 64
    ref = np.load(export / "reference.npz")
    diff = float(np.abs(prompt_logits(out, ref["input_ids"]) - ref["logits"]).max())
    assert diff <= INT8_LOGIT_TOL, diff
    n = decisive_prefix(ref["greedy_margins"], 2 * INT8_LOGIT_TOL)
    assert genai_greedy(out, ref["input_ids"])[:n] == ref["greedy"].tolist()[:n]


def test_int8_tied_lm_head_quantizes_the_embedding(tmp_path):
    src = write_synthetic_export(tmp_path / "src", config_overrides={"tie_word_embeddings": True},
                                 drop=("lm_head.weight",))
    r = run_builder("-i", src, "-o", tmp_path / "out", "--extra_options", "lm_head=int8")
    assert r.returncode == 0, r.stderr
    assert "lm_head=int8 quantizes a copy of it" in r.stderr
    embed = checkpoint_tensor(src, "model.embed_tokens.weight")
    assert_within_half_step(matmul_nbits_dequantized(tmp_path / "out")["/lm_head"], embed, 64)


def test_int8_leaves_a_quark_quantized_lm_head_alone(quark_exports):
    plan, ckpt = plan_model(quark_exports("llama_h64", "lmhead_g32") / "quark", "cpu", "fp32",
                            BuildOptions(extra={"lm_head": "int8"}))
    ckpt.close()
    assert plan.linears["lm_head"].scheme is not FloatToInt8Linear
    assert any("lm_head=int8 not applied" in n for n in plan.notes)


def test_lm_head_option_is_validated(tmp_path):
    src = write_synthetic_export(tmp_path / "src")
    r = run_builder("-i", src, "-o", tmp_path / "out", "--extra_options", "lm_head=int4")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "--extra_options lm_head='int4'" in r.stderr and "float, int8" in r.stderr
    assert not (tmp_path / "out").exists()
    r = run_builder("-i", src, "-o", tmp_path / "mgx", "-e", "migraphx", "--extra_options", "lm_head=int8")
    assert r.returncode == 2 and "8-bit MatMulNBits" in r.stderr and not (tmp_path / "mgx").exists()
    cfg = json.loads((src / "config.json").read_text())
    assert cfg["quantization_config"]["exclude"] == ["lm_head"]
