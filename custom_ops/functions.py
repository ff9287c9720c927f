"""Portable fallbacks: each custom op as an ONNX FunctionProto whose body uses only standard ONNX ops.

A model that holds a com.quark_onnx node plus the FunctionProto of the same domain/name runs anywhere (ORT inlines
the function when no kernel is registered, and prefers a registered kernel from a custom-op library when one is).
The bodies compute in float32 and cast the result back to A's dtype (CastLike), so fp32 and fp16 A both work.
Shapes are read at run time (Reshape with 0/-1), so the K/N attributes are declared but not needed by the bodies.

    node = make_node("MatMulMxfp4", ["A", "B", "B_scale"], ["Y"], K=4096, N=11008)
    attach_functions(model)       # adds the FunctionProtos + opset import for every custom op the graph uses
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

DOMAIN = "com.quark_onnx"
DOMAIN_VERSION = 1
DEFAULT_ONNX_OPSET = 21
MIN_ONNX_OPSET = 19  # QuantizeLinear with float8 and the `saturate` attribute

MXFP4_BLOCK_SIZE = 32
NVFP4_BLOCK_SIZE = 16
E4M3FN_MAX = 448.0
DYNAMIC_SCALE_MIN = 1e-12

E2M1_MAGNITUDES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _e2m1_table() -> np.ndarray:
    """16 floats indexed by the 4-bit code: codes 0-7 positive, 8-15 the same magnitudes negated."""
    return np.array(E2M1_MAGNITUDES + [-m for m in E2M1_MAGNITUDES], dtype=np.float32)


def _e8m0_table() -> np.ndarray:
    """256 floats indexed by the e8m0 byte: 2^(s-127), NaN at 255 (2^-127 is a float32 subnormal, exact)."""
    table = np.full(256, np.nan, dtype=np.float32)
    table[:255] = np.exp2(np.arange(255, dtype=np.float64) - 127.0)
    return table


def _const(name: str, array: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array, name))


def _ints(name: str, values) -> onnx.NodeProto:
    return _const(name, np.array(values, dtype=np.int64))


def _function(op_type: str, inputs, outputs, nodes, attributes, onnx_opset: int) -> onnx.FunctionProto:
    if onnx_opset < MIN_ONNX_OPSET:
        raise ValueError(f"{DOMAIN}.{op_type} fallback needs ONNX opset >= {MIN_ONNX_OPSET}, got {onnx_opset}")
    return helper.make_function(
        DOMAIN, op_type, inputs, outputs, nodes,
        opset_imports=[helper.make_opsetid("", onnx_opset)],
        attributes=list(attributes),
    )


def matmul_mxfp4_function(onnx_opset: int = DEFAULT_ONNX_OPSET) -> onnx.FunctionProto:
    """MatMulMxfp4(A [...,K] f32|f16, B uint8 [N,K/2], B_scale uint8 [N,K/32]; K, N) -> Y [...,N] like A.

    B: OCP MXFP4 e2m1 codes, element 2j in the low nibble of byte j. B_scale: e8m0, 2^(s-127), 255 = NaN.
    """
    n = helper.make_node
    nodes = [
        _const("fp4_table", _e2m1_table()),
        _const("e8m0_table", _e8m0_table()),
        _const("low_mask", np.array(0x0F, dtype=np.uint8)),
        _const("nibble_bits", np.array(4, dtype=np.uint8)),
        _ints("last_axis", [-1]),
        _ints("shape_n_blocks_32", [0, -1, MXFP4_BLOCK_SIZE]),
        _ints("shape_n_k", [0, -1]),
        n("BitwiseAnd", ["B", "low_mask"], ["code_even"]),
        n("BitShift", ["B", "nibble_bits"], ["code_odd"], direction="RIGHT"),
        n("Unsqueeze", ["code_even", "last_axis"], ["code_even_1"]),
        n("Unsqueeze", ["code_odd", "last_axis"], ["code_odd_1"]),
        n("Concat", ["code_even_1", "code_odd_1"], ["code_pairs"], axis=-1),          # [N, K/2, 2]
        n("Reshape", ["code_pairs", "shape_n_blocks_32"], ["code_blocks"]),          # [N, K/32, 32]
        n("Cast", ["code_blocks"], ["code_index"], to=TensorProto.INT32),      # int32: half the folding peak
        n("Gather", ["fp4_table", "code_index"], ["value_blocks"]),                   # float [N, K/32, 32]
        n("Cast", ["B_scale"], ["scale_index"], to=TensorProto.INT64),
        n("Gather", ["e8m0_table", "scale_index"], ["block_scale"]),                  # float [N, K/32]
        n("Unsqueeze", ["block_scale", "last_axis"], ["block_scale_1"]),
        n("Mul", ["value_blocks", "block_scale_1"], ["weight_blocks"]),
        n("Reshape", ["weight_blocks", "shape_n_k"], ["weight_nk"]),                  # [N, K]
        n("Transpose", ["weight_nk"], ["weight_kn"], perm=[1, 0]),
        n("Cast", ["A"], ["a_f32"], to=TensorProto.FLOAT),
        n("MatMul", ["a_f32", "weight_kn"], ["y_f32"]),
        n("CastLike", ["y_f32", "A"], ["Y"]),
    ]
    return _function("MatMulMxfp4", ["A", "B", "B_scale"], ["Y"], nodes, ["K", "N"], onnx_opset)


def _fp8_weight_and_matmul_nodes(a_dq: str) -> list[onnx.NodeProto]:
    """B fp8 [N,K] * B_scale (scalar or [N]) -> weight [K,N]; Y = CastLike(a_dq @ weight, A)."""
    n = helper.make_node
    return [
        _ints("shape_col", [-1, 1]),
        n("Cast", ["B"], ["b_f32"], to=TensorProto.FLOAT),
        n("Reshape", ["B_scale", "shape_col"], ["b_scale_col"]),                      # [1,1] or [N,1]
        n("Mul", ["b_f32", "b_scale_col"], ["weight_nk"]),
        n("Transpose", ["weight_nk"], ["weight_kn"], perm=[1, 0]),
        n("MatMul", [a_dq, "weight_kn"], ["y_f32"]),
        n("CastLike", ["y_f32", "A"], ["Y"]),
    ]


def matmul_fp8_w8a8_function(onnx_opset: int = DEFAULT_ONNX_OPSET) -> onnx.FunctionProto:
    """MatMulFp8W8A8(A [...,K] f32|f16, B e4m3fn [N,K], B_scale f32 scalar|[N], A_scale f32 scalar) -> Y like A.

    a_q = QuantizeLinear(float32(A), A_scale, e4m3fn, saturate=1); Y = (a_q*A_scale) @ (B*B_scale).T.
    """
    n = helper.make_node
    zero_point = np.zeros((), dtype=np.uint8)
    nodes = [
        helper.make_node("Constant", [], ["fp8_zero"], value=helper.make_tensor(
            "fp8_zero", TensorProto.FLOAT8E4M3FN, [], zero_point.tobytes(), raw=True)),
        _ints("scalar_shape", np.zeros((0,), dtype=np.int64)),
        n("Cast", ["A"], ["a_f32"], to=TensorProto.FLOAT),
        n("Reshape", ["A_scale", "scalar_shape"], ["a_scale_scalar"]),
        n("QuantizeLinear", ["a_f32", "a_scale_scalar", "fp8_zero"], ["a_q"], saturate=1),
        n("DequantizeLinear", ["a_q", "a_scale_scalar"], ["a_dq"]),
    ] + _fp8_weight_and_matmul_nodes("a_dq")
    return _function("MatMulFp8W8A8", ["A", "B", "B_scale", "A_scale"], ["Y"], nodes, [], onnx_opset)


def matmul_fp8_w8a8_dyn_function(onnx_opset: int = DEFAULT_ONNX_OPSET) -> onnx.FunctionProto:
    """MatMulFp8W8A8Dyn(A, B e4m3fn [N,K], B_scale scalar|[N]) -> Y: per-row scale s = max(max|row|/448, 1e-12).

    a_q = saturate_e4m3fn(float32(A) / s) (QuantizeLinear with scale 1 does the rounding); Y = (a_q*s) @ (B*B_scale).T.
    """
    n = helper.make_node
    nodes = [
        helper.make_node("Constant", [], ["fp8_zero"], value=helper.make_tensor(
            "fp8_zero", TensorProto.FLOAT8E4M3FN, [], np.zeros((), np.uint8).tobytes(), raw=True)),
        _const("one", np.array(1.0, dtype=np.float32)),
        _const("fp8_max", np.array(E4M3FN_MAX, dtype=np.float32)),
        _const("scale_min", np.array(DYNAMIC_SCALE_MIN, dtype=np.float32)),
        _ints("last_axis", [-1]),
        n("Cast", ["A"], ["a_f32"], to=TensorProto.FLOAT),
        n("Abs", ["a_f32"], ["a_abs"]),
        n("ReduceMax", ["a_abs", "last_axis"], ["row_amax"], keepdims=1),
        n("Div", ["row_amax", "fp8_max"], ["row_scale_raw"]),
        n("Max", ["row_scale_raw", "scale_min"], ["row_scale"]),
        n("Div", ["a_f32", "row_scale"], ["a_scaled"]),
        n("QuantizeLinear", ["a_scaled", "one", "fp8_zero"], ["a_q"], saturate=1),
        n("Cast", ["a_q"], ["a_q_f32"], to=TensorProto.FLOAT),
        n("Mul", ["a_q_f32", "row_scale"], ["a_dq"]),
    ] + _fp8_weight_and_matmul_nodes("a_dq")
    return _function("MatMulFp8W8A8Dyn", ["A", "B", "B_scale"], ["Y"], nodes, [], onnx_opset)


def matmul_bf16_function(onnx_opset: int = DEFAULT_ONNX_OPSET) -> onnx.FunctionProto:
    """MatMulBf16(A [...,K] f32|f16, B bfloat16 [N,K]) -> Y like A: Y = float32(A) @ float32(B).T.

    bf16 -> float32 is exact, so this is the float lm_head's own arithmetic; ORT constant-folds Cast and Transpose of
    an initializer B into one float32 [K, N] weight, i.e. the default float form (speed and memory included)."""
    n = helper.make_node
    nodes = [
        n("Cast", ["A"], ["a_f32"], to=TensorProto.FLOAT),
        n("Cast", ["B"], ["b_f32"], to=TensorProto.FLOAT),
        n("Transpose", ["b_f32"], ["weight_kn"], perm=[1, 0]),
        n("MatMul", ["a_f32", "weight_kn"], ["y_f32"]),
        n("CastLike", ["y_f32", "A"], ["Y"]),
    ]
    return _function("MatMulBf16", ["A", "B"], ["Y"], nodes, [], onnx_opset)


def _scaled_weight_matmul_function(op_type: str, doc: str, onnx_opset: int) -> onnx.FunctionProto:
    """Y = CastLike(float32(A) @ (float32(B) * B_scale).T, A), B [N,K] of any type Cast takes, B_scale scalar|[N]."""
    n = helper.make_node
    nodes = [n("Cast", ["A"], ["a_f32"], to=TensorProto.FLOAT)] + _fp8_weight_and_matmul_nodes("a_f32")
    function = _function(op_type, ["A", "B", "B_scale"], ["Y"], nodes, [], onnx_opset)
    function.doc_string = doc
    return function


def matmul_fp8_function(onnx_opset: int = DEFAULT_ONNX_OPSET) -> onnx.FunctionProto:
    """MatMulFp8(A [...,K] f32|f16, B e4m3fn [N,K], B_scale f32 scalar|[N]) -> Y like A: A @ (B * B_scale).T.

    Weight-only: the activation's FP8 emulation (if any) is standard Q/DQ before the node. float32(e4m3) * B_scale is
    the correctly rounded float32 product DequantizeLinear computes, so the body is the dense fp32 form's arithmetic
    (ORT constant-folds Cast/Mul/Transpose of initializers into that very fp32 [K, N] weight at load)."""
    return _scaled_weight_matmul_function("MatMulFp8", matmul_fp8_function.__doc__, onnx_opset)


def matmul_int8_function(onnx_opset: int = DEFAULT_ONNX_OPSET) -> onnx.FunctionProto:
    """MatMulInt8(A [...,K] f32|f16, B int8 [N,K], B_scale f32 scalar|[N]) -> Y like A: A @ (B * B_scale).T.

    Weight-only and symmetric (an asymmetric checkpoint keeps the dense form); the activation's Q/DQ precedes it."""
    return _scaled_weight_matmul_function("MatMulInt8", matmul_int8_function.__doc__, onnx_opset)


def matmul_nvfp4_function(onnx_opset: int = DEFAULT_ONNX_OPSET) -> onnx.FunctionProto:
    """MatMulNvfp4(A [...,K] f32|f16, B uint8 [N,K/2], B_scale e4m3fn [N,K/16], B_scale_2 f32 scalar; K, N) -> Y.

    W = e2m1(B) * float32(float32(B_scale) * B_scale_2): Quark's order (the block scale rounded once in float32,
    quark_format.md), element 2j in the low nibble of byte j."""
    n = helper.make_node
    nodes = [
        _const("fp4_table", _e2m1_table()),
        _const("low_mask", np.array(0x0F, dtype=np.uint8)),
        _const("nibble_bits", np.array(4, dtype=np.uint8)),
        _ints("last_axis", [-1]),
        _ints("shape_n_blocks_16", [0, -1, NVFP4_BLOCK_SIZE]),
        _ints("shape_n_k", [0, -1]),
        _ints("scalar_shape", np.zeros((0,), dtype=np.int64)),
        n("BitwiseAnd", ["B", "low_mask"], ["code_even"]),
        n("BitShift", ["B", "nibble_bits"], ["code_odd"], direction="RIGHT"),
        n("Unsqueeze", ["code_even", "last_axis"], ["code_even_1"]),
        n("Unsqueeze", ["code_odd", "last_axis"], ["code_odd_1"]),
        n("Concat", ["code_even_1", "code_odd_1"], ["code_pairs"], axis=-1),          # [N, K/2, 2]
        n("Reshape", ["code_pairs", "shape_n_blocks_16"], ["code_blocks"]),          # [N, K/16, 16]
        n("Cast", ["code_blocks"], ["code_index"], to=TensorProto.INT32),      # int32: half the folding peak
        n("Gather", ["fp4_table", "code_index"], ["value_blocks"]),                   # float [N, K/16, 16]
        n("Cast", ["B_scale"], ["block_e4m3"], to=TensorProto.FLOAT),                # [N, K/16]
        n("Reshape", ["B_scale_2", "scalar_shape"], ["scale_2"]),
        n("Mul", ["block_e4m3", "scale_2"], ["block_scale"]),
        n("Unsqueeze", ["block_scale", "last_axis"], ["block_scale_1"]),
        n("Mul", ["value_blocks", "block_scale_1"], ["weight_blocks"]),
        n("Reshape", ["weight_blocks", "shape_n_k"], ["weight_nk"]),                  # [N, K]
        n("Transpose", ["weight_nk"], ["weight_kn"], perm=[1, 0]),
        n("Cast", ["A"], ["a_f32"], to=TensorProto.FLOAT),
        n("MatMul", ["a_f32", "weight_kn"], ["y_f32"]),
        n("CastLike", ["y_f32", "A"], ["Y"]),
    ]
    return _function("MatMulNvfp4", ["A", "B", "B_scale", "B_scale_2"], ["Y"], nodes, ["K", "N"], onnx_opset)


FUNCTIONS: dict[str, Callable[..., onnx.FunctionProto]] = {
    "MatMulMxfp4": matmul_mxfp4_function,
    "MatMulFp8W8A8": matmul_fp8_w8a8_function,
    "MatMulFp8W8A8Dyn": matmul_fp8_w8a8_dyn_function,
    "MatMulBf16": matmul_bf16_function,
    "MatMulFp8": matmul_fp8_function,
    "MatMulInt8": matmul_int8_function,
    "MatMulNvfp4": matmul_nvfp4_function,
}

# Inputs in order, and the integer attributes each node must carry.
OP_INPUTS = {
    "MatMulMxfp4": ("A", "B", "B_scale"),
    "MatMulFp8W8A8": ("A", "B", "B_scale", "A_scale"),
    "MatMulFp8W8A8Dyn": ("A", "B", "B_scale"),
    "MatMulBf16": ("A", "B"),
    "MatMulFp8": ("A", "B", "B_scale"),
    "MatMulInt8": ("A", "B", "B_scale"),
    "MatMulNvfp4": ("A", "B", "B_scale", "B_scale_2"),
}
OP_REQUIRED_ATTRIBUTES = {
    "MatMulMxfp4": ("K", "N"),
    "MatMulFp8W8A8": (),
    "MatMulFp8W8A8Dyn": (),
    "MatMulBf16": (),
    "MatMulFp8": (),
    "MatMulInt8": (),
    "MatMulNvfp4": ("K", "N"),
}


def make_node(op_type: str, inputs, outputs, name: str | None = None, **attributes) -> onnx.NodeProto:
    """A com.quark_onnx node; checks the op name, input count and (integer) attributes."""
    if op_type not in FUNCTIONS:
        raise ValueError(f"unknown {DOMAIN} op {op_type!r}; known: {sorted(FUNCTIONS)}")
    want_inputs = OP_INPUTS[op_type]
    if len(inputs) != len(want_inputs):
        raise ValueError(f"{op_type} takes {len(want_inputs)} inputs {want_inputs}, got {len(inputs)}: {inputs}")
    if len(outputs) != 1:
        raise ValueError(f"{op_type} has one output, got {outputs}")
    required = OP_REQUIRED_ATTRIBUTES[op_type]
    missing = [a for a in required if a not in attributes]
    unknown = [a for a in attributes if a not in required]
    if missing or unknown:
        raise ValueError(f"{op_type} attributes: want exactly {required}; missing {missing}, unknown {unknown}")
    for key, value in attributes.items():
        if not isinstance(value, (int, np.integer)) or value <= 0:
            raise ValueError(f"{op_type} attribute {key} must be a positive int, got {value!r}")
    if op_type == "MatMulMxfp4" and attributes["K"] % MXFP4_BLOCK_SIZE:
        raise ValueError(f"MatMulMxfp4 K={attributes['K']} must be a multiple of {MXFP4_BLOCK_SIZE}")
    if op_type == "MatMulNvfp4" and attributes["K"] % NVFP4_BLOCK_SIZE:
        raise ValueError(f"MatMulNvfp4 K={attributes['K']} must be a multiple of {NVFP4_BLOCK_SIZE}")
    return helper.make_node(op_type, list(inputs), list(outputs), name=name, domain=DOMAIN,
                            **{k: int(v) for k, v in attributes.items()})


def _model_onnx_opset(model: onnx.ModelProto) -> int:
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx"):
            return opset.version
    raise ValueError("model has no default-domain opset import")


def attach_functions(model: onnx.ModelProto, onnx_opset: int | None = None) -> list[str]:
    """Add the FunctionProto of every com.quark_onnx op used in the main graph (if absent) and the domain's opset
    import. The function bodies use the model's own default opset unless onnx_opset is given. Returns added names."""
    opset = onnx_opset if onnx_opset is not None else _model_onnx_opset(model)
    used = sorted({node.op_type for node in model.graph.node if node.domain == DOMAIN})
    have = {(f.domain, f.name) for f in model.functions}
    added = []
    for op_type in used:
        if op_type not in FUNCTIONS:
            raise ValueError(f"graph uses {DOMAIN}.{op_type}, which has no fallback; known: {sorted(FUNCTIONS)}")
        if (DOMAIN, op_type) not in have:
            model.functions.append(FUNCTIONS[op_type](opset))
            added.append(op_type)
    if used and not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, DOMAIN_VERSION))
    return added
