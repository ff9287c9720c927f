"""genai_config.json contents and the files beside model.onnx."""
import json
from pathlib import Path

import pytest

from builder.convert import convert
from builder.emit_context import BuildOptions
from builder.errors import ConversionError
from ort_library_fixture import ort_ops_library  # noqa: F401  (fixture)
from synthetic_export import write_synthetic_export


def build(tmp_path, **options):
    src = write_synthetic_export(tmp_path / "src")
    (src / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 1, "eos_token_id": [2, 7], "temperature": 0.6, "top_p": 0.9, "do_sample": True}))
    (src / "tokenizer.json").write_text("{}")
    (src / "chat_template.jinja").write_text("{{ messages }}")
    out = tmp_path / "out"
    convert(src, out, "cpu", options=BuildOptions(**options), log=lambda _m: None)
    return out, json.loads((out / "genai_config.json").read_text())


def test_fields_from_config_and_generation_config(tmp_path, ort_ops_library):
    out, cfg = build(tmp_path)
    model, search = cfg["model"], cfg["search"]
    assert model["type"] == "llama" and model["context_length"] == 128 and model["vocab_size"] == 256
    assert model["eos_token_id"] == [2, 7] and model["bos_token_id"] == 1 and model["pad_token_id"] == 2
    dec = model["decoder"]
    assert (dec["num_attention_heads"], dec["num_key_value_heads"], dec["head_size"], dec["hidden_size"]) == (4, 2, 16, 64)
    assert dec["inputs"]["past_key_names"] == "past_key_values.%d.key"
    assert dec["outputs"]["present_value_names"] == "present.%d.value"
    assert dec["session_options"]["provider_options"] == []
    assert dec["session_options"]["intra_op_num_threads"] == 0  # ORT's default: a thread per physical core
    assert search["temperature"] == 0.6 and search["top_p"] == 0.9 and search["do_sample"] is True
    assert search["max_length"] == 128
    # the custom-op library comes along for the cpu default's 4-bit linears (com.quark_onnx MatMulUint4)
    assert {p.name for p in out.iterdir()} == {"model.onnx", "model.onnx.data", "genai_config.json",
                                               "tokenizer.json", "chat_template.jinja", ".quark_onnx_builder.json",
                                               "libquark_onnx_ops.so"}


def test_custom_ops_library_is_copied_and_named(tmp_path, ort_ops_library):
    # a real ORT custom-op library: a stub is refused at plan time (tests/test_custom_ops_genai.py)
    out, cfg = build(tmp_path, custom_ops_library=ort_ops_library)
    assert cfg["model"]["decoder"]["session_options"]["custom_ops_library"] == "libquark_onnx_ops.so"
    assert (out / "libquark_onnx_ops.so").read_bytes() == Path(ort_ops_library).read_bytes()


def test_missing_custom_ops_library_is_refused(tmp_path):
    with pytest.raises(ConversionError, match="custom-op library not found"):
        build(tmp_path, custom_ops_library=str(tmp_path / "nope.so"))
    assert not (tmp_path / "out").exists()


def _physical_cores() -> int:
    """Distinct (physical id, core id) pairs of /proc/cpuinfo (0 where it cannot be read)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return 0
    cores, phys = set(), "0"
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "physical id":
            phys = value.strip()
        elif key.strip() == "core id":
            cores.add((phys, value.strip()))
    return len(cores)


def test_cpu_output_runs_a_thread_per_physical_core(tmp_path, ort_ops_library):
    """onnxruntime-genai's own default is hardware_concurrency() / 2 intra-op threads (one thread on a 2-core VM
    without SMT); the cpu output's intra_op_num_threads 0 gives ONNX Runtime's default, one per physical core. Counted
    as the threads the loaded model adds to the process, against the same output pinned to 1 thread."""
    import shutil

    import onnxruntime_genai as og
    cores = _physical_cores()
    if cores < 2:
        pytest.skip(f"{cores} physical core(s) in /proc/cpuinfo: one intra-op thread either way")
    out, cfg = build(tmp_path)
    one = tmp_path / "one_thread"
    shutil.copytree(out, one)
    cfg["model"]["decoder"]["session_options"]["intra_op_num_threads"] = 1
    (one / "genai_config.json").write_text(json.dumps(cfg))

    def threads_added(folder: Path) -> int:
        before = len(list(Path("/proc/self/task").iterdir()))
        model = og.Model(str(folder))
        added = len(list(Path("/proc/self/task").iterdir())) - before
        del model
        return added
    threads_added(one)  # the first model also starts og's and ORT's process-wide threads
    assert threads_added(out) - threads_added(one) == cores - 1  # ORT's default has no cap (og's own: 16)
