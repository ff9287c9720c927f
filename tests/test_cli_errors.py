"""Bad input: one line naming file/layer/field/value, exit code 2, no traceback, no output folder left."""
import copy
import json
from pathlib import Path

import numpy as np
import pytest

from bad_input_kit import run_cli
from synthetic_export import QUANT_CONFIG, write_synthetic_export

REPO = Path(__file__).resolve().parents[1]


def run_builder(*args, spawn: bool | None = None):
    """`python -m builder ARGS` from the repo root: forked from this warm process (tests/bad_input_kit.py; a fresh
    interpreter costs ~1 CPU s of imports per case), or a real subprocess with spawn=True (or QO_CORPUS_SPAWN=1)."""
    return run_cli(args, cwd=REPO, spawn=spawn)


def quant(**weight_overrides):
    q = copy.deepcopy(QUANT_CONFIG)
    q["global_quant_config"]["weight"].update(weight_overrides)
    return q


CASES = {
    "unknown_architecture": (dict(config_overrides={"architectures": ["FalconForCausalLM"]}),
                             ["config.json", "architectures[0]='FalconForCausalLM'"]),
    "unsupported_dtype": (dict(quant_config=quant(dtype="int3")),
                          ["config.json", "layer model.layers.0.self_attn.q_proj", "global.weight='int3"]),
    "unsupported_qscheme": (dict(quant_config=quant(qscheme="per_block", group_size=None, block_size=[32, 32])),
                            ["config.json", "per_block"]),
    "missing_tensor": (dict(drop=("model.layers.0.mlp.up_proj.weight_scale",)),
                       ["model.layers.0.mlp.up_proj.weight_scale", "missing"]),
    "group_not_dividing": (dict(quant_config=quant(group_size=48)),
                           ["layer model.layers.0.self_attn.q_proj", "weight.group_size=48", "in_features=64"]),
    "bad_pack_method": (dict(quant_config=dict(copy.deepcopy(QUANT_CONFIG),
                                               export=dict(QUANT_CONFIG["export"], pack_method="zigzag"))),
                        ["quantization_config.export.pack_method='zigzag'"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_one_line_exit_2_no_output(tmp_path, case):
    kwargs, expected = CASES[case]
    src = write_synthetic_export(tmp_path / "src", **kwargs)
    out = tmp_path / "out"
    r = run_builder("-i", src, "-o", out)
    assert r.returncode == 2, r.stderr
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    errors = [l for l in lines if l.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
    for fragment in expected:
        assert fragment in errors[0], errors[0]
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["src"]  # no temp folder left either


def test_nan_scale_is_refused(tmp_path):
    from safetensors.numpy import load_file, save_file
    src = write_synthetic_export(tmp_path / "src")
    tensors = load_file(str(src / "model.safetensors"))
    tensors["model.layers.0.mlp.up_proj.weight_scale"][1, 3] = np.nan
    save_file(tensors, str(src / "model.safetensors"))
    r = run_builder("-i", src, "-o", tmp_path / "out")
    assert r.returncode == 2 and "model.layers.0.mlp.up_proj.weight_scale" in r.stderr and "non-finite" in r.stderr
    assert not (tmp_path / "out").exists()


def test_shard_listed_in_index_but_missing(tmp_path):
    src = write_synthetic_export(tmp_path / "src")
    (src / "model.safetensors").rename(src / "model-00001-of-00002.safetensors")
    (src / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "model.norm.weight": "model-00001-of-00002.safetensors", "lm_head.weight": "model-00002-of-00002.safetensors"}}))
    r = run_builder("-i", src, "-o", tmp_path / "out")
    assert r.returncode == 2 and "model.safetensors.index.json" in r.stderr
    assert "weight_map='model-00002-of-00002.safetensors'" in r.stderr


@pytest.mark.parametrize("overrides,needle", [
    ({"hidden_size": None}, "hidden_size=None"),
    ({"num_key_value_heads": 3}, "num_key_value_heads=3"),
    ({"intermediate_size": -5}, "intermediate_size=-5"),
])
def test_bad_hyper_parameters(tmp_path, overrides, needle):
    src = write_synthetic_export(tmp_path / "src", config_overrides=overrides)
    r = run_builder("-i", src, "-o", tmp_path / "out")
    assert r.returncode == 2 and needle in r.stderr and "config.json" in r.stderr, r.stderr


def test_verbose_shows_traceback(tmp_path):
    src = write_synthetic_export(tmp_path / "src", config_overrides={"architectures": ["Nope"]})
    r = run_builder("-i", src, "-o", tmp_path / "out", "--verbose", spawn=True)  # one true `python -m builder`
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_truncated_safetensors(tmp_path):
    src = write_synthetic_export(tmp_path / "src")
    st = src / "model.safetensors"
    st.write_bytes(st.read_bytes()[:-100])
    r = run_builder("-i", src, "-o", tmp_path / "out")
    assert r.returncode == 2 and "model.safetensors" in r.stderr and "truncated" in r.stderr


def test_corrupt_config_json(tmp_path):
    src = write_synthetic_export(tmp_path / "src")
    (src / "config.json").write_text("{not json")
    r = run_builder("-i", src, "-o", tmp_path / "out")
    assert r.returncode == 2 and "config.json" in r.stderr and "Traceback" not in r.stderr


def test_missing_input_folder(tmp_path):
    r = run_builder("-i", tmp_path / "nope", "-o", tmp_path / "out")
    assert r.returncode == 2 and "input model folder not found" in r.stderr


def test_unknown_ep(tmp_path):
    src = write_synthetic_export(tmp_path / "src")
    r = run_builder("-i", src, "-o", tmp_path / "out", "-e", "tpu")
    assert r.returncode == 2 and "--execution_provider='tpu'" in r.stderr


def test_existing_output_untouched_on_failure(tmp_path):
    src = write_synthetic_export(tmp_path / "src", drop=("model.norm.weight",))
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    r = run_builder("-i", src, "-o", out)
    assert r.returncode == 2 and (out / "keep.txt").read_text() == "mine"


def test_inspect_prints_plan_and_writes_nothing(tmp_path):
    q = copy.deepcopy(QUANT_CONFIG)
    q["layer_quant_config"] = {"*down_proj": {"weight": dict(q["global_quant_config"]["weight"], group_size=16)}}
    src = write_synthetic_export(tmp_path / "src", quant_config=q, groups={"mlp.down_proj": 16})
    r = run_builder("inspect", "-i", src, "-e", "cpu")
    assert r.returncode == 0, r.stderr
    down = [l for l in r.stdout.splitlines() if "down_proj" in l][0]
    assert "g16" in down and "layer:*down_proj" in down and "block_size=16" in down
    assert "lm_head" in r.stdout and [p.name for p in tmp_path.iterdir()] == ["src"]


def test_config_disagreeing_with_tensors_is_refused(tmp_path):
    q = copy.deepcopy(QUANT_CONFIG)
    q["layer_quant_config"] = {"*down_proj": {"weight": dict(q["global_quant_config"]["weight"], group_size=16)}}
    src = write_synthetic_export(tmp_path / "src", quant_config=q)  # tensors still written with g32
    r = run_builder("-i", src, "-o", tmp_path / "out")
    assert r.returncode == 2
    assert "model.layers.0.mlp.down_proj.weight_scale: shape=[4, 64]" in r.stderr and "[8, 64]" in r.stderr


def test_convert_twice_byte_identical(tmp_path):
    src = write_synthetic_export(tmp_path / "src")
    # "b" in a fresh interpreter: its own str-hash seed, so set/dict-order dependence would show
    for out, spawn in (("a", False), ("b", True)):
        assert run_builder("-i", src, "-o", tmp_path / out, spawn=spawn).returncode == 0
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "b").iterdir())
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    cfg = json.loads((tmp_path / "a" / "genai_config.json").read_text())
    assert cfg["model"]["decoder"]["filename"] == "model.onnx"


def test_ep_form_overrides_are_validated_and_shown(tmp_path):
    src = write_synthetic_export(tmp_path / "src")
    r = run_builder("-i", src, "-o", tmp_path / "out", "--extra_options", "fp8_linear=fast")
    assert r.returncode == 2 and "--extra_options fp8_linear='fast'" in r.stderr and "qdq" in r.stderr
    assert not (tmp_path / "out").exists()
