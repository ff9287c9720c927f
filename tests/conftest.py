"""Shared pytest fixtures. Keep this file small: put helpers in their own modules under tests/."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
sys.path.insert(0, str(TESTS_DIR))

from quark_factory import RECIPES, SHAPES, QuantRecipe, TinyModelSpec, ensure_exports  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes more than a few seconds")


def fixture_cache_dir() -> Path:
    """Where Quark exports are cached (env QO_FIXTURE_CACHE, default <repo>/.cache/fixtures, gitignored)."""
    return Path(os.environ.get("QO_FIXTURE_CACHE", REPO_ROOT / ".cache" / "fixtures"))


class QuarkExports:
    """quark_exports(spec, recipe) -> Path of one export dir (quark/, float/, reference.npz, quark_dequant.npz).

    spec: a TinyModelSpec or a SHAPES key; recipe: a QuantRecipe or a RECIPES key.
    quark_exports.many([(spec, recipe), ...]) makes all missing ones in ONE Quark subprocess (call it first).
    """

    def __init__(self, root: Path):
        self.root = root

    @staticmethod
    def _item(spec: TinyModelSpec | str, recipe: QuantRecipe | str) -> tuple[TinyModelSpec, QuantRecipe]:
        return (SHAPES[spec] if isinstance(spec, str) else spec, RECIPES[recipe] if isinstance(recipe, str) else recipe)

    def many(self, items) -> list[Path]:
        return ensure_exports(self.root, [self._item(s, r) for s, r in items])

    def __call__(self, spec: TinyModelSpec | str = "llama_h64", recipe: QuantRecipe | str = "uint4_g64") -> Path:
        return self.many([(spec, recipe)])[0]


@pytest.fixture(scope="session")
def quark_exports() -> QuarkExports:
    if importlib.util.find_spec("quark") is None:
        pytest.skip("amd-quark is not installed (pip install -e .[test])")
    return QuarkExports(fixture_cache_dir())
