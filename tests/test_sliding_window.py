"""Per-layer sliding windows (Qwen2/Qwen3 `use_sliding_window` with `max_window_layers`, or `layer_types`): each
layer's GroupQueryAttention gets its own local_window_size. Reference: transformers on independently decoded weights
with the edited config (its eager attention applies the window per layer), not the converter."""
from __future__ import annotations

import json
import shutil

import numpy as np
import onnx

from onnx_helpers import build, genai_greedy, prompt_logits

QUARK_EXPORTS = [("qwen2", "uint4_g32")]
WINDOW = 4  # shorter than the 8-token prompt, so it changes the logits


def _torch_reference(src, ids: np.ndarray, new_tokens: int = 16):
    import torch

    from independent_decode import load_reference_model
    model = load_reference_model(src)
    seq = torch.from_numpy(ids)
    with torch.no_grad():
        logits = model(seq).logits.numpy()
        for _ in range(new_tokens):
            nxt = model(seq).logits[0, -1].argmax()
            seq = torch.cat([seq, nxt.view(1, 1)], dim=1)
    return logits, seq[0, ids.shape[1]:].tolist()


def test_mixed_windows_match_transformers(quark_exports, tmp_path):
    export = quark_exports("qwen2", "uint4_g32")
    src = tmp_path / "src"
    shutil.copytree(export / "quark", src)
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1,
               layer_types=["full_attention", "sliding_attention"])
    (src / "config.json").write_text(json.dumps(cfg))
    out = build(src, tmp_path / "onnx", "cpu", "fp32", accuracy_level=1)
    windows = [next(a.i for a in n.attribute if a.name == "local_window_size")
               for n in onnx.load(str(out / "model.onnx"), load_external_data=False).graph.node
               if n.op_type == "GroupQueryAttentionFixedOrder"]  # the cpu default (custom-op library)
    assert windows == [-1, WINDOW]
    ids = np.load(export / "reference.npz")["input_ids"]
    ref_logits, ref_greedy = _torch_reference(src, ids)
    full = np.load(export / "reference.npz")["logits"]  # the same weights without any window
    assert np.abs(ref_logits - full).max() > 1e-2, "the window must matter for this test to mean anything"
    assert np.abs(prompt_logits(out, ids) - ref_logits).max() <= 1e-4
    assert genai_greedy(out, ids) == ref_greedy
