"""Shared pytest fixtures. Keep this file small: put helpers in their own modules under tests/.

Quark exports: a test module that needs some declares them at module level,
    QUARK_EXPORTS = [("llama_h64", "uint4_g64"), ...]      # (SHAPES key or TinyModelSpec, RECIPES key or QuantRecipe)
and takes them from the session fixture `quark_exports` (quark_exports(shape, recipe) -> export dir). The first
request in a session makes every missing export declared by the modules collected for this run in ONE Quark
subprocess (amd-quark's import alone costs ~20 s); the cache survives sessions (QO_FIXTURE_CACHE).
"""
from __future__ import annotations

import importlib.util
import os
import sys
import warnings
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
sys.path.insert(0, str(TESTS_DIR))

from quark_factory import (RECIPES, SHAPES, QuantRecipe, TinyModelSpec, ensure_exports,  # noqa: E402
                           export_dir_for, is_complete)

ExportItem = tuple[TinyModelSpec, QuantRecipe]
_DECLARED = pytest.StashKey[list]()


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes more than a few seconds")
    config.addinivalue_line("markers", "heavy: long evaluations kept out of the default run (select with -m heavy)")


def pytest_collection_modifyitems(config, items):
    """heavy tests run only when the -m expression names them (.ci/run: pytest -m heavy)."""
    if "heavy" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="heavy: run with -m heavy")
    for item in items:
        if "heavy" in item.keywords:
            item.add_marker(skip)


def fixture_cache_dir() -> Path:
    """Where Quark exports are cached (env QO_FIXTURE_CACHE, default <repo>/.cache/fixtures, gitignored)."""
    return Path(os.environ.get("QO_FIXTURE_CACHE", REPO_ROOT / ".cache" / "fixtures"))


def _item(spec: TinyModelSpec | str, recipe: QuantRecipe | str) -> ExportItem:
    return (SHAPES[spec] if isinstance(spec, str) else spec, RECIPES[recipe] if isinstance(recipe, str) else recipe)


def declared_exports(modules) -> list[ExportItem]:
    """The QUARK_EXPORTS of these modules, in order, without repeats."""
    seen: dict[ExportItem, None] = {}
    for module in modules:
        for spec, recipe in getattr(module, "QUARK_EXPORTS", ()):
            seen.setdefault(_item(spec, recipe))
    return list(seen)


def pytest_collection_finish(session):
    """After -k/-m deselection: remember what the modules of the selected tests declared."""
    modules = dict.fromkeys(item.module for item in session.items if getattr(item, "module", None) is not None)
    session.config.stash[_DECLARED] = declared_exports(modules)


class QuarkExports:
    """quark_exports(spec, recipe) -> Path of one export dir (quark/, float/, reference.npz, quark_dequant.npz).

    spec: a TinyModelSpec or a SHAPES key; recipe: a QuantRecipe or a RECIPES key.
    quark_exports.many([(spec, recipe), ...]) -> [Path, ...].
    The first call also makes every missing export in `declared`, in the same (single) Quark subprocess.
    """

    def __init__(self, root: Path, declared: list[ExportItem]):
        self.root = root
        self.declared = list(declared)
        self._pending = list(declared)

    def many(self, items) -> list[Path]:
        wanted = [_item(s, r) for s, r in items]
        late = [(s, r.name) for s, r in wanted
                if (s, r) not in self.declared and not is_complete(export_dir_for(self.root, s, r))]
        if late:
            warnings.warn(f"Quark exports {late} are not in any collected module's QUARK_EXPORTS: they are made "
                          "in a Quark subprocess of their own", stacklevel=2)
        batch, self._pending = list(dict.fromkeys(self._pending + wanted)), []
        paths = dict(zip(batch, ensure_exports(self.root, batch)))
        return [paths[i] for i in wanted]

    def __call__(self, spec: TinyModelSpec | str = "llama_h64", recipe: QuantRecipe | str = "uint4_g64") -> Path:
        return self.many([(spec, recipe)])[0]


@pytest.fixture(scope="session")
def quark_exports(request) -> QuarkExports:
    if importlib.util.find_spec("quark") is None:
        pytest.skip("amd-quark is not installed (pip install -e .[test])")
    return QuarkExports(fixture_cache_dir(), request.config.stash.get(_DECLARED, []))
