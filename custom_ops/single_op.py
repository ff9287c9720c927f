"""One-node ONNX models of the com.quark_onnx ops (weights as initializers, A as the input) and ORT sessions on them,
with or without the custom-op library; used by the in-ORT tests and benchmarks/custom_ops_cpu.py.

    model = single_op_model("MatMulFp8W8A8", np.float16, k, {"B": b_fp8, "B_scale": s, "A_scale": a_s})
    sess = session(model, library="custom_ops/build/ort/libquark_onnx_ops.so", profile=True)
    y = sess.run(None, {"A": a})[0];  profiled_nodes(sess) -> [(op_name, provider), ...]
"""

from __future__ import annotations

import json
import os
import tempfile

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from . import functions

_ELEM = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16}


def _initializer(name: str, value) -> onnx.TensorProto:
    array = np.asarray(value)
    if array.dtype == ml_dtypes.bfloat16:
        return helper.make_tensor(name, TensorProto.BFLOAT16, array.shape, array.view(np.uint16).tobytes(), raw=True)
    if array.dtype == ml_dtypes.float8_e4m3fn:
        return helper.make_tensor(name, TensorProto.FLOAT8E4M3FN, array.shape, array.view(np.uint8).tobytes(),
                                  raw=True)
    return numpy_helper.from_array(array, name)


def single_op_model(op_type: str, a_dtype, k: int, weights: dict, attributes: dict | None = None,
                    attach_function: bool = True, opset: int = functions.DEFAULT_ONNX_OPSET) -> onnx.ModelProto:
    """A [..., K] (a_dtype) -> op(A, *weights) -> Y. weights: the op's other inputs by name, in op order. The graph's
    input takes the op's first input name (A; X for the QuantizeDequantize* ops). attributes default to the op's
    required ones inferred from the weights (MatMulMxfp4: K, N)."""
    names = functions.OP_INPUTS[op_type]
    if attributes is None:
        attributes = {"K": k, "N": np.asarray(weights["B"]).shape[0]} if op_type == "MatMulMxfp4" else {}
    node = helper.make_node(op_type, list(names), ["Y"], name=f"{op_type}_node", domain=functions.DOMAIN,
                            **attributes)
    elem = _ELEM[np.dtype(a_dtype)]
    graph = helper.make_graph(
        [node], f"single_{op_type}", [helper.make_tensor_value_info(names[0], elem, None)],
        [helper.make_tensor_value_info("Y", elem, None)], [_initializer(n, weights[n]) for n in names[1:]])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                    helper.make_opsetid(functions.DOMAIN, functions.DOMAIN_VERSION)])
    model.ir_version = 10
    if attach_function:
        functions.attach_functions(model)
    return model


def session(model: onnx.ModelProto, library: str | None = None, profile: bool = False, threads: int = 0,
            optimize: bool = True) -> ort.InferenceSession:
    so = ort.SessionOptions()
    if library:
        so.register_custom_ops_library(str(library))
    if profile:
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tempfile.gettempdir(), f"qo_profile_{os.getpid()}")
    if threads:
        so.intra_op_num_threads = threads
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def profiled_nodes(sess: ort.InferenceSession) -> list[tuple[str, str]]:
    """(op_name, provider) of every node event in the session's profile (ends profiling, removes the file)."""
    path = sess.end_profiling()
    try:
        with open(path) as f:
            events = json.load(f)
    finally:
        os.remove(path)
    return [(e["args"].get("op_name", ""), e["args"].get("provider", "")) for e in events
            if e.get("cat") == "Node" and "op_name" in e.get("args", {})]
