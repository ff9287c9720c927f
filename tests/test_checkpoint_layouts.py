"""The same export stored differently converts to the same bytes: sharded with model.safetensors.index.json, and
with the legacy `*.weight_quantizer.scale` / `*.weight_quantizer.zero_point` tensor names (quark_format.md pitfall 4)."""
from __future__ import annotations

import json
import shutil

from safetensors.numpy import load_file, save_file

from onnx_helpers import build

QUARK_EXPORTS = [("llama_h64", "uint4_g64")]


def _restore(export, dst, rename=None, shards=1):
    shutil.copytree(export / "quark", dst)
    tensors = load_file(str(dst / "model.safetensors"))
    (dst / "model.safetensors").unlink()
    if rename:
        tensors = {rename(k): v for k, v in tensors.items()}
    names = sorted(tensors)
    weight_map = {}
    for s in range(shards):
        part = names[s::shards]
        fname = "model.safetensors" if shards == 1 else f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({k: tensors[k] for k in part}, str(dst / fname))
        weight_map.update({k: fname for k in part})
    if shards > 1:
        (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return dst


def _files(out):
    return {p.name: p.read_bytes() for p in out.iterdir()}


def test_sharded_and_legacy_names_convert_identically(quark_exports, tmp_path):
    export = quark_exports("llama_h64", "uint4_g64")
    plain = build(_restore(export, tmp_path / "plain"), tmp_path / "out_plain")
    sharded = build(_restore(export, tmp_path / "sharded", shards=3), tmp_path / "out_sharded")
    legacy_names = {".weight_scale": ".weight_quantizer.scale", ".weight_zero_point": ".weight_quantizer.zero_point"}

    def legacy(name):
        for new, old in legacy_names.items():
            if name.endswith(new):
                return name[: -len(new)] + old
        return name
    legacy_src = _restore(export, tmp_path / "legacy", rename=legacy)
    assert any(k.endswith(".weight_quantizer.scale") for k in load_file(str(legacy_src / "model.safetensors")))
    legacy_out = build(legacy_src, tmp_path / "out_legacy")
    reference = _files(plain)
    assert _files(sharded) == reference
    assert _files(legacy_out) == reference
