"""scripts/quantize_quark.py: a tiny random float Llama -> amd-quark -> hf_format export (-> builder -> verify).

Quantizing needs torch + amd-quark (the "test" extra); every error case must fail before they are imported,
so those run in well under a second each. The end-to-end part needs builder.convert (the converter) and is
skipped until it exists.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

# REPO_ROOT, SCRIPT, TINY_LLAMA, make_tiny_float_model: imported from here by tests/test_verify.py
from quantize_script_kit import (REPO_ROOT, SCRIPT, TINY_LLAMA, can_quantize, has_module,  # noqa: F401
                                 make_tiny_float_model, run_script)

needs_quark = pytest.mark.skipif(not can_quantize(),
                                 reason="needs the 'test' extra: torch==2.13.0, amd-quark==0.13, transformers")
CONVERTER_MISSING = not has_module("builder.convert")


@pytest.fixture(scope="module")
def float_model(script_float_model) -> Path:
    """The bf16 tiny float model the shared script runs start from (tests/quantize_script_kit.py)."""
    return script_float_model


@pytest.fixture(scope="module")
def fake_model_dir(tmp_path_factory) -> Path:
    """Just a config.json: enough for the checks that run before any import."""
    folder = tmp_path_factory.mktemp("config_only")
    (folder / "config.json").write_text(json.dumps(dict(TINY_LLAMA, model_type="llama")))
    return folder


def load_export(folder: Path) -> tuple[dict, dict]:
    from safetensors import safe_open

    config = json.loads((folder / "config.json").read_text())
    tensors = {}
    for file in folder.glob("*.safetensors"):
        with safe_open(str(file), "np") as handle:
            for name in handle.keys():
                tensors[name] = handle.get_slice(name)
    return config, tensors


# ------------------------------------------------------------------ errors: one line, exit 2, no slow imports

@pytest.mark.parametrize("extra, expected", [
    (["--quant_scheme", "w_int3_magic"], "unknown --quant_scheme 'w_int3_magic'"),
    (["--quant_scheme", "w_uint4_per_group_asym", "--group_size", "64", "--dataset", "pileval"],
     "dataset 'pileval' is not a local file or folder"),
    (["--quant_scheme", "w_uint4_per_group_asym", "--group_size", "128"], "does not divide config.json hidden_size=64"),
    (["--quant_scheme", "w_uint4_per_group_asym", "--group_size", "48"], "group size 48 not supported"),
    (["--quant_scheme", "w_fp8_a_fp8", "--quant_algo", "awq"], "--quant_algo awq does not apply"),
    (["--quant_scheme", "w_int8_a_int8_per_tensor_sym", "--layer_group_size", "lm_head=32"], "has no group size"),
    (["--quant_scheme", "int8", "--quant_algo", "quarot"], "unknown --quant_algo 'quarot'"),
    (["--quant_scheme", "int8", "-e", "cpu"], "needs --onnx_out"),
])
def test_bad_input_exits_2_with_one_line(fake_model_dir, tmp_path, extra, expected):
    completed = run_script("--model_dir", str(fake_model_dir), "--output_dir", str(tmp_path / "out"), *extra,
                           timeout=60)
    assert completed.returncode == 2, completed.stderr
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], completed.stderr
    assert not (tmp_path / "out").exists()


def test_missing_model_dir_exits_2(tmp_path):
    completed = run_script("--model_dir", str(tmp_path / "no_such_model"), "--output_dir", str(tmp_path / "out"),
                           "--quant_scheme", "w_uint4_per_group_asym", timeout=60)
    assert completed.returncode == 2
    assert completed.stderr.strip().splitlines() == [
        f"error: --model_dir '{tmp_path / 'no_such_model'}' is not a local folder "
        "(hub model ids cannot be downloaded here)"]


def test_hub_dataset_name_with_slash_exits_2(fake_model_dir, tmp_path):
    completed = run_script("--model_dir", str(fake_model_dir), "--output_dir", str(tmp_path / "out"),
                           "--quant_scheme", "int8", "--dataset", "HuggingFaceH4/ultrachat_200k", timeout=60)
    assert completed.returncode == 2
    assert "hub datasets cannot be fetched" in completed.stderr and len(completed.stderr.strip().splitlines()) == 1


def test_group_size_in_scheme_name_plans_like_the_group_size_flag(fake_model_dir):
    """--quant_scheme uint4_wo_32 (Quark 0.11+ template name) plans what w_uint4_per_group_asym --group_size 32 does:
    the shared uint4 g32 run (tests/quantize_script_kit.py) uses the second spelling, test_verify used the first."""
    import importlib.util as iu
    import sys

    spec = iu.spec_from_file_location("quantize_quark_script", SCRIPT)
    script = sys.modules[spec.name] = iu.module_from_spec(spec)  # its dataclasses look their module up
    spec.loader.exec_module(script)
    common = ["--model_dir", str(fake_model_dir), "--output_dir", "unused", "--exclude_layers"]
    named = script.validate(script.parse_args(common + ["--quant_scheme", "uint4_wo_32"]))
    flag = script.validate(script.parse_args(common + ["--quant_scheme", "w_uint4_per_group_asym", "--group_size",
                                                       "32"]))
    assert named == flag and named["template_scheme"] == "uint4_wo_32" and named["group_size"] == 32


# ------------------------------------------------------------------ real quantization (amd-quark on CPU)

@pytest.fixture(scope="module")
def uint4_export(uint4_g64_script_run) -> tuple[Path, subprocess.CompletedProcess]:
    """quantize_quark.py --quant_scheme w_uint4_per_group_asym --group_size 64 --layer_group_size lm_head=32
    --num_calib_data 4 --seq_len 64 (tests/quantize_script_kit.py SCRIPT_RUNS, shared by the session)."""
    folder, completed = uint4_g64_script_run
    return folder / "quark", completed


@needs_quark
def test_uint4_per_group_export(uint4_export):
    out, completed = uint4_export
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "[7/7] export hf_format: done in" in completed.stdout
    config, tensors = load_export(out)
    quant = config["quantization_config"]
    assert quant["quant_method"] == "quark"
    weight = quant["global_quant_config"]["weight"]
    assert (weight["dtype"], weight["qscheme"], weight["group_size"], weight["symmetric"]) == (
        "uint4", "per_group", 64, False)
    assert quant["layer_quant_config"]["lm_head"]["weight"]["group_size"] == 32
    assert "lm_head" not in quant["exclude"]
    # Quark packs int4 8 per int32 along the output axis of the transposed weight: [in, out / 8];
    # scales and zero points are [in / group, out] (zero points packed too).
    up_proj = "model.layers.0.mlp.up_proj"
    assert tensors[f"{up_proj}.weight"].get_dtype() == "I32" and tensors[f"{up_proj}.weight"].get_shape() == [64, 16]
    assert tensors[f"{up_proj}.weight_scale"].get_shape() == [1, 128]
    assert tensors[f"{up_proj}.weight_zero_point"].get_shape() == [1, 16]
    assert tensors["lm_head.weight_scale"].get_shape() == [2, 256]
    assert (out / "tokenizer.json").is_file() and (out / "generation_config.json").is_file()
    info = json.loads((out / "quark_pipeline_info.json").read_text())
    assert info["template_scheme"] == "uint4_wo_64" and info["layer_config"] == {"lm_head": "uint4_wo_32"}


@needs_quark
def test_uint4_export_matches_float_model_within_quantization_error(uint4_export, float_model):
    """Quark's own dequantization (transformers from_pretrained on the export) stays near the float model."""
    import torch
    from transformers import AutoModelForCausalLM

    out, completed = uint4_export
    assert completed.returncode == 0, completed.stderr[-3000:]
    quantized = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    reference = AutoModelForCausalLM.from_pretrained(float_model, dtype=torch.float32).eval()
    ids = torch.tensor([[1, 40, 41, 42, 43, 44, 45]])
    with torch.no_grad():
        diff = (quantized(ids).logits - reference(ids).logits).abs().max().item()
    assert 1e-4 < diff < 0.5  # really quantized (not a float copy), but close


@needs_quark
def test_fp8_activation_scheme_export(fp8_script_run):
    """quantize_quark.py --quant_scheme w_fp8_a_fp8 --dataset calib.jsonl (8 local records) --num_calib_data 2
    --seq_len 32 (tests/quantize_script_kit.py SCRIPT_RUNS)."""
    folder, completed = fp8_script_run
    out = folder / "quark"
    assert completed.returncode == 0, completed.stderr[-3000:]
    config, tensors = load_export(out)
    quant = config["quantization_config"]
    assert quant["quant_method"] == "quark"
    assert quant["global_quant_config"]["weight"]["dtype"] == "fp8_e4m3"
    assert quant["global_quant_config"]["input_tensors"]["dtype"] == "fp8_e4m3"
    assert quant["exclude"] == ["lm_head"]
    down = "model.layers.1.mlp.down_proj"
    assert tensors[f"{down}.weight"].get_dtype() == "F8_E4M3" and tensors[f"{down}.weight"].get_shape() == [64, 128]
    assert tensors[f"{down}.input_scale"].get_shape() == [] and tensors[f"{down}.weight_scale"].get_shape() == []
    assert "lm_head.weight_scale" not in tensors


# ------------------------------------------------------------------ end to end: builder + onnxruntime-genai + verify

@needs_quark
@pytest.mark.skipif(CONVERTER_MISSING, reason="builder.convert (the converter) is not importable yet")
def test_end_to_end_uint4_cpu(uint4_g32_cpu_script_run):
    """quantize_quark.py --quant_scheme w_uint4_per_group_asym --group_size 32 --exclude_layers --num_calib_data 2
    --seq_len 64 --onnx_out ONNX -e cpu --verify_json REPORT (tests/quantize_script_kit.py SCRIPT_RUNS; tests/
    test_verify.py takes its Quark export too)."""
    folder, completed = uint4_g32_cpu_script_run
    report = folder / "verify.json"
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-3000:]
    figures = json.loads(report.read_text())
    quark_reference = figures["references"]["quark"]
    assert "skipped" not in quark_reference, quark_reference
    # Conversion error only: ONNX vs Quark's own emulation of the same quantized weights.
    assert quark_reference["max_abs_logit_diff"] < 0.05 * max(1.0, quark_reference["reference_logit_range"])
    assert quark_reference["top1_agreement"] > 0.9
    assert figures["references"]["float"]["perplexity"] > 1


# ------------------------------------------------------------------ offline dataset sources (pure Python)

def test_calibration_sources_read_local_files_only(tmp_path):
    from builder import calib_text

    (tmp_path / "a.txt").write_text("plain text file")
    (tmp_path / "b.jsonl").write_text('{"text": "first"}\n\n{"content": "second"}\n')
    assert calib_text.load_texts(str(tmp_path / "a.txt")) == ["plain text file"]
    assert calib_text.load_texts(str(tmp_path / "b.jsonl")) == ["first", "second"]
    assert calib_text.load_texts(str(tmp_path)) == ["plain text file", "first", "second"]
    assert calib_text.load_texts(None) == calib_text.load_texts("builtin") == [calib_text.BUILTIN_TEXT]
    (tmp_path / "bad.jsonl").write_text('{"label": 1}\n')
    with pytest.raises(calib_text.DatasetSourceError, match=r"bad.jsonl:1: record has no text field"):
        calib_text.load_texts(str(tmp_path / "bad.jsonl"))
    with pytest.raises(calib_text.DatasetSourceError, match="hub datasets cannot be fetched"):
        calib_text.load_texts("wikitext")
