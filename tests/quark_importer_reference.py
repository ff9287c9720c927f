"""Quark's own model of an export *as exported*: amd-quark's import_model_from_safetensors on `<export>/quark`, run
on the export's prompt (prompt logits, 16 greedy tokens without KV cache, top-2 margins).

Why: with an FP8 KV cache, Quark's in-memory model (reference.npz) fake-quantizes k and v with their own scales
while the export writes one scale per layer (max of the two, quark_format.md section 2), so no faithful conversion
of the export can match it; Quark's importer reads the export back and is the reference for such recipes (measured:
importer == in-memory logits exactly for the recipes without KV-cache scales).

importer_references([export dirs]) -> [dict(logits, greedy, greedy_margins)], cached as
<export>/importer_reference.npz (written atomically next to the factory's files); missing ones are made in ONE
subprocess (Quark's import costs ~20 s), never in the calling process. A test module that declares
QUARK_IMPORTER_REFERENCES (tests/conftest.py) gets them made in the session's one quark_factory subprocess instead.
CLI (the subprocess): python tests/quark_importer_reference.py DIR [DIR ...]
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
CACHE_NAME = "importer_reference.npz"


def importer_references(export_dirs: list[Path], timeout_s: float = 900) -> list[dict]:
    missing = [str(d) for d in export_dirs if not (Path(d) / CACHE_NAME).is_file()]
    if missing:
        from quark_factory import _quiet_env
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), *missing], text=True,
                              capture_output=True, timeout=timeout_s, env=_quiet_env())
        if proc.returncode != 0:
            raise RuntimeError(f"Quark importer reference failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}")
    return [dict(np.load(Path(d) / CACHE_NAME)) for d in export_dirs]


def _make(export_dir: Path) -> None:
    import torch
    from quark.torch.export.api import import_model_from_safetensors

    from quark_factory import forward_logits, torch_greedy
    ids = torch.from_numpy(np.load(export_dir / "reference.npz")["input_ids"])
    model = import_model_from_safetensors(None, str(export_dir / "quark"), device="cpu")
    logits = forward_logits(model, ids).numpy()
    greedy, margins = torch_greedy(model, ids, 16)
    tmp = export_dir / f".{CACHE_NAME}.{os.getpid()}.npz"
    np.savez(tmp, logits=logits, greedy=np.asarray(greedy, np.int64), greedy_margins=np.asarray(margins, np.float32))
    tmp.replace(export_dir / CACHE_NAME)


def make_all(export_dirs: list[Path]) -> None:
    """In this process (which may import Quark): every missing importer_reference.npz."""
    for d in export_dirs:
        if not (Path(d) / CACHE_NAME).is_file():
            _make(Path(d))


if __name__ == "__main__":
    make_all([Path(a) for a in sys.argv[1:]])
