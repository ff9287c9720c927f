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
from .input_files import exists, list_dir, open_input, read_json

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


MAX_HEADER_BYTES = 100 << 20  # the safetensors library's own limit


def _is_uint(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


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
        try:
            for file in self._shard_files():
                self._read_header(file)
        except BaseException:
            self.close()
            raise

    def _shard_files(self) -> list[Path]:
        index = self.model_dir / "model.safetensors.index.json"
        if exists(index):
            weight_map = read_json(index, self.model_dir).get("weight_map")
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise ConversionError("must be an object of tensor name -> shard file name", file=index,
                                      field="weight_map", value=type(weight_map).__name__)
            names = sorted(set(weight_map.values()))
            for name in names:
                if not name or "/" in name or "\\" in name or name in (".", ".."):
                    raise ConversionError("shard must be a file name inside the model folder", file=index,
                                          field="weight_map", value=name)
                if not exists(self.model_dir / name):
                    raise ConversionError("shard listed in the index is missing", file=index,
                                          field="weight_map", value=name)
            return [self.model_dir / n for n in names]
        files = [self.model_dir / n for n in list_dir(self.model_dir)
                 if n.endswith(".safetensors") and not n.startswith(".")]
        if not files:
            raise ConversionError("no *.safetensors file", file=self.model_dir)
        return files

    def _read_header(self, file: Path) -> None:
        """Parse one shard's header; the file stays open (this fd serves every later read of its tensors)."""
        fd = open_input(file, self.model_dir)
        self._fds[file] = fd
        try:
            size = os.fstat(fd).st_size
            raw = os.pread(fd, 8, 0)
            if len(raw) != 8:
                raise ConversionError("truncated safetensors file (no header)", file=file)
            (header_len,) = struct.unpack("<Q", raw)
            if header_len > size - 8:
                raise ConversionError("truncated safetensors file (header length past end)", file=file,
                                      field="header_len", value=header_len)
            if header_len > MAX_HEADER_BYTES:
                raise ConversionError("safetensors header too large", file=file, field="header_len",
                                      value=header_len, accepted=f"at most {MAX_HEADER_BYTES}")
            blob = os.pread(fd, header_len, 8)
        except OSError as exc:
            raise ConversionError(f"cannot read ({exc.strerror})", file=file) from None
        try:
            header = json.loads(blob)
        except RecursionError:
            raise ConversionError("corrupt safetensors header (JSON nested too deeply)", file=file) from None
        except ValueError:
            raise ConversionError("corrupt safetensors header (not JSON)", file=file) from None
        if not isinstance(header, dict):
            raise ConversionError("corrupt safetensors header (not a JSON object)", file=file)
        data_start = 8 + header_len
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            if not isinstance(meta, dict):
                raise ConversionError("corrupt safetensors header (tensor entry not an object)", file=file,
                                      layer=name)
            dtype = meta.get("dtype")
            if not isinstance(dtype, str) or dtype not in SAFETENSORS_DTYPES:
                raise ConversionError("tensor dtype not supported", file=file, layer=name, field="dtype",
                                      value=dtype, accepted=", ".join(SAFETENSORS_DTYPES))
            offsets, shape = meta.get("data_offsets"), meta.get("shape")
            if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_uint(x) for x in offsets)
                    and offsets[0] <= offsets[1]):
                raise ConversionError("corrupt safetensors header (data_offsets must be [begin, end])", file=file,
                                      layer=name, field="data_offsets", value=offsets)
            if not (isinstance(shape, list) and len(shape) <= 8 and all(_is_uint(d) for d in shape)):
                raise ConversionError("corrupt safetensors header (shape must be a list of sizes)", file=file,
                                      layer=name, field="shape", value=shape)
            begin, end = offsets
            shape = tuple(shape)
            expected = SAFETENSORS_DTYPES[dtype].itemsize
            for d in shape:
                expected *= d
            if end - begin != expected or data_start + end > size:
                raise ConversionError("tensor data out of bounds or of the wrong size (truncated file?)",
                                      file=file, layer=name, field="data_offsets", value=[begin, end])
            canonical = name
            for old, new in LEGACY_SUFFIXES.items():
                if name.endswith(old):
                    canonical = name[: -len(old)] + new
            if canonical in self._entries:
                first = self._entries[canonical].file
                raise ConversionError(f"tensor defined twice (also in {first.name})", file=file, layer=canonical)
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
            if fd is None:  # after close(): reopened with the same checks
                fd = self._fds[e.file] = open_input(e.file, self.model_dir)
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
