"""Lazy access to (sharded) safetensors checkpoints, without torch.

Only the header of each file is parsed up front. `get()` reads one tensor into a fresh array, so a tensor costs
memory only while a caller holds it and nothing is cached: a 70B export converts tensor by tensor.
"""
from __future__ import annotations

import json
import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

from .errors import ConversionError

SAFETENSORS_DTYPES = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn), "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),
    "I64": np.dtype(np.int64), "I32": np.dtype(np.int32), "I16": np.dtype(np.int16), "I8": np.dtype(np.int8),
    "U64": np.dtype(np.uint64), "U32": np.dtype(np.uint32), "U16": np.dtype(np.uint16), "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
# Older exporters spell some scales differently; map them to the canonical suffix (quark_format.md, pitfall 4).
LEGACY_SUFFIXES = {
    ".weight_quantizer.scale": ".weight_scale",
    ".weight_quantizer.zero_point": ".weight_zero_point",
    ".input_quantizer.scale": ".input_scale",
    ".input_quantizer.zero_point": ".input_zero_point",
    ".output_quantizer.scale": ".output_scale",
    ".output_quantizer.zero_point": ".output_zero_point",
}


@dataclass(frozen=True)
class TensorEntry:
    file: Path
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute byte offset in the file
    end: int


class Checkpoint:
    """All tensors of a model folder, by canonical name."""

    def __init__(self, model_dir: str | Path):
        self.model_dir = Path(model_dir)
        self._entries: dict[str, TensorEntry] = {}
        self._fds: dict[Path, int] = {}
        self._fd_lock = threading.Lock()  # row blocks are read from worker threads (builder/pipeline.py)
        for file in self._shard_files():
            self._read_header(file)

    def _shard_files(self) -> list[Path]:
        index = self.model_dir / "model.safetensors.index.json"
        if index.exists():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (ValueError, KeyError) as exc:
                raise ConversionError(f"unreadable shard index ({exc})", file=index, field="weight_map") from None
            files = sorted({self.model_dir / f for f in weight_map.values()})
            for f in files:
                if not f.exists():
                    raise ConversionError("shard listed in the index is missing", file=index,
                                          field="weight_map", value=f.name)
            return files
        files = sorted(self.model_dir.glob("*.safetensors"))
        if not files:
            raise ConversionError("no *.safetensors file", file=self.model_dir)
        return files

    def _read_header(self, file: Path) -> None:
        with open(file, "rb") as fh:
            raw = fh.read(8)
            if len(raw) != 8:
                raise ConversionError("truncated safetensors file (no header)", file=file)
            (header_len,) = struct.unpack("<Q", raw)
            size = file.stat().st_size
            if header_len > size - 8:
                raise ConversionError("truncated safetensors file (header length past end)", file=file,
                                      field="header_len", value=header_len)
            try:
                header = json.loads(fh.read(header_len))
            except ValueError:
                raise ConversionError("corrupt safetensors header (not JSON)", file=file) from None
        data_start = 8 + header_len
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            dtype = meta.get("dtype")
            if dtype not in SAFETENSORS_DTYPES:
                raise ConversionError("tensor dtype not supported", file=file, layer=name, field="dtype",
                                      value=dtype, accepted=", ".join(SAFETENSORS_DTYPES))
            begin, end = meta["data_offsets"]
            shape = tuple(int(d) for d in meta["shape"])
            expected = int(np.prod(shape, dtype=np.int64)) * SAFETENSORS_DTYPES[dtype].itemsize
            if end - begin != expected or data_start + end > size:
                raise ConversionError("tensor data out of bounds or of the wrong size (truncated file?)",
                                      file=file, layer=name, field="data_offsets", value=[begin, end])
            canonical = name
            for old, new in LEGACY_SUFFIXES.items():
                if name.endswith(old):
                    canonical = name[: -len(old)] + new
            self._entries[canonical] = TensorEntry(file, dtype, shape, data_start + begin, data_start + end)

    def names(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def entry(self, name: str) -> TensorEntry:
        try:
            return self._entries[name]
        except KeyError:
            raise ConversionError("tensor missing from the checkpoint", file=self.model_dir,
                                  layer=name) from None

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entry(name).shape

    def dtype(self, name: str) -> str:
        return self.entry(name).dtype

    def get(self, name: str) -> np.ndarray:
        """A fresh numpy array of one tensor, read with pread: memory is held only while the caller keeps it
        (a memory map would leave every touched page resident and count towards the process's RSS)."""
        return self.read_rows(name, 0, None)

    def read_rows(self, name: str, start: int, stop: int | None) -> np.ndarray:
        """Rows [start, stop) of a tensor's first axis (stop None: to the end), read with one pread into a fresh
        array: the embedding and lm_head are streamed in row blocks this way, never read whole."""
        e = self.entry(name)
        with self._fd_lock:
            fd = self._fds.get(e.file)
            if fd is None:
                fd = self._fds[e.file] = os.open(e.file, os.O_RDONLY)
        dtype = SAFETENSORS_DTYPES[e.dtype]
        rows = e.shape[0] if e.shape else 1
        stop = rows if stop is None else min(stop, rows)
        row_bytes = (e.end - e.begin) // max(1, rows)
        out = np.empty((stop - start, *e.shape[1:]) if e.shape else (), dtype=dtype)
        view = memoryview(out.reshape(-1).view(np.uint8))
        begin, size, done = e.begin + start * row_bytes, (stop - start) * row_bytes if e.shape else e.end - e.begin, 0
        while done < size:
            n = os.preadv(fd, [view[done:]], begin + done)
            if n <= 0:
                raise ConversionError("unexpected end of file while reading a tensor", file=e.file, layer=name)
            done += n
        return out

    def get_scale(self, name: str) -> np.ndarray:
        """A quantization scale as float32; refuses a non-float tensor (an int scale would silently become 0s)."""
        if self.dtype(name) not in ("F32", "F16", "BF16", "F64"):
            raise ConversionError("scale tensor must be a float tensor", file=self.model_dir, layer=name,
                                  field="dtype", value=self.dtype(name), accepted="F32, F16, BF16")
        return self.get_f32(name)

    def get_f32(self, name: str) -> np.ndarray:
        return np.asarray(self.get(name), dtype=np.float32)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
