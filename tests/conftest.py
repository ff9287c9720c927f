"""Shared pytest fixtures. Keep this file small: put helpers in their own modules under tests/.

Quark exports: a test module that needs some declares them at module level,
    QUARK_EXPORTS = [("llama_h64", "uint4_g64"), ...]      # (SHAPES key or TinyModelSpec, RECIPES key or QuantRecipe)
and takes them from the session fixture `quark_exports` (quark_exports(shape, recipe) -> export dir). The first
request in a session makes every missing export declared by the modules collected for this run in ONE Quark
subprocess (amd-quark's import alone costs ~20 s); the cache survives sessions (QO_FIXTURE_CACHE). A module that
also needs Quark's importer reference of some of them (tests/quark_importer_reference.py) declares those in
    QUARK_IMPORTER_REFERENCES = [("qwen3_moe", "fp8_w8a8_kv"), ...]   # also listed in QUARK_EXPORTS
and they are made in that same subprocess.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
sys.path.insert(0, str(TESTS_DIR))

from quark_factory import (RECIPES, SHAPES, QuantRecipe, TinyModelSpec, ensure_exports,  # noqa: E402
                           export_dir_for, is_complete, start_exports)

ExportItem = tuple[TinyModelSpec, QuantRecipe]
_DECLARED = pytest.StashKey[list]()
_DECLARED_REFS = pytest.StashKey[list]()


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes more than a few seconds")


# `pytest -m quick` (the edit-loop subset): node ids that start with one of these. Every registered scheme on every
# execution provider converts and passes its EP check (test_ep_convert); one numerics check per scheme against
# Quark on CPU; the CLI's one-line errors. Kept here, not as marks in the modules, so that one list says what it is.
QUICK = (
    "tests/test_ep_convert.py::test_converted_model_passes_its_ep_check",
    "tests/test_int_weight_models.py::test_logits_and_greedy_match_quark[llama_h64-uint4_g64]",
    "tests/test_int_weight_models.py::test_logits_and_greedy_match_quark[llama_h64-int4_per_channel]",
    "tests/test_int_weight_models.py::test_logits_and_greedy_match_quark[llama_h64-int8_wo_g64]",
    "tests/test_fp8_w8a8.py::test_fp8_cpu_matches_quark_emulation",
    "tests/test_int8_w8a8.py::test_int8_cpu_matches_quark_emulation",
    "tests/test_mxfp4_model.py::test_mxfp4_cpu_matches_quark",
    "tests/test_mxfp4_fp8.py::test_cpu_matches_quark",
    "tests/test_nvfp4_model.py::test_nvfp4_cpu_matches_quark",
    "tests/test_quark_reader.py",
    "tests/test_cli_errors.py::test_bad_input_one_line_exit_2_no_output",
    "tests/test_newcomer_cli.py::test_huge_values_are_cut_to_400_characters",
)


# `heavy`: kept out of the default run (pyproject addopts -m 'not heavy'); .ci/run runs them after it with -m heavy.
# Measured in the full run of 2026-12-02 (loaded 2-core machine, --durations): these took 1,531 s of 2,295 s outside
# the real-model test. Each runs scripts/quantize_quark.py (amd-quark import + quantization) in a subprocess, or nvcc;
# .ci/run also runs the pipeline command itself.
HEAVY = (
    "tests/test_quantize_script.py::test_uint4_per_group_export",
    "tests/test_quantize_script.py::test_uint4_export_matches_float_model_within_quantization_error",
    "tests/test_quantize_script.py::test_fp8_activation_scheme_export",
    "tests/test_quantize_script.py::test_end_to_end_uint4_cpu",
    "tests/test_verify.py::test_quark_export_reference_is_emulated_by_quark",
    "tests/test_custom_ops_gpu_build.py::test_cuda_kernels_compile_for_sm80_and_sm90",
    "tests/test_custom_ops_gpu_build.py::test_cuda_ort_library_builds_and_its_cpu_kernels_run_in_cpu_ort",
    "tests/test_real_model_float.py",  # transformers' slow GGUF loader, the reference of real_model's direct reader
)


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.startswith(QUICK):
            item.add_marker(pytest.mark.quick)
        if item.nodeid.startswith(HEAVY):
            item.add_marker(pytest.mark.heavy)
    _order_by_what_modules_wait_for(items)


def _order_by_what_modules_wait_for(items) -> None:
    """Whole modules, in their own order within each group: first those that need no Quark export, then those that
    need the tiny-model exports, then those that need the real model's. From an empty cache both export jobs start
    in the background when collection ends (pytest_collection_finish) and make their exports while the modules
    before them run, instead of pytest waiting on the first module that needs one (test_accuracy_level, the first
    module, waited 155 s for the tiny-model job on 2026-12-04)."""
    def need(item) -> int:
        names = getattr(item, "fixturenames", ())
        return 2 if "real_exports" in names else 1 if "quark_exports" in names else 0

    by_module: dict[object, int] = {}
    for item in items:
        key = getattr(item, "module", None)
        by_module[key] = max(by_module.get(key, 0), need(item))
    items.sort(key=lambda item: by_module[getattr(item, "module", None)])  # stable: keeps the order within a group


def fixture_cache_dir() -> Path:
    """Where Quark exports are cached (env QO_FIXTURE_CACHE, default <repo>/.cache/fixtures, gitignored)."""
    return Path(os.environ.get("QO_FIXTURE_CACHE", REPO_ROOT / ".cache" / "fixtures"))


def _item(spec: TinyModelSpec | str, recipe: QuantRecipe | str) -> ExportItem:
    return (SHAPES[spec] if isinstance(spec, str) else spec, RECIPES[recipe] if isinstance(recipe, str) else recipe)


def declared_exports(modules, name: str = "QUARK_EXPORTS") -> list[ExportItem]:
    """The QUARK_EXPORTS (or another such list) of these modules, in order, without repeats."""
    seen: dict[ExportItem, None] = {}
    for module in modules:
        for spec, recipe in getattr(module, name, ()):
            seen.setdefault(_item(spec, recipe))
    return list(seen)


def pytest_collection_finish(session):
    """After -k/-m deselection: remember what the modules of the selected tests declared."""
    modules = dict.fromkeys(item.module for item in session.items if getattr(item, "module", None) is not None)
    session.config.stash[_DECLARED] = declared_exports(modules)
    session.config.stash[_DECLARED_REFS] = declared_exports(modules, "QUARK_IMPORTER_REFERENCES")
    _start_real_exports(session, [item for item in session.items if "real_exports" in getattr(item, "fixturenames", ())
                                  and not _skipped_by_mark(item)])
    _start_tiny_exports(session)
    _start_script_runs(session)


# The tiny-model exports declared by the selected modules: from an empty cache, one amd-quark subprocess started in the
# background when collection ends (the modules that need no export run first: _order_by_what_modules_wait_for);
# quark_exports waits for it on its first call, then finds the exports made. If it failed, quark_exports makes them
# again itself and reports the error. QO_EXPORTS_BACKGROUND=0: no background start.
_TINY_JOB = pytest.StashKey[object]()


def _start_tiny_exports(session) -> None:
    config = session.config
    if (config.option.collectonly or os.environ.get("QO_EXPORTS_BACKGROUND", "1") == "0"
            or importlib.util.find_spec("quark") is None
            or not any("quark_exports" in getattr(item, "fixturenames", ()) for item in session.items)):
        return
    declared, refs = config.stash[_DECLARED], config.stash[_DECLARED_REFS]
    log = tempfile.NamedTemporaryFile("w+", prefix="qo-tiny-exports-job-", suffix=".log", delete=False)
    proc = start_exports(fixture_cache_dir(), list(dict.fromkeys(declared + refs)), log, importer_refs=refs)
    if proc is None:
        log.close()
        Path(log.name).unlink(missing_ok=True)
        return
    config.stash[_TINY_JOB] = (proc, log)


def _wait_for_background(config, key, what: str) -> None:
    """Wait for the background job under `key` (if any); warn with its log's tail if it failed."""
    job = config.stash.get(key, None)
    if job is None:
        return
    proc, log = job
    try:
        rc = proc.wait(timeout=1800)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
    if rc != 0:
        log.seek(0)
        warnings.warn(f"the background {what} job failed (rc={rc}); the fixture retries:\n{log.read()[-2000:]}",
                      stacklevel=2)
    _drop_job(config, key)


def _drop_job(config, key) -> None:
    """Forget the job under `key`: its log file closed and deleted (the process has ended or been killed)."""
    _, log = config.stash[key]
    log.close()
    Path(log.name).unlink(missing_ok=True)
    del config.stash[key]


def _skipped_by_mark(item) -> bool:
    """A skip mark, or a skipif mark whose condition is already True (a bool, not a string to evaluate)."""
    return any(True for _ in item.iter_markers("skip")) or any(
        m.args and m.args[0] is True for m in item.iter_markers("skipif"))


# scripts/quantize_quark.py runs that several heavy tests share (tests/quantize_script_kit.py SCRIPT_RUNS): started in
# the background, one at a time, when collection ends; the fixtures below wait for the one a test asks for.
_SCRIPT_RUNS = pytest.StashKey[object]()


def _script_runs(config):
    import quantize_script_kit
    runs = config.stash.get(_SCRIPT_RUNS, None)
    if runs is None:
        runs = config.stash[_SCRIPT_RUNS] = quantize_script_kit.ScriptRuns(
            Path(tempfile.mkdtemp(prefix="qo-quark-script-")))
    return runs


def _start_script_runs(session) -> None:
    import quantize_script_kit
    names = quantize_script_kit.wanted_runs(session.items)
    if names and not session.config.option.collectonly and quantize_script_kit.can_quantize():
        _script_runs(session.config).start(names)


def _script_run(request, fixture_name: str):
    import quantize_script_kit
    if not quantize_script_kit.can_quantize():
        pytest.skip("needs the 'test' extra: torch==2.13.0, amd-quark==0.13, transformers")
    return _script_runs(request.config).get(quantize_script_kit.RUN_FIXTURES[fixture_name])


@pytest.fixture(scope="session")
def uint4_g64_script_run(request):
    """(run folder, CompletedProcess) of quantize_quark.py: uint4 g64, lm_head g32 (folder/quark: the export)."""
    return _script_run(request, "uint4_g64_script_run")


@pytest.fixture(scope="session")
def fp8_script_run(request):
    """(run folder, CompletedProcess) of quantize_quark.py: w_fp8_a_fp8 calibrated on a local jsonl."""
    return _script_run(request, "fp8_script_run")


@pytest.fixture(scope="session")
def uint4_g32_cpu_script_run(request):
    """(run folder, CompletedProcess) of quantize_quark.py: uint4 g32, lm_head too, -> ONNX (folder/onnx) -> verify
    (folder/verify.json)."""
    return _script_run(request, "uint4_g32_cpu_script_run")


@pytest.fixture(scope="session")
def script_float_model(request):
    """The bf16 tiny float model the shared quantize_quark.py runs start from."""
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
        pytest.skip("needs torch + transformers to write the tiny float model")
    runs = _script_runs(request.config)
    runs.start([])
    return runs.float_model


# The real model's exports (tests/real_model.py: a 135M model quantized 8 ways, minutes of CPU) are made in ONE
# amd-quark subprocess. From an empty cache it starts in the background as soon as collection ends, so it runs on
# the second core while the (mostly single-threaded) tiny-model tests run on the first; tests/test_real_model.py's
# tests wait for it (pytest_runtest_setup below), and their fixture then finds the exports complete. If it failed,
# the fixture makes them again itself and reports the error. QO_REAL_BACKGROUND=0: no background start.
_REAL_JOB = pytest.StashKey[object]()


def _start_real_exports(session, users) -> None:
    """users: the selected tests that need the real exports and are not skipped by a mark (the heavy 1,024-token
    tests are, without QO_REAL_LONG=1: `pytest -m heavy` from an empty cache made the 8 exports for nothing)."""
    if not users or session.config.option.collectonly or os.environ.get("QO_REAL_BACKGROUND", "1") == "0":
        return
    import real_model
    if importlib.util.find_spec("quark") is None or real_model.gguf_path() is None:
        return  # the fixture skips, saying why
    root = fixture_cache_dir()
    missing = [r for r in real_model.REAL_SCHEMES.values()
               if not real_model.is_complete(real_model.export_dir_for(root, r))]
    if not missing:
        return
    # the same job ensure_real_exports(root, REAL_SCHEMES) would run, but started without waiting for it
    env = real_model._quiet_env()
    # One intra-op thread: the suite keeps the other core busy, and two OpenMP threads on one free core spin at every
    # barrier. Measured (int8_w8a8 + mxfp4 with one core kept busy, 2026-12-04): 2 threads 115 s wall / 101 s CPU,
    # 1 thread 63 s / 42 s. ensure_real_exports (pytest waiting, nothing else running) keeps 2. QO_REAL_THREADS sets it.
    env["OMP_NUM_THREADS"] = env.get("QO_REAL_THREADS", "1")
    log = tempfile.NamedTemporaryFile("w+", prefix="qo-real-model-job-", suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, real_model.__file__, "job", "-"], stdin=subprocess.PIPE, stdout=log,
                            stderr=subprocess.STDOUT, text=True, env=env)
    proc.stdin.write(json.dumps(dict(root=str(root), recipes=[dataclasses.asdict(r) for r in missing], long=False)))
    proc.stdin.close()
    session.config.stash[_REAL_JOB] = (proc, log)


def pytest_runtest_setup(item):
    if getattr(getattr(item, "module", None), "__name__", None) == "test_real_model":
        _wait_for_background(item.config, _REAL_JOB, "real-model export")


def pytest_unconfigure(config):
    runs = config.stash.get(_SCRIPT_RUNS, None)
    if runs is not None:
        runs.close()
        import shutil
        shutil.rmtree(runs.root, ignore_errors=True)
    for key in (_REAL_JOB, _TINY_JOB):
        job = config.stash.get(key, None)
        if job is not None:  # the session ended (or was interrupted) before a test waited for it
            job[0].kill()
            job[0].wait()
            _drop_job(config, key)


class QuarkExports:
    """quark_exports(spec, recipe) -> Path of one export dir (quark/, float/, reference.npz, quark_dequant.npz).

    spec: a TinyModelSpec or a SHAPES key; recipe: a QuantRecipe or a RECIPES key.
    quark_exports.many([(spec, recipe), ...]) -> [Path, ...].
    The first call also makes every missing export in `declared`, in the same (single) Quark subprocess.
    """

    def __init__(self, root: Path, declared: list[ExportItem], importer_refs: list[ExportItem] = (),
                 wait_for_background=lambda: None):
        self.root = root
        self._wait_for_background = wait_for_background
        self.declared = list(declared)
        self._pending = list(dict.fromkeys(list(declared) + list(importer_refs)))
        self._refs = list(importer_refs)

    def many(self, items) -> list[Path]:
        wanted = [_item(s, r) for s, r in items]
        late = [(s, r.name) for s, r in wanted
                if (s, r) not in self.declared and not is_complete(export_dir_for(self.root, s, r))]
        if late:
            warnings.warn(f"Quark exports {late} are not in any collected module's QUARK_EXPORTS: they are made "
                          "in a Quark subprocess of their own", stacklevel=2)
        self._wait_for_background()  # the background job's exports (_start_tiny_exports), before looking for them
        batch, self._pending = list(dict.fromkeys(self._pending + wanted)), []
        refs, self._refs = self._refs, []
        paths = dict(zip(batch, ensure_exports(self.root, batch, importer_refs=refs)))
        return [paths[i] for i in wanted]

    def __call__(self, spec: TinyModelSpec | str = "llama_h64", recipe: QuantRecipe | str = "uint4_g64") -> Path:
        return self.many([(spec, recipe)])[0]


@pytest.fixture(scope="session")
def quark_exports(request) -> QuarkExports:
    if importlib.util.find_spec("quark") is None:
        pytest.skip("amd-quark is not installed (pip install -e .[test])")
    return QuarkExports(fixture_cache_dir(), request.config.stash.get(_DECLARED, []),
                        request.config.stash.get(_DECLARED_REFS, []),
                        lambda: _wait_for_background(request.config, _TINY_JOB, "tiny-model export"))
