"""Portable fallbacks: each custom op as an ONNX FunctionProto whose body uses only standard ONNX ops.

A model that holds a com.quark_onnx node plus the FunctionProto of the same domain/name runs anywhere (ORT inlines
the function when no kernel is registered, and prefers a registered kernel from a custom-op library when one is).
The bodies are onnxscript functions (function_bodies.py): float32 arithmetic, the result cast back to A's dtype, so
fp32 and fp16 A both work. Shapes are read at run time, so the K/N attributes are declared but not used by them.

    node = make_node("MatMulMxfp4", ["A", "B", "B_scale"], ["Y"], K=4096, N=11008)
    attach_functions(model)       # adds the FunctionProtos + opset import for every custom op the graph uses

onnxscript is imported on the first FunctionProto asked for, not with this module (it adds ~1 s to a start).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import onnx
from onnx import helper

DOMAIN = "com.quark_onnx"
DOMAIN_VERSION = 1
DEFAULT_ONNX_OPSET = 21
MIN_ONNX_OPSET = 19  # QuantizeLinear with float8 and the `saturate` attribute

MXFP4_BLOCK_SIZE = 32
NVFP4_BLOCK_SIZE = 16
E4M3FN_MAX = 448.0
DYNAMIC_SCALE_MIN = 1e-12


def function_proto(op_type: str, onnx_opset: int = DEFAULT_ONNX_OPSET) -> onnx.FunctionProto:
    """The FunctionProto of one op, its body importing the default ONNX domain at `onnx_opset` (the model's own:
    every op of the bodies means the same from opset 19 on)."""
    if onnx_opset < MIN_ONNX_OPSET:
        raise ValueError(f"{DOMAIN}.{op_type} fallback needs ONNX opset >= {MIN_ONNX_OPSET}, got {onnx_opset}")
    from .function_bodies import BODIES

    proto = BODIES[op_type].to_function_proto()
    for opset in proto.opset_import:
        if opset.domain in ("", "ai.onnx"):
            opset.version = onnx_opset
    return proto


def matmul_mxfp4_function(onnx_opset: int = DEFAULT_ONNX_OPSET) -> onnx.FunctionProto:
    return function_proto("MatMulMxfp4", onnx_opset)


def matmul_fp8_w8a8_function(onnx_opset: int = DEFAULT_ONNX_OPSET) -> onnx.FunctionProto:
    return function_proto("MatMulFp8W8A8", onnx_opset)


def matmul_fp8_w8a8_dyn_function(onnx_opset: int = DEFAULT_ONNX_OPSET) -> onnx.FunctionProto:
    return function_proto("MatMulFp8W8A8Dyn", onnx_opset)


def matmul_bf16_function(onnx_opset: int = DEFAULT_ONNX_OPSET) -> onnx.FunctionProto:
    return function_proto("MatMulBf16", onnx_opset)


def matmul_fp8_function(onnx_opset: int = DEFAULT_ONNX_OPSET) -> onnx.FunctionProto:
    return function_proto("MatMulFp8", onnx_opset)


def matmul_int8_function(onnx_opset: int = DEFAULT_ONNX_OPSET) -> onnx.FunctionProto:
    return function_proto("MatMulInt8", onnx_opset)


def matmul_nvfp4_function(onnx_opset: int = DEFAULT_ONNX_OPSET) -> onnx.FunctionProto:
    return function_proto("MatMulNvfp4", onnx_opset)


def matmul_uint4_function(onnx_opset: int = DEFAULT_ONNX_OPSET) -> onnx.FunctionProto:
    return function_proto("MatMulUint4", onnx_opset)


def matmul_int4_function(onnx_opset: int = DEFAULT_ONNX_OPSET) -> onnx.FunctionProto:
    return function_proto("MatMulInt4", onnx_opset)


FUNCTIONS: dict[str, Callable[..., onnx.FunctionProto]] = {
    "MatMulUint4": matmul_uint4_function,
    "MatMulInt4": matmul_int4_function,
    "MatMulMxfp4": matmul_mxfp4_function,
    "MatMulFp8W8A8": matmul_fp8_w8a8_function,
    "MatMulFp8W8A8Dyn": matmul_fp8_w8a8_dyn_function,
    "MatMulBf16": matmul_bf16_function,
    "MatMulFp8": matmul_fp8_function,
    "MatMulInt8": matmul_int8_function,
    "MatMulInt8W8A8": lambda opset=DEFAULT_ONNX_OPSET: function_proto("MatMulInt8W8A8", opset),
    "MatMulNvfp4": matmul_nvfp4_function,
    # the same weights in 16-row tiles (qo_cpu_fp4_r16.c; custom_ops/fp4_r16.py)
    "MatMulMxfp4R16": lambda opset=DEFAULT_ONNX_OPSET: function_proto("MatMulMxfp4R16", opset),
    "MatMulNvfp4R16": lambda opset=DEFAULT_ONNX_OPSET: function_proto("MatMulNvfp4R16", opset),
    # routed experts (qo_cpu_experts.c): the chosen experts' stacked weights read in place
    "MatMulExpertsMxfp4": lambda opset=DEFAULT_ONNX_OPSET: function_proto("MatMulExpertsMxfp4", opset),
    "MatMulExpertsNvfp4": lambda opset=DEFAULT_ONNX_OPSET: function_proto("MatMulExpertsNvfp4", opset),
    "MatMulExpertsMxfp4R16": lambda opset=DEFAULT_ONNX_OPSET: function_proto("MatMulExpertsMxfp4R16", opset),
    "MatMulExpertsNvfp4R16": lambda opset=DEFAULT_ONNX_OPSET: function_proto("MatMulExpertsNvfp4R16", opset),
    "MatMulExpertsFp8": lambda opset=DEFAULT_ONNX_OPSET: function_proto("MatMulExpertsFp8", opset),
    "MatMulExpertsInt8": lambda opset=DEFAULT_ONNX_OPSET: function_proto("MatMulExpertsInt8", opset),
    "MatMulExpertsUint4": lambda opset=DEFAULT_ONNX_OPSET: function_proto("MatMulExpertsUint4", opset),
    "MatMulExpertsInt4": lambda opset=DEFAULT_ONNX_OPSET: function_proto("MatMulExpertsInt4", opset),
    # the static per-tensor FP8 activation Q/DQ as one node (qo_cpu_fp8_qdq.c)
    "QuantizeDequantizeFp8": lambda opset=DEFAULT_ONNX_OPSET: function_proto("QuantizeDequantizeFp8", opset),
    # Quark's dynamic MXFP4 activation fake quantization ("even" scales) as one node (qo_cpu_fp4_act.c)
    "QuantizeDequantizeMxfp4": lambda opset=DEFAULT_ONNX_OPSET: function_proto("QuantizeDequantizeMxfp4", opset),
    "QuantizeDequantizeNvfp4": lambda opset=DEFAULT_ONNX_OPSET: function_proto("QuantizeDequantizeNvfp4", opset),
    # attention with a fixed summation order (qo_cpu_attention.c)
    "GroupQueryAttentionFixedOrder": lambda opset=DEFAULT_ONNX_OPSET: function_proto("GroupQueryAttentionFixedOrder",
                                                                                     opset),
    "GroupQueryAttentionFixedOrderSinks": lambda opset=DEFAULT_ONNX_OPSET: function_proto(
        "GroupQueryAttentionFixedOrderSinks", opset),
}
# Functions the bodies above call (not ops of their own: attached with the op that uses them).
HELPERS: dict[str, Callable[..., onnx.FunctionProto]] = {
    "Fp4TilesToRows": lambda opset=DEFAULT_ONNX_OPSET: function_proto("Fp4TilesToRows", opset),
    "MatMulMxfp4": matmul_mxfp4_function,
    "MatMulNvfp4": matmul_nvfp4_function,
    "MatMulExpertsMxfp4": lambda opset=DEFAULT_ONNX_OPSET: function_proto("MatMulExpertsMxfp4", opset),
    "MatMulExpertsNvfp4": lambda opset=DEFAULT_ONNX_OPSET: function_proto("MatMulExpertsNvfp4", opset),
    "Int8BlockActivations": lambda opset=DEFAULT_ONNX_OPSET: function_proto("Int8BlockActivations", opset),
    "GqaFixedOrderScores": lambda opset=DEFAULT_ONNX_OPSET: function_proto("GqaFixedOrderScores", opset),
}
HELPERS_USED = {"MatMulMxfp4R16": ("Fp4TilesToRows", "MatMulMxfp4"), "MatMulNvfp4R16": ("Fp4TilesToRows", "MatMulNvfp4"),
                "MatMulExpertsMxfp4R16": ("Fp4TilesToRows", "MatMulExpertsMxfp4"),
                "MatMulExpertsNvfp4R16": ("Fp4TilesToRows", "MatMulExpertsNvfp4"),
                "MatMulExpertsUint4": ("Int8BlockActivations",), "MatMulExpertsInt4": ("Int8BlockActivations",),
                "GroupQueryAttentionFixedOrder": ("GqaFixedOrderScores",),
                "GroupQueryAttentionFixedOrderSinks": ("GqaFixedOrderScores",)}


def function_protos(op_type: str, onnx_opset: int = DEFAULT_ONNX_OPSET) -> list[onnx.FunctionProto]:
    """The FunctionProtos a node of op_type needs in its model: its own, then the helpers its body calls."""
    return [FUNCTIONS[op_type](onnx_opset)] + [HELPERS[h](onnx_opset) for h in HELPERS_USED.get(op_type, ())]

# Inputs in order, and the integer attributes each node must carry.
OP_INPUTS = {
    "MatMulMxfp4": ("A", "B", "B_scale"),
    "MatMulFp8W8A8": ("A", "B", "B_scale", "A_scale"),
    "MatMulFp8W8A8Dyn": ("A", "B", "B_scale"),
    "MatMulBf16": ("A", "B"),
    "MatMulFp8": ("A", "B", "B_scale"),
    "MatMulInt8": ("A", "B", "B_scale"),
    "MatMulInt8W8A8": ("A", "B", "B_scale", "A_scale"),
    "MatMulNvfp4": ("A", "B", "B_scale", "B_scale_2"),
    "MatMulMxfp4R16": ("A", "B", "B_scale"),
    "MatMulNvfp4R16": ("A", "B", "B_scale", "B_scale_2"),
    "MatMulExpertsMxfp4": ("A", "expert_ids", "B", "B_scale"),
    "MatMulExpertsNvfp4": ("A", "expert_ids", "B", "B_scale", "B_scale_2"),
    "MatMulExpertsMxfp4R16": ("A", "expert_ids", "B", "B_scale"),
    "MatMulExpertsNvfp4R16": ("A", "expert_ids", "B", "B_scale", "B_scale_2"),
    "MatMulExpertsFp8": ("A", "expert_ids", "B", "B_scale"),
    "MatMulExpertsInt8": ("A", "expert_ids", "B", "B_scale"),
    "MatMulExpertsUint4": ("A", "expert_ids", "B", "scales", "zero_points"),
    "MatMulExpertsInt4": ("A", "expert_ids", "B", "scales"),
    "MatMulUint4": ("A", "B", "scales", "zero_points"),
    "MatMulInt4": ("A", "B", "scales"),
    "QuantizeDequantizeFp8": ("X", "scale"),
    "QuantizeDequantizeMxfp4": ("X",),
    "QuantizeDequantizeNvfp4": ("X", "input_scale_2"),
    "GroupQueryAttentionFixedOrder": ("query", "key", "value", "past_key", "past_value", "seqlens_k",
                                      "total_sequence_length", "cos_cache", "sin_cache"),
    "GroupQueryAttentionFixedOrderSinks": ("query", "key", "value", "past_key", "past_value", "seqlens_k",
                                           "total_sequence_length", "cos_cache", "sin_cache", "head_sink"),
}
OP_REQUIRED_ATTRIBUTES = {
    "MatMulMxfp4": ("K", "N"),
    "MatMulFp8W8A8": (),
    "MatMulFp8W8A8Dyn": (),
    "MatMulBf16": (),
    "MatMulFp8": (),
    "MatMulInt8": (),
    "MatMulInt8W8A8": (),
    "MatMulNvfp4": ("K", "N"),
    "MatMulMxfp4R16": ("K", "N"),
    "MatMulNvfp4R16": ("K", "N"),
    "MatMulExpertsMxfp4": (),
    "MatMulExpertsNvfp4": (),
    "MatMulExpertsMxfp4R16": (),
    "MatMulExpertsNvfp4R16": (),
    "MatMulExpertsFp8": (),
    "MatMulExpertsInt8": (),
    "MatMulExpertsUint4": (),
    "MatMulExpertsInt4": (),
    "MatMulUint4": ("K", "N", "block_size"),
    "MatMulInt4": ("K", "N", "block_size"),
    "QuantizeDequantizeFp8": (),
    "QuantizeDequantizeMxfp4": (),
    "QuantizeDequantizeNvfp4": (),
    "GroupQueryAttentionFixedOrder": ("num_heads", "kv_num_heads"),
    "GroupQueryAttentionFixedOrderSinks": ("num_heads", "kv_num_heads"),
}
# Integer attributes a node may carry, and the values each may take.
OP_OPTIONAL_ATTRIBUTES = {
    # 1 (the default): float32 activations, Quark's exact product; 4: int8 activations per weight block, the
    # arithmetic of MatMulNBits / QMoE at accuracy_level 4 (custom_ops/src/qo_cpu_int4_a8.c)
    "MatMulExpertsUint4": {"accuracy_level": (1, 4)},
    "MatMulExpertsInt4": {"accuracy_level": (1, 4)},
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
    optional = OP_OPTIONAL_ATTRIBUTES.get(op_type, {})
    missing = [a for a in required if a not in attributes]
    unknown = [a for a in attributes if a not in required and a not in optional]
    if missing or unknown:
        raise ValueError(f"{op_type} attributes: want {required} (optional {tuple(optional)}); missing {missing}, "
                         f"unknown {unknown}")
    for key, allowed in optional.items():
        if key in attributes and attributes[key] not in allowed:
            raise ValueError(f"{op_type} attribute {key} must be one of {allowed}, got {attributes[key]!r}")
    for key, value in attributes.items():
        if not isinstance(value, (int, np.integer)) or value <= 0:
            raise ValueError(f"{op_type} attribute {key} must be a positive int, got {value!r}")
    if op_type == "MatMulMxfp4" and attributes["K"] % MXFP4_BLOCK_SIZE:
        raise ValueError(f"MatMulMxfp4 K={attributes['K']} must be a multiple of {MXFP4_BLOCK_SIZE}")
    if op_type in ("MatMulMxfp4R16", "MatMulNvfp4R16") and (attributes["N"] % 16 or attributes["K"] % (
            MXFP4_BLOCK_SIZE if op_type == "MatMulMxfp4R16" else NVFP4_BLOCK_SIZE)):
        raise ValueError(f"{op_type} N={attributes['N']} must be a multiple of 16 and K={attributes['K']} of the block")
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
        for proto in function_protos(op_type, opset):
            if (DOMAIN, proto.name) not in have:
                model.functions.append(proto)
                have.add((DOMAIN, proto.name))
                added.append(proto.name)
    if used and not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, DOMAIN_VERSION))
    return added
