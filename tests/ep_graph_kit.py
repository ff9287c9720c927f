"""Hand-built one-node ONNX graphs for the EP rule tests: each breaks (or keeps) exactly one constraint."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h

MS = "com.microsoft"
FLOAT_TYPES = (T.FLOAT, T.FLOAT16, T.BFLOAT16)


def tensor(name: str, dtype: int, dims: list[int]) -> onnx.TensorProto:
    n = int(np.prod(dims)) if dims else 1
    if dtype in FLOAT_TYPES or dtype in (T.FLOAT8E4M3FN, T.FLOAT8E5M2, T.FLOAT4E2M1, T.FLOAT8E8M0):
        return h.make_tensor(name, dtype, dims, [1.0] * n)
    return h.make_tensor(name, dtype, dims, [1] * n)


def model(nodes, inputs=(), outputs=(), inits=(), functions=(), opset=23) -> onnx.ModelProto:
    g = h.make_graph(list(nodes), "g", list(inputs), list(outputs), list(inits))
    imports = [h.make_opsetid("", opset), h.make_opsetid(MS, 1)]
    domains = {n.domain for n in nodes} | {f.domain for f in functions}
    imports += [h.make_opsetid(d, 1) for d in sorted(domains - {"", MS})]
    return h.make_model(g, opset_imports=imports, ir_version=11, functions=list(functions))


def vi(name: str, dtype: int, shape=None) -> onnx.ValueInfoProto:
    return h.make_tensor_value_info(name, dtype, shape)


def matmul_nbits(name="/model/layers.0/mlp/up_proj/MatMulNBits", *, n=16, k=64, bits=4, block=32, io=T.FLOAT,
                 zero_points: str | None = None, bias=False, b_dims=None, **attrs) -> onnx.ModelProto:
    """zero_points: None, "packed-1d" (what MIGraphX takes), "packed-2d" or "float"."""
    k_blocks = -(-k // block)
    inits = [tensor("B", T.UINT8, b_dims or [n, k_blocks, block * bits // 8]), tensor("scales", io, [n * k_blocks])]
    inputs = ["A", "B", "scales"]
    if zero_points == "packed-1d":
        inits.append(tensor("zp", T.UINT8, [n * -(-(k_blocks * bits) // 8)]))
    elif zero_points == "packed-2d":
        inits.append(tensor("zp", T.UINT8, [n, -(-(k_blocks * bits) // 8)]))
    elif zero_points == "float":
        inits.append(tensor("zp", io, [n * k_blocks]))
    inputs.append("zp" if zero_points else "")
    if bias:
        inits.append(tensor("bias", io, [n]))
        inputs += ["", "bias"]
    while inputs and not inputs[-1]:
        inputs.pop()
    node = h.make_node("MatMulNBits", inputs, ["Y"], name, domain=MS, K=k, N=n, bits=bits, block_size=block, **attrs)
    return model([node], [vi("A", io, [1, k])], [vi("Y", io, [1, n])], inits)


def gqa(name="/model/layers.0/attn/GroupQueryAttention", *, io=T.FLOAT16, cache=None, kv_scales=False,
        **attrs) -> onnx.ModelProto:
    """One GroupQueryAttention the way builder/ops/attention.py emits it (9 inputs), optionally with k/v scales."""
    cache = cache or io
    b, s, heads, kv_heads, d, past = 1, 2, 2, 1, 16, 4
    cache_d = d // 2 if attrs.get("kv_cache_bit_width") == 4 else d
    inputs = [vi("q", io, [b, s, heads * d]), vi("k", io, [b, s, kv_heads * d]), vi("v", io, [b, s, kv_heads * d]),
              vi("past_k", cache, [b, kv_heads, past, cache_d]), vi("past_v", cache, [b, kv_heads, past, cache_d]),
              vi("seqlens_k", T.INT32, [b]), vi("total_len", T.INT32, [])]
    inits = [tensor("cos", io, [8, d // 2]), tensor("sin", io, [8, d // 2])]
    names = ["q", "k", "v", "past_k", "past_v", "seqlens_k", "total_len", "cos", "sin"]
    if kv_scales:
        inits += [tensor("k_scale", T.FLOAT, [1]), tensor("v_scale", T.FLOAT, [1])]
        names += ["", "", "", "k_scale", "v_scale"]
    node = h.make_node("GroupQueryAttention", names, ["out", "present_k", "present_v"], name, domain=MS,
                       num_heads=heads, kv_num_heads=kv_heads, do_rotary=1, **attrs)
    outputs = [vi("out", io, [b, s, heads * d]), vi("present_k", cache), vi("present_v", cache)]
    return model([node], inputs, outputs, inits)


def dequantize(name="/model/layers.0/mlp/up_proj/weight/DequantizeLinear", *, x_type=T.FLOAT8E4M3FN,
               scale_type=T.FLOAT, block: int | None = None) -> onnx.ModelProto:
    attrs = {"axis": 1, "block_size": block} if block else {"axis": 0}
    scale_dims = [4, 8 // block] if block else [4]
    node = h.make_node("DequantizeLinear", ["W", "W_scale"], ["Wf"], name, **attrs)
    return model([node], [], [vi("Wf", scale_type, [4, 8])],
                 [tensor("W", x_type, [4, 8]), tensor("W_scale", scale_type, scale_dims)])


def chain(op_types: list[tuple[str, str]], io=T.FLOAT, prefix="/model/x", functions=()) -> onnx.ModelProto:
    """A chain of unary nodes [(domain, op_type), ...] on one float tensor."""
    nodes, cur = [], "x"
    for i, (domain, op) in enumerate(op_types):
        out = f"t{i}"
        nodes.append(h.make_node(op, [cur], [out], f"{prefix}/{i}/{op}", domain=domain))
        cur = out
    nodes.append(h.make_node("Identity", [cur], ["y"], f"{prefix}/out"))
    return model(nodes, [vi("x", io, [4])], [vi("y", io, [4])],
                 functions=functions)


def local_function(domain: str, name: str, body_ops: list[str]) -> onnx.FunctionProto:
    nodes, cur = [], "x"
    for i, op in enumerate(body_ops):
        out = f"b{i}"
        nodes.append(h.make_node(op, [cur], [out]))
        cur = out
    nodes.append(h.make_node("Identity", [cur], ["y"]))
    return h.make_function(domain, name, ["x"], ["y"], nodes, [h.make_opsetid("", 23)])
