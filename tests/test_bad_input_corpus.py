"""Bad-input corpus: real amd-quark exports of tiny models, copied and broken one way each, run through the CLI.

Each case runs `builder.__main__.main` in a forked child (tests/bad_input_kit.py; QO_CORPUS_SPAWN=1: a fresh
`python -m builder` per case). Every case asserts: the exit code (2 unless said), exactly one stderr line with
--quiet, starting "error: " and naming the file / field / value, no traceback, the input tree byte-for-byte unchanged, and nothing left beside the
input (no output, no `.out.tmp-*` folder). Categories: output safety, config JSON shape and types, hyper-parameter
ranges, checkpoint structure (layers, duplicates, headers, shards), special files (FIFO, symlink loop / escape,
folders), --extra_options, and every tensor kind (packed weight, weight/input/output scales, zero points, FP4
second-level scales, FP8 attention probability scale, bias, norms, embedding, lm_head, MoE router, Gemma q_norm).
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from bad_input_kit import load_tensors, read_safetensors, run_cli, save_tensors, tree_digest, write_raw_safetensors

QUARK_EXPORTS = [("llama_h64", "uint4_g64"), ("llama_h64", "int8_w8a8"), ("llama_h64", "fp8_w8a8_kv_attn"),
                 ("llama_h64", "nvfp4"), ("llama_h64", "mxfp4"), ("llama_bias", "uint4_g64"),
                 ("mixtral", "uint4_g32"), ("gemma3", "uint4_g32")]
EXPORT_KEYS = {"uint4": ("llama_h64", "uint4_g64"), "int8": ("llama_h64", "int8_w8a8"),
               "fp8": ("llama_h64", "fp8_w8a8_kv_attn"), "nvfp4": ("llama_h64", "nvfp4"),
               "mxfp4": ("llama_h64", "mxfp4"), "bias": ("llama_bias", "uint4_g64"),
               "mixtral": ("mixtral", "uint4_g32"), "gemma3": ("gemma3", "uint4_g32")}
L0 = "model.layers.0"


# ---- mutations -------------------------------------------------------------------------------------------------
def config(**changes):
    def mutate(src: Path, _tmp: Path):
        cfg = json.loads((src / "config.json").read_text())
        for key, value in changes.items():
            node, parts = cfg, key.split("__")
            for part in parts[:-1]:
                node = node.setdefault(part, {})
            node[parts[-1]] = value
        (src / "config.json").write_text(json.dumps(cfg))  # NaN / Infinity written as JSON allows in Python
    return mutate


def config_text(text: str):
    def mutate(src: Path, _tmp: Path):
        (src / "config.json").write_text(text)
    return mutate


def tensors(fn):
    def mutate(src: Path, _tmp: Path):
        t = load_tensors(src / "model.safetensors")
        fn(t)
        save_tensors(t, src / "model.safetensors")
    return mutate


def set_tensor(name, make):
    return tensors(lambda t: t.__setitem__(name, make(t[name])))


def drop(name):
    return tensors(lambda t: t.pop(name))


def header(fn):
    def mutate(src: Path, _tmp: Path):
        h, data = read_safetensors(src / "model.safetensors")
        h = fn(h)
        write_raw_safetensors(src / "model.safetensors", h, data)
    return mutate


def two_shards_with_duplicate(src: Path, _tmp: Path):
    t = load_tensors(src / "model.safetensors")
    (src / "model.safetensors").unlink()
    names = list(t)
    a, b = dict(list(t.items())[: len(names) // 2]), dict(list(t.items())[len(names) // 2:])
    b["model.norm.weight"] = t["model.norm.weight"]
    a["model.norm.weight"] = t["model.norm.weight"]
    save_tensors(a, src / "model-00001-of-00002.safetensors")
    save_tensors(b, src / "model-00002-of-00002.safetensors")
    wm = {n: "model-00001-of-00002.safetensors" for n in a} | {n: "model-00002-of-00002.safetensors" for n in b}
    (src / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))


def index(weight_map):
    def mutate(src: Path, _tmp: Path):
        (src / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return mutate


def extra_layer(src: Path, _tmp: Path):
    t = load_tensors(src / "model.safetensors")
    t.update({n.replace("model.layers.1.", "model.layers.2."): v for n, v in list(t.items())
              if n.startswith("model.layers.1.")})
    save_tensors(t, src / "model.safetensors")


def fifo(name):
    def mutate(src: Path, _tmp: Path):
        (src / name).unlink()
        os.mkfifo(src / name)
    return mutate


def symlink_loop(src: Path, _tmp: Path):
    (src / "model.safetensors").unlink()
    os.symlink("b.safetensors.lnk", src / "a.safetensors.lnk")
    os.symlink("a.safetensors.lnk", src / "b.safetensors.lnk")
    os.symlink("a.safetensors.lnk", src / "model.safetensors")


def symlink_outside(src: Path, tmp: Path):
    outside = tmp / "elsewhere"
    outside.mkdir()
    shutil.move(src / "model.safetensors", outside / "model.safetensors")
    os.symlink(outside / "model.safetensors", src / "model.safetensors")


def config_is_folder(src: Path, _tmp: Path):
    (src / "config.json").unlink()
    (src / "config.json").mkdir()


def nothing(_src: Path, _tmp: Path):
    pass


# ---- cases: name -> (export, mutation, extra CLI args (OUT/SRC/TMP substituted), [needles]) ----------------------
CASES = {
    # output safety
    "o_is_input": ("uint4", nothing, ["-o", "SRC"], ["output folder is the input folder"]),
    "o_inside_input": ("uint4", nothing, ["-o", "SRC/onnx"], ["inside the input folder"]),
    "o_contains_input": ("uint4", nothing, ["-o", "TMP"], ["contains the input folder"]),
    "o_symlink_to_input": ("uint4", lambda s, t: os.symlink(s, t / "link"), ["-o", "TMP/link"],
                           ["output folder is the input folder"]),
    "o_root": ("uint4", nothing, ["-o", "/"], ["/: ", "root folder"]),
    "o_cwd": ("uint4", lambda s, t: (t / "cwd").mkdir(), ["-o", ".", "CWD=TMP/cwd"], [".: ", "current folder"]),
    "o_foreign_files": ("uint4", lambda s, t: ((t / "notes").mkdir(), (t / "notes" / "todo.txt").write_text("x")),
                        ["-o", "TMP/notes"], ["notes", "did not write", "todo.txt", "--overwrite"]),
    "o_overwrite_folder_with_subfolders": ("uint4", lambda s, t: (t / "home" / "projects").mkdir(parents=True),
                                           ["-o", "TMP/home", "--overwrite"], ["home", "sub-folders", "projects"]),
    "o_is_a_file": ("uint4", lambda s, t: (t / "f.txt").write_text("x"), ["-o", "TMP/f.txt"], ["not a folder"]),
    "o_dangling_symlink": ("uint4", lambda s, t: os.symlink(t / "no" / "where", t / "dl"), ["-o", "TMP/dl"],
                           ["dangling symlink"]),
    # config.json shape
    "config_list": ("uint4", config_text("[1, 2]"), [], ["config.json", "must be a JSON object", "[1, 2]"]),
    "config_null": ("uint4", config_text("null"), [], ["config.json", "must be a JSON object"]),
    "config_deep": ("uint4", config_text("[" * 200000 + "]" * 200000), [], ["config.json", "nested too deeply"]),
    "config_not_json": ("uint4", config_text("{\"a\": "), [], ["config.json", "not valid JSON"]),
    "config_folder": ("uint4", config_is_folder, [], ["config.json", "folder"]),
    "config_fifo": ("uint4", fifo("config.json"), [], ["config.json", "not a regular file"]),
    "tokenizer_fifo": ("uint4", fifo("tokenizer.json"), [], ["tokenizer.json", "not a regular file"]),
    # types and ranges
    "rope_scaling_string": ("uint4", config(rope_scaling="linear"), [], ["rope_scaling='linear'", "object"]),
    "rope_theta_nan": ("uint4", config(rope_theta=float("nan")), [], ["rope_theta=nan", "finite positive"]),
    "rope_theta_zero": ("uint4", config(rope_theta=0), [], ["rope_theta=0", "finite positive"]),
    "rope_theta_negative": ("uint4", config(rope_theta=-10000.0), [], ["rope_theta=-10000.0"]),
    "rms_norm_eps_inf": ("uint4", config(rms_norm_eps=float("inf")), [], ["rms_norm_eps=inf"]),
    "rms_norm_eps_negative": ("uint4", config(rms_norm_eps=-1e-6), [], ["rms_norm_eps=-1e-06"]),
    "hidden_size_string": ("uint4", config(hidden_size="64"), [], ["hidden_size='64'", "positive integer"]),
    "num_layers_bool": ("uint4", config(num_hidden_layers=True), [], ["num_hidden_layers=True"]),
    "max_positions_huge": ("uint4", config(max_position_embeddings=10**9), [],
                           ["max_position_embeddings=1000000000", "GiB"]),
    "llama3_rope_without_factor": ("uint4", config(rope_scaling={"rope_type": "llama3", "low_freq_factor": 1.0}),
                                   [], ["rope_scaling.factor=None", "llama3"]),
    "eos_string": ("uint4", config(eos_token_id="</s>"), [], ["eos_token_id='</s>'"]),
    "quant_export_list": ("uint4", config(quantization_config__export=[]), [],
                          ["quantization_config.export=[]", "object"]),
    "quant_group_size_bool": ("uint4", config(quantization_config__global_quant_config__weight__group_size=True),
                              [], ["global_quant_config.weight.group_size=True"]),
    "quant_symmetric_string": ("uint4", config(quantization_config__global_quant_config__weight__symmetric="no"),
                               [], ["global_quant_config.weight.symmetric='no'"]),
    "generation_config_list": ("uint4", lambda s, t: (s / "generation_config.json").write_text("[]"), [],
                               ["generation_config.json", "JSON object"]),
    # checkpoint structure
    "fewer_layers_in_config": ("uint4", config(num_hidden_layers=1), [],
                               ["num_hidden_layers=1", "model.layers.1", "does not describe"]),
    "extra_layer_in_checkpoint": ("uint4", extra_layer, [], ["num_hidden_layers=2", "model.layers.2"]),
    "duplicate_across_shards": ("uint4", two_shards_with_duplicate, [],
                                ["model.norm.weight", "defined twice", "model-0000"]),
    "index_not_object": ("uint4", index(["model.safetensors"]), [], ["model.safetensors.index.json", "weight_map"]),
    "index_escapes_folder": ("uint4", index({"model.norm.weight": "../x.safetensors"}), [],
                             ["weight_map='../x.safetensors'", "inside the model folder"]),
    "header_not_object": ("uint4", header(lambda h: b"[]"), [], ["model.safetensors", "not a JSON object"]),
    "header_deep": ("uint4", header(lambda h: b"[" * 100000 + b"]" * 100000), [],
                    ["model.safetensors", "nested too deeply"]),
    "header_bad_offsets": ("uint4", header(lambda h: {**h, "model.norm.weight": {**h["model.norm.weight"],
                                                                                 "data_offsets": [5, "x"]}}),
                           [], ["model.norm.weight", "data_offsets"]),
    "header_negative_shape": ("uint4", header(lambda h: {**h, "model.norm.weight": {**h["model.norm.weight"],
                                                                                    "shape": [-64]}}),
                              [], ["model.norm.weight", "shape=[-64]"]),
    "safetensors_fifo": ("uint4", fifo("model.safetensors"), [], ["model.safetensors", "not a regular file"]),
    "safetensors_symlink_loop": ("uint4", symlink_loop, [], ["model.safetensors", "symlink loop"]),
    "safetensors_symlink_outside": ("uint4", symlink_outside, [], ["model.safetensors", "outside the model folder"]),
    # --extra_options
    "option_misspelled": ("uint4", nothing, ["--extra_options", "accuracy_levle=1"],
                          ["--extra_options='accuracy_levle'", "unknown option", "accuracy_level"]),
    "option_fp8_attention_maybe": ("uint4", nothing, ["--extra_options", "fp8_attention=maybe"],
                                   ["--extra_options fp8_attention='maybe'", "auto, off"]),
    "option_kv_cache_empty": ("uint4", nothing, ["--extra_options", "kv_cache="], ["--extra_options kv_cache=''"]),
    "option_twice": ("uint4", nothing, ["--extra_options", "accuracy_level=1", "accuracy_level=4"],
                     ["accuracy_level='4'", "twice"]),
    "option_no_equals": ("uint4", nothing, ["--extra_options", "kv_cache"], ["--extra_options='kv_cache'"]),
    # every tensor kind
    "packed_weight_dtype": ("uint4", set_tensor(f"{L0}.self_attn.q_proj.weight", lambda v: v.astype(np.int8)), [],
                            [f"{L0}.self_attn.q_proj.weight"]),
    "weight_scale_nan": ("uint4", set_tensor(f"{L0}.mlp.up_proj.weight_scale",
                                             lambda v: np.where(np.arange(v.size).reshape(v.shape) == 3, np.nan, v)
                                             .astype(v.dtype)), [], [f"{L0}.mlp.up_proj.weight_scale", "non-finite"]),
    "weight_zero_point_missing": ("uint4", drop(f"{L0}.mlp.down_proj.weight_zero_point"), [],
                                  [f"{L0}.mlp.down_proj.weight_zero_point", "no zero point tensor"]),
    "input_scale_shape": ("int8", set_tensor(f"{L0}.self_attn.o_proj.input_scale", lambda v: np.zeros((2, 2),
                                                                                                       v.dtype)),
                          [], [f"{L0}.self_attn.o_proj.input_scale"]),
    "input_zero_point_dtype": ("int8", set_tensor(f"{L0}.mlp.gate_proj.input_zero_point",
                                                  lambda v: v.astype(np.float32)), [],
                               [f"{L0}.mlp.gate_proj.input_zero_point"]),
    "kv_output_scale_missing": ("fp8", drop(f"{L0}.self_attn.v_proj.output_scale"), [],
                                [f"{L0}.self_attn.v_proj.output_scale"]),
    "prob_output_scale_dtype": ("fp8", set_tensor(f"{L0}.self_attn.prob_output_scale",
                                                  lambda v: v.astype(np.int8)), [],
                                [f"{L0}.self_attn.prob_output_scale"]),
    "fp8_weight_scale_negative": ("fp8", set_tensor(f"{L0}.mlp.down_proj.weight_scale", lambda v: -v), [],
                                  [f"{L0}.mlp.down_proj.weight_scale", "negative"]),
    "nvfp4_weight_scale_2_missing": ("nvfp4", drop(f"{L0}.self_attn.k_proj.weight_scale_2"), [],
                                     [f"{L0}.self_attn.k_proj.weight_scale_2"]),
    "mxfp4_weight_scale_shape": ("mxfp4", set_tensor(f"{L0}.mlp.up_proj.weight_scale", lambda v: v[:, :1]), [],
                                 [f"{L0}.mlp.up_proj.weight_scale"]),
    "bias_shape": ("bias", set_tensor(f"{L0}.self_attn.k_proj.bias", lambda v: v[:-1]), [],
                   [f"{L0}.self_attn.k_proj.bias", "shape=[31]"]),
    "norm_dtype": ("uint4", set_tensor(f"{L0}.input_layernorm.weight", lambda v: v.astype(np.int8)), [],
                   [f"{L0}.input_layernorm.weight", "dtype='I8'"]),
    "embedding_shape": ("uint4", set_tensor("model.embed_tokens.weight", lambda v: v[:-1]), [],
                        ["model.embed_tokens.weight", "shape"]),
    "lm_head_truncated": ("uint4", header(lambda h: {**h, "lm_head.weight": {**h["lm_head.weight"], "data_offsets": [
        h["lm_head.weight"]["data_offsets"][0], h["lm_head.weight"]["data_offsets"][1] + 4]}}), [],
        ["lm_head.weight", "out of bounds"]),
    "moe_router_shape": ("mixtral", set_tensor(f"{L0}.mlp.gate.weight", lambda v: v[:-1]), [],
                         [f"{L0}.mlp.gate.weight"]),
    "gemma_q_norm_dtype": ("gemma3", set_tensor(f"{L0}.self_attn.q_norm.weight", lambda v: v.astype(np.int16)), [],
                           [f"{L0}.self_attn.q_norm.weight"]),
}


@pytest.fixture(scope="module")
def exports(quark_exports):
    return {key: quark_exports(*EXPORT_KEYS[key]) / "quark" for key in sorted(EXPORT_KEYS)}


def _subst(args, src: Path, tmp: Path):
    out, cwd = [], None
    for a in args:
        a = a.replace("SRC", str(src)).replace("TMP", str(tmp))
        if a.startswith("CWD="):
            cwd = Path(a[4:])
        else:
            out.append(a)
    return out, cwd


def assert_one_line_error(r, needles, rc=2):
    assert not r.timed_out, "hung: killed after the timeout"
    assert r.returncode == rc, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input(exports, tmp_path, case):
    key, mutate, args, needles = CASES[case]
    src = tmp_path / "src"
    shutil.copytree(exports[key], src)
    mutate(src, tmp_path)
    before_src, before_tmp = tree_digest(src), sorted(p.name for p in tmp_path.iterdir())
    extra_digest = {n: tree_digest(tmp_path / n) for n in before_tmp if n != "src" and (tmp_path / n).is_dir()}
    args, cwd = _subst(args, src, tmp_path)
    if "-o" not in args:
        args = ["-o", str(tmp_path / "out"), *args]
    r = run_cli(["-i", src, *args, "-q"], cwd=cwd)
    assert_one_line_error(r, needles)
    assert tree_digest(src) == before_src, "input changed"
    assert sorted(p.name for p in tmp_path.iterdir()) == before_tmp, "output or temp folder left behind"
    for name, digest in extra_digest.items():
        assert tree_digest(tmp_path / name) == digest, f"{name} changed"


def test_corpus_size():
    kinds = {"weight", "weight_scale", "weight_zero_point", "input_scale", "input_zero_point", "output_scale",
             "prob_output_scale", "weight_scale_2", "bias", "layernorm", "embed_tokens", "lm_head", "gate", "q_norm"}
    covered = {k for k in kinds if any(k in " ".join(map(str, CASES[c][3])) for c in CASES)}
    assert len(CASES) >= 40 and covered == kinds, kinds - covered


def test_disk_full_is_one_line_naming_output(exports, tmp_path):
    """EFBIG (a file-size limit) while writing model.onnx.data: one line naming -o, nothing left."""
    src = tmp_path / "src"
    shutil.copytree(exports["uint4"], src)
    out = tmp_path / "out"
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, hard))  # the child inherits it; the data file is ~190 KiB
    try:
        r = run_cli(["-i", src, "-o", out, "-q"])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert_one_line_error(r, [str(out), "file too large"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_unreadable_file_is_one_line(exports, tmp_path, monkeypatch):
    """PermissionError (root ignores chmod, so the refusal is simulated in-process at os.open)."""
    import builder.input_files as input_files
    from builder.convert import plan_model
    from builder.errors import ConversionError
    src = tmp_path / "src"
    shutil.copytree(exports["uint4"], src)
    real_open = os.open

    def deny(path, flags, *a, **k):
        if str(path).endswith("model.safetensors"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *a, **k)
    monkeypatch.setattr(input_files.os, "open", deny)
    with pytest.raises(ConversionError, match="model.safetensors: permission denied"):
        plan_model(src, "cpu")
    if os.geteuid() != 0:  # and for real where chmod is honoured
        monkeypatch.undo()
        (src / "model.safetensors").chmod(0)
        r = run_cli(["-i", src, "-o", tmp_path / "out", "-q"])
        assert_one_line_error(r, ["model.safetensors", "permission denied"])


# ---- what is accepted, with a warning ---------------------------------------------------------------------------
def _warnings(r):
    return [l for l in r.stderr.splitlines() if l.startswith("warning: ")]


def test_option_not_applying_is_a_warning(exports, tmp_path):
    r = run_cli(["-i", exports["uint4"], "-o", tmp_path / "out", "-q", "--extra_options", "kv_cache=off",
                 "fp8_attention=off", "accuracy_level=1"])
    assert r.returncode == 0, r.stderr
    w = _warnings(r)
    assert len(w) == 2 and "fp8_attention does not apply" in w[0] and "kv_cache does not apply" in w[1], r.stderr


def test_missing_tokenizer_is_a_warning_with_the_fix(exports, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(exports["uint4"], src, ignore=shutil.ignore_patterns("tokenizer*"))
    r = run_cli(["-i", src, "-o", tmp_path / "out", "-q"])
    assert r.returncode == 0, r.stderr
    (w,) = _warnings(r)
    assert "no tokenizer files" in w and "copy them from the float model" in w


def test_unexpected_exception_is_one_line_exit_1(exports, tmp_path, monkeypatch):
    """Anything that is not a ConversionError: one line, exit 1, the --verbose hint (main() in-process)."""
    import builder.convert as convert_module
    from builder.__main__ import main

    def boom(*_a, **_k):
        raise ZeroDivisionError("synthetic bug")
    monkeypatch.setattr(convert_module, "plan_model", boom)
    import io
    import sys
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    assert main(["-i", str(exports["uint4"]), "-o", str(tmp_path / "out")]) == 1
    (line,) = err.getvalue().splitlines()
    assert "internal error: ZeroDivisionError: synthetic bug" in line and "--verbose" in line


# ---- previous outputs ------------------------------------------------------------------------------------------
def test_previous_output_replaced_foreign_needs_overwrite(exports, tmp_path):
    out = tmp_path / "out"
    assert run_cli(["-i", exports["uint4"], "-o", out, "-q"]).returncode == 0
    (out / "stale.bin").write_text("from an older build")  # a previous output (marker present): replaced whole
    assert run_cli(["-i", exports["uint4"], "-o", out, "-q"]).returncode == 0
    assert not (out / "stale.bin").exists() and (out / "model.onnx").is_file()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    r = run_cli(["-i", exports["uint4"], "-o", foreign, "-q", "--overwrite"])
    assert r.returncode == 0 and not (foreign / "notes.txt").exists() and (foreign / "model.onnx").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["foreign", "out"]


def test_symlinked_output_replaces_the_target(exports, tmp_path):
    """-o a symlink: the folder it points to is replaced, the link kept, nothing (.old, .tmp) left beside either."""
    real = tmp_path / "disk" / "model"
    real.parent.mkdir()
    link = tmp_path / "link"
    os.symlink(real, link)
    for _ in range(2):
        r = run_cli(["-i", exports["uint4"], "-o", link, "-q"])
        assert r.returncode == 0, r.stderr
    assert link.is_symlink() and (real / "model.onnx").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["disk", "link"]
    assert [p.name for p in real.parent.iterdir()] == ["model"]


def test_validate_flag(exports, tmp_path):
    r = run_cli(["-i", exports["uint4"], "-o", tmp_path / "out", "--validate"], spawn=True)  # ORT in the child
    assert r.returncode == 0, r.stderr
    assert "validate: onnx.checker passed; one-token CPU run gives finite logits" in r.stderr


def test_validate_failure_leaves_no_output(exports, tmp_path, monkeypatch):
    """A model that ORT cannot run is refused by --validate before it is moved into place."""
    from builder.convert import convert
    from builder.errors import ConversionError
    import builder.validate as validate
    real = validate.validate_model

    def corrupt_then_validate(folder, *a, **k):
        data = folder / "model.onnx.data"
        data.write_bytes(data.read_bytes()[:100])  # external data truncated: ORT cannot load it
        return real(folder, *a, **k)
    monkeypatch.setattr(validate, "validate_model", corrupt_then_validate)
    with pytest.raises(ConversionError, match="--validate"):
        convert(exports["uint4"], tmp_path / "out", log=lambda _m: None, validate=True)
    assert list(tmp_path.iterdir()) == []


def test_header_length_beyond_limit(tmp_path, exports):
    src = tmp_path / "src"
    shutil.copytree(exports["uint4"], src)
    raw = (src / "model.safetensors").read_bytes()
    (src / "model.safetensors").write_bytes(struct.pack("<Q", 2**63) + raw[8:])
    r = run_cli(["-i", src, "-o", tmp_path / "out", "-q"])
    assert_one_line_error(r, ["model.safetensors", "header_len"])


def test_replacing_an_output_never_follows_its_symlinks(exports, tmp_path):
    """A previous output holding a symlink to a folder outside it: replaced, and the outside folder untouched."""
    out, outside = tmp_path / "out", tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep")
    assert run_cli(["-i", exports["uint4"], "-o", out, "-q"]).returncode == 0
    os.symlink(outside, out / "link_to_outside")
    os.symlink(outside / "precious.txt", out / "tokenizer_extra.txt")
    assert run_cli(["-i", exports["uint4"], "-o", out, "-q"]).returncode == 0
    assert (outside / "precious.txt").read_text() == "keep" and not (out / "link_to_outside").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "outside"]


def test_disk_full_in_process_names_output(exports, tmp_path, monkeypatch):
    """ENOSPC from the data-file writer (simulated): ConversionError naming -o, the temporary folder removed."""
    import errno

    import builder.graph as graph
    from builder.convert import convert
    from builder.errors import ConversionError
    real_add = graph.GraphBuilder._add
    calls = [0]

    def full(self, *a, **k):
        calls[0] += 1
        if calls[0] > 5:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.data_path))
        return real_add(self, *a, **k)
    monkeypatch.setattr(graph.GraphBuilder, "_add", full)
    out = tmp_path / "out"
    with pytest.raises(ConversionError, match=f"{out}: cannot write the output: no space left on the device"):
        convert(exports["uint4"], out, log=lambda _m: None)
    assert list(tmp_path.iterdir()) == []


def test_swap_without_renameat2(exports, tmp_path, monkeypatch):
    """Where the kernel has no RENAME_EXCHANGE, the two-rename fallback leaves no .old folder either."""
    import builder.output_dir as output_dir
    from builder.convert import convert
    monkeypatch.setattr(output_dir, "_exchange", lambda a, b: False)
    out = tmp_path / "out"
    for _ in range(2):
        convert(exports["uint4"], out, log=lambda _m: None)
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and (out / "model.onnx").is_file()
