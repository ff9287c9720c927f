"""Hardening: every tensor of real exports, dropped, given a wrong shape or a wrong dtype, must end in a one-line
ConversionError (nothing written), never another exception and never a silent conversion, except where the format
says the tensor is optional (zero points of symmetric specs)."""
from __future__ import annotations

import json
import shutil
import struct

import ml_dtypes
import numpy as np
import pytest

from builder.checkpoint import SAFETENSORS_DTYPES, Checkpoint
from builder.convert import convert
from builder.errors import ConversionError

QUARK_EXPORTS = [("llama_h64", "uint4_g64"), ("llama_h64", "int8_w8a8"), ("llama_h64", "fp8_w8a8_kv_attn"),
                 ("llama_h64", "nvfp4")]
OPTIONAL = {"int8_w8a8": (".weight_zero_point", ".input_zero_point")}  # symmetric: zero point 0 when absent
ST_NAMES = {dtype: name for name, dtype in SAFETENSORS_DTYPES.items()}


def write_safetensors(tensors: dict[str, np.ndarray], path) -> None:
    """Minimal writer (safetensors.numpy has no bf16/fp8): header JSON + raw little-endian data."""
    header, blobs, offset = {}, [], 0
    for name, value in tensors.items():
        raw = np.ascontiguousarray(value).tobytes()
        header[name] = {"dtype": ST_NAMES[value.dtype], "shape": list(value.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header).encode()
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(head)) + head)
        for raw in blobs:
            fh.write(raw)


def mutations(value: np.ndarray):
    yield "drop", None
    yield "shape", np.zeros((*value.shape, 2), value.dtype)
    is_float = value.dtype.kind == "f" or value.dtype in (np.dtype(ml_dtypes.bfloat16),
                                                          np.dtype(ml_dtypes.float8_e4m3fn))
    with np.errstate(over="ignore", invalid="ignore"):  # the values do not matter, only the dtype
        yield "dtype", value.astype(np.int8) if is_float else value.astype(np.float16)


@pytest.mark.parametrize("recipe", [r for _, r in QUARK_EXPORTS])
def test_every_broken_tensor_is_a_one_line_error(quark_exports, tmp_path, recipe):
    export = quark_exports("llama_h64", recipe) / "quark"
    ckpt = Checkpoint(export)
    tensors = {n: ckpt.get(n) for n in ckpt.names()}
    ckpt.close()
    targets = [n for n in tensors if not n.startswith("model.layers.1.")]  # layer 1 repeats layer 0
    silent, other = [], []
    for name in targets:
        for kind, replacement in mutations(tensors[name]):
            src, out = tmp_path / "src", tmp_path / "out"
            shutil.rmtree(src, ignore_errors=True)
            shutil.copytree(export, src, ignore=shutil.ignore_patterns("*.safetensors"))
            broken = {k: v for k, v in tensors.items() if k != name}
            if replacement is not None:
                broken[name] = replacement
            write_safetensors(broken, src / "model.safetensors")
            try:
                convert(src, out, "cpu", log=lambda _m: None)
                if not (kind == "drop" and name.endswith(OPTIONAL.get(recipe, ()))):
                    silent.append((name, kind))
                shutil.rmtree(out)
            except ConversionError as err:
                assert "\n" not in err.one_line() and not out.exists()
            except Exception as err:  # noqa: BLE001 - any other exception is the bug this test looks for
                other.append((name, kind, f"{type(err).__name__}: {err}"))
    assert other == [], other[:5]
    assert silent == [], silent[:5]
