"""scripts/quantize_quark.py: a tiny random float Llama -> amd-quark -> hf_format export (-> builder -> verify).

Quantizing needs torch + amd-quark (the "test" extra); every error case must fail before they are imported,
so those run in well under a second each. The end-to-end part needs builder.convert (the converter) and is
skipped until it exists.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPT = REPO_ROOT / "scripts" / "quantize_quark.py"

TINY_LLAMA = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
    tie_word_embeddings=False,
)


def make_tiny_float_model(folder: Path, dtype: str = "bfloat16") -> Path:
    """A random LlamaForCausalLM (hidden 64, 2 layers) + a 256-id byte-level tokenizer, saved with save_pretrained."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TINY_LLAMA)).to(getattr(torch, dtype))
    model.save_pretrained(folder)
    # 3 specials + 253 byte symbols, no merges: every byte is one token, so any text tokenizes in-vocab.
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for symbol in sorted(pre_tokenizers.ByteLevel.alphabet())[: TINY_LLAMA["vocab_size"] - 3]:
        vocab[symbol] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(folder)
    return folder


def run_script(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO_ROOT)


def has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


needs_quark = pytest.mark.skipif(not (has_module("quark") and has_module("torch") and has_module("transformers")),
                                 reason="needs the 'test' extra: torch==2.13.0, amd-quark==0.13, transformers")
CONVERTER_MISSING = not has_module("builder.convert")


@pytest.fixture(scope="module")
def float_model(tmp_path_factory) -> Path:
    if not has_module("torch"):
        pytest.skip("needs torch + transformers to write the tiny float model")
    return make_tiny_float_model(tmp_path_factory.mktemp("tiny_float"))


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


# ------------------------------------------------------------------ real quantization (amd-quark on CPU)

@pytest.fixture(scope="module")
def uint4_export(float_model, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("export") / "uint4_g64_lmhead_g32"
    completed = run_script("--model_dir", str(float_model), "--output_dir", str(out),
                           "--quant_scheme", "w_uint4_per_group_asym", "--group_size", "64",
                           "--layer_group_size", "lm_head=32", "--num_calib_data", "4", "--seq_len", "64")
    return out, completed


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
def test_fp8_activation_scheme_export(float_model, tmp_path):
    out = tmp_path / "fp8"
    data = tmp_path / "calib.jsonl"
    data.write_text("\n".join(json.dumps({"text": f"sample {i}: the quick brown fox jumps over the lazy dog"})
                              for i in range(8)))
    completed = run_script("--model_dir", str(float_model), "--output_dir", str(out), "--quant_scheme",
                           "w_fp8_a_fp8", "--dataset", str(data), "--num_calib_data", "2", "--seq_len", "32")
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
def test_end_to_end_uint4_cpu(float_model, tmp_path):
    out, onnx_dir, report = tmp_path / "quark", tmp_path / "onnx", tmp_path / "verify.json"
    completed = run_script("--model_dir", str(float_model), "--output_dir", str(out),
                           "--quant_scheme", "w_uint4_per_group_asym", "--group_size", "32", "--exclude_layers",
                           "--num_calib_data", "2", "--seq_len", "64",
                           "--onnx_out", str(onnx_dir), "-e", "cpu", "--verify_json", str(report))
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
