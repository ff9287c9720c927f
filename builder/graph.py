"""A small ONNX graph builder that streams initializers to one external data file as they are added.

Weights are written to `<model>.onnx.data` the moment they are created, so the converter never holds more than the
tensor it is working on; the ModelProto keeps only external-data references and is small even for 70B models.
Everything is emitted in insertion order, so the same input gives byte-identical files.
"""
from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper

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
        self._data = open(self.data_path, "wb")
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
            chunks = (array[i:i + rows].astype(np.float32).astype(dtype) for i in range(0, array.shape[0], rows))
            return self._add(name, dtype, array.shape, chunks)
        return self._add(name, dtype, array.shape, [array.astype(dtype, copy=False)])

    def initializer_transposed(self, name: str, matrix: np.ndarray, cast_to: np.dtype | None = None,
                               rows_per_chunk: int = 1024) -> str:
        """Add matrix.T (optionally cast) without materialising the transposed copy: written in row chunks."""
        dtype = np.dtype(cast_to) if cast_to is not None else matrix.dtype
        n_out, n_in = matrix.shape
        chunks = (np.ascontiguousarray(matrix[:, i:i + rows_per_chunk].T).astype(np.float32).astype(dtype)
                  for i in range(0, n_in, rows_per_chunk))
        return self._add(name, dtype, (n_in, n_out), chunks)

    def _add(self, name: str, dtype: np.dtype, shape: tuple, chunks, inline: bool = False) -> str:
        if name in self._names:
            raise ValueError(f"duplicate initializer {name}")
        self._names.add(name)
        tensor = TensorProto(name=name, data_type=NP_TO_ONNX[np.dtype(dtype)], dims=list(shape))
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if nbytes <= INLINE_LIMIT or inline:
            tensor.raw_data = b"".join(np.ascontiguousarray(c).tobytes() for c in chunks)
            self.initializers.append(tensor)
            return name
        pad = (-self._offset) % ALIGN
        self._data.write(b"\0" * pad)
        self._offset += pad
        start = self._offset
        for chunk in chunks:
            raw = np.ascontiguousarray(chunk).tobytes()
            self._data.write(raw)
            self._offset += len(raw)
        if self._offset - start != nbytes:
            raise ValueError(f"{name}: wrote {self._offset - start} bytes, expected {nbytes}")
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.data_path.name), ("offset", str(start)), ("length", str(nbytes))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        self.initializers.append(tensor)
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

    # ---- save --------------------------------------------------------------------------------------------------
    def finish(self, model_path: Path, graph_name: str = "main_graph", producer: str = "quark-onnx-builder",
               metadata: dict | None = None) -> onnx.ModelProto:
        self._data.close()
        graph = helper.make_graph(self.nodes, graph_name, self.inputs, self.outputs, self.initializers)
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid(d, v) for d, v in sorted(self.opsets.items())],
            producer_name=producer, functions=list(self.functions.values()))
        model.ir_version = 10
        for k, v in sorted((metadata or {}).items()):
            model.metadata_props.add(key=k, value=str(v))
        with open(model_path, "wb") as fh:
            fh.write(model.SerializeToString(deterministic=True))
        return model

    def abort(self) -> None:
        if not self._data.closed:
            self._data.close()
