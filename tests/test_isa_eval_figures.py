"""tools/isa_eval.py --figures: the real-model test's figures for a saved logits file, floor from the reference's
nudged draws; a weight-only reference holds one draw (no floor), which used to end in "math domain error"."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import isa_eval


def _reference(tmp_path, draws: int):
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((12, 50)).astype(np.float32)
    ids = rng.integers(0, 50, 12)
    np.savez(tmp_path / "reference.npz", eval_ids=ids, logits=logits,
             draw_ppl_rel=np.linspace(-0.02, 0.03, draws), draw_top1=np.linspace(0.9, 0.97, draws))
    got = logits.copy()
    got[3, 7] += 2.5
    np.savez(tmp_path / "out.npz", logits=got)
    return str(tmp_path), str(tmp_path / "out.npz")


def test_weight_only_reference_gets_figures_without_a_floor(tmp_path):
    line = isa_eval.figures(*_reference(tmp_path, 1), "reference.npz")
    assert "max |logit diff| 2.5 (weight-only: no floor)" in line and "floor " not in line, line


def test_activation_quantized_reference_gets_its_floor(tmp_path):
    line = isa_eval.figures(*_reference(tmp_path, 8), "reference.npz")
    assert "(floor " in line and "weight-only" not in line, line
