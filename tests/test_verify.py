"""builder.verify: ONNX (onnxruntime-genai) vs PyTorch figures.

The ONNX models here are made by onnxruntime-genai's own model builder (independent of our converter), from
a tiny random float Llama: fp32 (must agree with PyTorch to float rounding), a different-seed model (verify
must report the disagreement), and int4 from a Quark uint4 export (compared with Quark's emulation).
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from builder import verify

from quantize_script_kit import has_module, make_tiny_float_model

pytestmark = pytest.mark.skipif(
    not (has_module("torch") and has_module("transformers") and has_module("onnxruntime_genai")),
    reason="needs torch, transformers and onnxruntime-genai",
)
REPO_ROOT = Path(__file__).resolve().parent.parent


def genai_build(model_dir: Path, out: Path, precision: str) -> Path:
    """onnxruntime-genai's builder (not ours) -> a reference ONNX model folder."""
    completed = subprocess.run(
        [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(model_dir), "-o", str(out),
         "-p", precision, "-e", "cpu", "-c", str(out.parent / "genai_cache")],
        capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def float_model(tmp_path_factory) -> Path:
    return make_tiny_float_model(tmp_path_factory.mktemp("float"), dtype="float32")


@pytest.fixture(scope="module")
def fp32_onnx(float_model, tmp_path_factory) -> Path:
    return genai_build(float_model, tmp_path_factory.mktemp("onnx") / "fp32", "fp32")


def test_perplexity_matches_torch_cross_entropy():
    import torch

    rng = np.random.default_rng(3)
    logits = rng.normal(size=(12, 50)).astype(np.float32) * 3
    ids = rng.integers(0, 50, size=12)
    expected = math.exp(torch.nn.functional.cross_entropy(torch.from_numpy(logits[:-1]),
                                                          torch.from_numpy(ids[1:])).item())
    assert verify.perplexity(logits, ids) == pytest.approx(expected, rel=1e-5)


def test_greedy_agreement_counts_positions_and_first_divergence():
    figures = verify.greedy_agreement([[1, 2, 3], [4, 5]], [[1, 2, 9, 9], [4, 5, 6]])
    assert (figures["greedy_matched"], figures["greedy_compared"]) == (4, 5)
    assert figures["first_divergence"] == [2, None]


def test_fp32_onnx_agrees_with_float_model(fp32_onnx, float_model, tmp_path, capsys):
    report = tmp_path / "verify.json"
    result = verify.run_verify(str(fp32_onnx), str(float_model), new_tokens=8, max_tokens=96,
                               json_out=str(report), print_table=True)
    float_figures = result["references"]["float"]
    assert list(result["references"]) == ["float"]
    assert result["tokens_evaluated"] == 96
    assert float_figures["max_abs_logit_diff"] < 1e-4
    assert float_figures["perplexity"] == pytest.approx(result["onnx"]["perplexity"], rel=1e-4)
    assert float_figures["greedy_agreement"] == 1.0 and float_figures["top1_agreement"] == 1.0
    assert json.loads(report.read_text())["references"]["float"]["greedy_compared"] == 3 * 8
    table = capsys.readouterr().out
    assert "perplexity" in table and "greedy agreement" in table and "100.0%" in table
    # built by onnxruntime-genai's builder: no quark_onnx metadata
    assert result["onnx"]["accuracy_level"] == "unknown" and "accuracy_level: unknown" in table


def test_other_model_is_reported_as_different(fp32_onnx, tmp_path):
    import torch

    other = make_tiny_float_model(tmp_path / "other", dtype="float32")
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(other)
    torch.manual_seed(123)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.05)
    model.save_pretrained(other)
    result = verify.run_verify(str(fp32_onnx), str(other), new_tokens=8, max_tokens=64)
    figures = result["references"]["float"]
    assert figures["max_abs_logit_diff"] > 0.05
    assert figures["top1_agreement"] < 0.9
    assert figures["perplexity"] != pytest.approx(result["onnx"]["perplexity"], rel=1e-3)


def test_cli_errors_are_one_line_exit_2(fp32_onnx, tmp_path):
    completed = subprocess.run([sys.executable, "-m", "builder.verify", str(fp32_onnx), "--reference",
                                str(tmp_path / "missing")], capture_output=True, text=True, cwd=REPO_ROOT)
    assert completed.returncode == 2
    assert completed.stderr.strip().splitlines() == [
        f"error: --reference '{tmp_path / 'missing'}' has no config.json "
        "(need a local HF float or Quark export folder)"]


@pytest.mark.skipif(not has_module("quark"), reason="needs amd-quark 0.13 to make and emulate a Quark export")
def test_quark_export_reference_is_emulated_by_quark(uint4_g32_cpu_script_run, script_float_model, tmp_path):
    """uint4 g32 Quark export -> onnxruntime-genai's int4 builder -> verify against Quark's emulation + float.

    lm_head is quantized too (--exclude_layers with no value): onnxruntime-genai 0.18 would re-quantize a
    float lm_head to int4 on its own, which is a real difference verify would (rightly) report.
    The export is tests/test_quantize_script.py test_end_to_end_uint4_cpu's (tests/quantize_script_kit.py
    SCRIPT_RUNS: the bf16 tiny model, --group_size 32 --exclude_layers --num_calib_data 2 --seq_len 64), made once.
    """
    folder, completed = uint4_g32_cpu_script_run
    float_model, export = script_float_model, folder / "quark"
    assert completed.returncode == 0, completed.stderr[-3000:]
    onnx_dir = genai_build(export, tmp_path / "onnx_int4", "int4")
    result = verify.run_verify(str(onnx_dir), str(export), new_tokens=8, max_tokens=64)
    quark_figures, float_figures = result["references"]["quark"], result["references"]["float"]
    assert "skipped" not in quark_figures, quark_figures
    assert float_figures["path"] == str(float_model.resolve())
    # ONNX is closer to Quark's emulation (same quantized weights) than to the float model.
    assert quark_figures["max_abs_logit_diff"] < float_figures["max_abs_logit_diff"]
    assert quark_figures["max_abs_logit_diff"] < 0.05
