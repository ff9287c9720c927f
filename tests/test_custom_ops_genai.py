"""End to end through onnxruntime-genai: a model the builder converts with --extra_options custom_ops_library=PATH
runs through og.Generator with the kernels (genai's profile shows the custom nodes), and its greedy tokens equal the
function-fallback run of the same graph and Quark's own greedy tokens. Also: the converter's refusal of anything
but a loadable custom-op library (before any output is written), and genai 0.18's path rules for
session_options.custom_ops_library (custom_ops/README.md, "onnxruntime-genai")."""
from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from onnx_helpers import build, genai_greedy, op_types

from builder.__main__ import main as cli_main
from builder.errors import ConversionError

from ort_library_fixture import ort_ops_library  # noqa: F401  (fixture)

QUARK_EXPORTS = [("llama_h64", "mxfp4"), ("llama_h64", "fp8_w8a8"), ("llama_h64", "ptpc_fp8")]
LINEARS = 15  # 2 layers x 7 + lm_head
# (recipe, build options, custom op, custom nodes in the graph)
CASES = [("mxfp4", {"fp4_linear": "native"}, "MatMulMxfp4", LINEARS - 1),  # lm_head is excluded (float) in the recipe
         ("fp8_w8a8", {"fp8_linear": "custom_op"}, "MatMulFp8W8A8", None),
         ("ptpc_fp8", {"fp8_linear": "custom_op"}, "MatMulFp8W8A8Dyn", None)]


def _profiled_greedy(model_dir: Path, input_ids: np.ndarray, prefix: Path) -> tuple[list[int], Counter]:
    """Greedy tokens through og.Generator with genai's session profiling on; op counts from the profile."""
    config_path = model_dir / "genai_config.json"
    config = json.loads(config_path.read_text())
    config["model"]["decoder"]["session_options"]["enable_profiling"] = str(prefix)
    config_path.write_text(json.dumps(config, indent=2))
    tokens = genai_greedy(model_dir, input_ids)
    gc.collect()  # the session writes its profile when destroyed
    files = sorted(prefix.parent.glob(prefix.name + "*.json"))
    assert len(files) == 1, files
    events = json.loads(files[0].read_text())
    return tokens, Counter(e["args"]["op_name"] for e in events if e.get("cat") == "Node" and "op_name" in e["args"])


@pytest.mark.parametrize("recipe,options,op,nodes", CASES, ids=[c[0] for c in CASES])
def test_genai_runs_kernels_and_matches_function_fallback(quark_exports, ort_ops_library, tmp_path, recipe, options,
                                                          op, nodes):
    export = quark_exports("llama_h64", recipe)
    ref = np.load(export / "reference.npz")
    with_lib = build(export, tmp_path / "lib", custom_ops_library=ort_ops_library, **options)
    fallback = build(export, tmp_path / "fn", custom_ops_library="none", **options)
    count = op_types(with_lib).get(op, 0)
    assert count == (nodes or count) and count >= LINEARS - 1, op_types(with_lib)
    config = json.loads((with_lib / "genai_config.json").read_text())
    assert config["model"]["decoder"]["session_options"]["custom_ops_library"] == "libquark_onnx_ops.so"
    assert (with_lib / "libquark_onnx_ops.so").read_bytes() == Path(ort_ops_library).read_bytes()
    assert "custom_ops_library" not in json.loads((fallback / "genai_config.json").read_text())["model"]["decoder"][
        "session_options"]

    tokens_lib, ops_lib = _profiled_greedy(with_lib, ref["input_ids"], tmp_path / "prof_lib")
    tokens_fn, ops_fn = _profiled_greedy(fallback, ref["input_ids"], tmp_path / "prof_fn")
    assert ops_lib[op] > 0 and ops_lib[op] % count == 0, ops_lib  # every custom node ran as the kernel, every step
    assert ops_fn[op] == 0 and ops_fn["MatMul"] >= count, ops_fn  # the function bodies ran instead
    assert tokens_lib == tokens_fn
    assert tokens_lib == ref["greedy"].tolist()  # and both are Quark's own greedy continuation


# ---------------- the converter refuses anything but a loadable custom-op library ----------------

def _convert_cli(export: Path, out: Path, library: str, capsys) -> tuple[int, str]:
    rc = cli_main(["-i", str(export / "quark"), "-o", str(out), "-e", "cpu",
                   "--extra_options", f"custom_ops_library={library}"])
    return rc, capsys.readouterr().err.strip()


@pytest.mark.parametrize("kind", ["text", "text_named_so", "elf_not_ort", "directory", "missing", "bad_name"])
def test_custom_ops_library_must_be_loadable(quark_exports, tmp_path, capsys, kind):
    export = quark_exports("llama_h64", "mxfp4")
    libm = next((p for p in ("/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6",
                             "/lib64/libm.so.6") if os.path.exists(p)), None)
    if kind == "text":
        library, expect = "/etc/passwd", "not a shared library"
    elif kind == "text_named_so":
        library, expect = str(tmp_path / "libfake.so"), "not a shared library"
        Path(library).write_text("root:x:0:0:root:/root:/bin/bash\n")
    elif kind == "elf_not_ort":
        if libm is None:
            pytest.skip("no libm.so.6 at a known path")
        library, expect = libm, "ONNX Runtime cannot load it as a custom-op library"
    elif kind == "directory":
        library, expect = str(tmp_path), "not a regular file"
    elif kind == "missing":
        library, expect = str(tmp_path / "libnothere.so"), "custom-op library not found"
    else:
        library, expect = str(tmp_path / "model.onnx"), "name must end in .so"
        shutil.copyfile(libm or sys.executable, library)
    out = tmp_path / "out"
    rc, err = _convert_cli(export, out, library, capsys)
    assert rc == 2 and len(err.splitlines()) == 1 and expect in err, err
    assert err.startswith("error: ") and "custom_ops_library=" in err and "Traceback" not in err
    assert not out.exists() and not list(tmp_path.glob(".out.*")), "nothing may be written"


def test_loadable_library_is_accepted_at_plan_time(quark_exports, ort_ops_library, capsys):
    export = quark_exports("llama_h64", "mxfp4")
    assert cli_main(["inspect", "-i", str(export / "quark"), "-e", "cpu", "--extra_options",
                     f"custom_ops_library={ort_ops_library}", "fp4_linear=native"]) == 0
    assert "MatMulMxfp4" in capsys.readouterr().out


# ---------------- onnxruntime-genai's rules for session_options.custom_ops_library ----------------

@pytest.fixture(scope="module")
def mxfp4_native_model(quark_exports, ort_ops_library, tmp_path_factory) -> Path:
    """A converted MXFP4 model whose custom nodes have NO function fallback, so it runs only with the library."""
    import onnx
    out = build(quark_exports("llama_h64", "mxfp4"), tmp_path_factory.mktemp("genai_rules") / "m",
                fp4_linear="native")
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    del model.functions[:]
    onnx.save(model, str(out / "model.onnx"))
    return out


def _genai_load(model_dir: Path, library: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    config_path = model_dir / "genai_config.json"
    config = json.loads(config_path.read_text())
    config["model"]["decoder"]["session_options"]["custom_ops_library"] = library
    config_path.write_text(json.dumps(config, indent=2))
    script = ("import sys, numpy as np, onnxruntime_genai as og\n"
              "m = og.Model(sys.argv[1]); p = og.GeneratorParams(m); p.set_search_options(max_length=6)\n"
              "g = og.Generator(m, p); g.append_tokens(np.array([[1, 2, 3]], dtype=np.int32))\n"
              "g.generate_next_token()\n"
              "print('ran')\n")
    return subprocess.run([sys.executable, "-c", script, str(model_dir)], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **(env or {})}, timeout=300)


def test_genai_custom_ops_library_path_rules(mxfp4_native_model, ort_ops_library, tmp_path):
    model_dir = tmp_path / "model"
    shutil.copytree(mxfp4_native_model, model_dir)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    outside_lib = elsewhere / "libquark_onnx_ops.so"
    shutil.copyfile(ort_ops_library, outside_lib)
    neutral_cwd = tmp_path / "cwd"
    neutral_cwd.mkdir()

    # 1. a bare name found in the model folder: loaded from there
    shutil.copyfile(ort_ops_library, model_dir / "libquark_onnx_ops.so")
    assert "ran" in _genai_load(model_dir, "libquark_onnx_ops.so", neutral_cwd).stdout
    # 2. an absolute path inside the model folder: allowed
    assert "ran" in _genai_load(model_dir, str(model_dir / "libquark_onnx_ops.so"), neutral_cwd).stdout
    # 3. any '..': refused, even when it resolves inside the model folder
    result = _genai_load(model_dir, "../model/libquark_onnx_ops.so", neutral_cwd)
    assert result.returncode != 0 and "must not contain path traversal (..)" in result.stderr
    # 4. an absolute path outside the model folder, the working directory and EP folders: refused
    result = _genai_load(model_dir, str(outside_lib), neutral_cwd)
    assert result.returncode != 0 and "not within an allowed directory" in result.stderr
    # 5. ... but allowed when the working directory holds it
    assert "ran" in _genai_load(model_dir, str(outside_lib), elsewhere).stdout
    # 6. a bare name not in the model folder (nor the working directory): handed to dlopen, so LD_LIBRARY_PATH finds it
    os.remove(model_dir / "libquark_onnx_ops.so")
    result = _genai_load(model_dir, "libquark_onnx_ops.so", neutral_cwd)
    assert result.returncode != 0 and "libquark_onnx_ops.so" in result.stderr
    result = _genai_load(model_dir, "libquark_onnx_ops.so", neutral_cwd, env={"LD_LIBRARY_PATH": str(elsewhere)})
    assert "ran" in result.stdout, result.stderr[-2000:]


def test_conversion_error_type_is_used_for_library_refusal(tmp_path):
    from builder.custom_ops_library import check_custom_ops_library
    with pytest.raises(ConversionError, match="not a shared library"):
        check_custom_ops_library("/etc/passwd")
