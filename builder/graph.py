"""A small ONNX graph builder that streams initializers to one external data file as they are added.

Weights are written to `<model>.onnx.data` the moment they are created, and big ones arrive as a stream of blocks
(`stream`, `stream_transposed`), so the converter holds one block at a time, never a whole vocabulary-sized tensor;
the ModelProto keeps only external-data references and is small even for 70B models. Every tensor gets its place in
the file in insertion order, so the same input gives byte-identical files.
"""
from __future__ import annotations

import os
import threading
from collections import deque
from pathlib import Path
from typing import Iterable

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper

WRITER_QUEUE_BYTES = 64 << 20  # bytes handed to the writer thread and not yet written (bounds the memory it holds)
WRITER_MIN_BYTES = 256 << 10  # smaller writes (padding, scattered rows) are written by the calling thread at once
ALIGN = 64  # byte alignment of each tensor in the data file (ORT memory-maps it)
INLINE_LIMIT = 64  # tensors with at most this many bytes stay inside the proto

NP_TO_ONNX = {
    np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(ml_dtypes.bfloat16): TensorProto.BFLOAT16, np.dtype(np.float64): TensorProto.DOUBLE,
    np.dtype(ml_dtypes.float8_e4m3fn): TensorProto.FLOAT8E4M3FN, np.dtype(ml_dtypes.float8_e5m2): TensorProto.FLOAT8E5M2,
    np.dtype(ml_dtypes.float8_e4m3fnuz): TensorProto.FLOAT8E4M3FNUZ,
    np.dtype(np.int64): TensorProto.INT64, np.dtype(np.int32): TensorProto.INT32, np.dtype(np.int8): TensorProto.INT8,
    np.dtype(np.uint8): TensorProto.UINT8, np.dtype(np.int16): TensorProto.INT16, np.dtype(np.uint16): TensorProto.UINT16,
    np.dtype(np.bool_): TensorProto.BOOL,
}
IO_DTYPES = {"fp32": TensorProto.FLOAT, "fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}
IO_NUMPY = {"fp32": np.dtype(np.float32), "fp16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16)}


class GraphBuilder:
    def __init__(self, data_path: Path, opset: int = 21):
        self.data_path = Path(data_path)
        self._fd: int | None = os.open(self.data_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        self._writer = _Writer(self._fd) if os.environ.get("QO_WRITER_THREAD", "1") != "0" else None
        self._offset = 0
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.functions: dict[tuple[str, str], onnx.FunctionProto] = {}
        self.opsets: dict[str, int] = {"": opset, "com.microsoft": 1}
        self._names: set[str] = set()
        self.op_counts: dict[str, int] = {}

    # ---- values ------------------------------------------------------------------------------------------------
    def input(self, name: str, elem_type: int, shape: list) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    def output(self, name: str, elem_type: int, shape: list) -> str:
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    def initializer(self, name: str, array: np.ndarray, cast_to: np.dtype | None = None) -> str:
        """Add a constant tensor; large ones go straight to the external data file. `cast_to` converts it
        (through float32) chunk by chunk, so a big bf16 tensor never exists in a second, wider copy."""
        array = np.require(array, requirements="C")  # keeps 0-d scalars 0-d (ascontiguousarray would not)
        dtype = np.dtype(cast_to) if cast_to is not None else array.dtype
        if dtype != array.dtype and array.ndim >= 1:
            rows = max(1, (1 << 24) // max(1, array[0].size))
            chunks = (cast_block(array[i:i + rows], dtype) for i in range(0, array.shape[0], rows))
            return self._add(name, dtype, array.shape, chunks)
        return self._add(name, dtype, array.shape, [array.astype(dtype, copy=False)])

    def initializer_transposed(self, name: str, matrix: np.ndarray, cast_to: np.dtype | None = None,
                               rows_per_chunk: int = 1024) -> str:
        """Add matrix.T (optionally cast) without materialising the transposed copy: written in column blocks."""
        dtype = np.dtype(cast_to) if cast_to is not None else matrix.dtype
        n_out, n_in = matrix.shape
        blocks = (cast_block(transpose_tiled(matrix[i:i + rows_per_chunk]), dtype)
                  for i in range(0, n_out, rows_per_chunk))
        return self.stream_columns(name, dtype, (n_in, n_out), blocks)

    def bytes_reserved(self) -> int:
        """Bytes of model.onnx.data laid out so far (the progress bar's size)."""
        return self._offset

    def has(self, name: str) -> bool:
        """Whether an initializer of this name was added."""
        return name in self._names

    def stream(self, name: str, dtype, shape: tuple, chunks: Iterable[np.ndarray]) -> str:
        """Add a tensor given as consecutive C-order pieces (row blocks), written as they arrive."""
        return self._add(name, np.dtype(dtype), tuple(shape), chunks)

    def stream_columns(self, name: str, dtype, shape: tuple, column_blocks: Iterable[np.ndarray]) -> str:
        """Add a matrix [rows, cols] = `shape` given as consecutive column blocks (each [rows, b] in `dtype`), each
        scattered into its rows with pwrite: a transposed lm_head is written from row blocks of the checkpoint
        tensor, so neither it nor its transpose is ever held whole."""
        dtype = np.dtype(dtype)
        rows, cols = shape
        start = self._reserve(name, dtype, (rows, cols))
        if start is None:  # tiny: inline
            full = np.concatenate([np.asarray(b, dtype) for b in column_blocks], axis=1)
            return self._add(name, dtype, (rows, cols), [full], inline=True)
        item, col = dtype.itemsize, 0
        for block in column_blocks:
            b = block.shape[1]
            if block.dtype != dtype or block.shape[0] != rows or col + b > cols:
                raise ValueError(f"{name}: column block {block.dtype}{list(block.shape)} at column {col} does not "
                                 f"fit {dtype}[{rows}, {cols}]")
            block = np.ascontiguousarray(block)
            view = memoryview(block.reshape(-1).view(np.uint8))
            width = b * item
            for r in range(rows):
                self._pwrite(view[r * width:(r + 1) * width], start + (r * cols + col) * item)
            col += b
        if col != cols:
            raise ValueError(f"{name}: wrote {col} columns, expected {cols}")
        return name

    def _pwrite(self, data, offset: int) -> None:
        view = memoryview(data).cast("B")
        if self._writer is not None and len(view) >= WRITER_MIN_BYTES:
            self._writer.put(view, offset)  # keeps `data` alive until written
        else:
            pwrite_all(self._fd, view, offset)

    def _reserve(self, name: str, dtype: np.dtype, shape: tuple) -> int | None:
        """Name the tensor and give it its aligned region of the data file; None when it is small enough to inline."""
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes <= INLINE_LIMIT:
            return None
        if name in self._names:
            raise ValueError(f"duplicate initializer {name}")
        self._names.add(name)
        pad = (-self._offset) % ALIGN
        if pad:
            self._pwrite(b"\0" * pad, self._offset)
        start = self._offset + pad
        self._offset = start + nbytes
        tensor = TensorProto(name=name, data_type=NP_TO_ONNX[dtype], dims=list(shape))
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.data_path.name), ("offset", str(start)), ("length", str(nbytes))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        self.initializers.append(tensor)
        return start

    def _add(self, name: str, dtype: np.dtype, shape: tuple, chunks, inline: bool = False) -> str:
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if nbytes <= INLINE_LIMIT or inline:
            if name in self._names:
                raise ValueError(f"duplicate initializer {name}")
            self._names.add(name)
            tensor = TensorProto(name=name, data_type=NP_TO_ONNX[np.dtype(dtype)], dims=list(shape))
            tensor.raw_data = b"".join(np.ascontiguousarray(c).tobytes() for c in chunks)
            self.initializers.append(tensor)
            return name
        start = self._reserve(name, np.dtype(dtype), shape)
        offset = start
        for chunk in chunks:
            chunk = np.ascontiguousarray(chunk)
            if chunk.dtype != np.dtype(dtype):
                raise ValueError(f"{name}: chunk of {chunk.dtype}, expected {np.dtype(dtype)}")
            if offset + chunk.nbytes > start + nbytes:
                raise ValueError(f"{name}: chunks exceed the {nbytes} bytes of shape {list(shape)}")
            self._pwrite(chunk.reshape(-1).view(np.uint8), offset)
            offset += chunk.nbytes
        if offset - start != nbytes:
            raise ValueError(f"{name}: wrote {offset - start} bytes, expected {nbytes}")
        return name

    def scalar(self, name: str, value, dtype) -> str:
        return self.initializer(name, np.array(value, dtype=dtype))

    def const_i64(self, name: str, values) -> str:
        """Shape-like int64 constants (Split sizes, axes) stay inside the proto whatever their size: ORT's shape
        inference cannot read external data."""
        array = np.array(values, dtype=np.int64)
        return self._add(name, array.dtype, array.shape, [array], inline=True)

    # ---- nodes -------------------------------------------------------------------------------------------------
    def node(self, op_type: str, inputs: list[str], name: str, outputs: int | list[str] = 1,
             domain: str = "", **attrs) -> list[str]:
        """Append a node; outputs default to `<name>/output_<i>`. Returns the output names."""
        if isinstance(outputs, int):
            outputs = [f"{name}/output_{i}" for i in range(outputs)]
        attrs = {k: v for k, v in attrs.items() if v is not None}
        self.nodes.append(helper.make_node(op_type, inputs, outputs, name=name, domain=domain or None, **attrs))
        key = f"{domain}::{op_type}" if domain else op_type
        self.op_counts[key] = self.op_counts.get(key, 0) + 1
        return outputs

    def op(self, op_type: str, inputs: list[str], name: str, domain: str = "", **attrs) -> str:
        return self.node(op_type, inputs, name, 1, domain, **attrs)[0]

    def add_function(self, function: onnx.FunctionProto, opset_version: int = 1) -> None:
        self.functions.setdefault((function.domain, function.name), function)
        self.opsets.setdefault(function.domain, opset_version)

    def quark_op(self, op_type: str, inputs: list[str], name: str, **attrs) -> str:
        """A com.quark_onnx node with one output; its ONNX-function fallback, and the helpers that body calls, attached
        to the model once (custom_ops/functions.py)."""
        from custom_ops.functions import DOMAIN, function_protos
        for proto in function_protos(op_type, self.opsets[""]):
            self.add_function(proto, opset_version=1)
        return self.op(op_type, inputs, name, domain=DOMAIN, **attrs)

    # ---- save --------------------------------------------------------------------------------------------------
    def finish(self, model_path: Path, graph_name: str = "main_graph", producer: str = "quark-onnx-builder",
               metadata: dict | None = None) -> onnx.ModelProto:
        self._close()
        graph = helper.make_graph(self.nodes, graph_name, self.inputs, self.outputs, self.initializers)
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid(d, v) for d, v in sorted(self.opsets.items())],
            producer_name=producer, functions=list(self.functions.values()))
        model.ir_version = 11 if self.opsets[""] >= 23 else 10  # float4e2m1 (opset 23, amd_arch=gfx950): IR 11
        for k, v in sorted((metadata or {}).items()):
            model.metadata_props.add(key=k, value=str(v))
        with open(model_path, "wb") as fh:
            fh.write(model.SerializeToString(deterministic=True))
        return model

    def _close(self) -> None:
        if self._writer is not None:
            self._writer.close()  # every queued write done; re-raises the writer's error
            self._writer = None
        if self._fd is not None:
            os.ftruncate(self._fd, self._offset)  # the file ends where the last tensor does
            os.close(self._fd)
            self._fd = None

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.stop()
            self._writer = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    while len(view):
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


class _Writer:
    """One thread that does the big pwrites, so the thread that plans and reads never waits on the page cache.

    The page-cache copy of the output is the largest single cost of a conversion (at the Llama-3 8B shape, 7.4 GiB:
    6-16 s for the I/O floor's writes alone on the development VM, docs/benchmarks.md); on the main thread it serialised with everything the main thread
    does besides (reading packed weights and scales, handing blocks to the workers). Writes go in submission order;
    at most WRITER_QUEUE_BYTES wait. pwrite releases the GIL. A queued write reads the caller's array when it runs, so
    an array handed to GraphBuilder must not be modified afterwards (none is: blocks are fresh, initializers final). The first error (ENOSPC, EFBIG, ...) is re-raised in
    the submitting thread by the next put() or by close(); nothing queued after it is written."""

    def __init__(self, fd: int, max_bytes: int = WRITER_QUEUE_BYTES):
        self._fd, self._max = fd, max_bytes
        self._queue: deque = deque()
        self._bytes = 0        # queued or being written
        self._error: BaseException | None = None
        self._closing = False
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="qo-write", daemon=True)
        self._thread.start()

    def put(self, view: memoryview, offset: int) -> None:
        with self._cv:
            while self._bytes > 0 and self._bytes + len(view) > self._max and self._error is None:
                self._cv.wait()
            if self._error is not None:
                raise self._error
            self._queue.append((view, offset))
            self._bytes += len(view)
            self._cv.notify_all()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closing:
                    self._cv.wait()
                if not self._queue:
                    return
                view, offset = self._queue.popleft()
            try:
                pwrite_all(self._fd, view, offset)
            except BaseException as exc:  # noqa: BLE001 - handed to the submitting thread
                with self._cv:
                    self._error = exc
                    self._queue.clear()
                    self._bytes = 0
                    self._cv.notify_all()
                return
            with self._cv:
                self._bytes -= len(view)
                self._cv.notify_all()

    def close(self) -> None:
        """Wait until everything queued is written; raise the writer's error if it had one."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        self._thread.join()
        if self._error is not None:
            raise self._error

    def stop(self) -> None:
        """Drop what is queued and wait for the write in progress (an aborted conversion)."""
        with self._cv:
            self._queue.clear()
            self._closing = True
            self._cv.notify_all()
        self._thread.join()


def cast_block(block: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A float block in `dtype`, through float32 (bf16 -> fp16 has no direct cast in ml_dtypes)."""
    dtype = np.dtype(dtype)
    if block.dtype == dtype:
        return block
    if block.dtype == np.float32 or dtype == np.float32:
        return block.astype(dtype)
    return block.astype(np.float32).astype(dtype)


def transpose_tiled(a: np.ndarray, tile: int = 64) -> np.ndarray:
    """a.T of a 2-D block made contiguous a band of `tile` source rows at a time (numpy's plain transposed copy
    walks the source a whole row apart per element: 2-4x slower here on 2- and 4-byte elements)."""
    out = np.empty(a.shape[::-1], a.dtype)
    for i in range(0, a.shape[0], tile):
        out[:, i:i + tile] = a[i:i + tile].T
    return out
