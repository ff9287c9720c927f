"""A newcomer's first hour (issue 20): one test per defect found, each run through the real CLI or script.

Closed pipes exit quietly; OS errors and missing packages are one line naming the user's path or the pip extra; every
error line is at most 400 characters; `-i` that is a file, a GGUF file or a Hub id says so; a float input and a
missing tokenizer_config.json are warnings; two conversions into one -o cannot both write it; the help names every
subcommand; examples/generate.py and scripts/quantize_quark.py fail in one line.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bad_input_kit import read_safetensors, run_cli, write_raw_safetensors
from synthetic_export import QUANT_CONFIG, write_synthetic_export

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "tiny-llama-uint4-quark"
FLOAT_EXAMPLE = REPO / "examples" / "tiny-llama-float"
MAX_LINE = 400
HUGE = "z" * 100_000


def _env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))


def python(*args, stdout=subprocess.PIPE, cwd=REPO, timeout=120):
    return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, stdout=stdout, stderr=subprocess.PIPE,
                          text=True, env=_env(), timeout=timeout)


def closed_pipe_run(*args):
    """Run with stdout a pipe whose reader has already gone (what `| head -1` becomes once head exits)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return python(*args, stdout=write_end)
    finally:
        os.close(write_end)


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr[:2000]
    assert lines[0].startswith("error: ") and "internal error" not in lines[0] and "Traceback" not in stderr
    assert len(lines[0]) <= MAX_LINE, len(lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("newcomer") / "tiny-cpu"
    r = run_cli(["-i", EXAMPLE, "-o", out, "-q"])
    assert r.returncode == 0, r.stderr
    return out


# ---- 1. closed pipes ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args", [["-m", "builder", "inspect", "-i", EXAMPLE], ["-m", "builder", "--help"]],
                         ids=["inspect", "help"])
def test_closed_pipe_exits_quietly(args):
    """141 like `cat`; --help may also exit 0 (argparse drops the write error itself), but never says anything."""
    r = closed_pipe_run(*args)
    assert r.returncode in ((0, 141) if "--help" in args else (141,)) and r.stderr == "", (r.returncode, r.stderr)


@pytest.mark.parametrize("args", [["--prompt", "Hello", "--max_length", "24"], ["--help"]], ids=["stream", "help"])
def test_generate_closed_pipe_exits_quietly(built, args):
    r = closed_pipe_run(REPO / "examples" / "generate.py", built, *args)
    assert r.returncode in ((0, 141) if "--help" in args else (141,)) and r.stderr == "", (r.returncode, r.stderr)


# ---- 2. verify without transformers; --verbose accepted -------------------------------------------------------
def test_verify_without_transformers_names_the_pip_extra(built):
    code = ("import sys; sys.modules['transformers'] = None; from builder.__main__ import main; "
            f"sys.exit(main(['verify', {str(built)!r}, '--reference', {str(EXAMPLE)!r}]))")
    r = python("-c", code)
    line = one_error_line(r.stderr)
    assert r.returncode == 2 and "transformers" in line and 'pip install -e ".[quantize]"' in line, line


def test_verify_accepts_verbose(capsys, monkeypatch):
    assert "--verbose" in help_text(["verify", "--help"], capsys, monkeypatch)


# ---- 3. names too long ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["-i", "-o"])
def test_name_too_long_is_one_line(tmp_path, which):
    long = tmp_path / ("n" * 300)
    args = ["-i", long, "-o", tmp_path / "out"] if which == "-i" else ["-i", EXAMPLE, "-o", long]
    r = run_cli(args)
    line = one_error_line(r.stderr)
    assert r.returncode == 2 and "too long" in line and "…" in line and "n" * 40 + ":" in line, line  # path cut
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# ---- 4. every echoed field, fed 100 KB ------------------------------------------------------------------------
def _export_with(tmp_path, **kwargs) -> Path:
    return write_synthetic_export(tmp_path / "src", **kwargs)


def _huge_dtype(tmp_path) -> Path:
    src = _export_with(tmp_path)
    header, data = read_safetensors(src / "model.safetensors")
    header["model.norm.weight"]["dtype"] = HUGE
    write_raw_safetensors(src / "model.safetensors", header, data)
    return src


HUGE_INPUTS = {
    "extra_options_key": lambda t: (EXAMPLE, ["--extra_options", f"{HUGE}=1"]),
    "extra_options_value": lambda t: (EXAMPLE, ["--extra_options", f"lm_head={HUGE}"]),
    "execution_provider": lambda t: (EXAMPLE, ["-e", HUGE]),
    "precision": lambda t: (EXAMPLE, ["-p", HUGE]),
    "input_path": lambda t: (t / HUGE[:4000], []),
    "quantization_config_key": lambda t: (_export_with(t, quant_config=dict(QUANT_CONFIG, **{HUGE: 1})), []),
    "quantization_config_value": lambda t: (_export_with(t, quant_config=dict(
        QUANT_CONFIG, export=dict(QUANT_CONFIG["export"], pack_method=HUGE))), []),
    "architectures": lambda t: (_export_with(t, config_overrides={"architectures": [HUGE]}), []),
    "dtype": _huge_dtype,
    "exclude_pattern": lambda t: (_export_with(t, quant_config=dict(QUANT_CONFIG, exclude=[HUGE])), []),
}


@pytest.mark.parametrize("field", sorted(HUGE_INPUTS))
def test_huge_values_are_cut_to_400_characters(tmp_path, field):
    made = HUGE_INPUTS[field](tmp_path)
    src, extra = made if isinstance(made, tuple) else (made, [])
    r = run_cli(["-i", src, "-o", tmp_path / "out", *extra])
    lines = r.stderr.splitlines()
    assert lines and all(len(line) <= MAX_LINE for line in lines), max(map(len, lines))
    assert "…" in r.stderr or "..." in r.stderr
    if field == "exclude_pattern":  # a pattern matching nothing is a warning, not an error
        assert r.returncode == 0 and any(line.startswith("warning: ") and "matches no layer" in line
                                         for line in lines), r.stderr
    else:
        assert r.returncode == 2
        errors = [line for line in lines if "error: " in line]  # argparse's: "python -m builder: error: ..."
        assert len(errors) == 1 and "internal error" not in errors[0] and "Traceback" not in r.stderr, r.stderr


# ---- 5. -i that is a file, a GGUF file, a Hub id ----------------------------------------------------------------
def test_input_is_a_file(tmp_path):
    line = one_error_line(run_cli(["-i", EXAMPLE / "model.safetensors", "-o", tmp_path / "o"]).stderr)
    assert "input is a file" in line and f"such as {EXAMPLE}" in line


def test_input_is_a_gguf_file(tmp_path):
    gguf = tmp_path / "model.bin"  # the magic, not the suffix, is what tells
    gguf.write_bytes(b"GGUF" + bytes(28))
    line = one_error_line(run_cli(["-i", gguf, "-o", tmp_path / "o"]).stderr)
    assert "GGUF file" in line and "not a Quark export" in line


def test_input_looks_like_a_hub_id(tmp_path):
    r = run_cli(["-i", "amd/Llama-3.1-8B-Instruct-FP8-KV", "-o", tmp_path / "o"], cwd=tmp_path)
    line = one_error_line(r.stderr)
    assert "Hugging Face Hub id" in line
    assert "huggingface-cli download amd/Llama-3.1-8B-Instruct-FP8-KV --local-dir Llama-3.1-8B-Instruct-FP8-KV" in line


def test_missing_local_folder_is_not_called_a_hub_id(tmp_path):
    line = one_error_line(run_cli(["-i", tmp_path / "nope", "-o", tmp_path / "o"]).stderr)
    assert "input model folder not found" in line and "Hub" not in line


# ---- 6. float input ----------------------------------------------------------------------------------------------
def test_float_input_converts_with_a_warning(tmp_path):
    r = run_cli(["-i", FLOAT_EXAMPLE, "-o", tmp_path / "out", "-q"])
    assert r.returncode == 0, r.stderr
    (warning,) = [line for line in r.stderr.splitlines() if line.startswith("warning: ")]
    assert "no quantization_config" in warning and "float ONNX model" in warning
    assert "no quantization_config" not in run_cli(["-i", EXAMPLE, "-o", tmp_path / "q", "-q"]).stderr


# ---- 7. tokenizer_config.json --------------------------------------------------------------------------------------
def test_missing_tokenizer_config_is_named(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("tokenizer_config.json"))
    r = run_cli(["-i", src, "-o", tmp_path / "out", "-q"])
    assert r.returncode == 0, r.stderr
    (warning,) = [line for line in r.stderr.splitlines() if line.startswith("warning: ")]
    assert "tokenizer_config.json missing" in warning and "og.Tokenizer" in warning


# ---- 8. concurrent conversions into one -o --------------------------------------------------------------------------
HOLD_LOCK = """
import sys, time
from pathlib import Path
from builder.output_lock import output_lock
target = Path(sys.argv[1])
with output_lock(target, target):
    print("held", flush=True)
    sys.stdin.readline()
"""


def test_second_conversion_into_one_output_fails_naming_the_first(tmp_path):
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(out)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=_env(), cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "held"
        r = run_cli(["-i", EXAMPLE, "-o", out, "-q"])
        line = one_error_line(r.stderr)
        assert r.returncode == 2 and f"being written by process {holder.pid}" in line and str(out) in line, line
        assert not out.exists()
    finally:
        holder.communicate("\n", timeout=30)
    r = run_cli(["-i", EXAMPLE, "-o", out, "-q"])  # once the first is done, the output can be written
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no lock file or temporary folder left
    assert (out / "model.onnx").is_file() and (out / "genai_config.json").is_file()


def test_two_real_conversions_never_both_write(tmp_path):
    """Started together: each either wins (rc 0) or fails in one line naming the other; the output is complete and
    nothing (lock file, temporary folder) is left beside it. Whether the two overlap is up to the scheduler: the
    refusal itself is forced in the test above."""
    out = tmp_path / "out"
    procs = [subprocess.Popen([sys.executable, "-m", "builder", "-i", str(EXAMPLE), "-o", str(out), "-q"],
                              stderr=subprocess.PIPE, text=True, env=_env(), cwd=REPO) for _ in range(2)]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    for rc, err in results:
        # "by process PID", or "by another process" when the winner holds the lock but has not written its pid yet
        assert rc == 0 or (rc == 2 and ("being written by process" in one_error_line(err)
                                        or "being written by another process" in one_error_line(err))), (rc, err)
    assert any(rc == 0 for rc, _ in results)
    from builder.output_dir import MARKER
    # the cpu default ships the custom-op library beside the model when it has one (the example's bf16 lm_head)
    names = sorted(p.name for p in out.iterdir() if p.name != "libquark_onnx_ops.so")
    assert names == sorted(
        [MARKER, "model.onnx", "model.onnx.data", "genai_config.json", "tokenizer.json", "tokenizer_config.json"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


# ---- 9/10. help texts, prog name -----------------------------------------------------------------------------------
def help_text(args, capsys, monkeypatch, argv0="/x/builder/__main__.py") -> str:
    """`--help` in-process (argparse prints and exits 0), with sys.argv[0] as `python -m builder` would set it."""
    from builder.__main__ import main
    monkeypatch.setattr(sys, "argv", [argv0])
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def test_top_level_help_lists_every_subcommand(capsys, monkeypatch):
    text = help_text(["--help"], capsys, monkeypatch)
    for command in ("convert", "inspect", "check", "verify"):
        assert any(line.split()[:1] == [command] and len(line.split()) > 2 for line in text.splitlines()), command


@pytest.mark.parametrize("command", ["inspect", "check", "verify", "convert"])
def test_subcommand_help_has_description_and_example(command, capsys, monkeypatch):
    text = help_text([*([command] if command != "convert" else []), "--help"], capsys, monkeypatch)
    usage_end = text.index("\n\n")
    assert text[usage_end:].strip().split("\n")[0].strip(), "no description after the usage"
    example = text.split("example:\n", 1)[1].strip().splitlines()[0]
    assert example.startswith("python -m builder") and (command == "convert" or f" {command} " in example)


def test_console_script_help_names_itself(capsys, monkeypatch):
    text = help_text(["--help"], capsys, monkeypatch, argv0="/usr/local/bin/quark-onnx")
    assert text.startswith("usage: quark-onnx ") and "python -m builder" not in text
    assert "quark-onnx" in (REPO / "README.md").read_text()


def test_check_defaults_to_cpu(built):
    r = run_cli(["check", built])
    assert r.returncode == 0 and "0 problem(s) for cpu" in r.stdout, r.stdout + r.stderr


# ---- 11. errors name the user's path, not our temporary folder -------------------------------------------------------
@pytest.mark.parametrize("err", [errno.EACCES, errno.EROFS])
def test_write_errors_name_the_users_output(tmp_path, monkeypatch, err):
    """The data file inside `.out.tmp-XXXX` cannot be created (simulated: root ignores permission bits here)."""
    import builder.convert as convert_module

    def refuse(path, *a, **k):
        raise OSError(err, os.strerror(err), str(path))
    monkeypatch.setattr(convert_module, "GraphBuilder", refuse)
    out = tmp_path / "out"
    r = run_cli(["-i", EXAMPLE, "-o", out, "-q"], spawn=False)  # forked: the patched module is the child's
    line = one_error_line(r.stderr)
    assert r.returncode == 2 and line.startswith(f"error: {out}: cannot write the output") and ".tmp-" not in line
    assert ("permission denied" if err == errno.EACCES else "read-only") in line
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# ---- 12. scripts/quantize_quark.py without amd-quark ------------------------------------------------------------------
def test_quantize_script_without_quark_names_the_pip_extra(tmp_path):
    code = ("import sys, runpy; sys.modules['quark'] = None; "
            f"sys.argv = ['scripts/quantize_quark.py', '--model_dir', {str(FLOAT_EXAMPLE)!r}, '--output_dir', "
            f"{str(tmp_path / 'q')!r}, '--quant_scheme', 'w_uint4_per_group_asym']; "
            "runpy.run_path('scripts/quantize_quark.py', run_name='__main__')")
    r = python("-c", code)
    line = one_error_line(r.stderr)
    assert r.returncode == 2 and "amd-quark" in line and 'pip install -e ".[quantize]"' in line, line


# ---- 13. examples/generate.py errors ---------------------------------------------------------------------------------
def test_generate_on_a_missing_folder_is_one_line(tmp_path):
    r = python(REPO / "examples" / "generate.py", tmp_path / "nope")
    line = one_error_line(r.stderr)
    assert r.returncode == 2 and "folder not found" in line


def test_generate_without_genai_config_is_one_line(tmp_path):
    r = python(REPO / "examples" / "generate.py", EXAMPLE)
    line = one_error_line(r.stderr)
    assert r.returncode == 2 and "no genai_config.json" in line


# ---- progress bar, pattern typos --------------------------------------------------------------------------------------
def _stderr_on_a_terminal(args) -> str:
    import pty
    import select
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "builder", *map(str, args)], stderr=slave,
                            stdout=subprocess.DEVNULL, env=dict(_env(), TERM="xterm"), cwd=REPO)
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], 60)
        if not ready:
            break
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=60) == 0
    return b"".join(chunks).decode(errors="replace")


def test_progress_bar_only_on_a_terminal(tmp_path):
    text = _stderr_on_a_terminal(["-i", EXAMPLE, "-o", tmp_path / "a"])
    assert "ETA" in text and "\r" in text and "MiB written" in text and "/15 linears" in text
    assert "ETA" not in _stderr_on_a_terminal(["-i", EXAMPLE, "-o", tmp_path / "b", "-q"])
    piped = run_cli(["-i", EXAMPLE, "-o", tmp_path / "c"])
    assert piped.returncode == 0 and "ETA" not in piped.stderr and "\r" not in piped.stderr


def test_unmatched_patterns_are_named(tmp_path):
    q = json.loads(json.dumps(QUANT_CONFIG))
    q["exclude"] = ["lm_head", "model.layers.*.mlp.down_porj"]
    q["layer_quant_config"] = {"*q_prj": q["global_quant_config"], "*down_proj": q["global_quant_config"]}
    src = write_synthetic_export(tmp_path / "src", quant_config=q)
    r = run_cli(["-i", src, "-o", tmp_path / "out", "-q"])
    assert r.returncode == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if "matches no layer" in line]
    assert len(warnings) == 2, r.stderr
    assert "'*q_prj'" in warnings[0] and "layer_quant_config" in warnings[0]
    assert "'model.layers.*.mlp.down_porj'" in warnings[1] and "exclude" in warnings[1]
