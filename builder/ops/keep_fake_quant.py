"""Keep Quark's fake quantization through MIGraphX's GPU pipeline (EPConfig.keep_fake_quant: rocm, migraphx).

MIGraphX's GPU target runs simplify_qdq (AMDMIGraphX src/targets/gpu/target.cpp required_pipeline, commit
f729a52); its ref target does not (src/targets/ref/target.cpp get_passes). In src/simplify_qdq.cpp:
  - match_find_quantizable_ops turns dot(dequantizelinear(a), dequantizelinear(b)) into quant_dot, each
    dequantizelinear reached through broadcast/multibroadcast/contiguous/transpose/reshape/convert only
    (match/dq_helpers.hpp skip_post_dq_ops) with a constant scale and zero point and an int8/fp8 input: the
    quantization is kept (the dot runs on the quantized values).
  - remove_qdq_pairs then replaces every other dequantizelinear(quantizelinear(x, s, z), s', z') by x when s' is s
    (the same instruction, or literals of equal value: is_same_scale_zero / compare_literals): a Q/DQ pair that
    emulates Quark's activation, KV-cache or scale quantization without feeding such a dot is dropped on the GPU.
    (MIGraphX's own `verify` does the same to its reference: src/driver/verify.cpp simplify_qdq{remove_qdq_only}.)
Measured with tools/migraphx_gpu_qdq_sim.py (the rule applied to the ONNX graph, run on ORT CPU): 0.07-1.2 max logit
difference on the tiny FP8-KV, FP8-attention, NVFP4 and FP8-expert models.

The rewrite: QuantizeLinear(x, s, z) -> QuantizeLinear(Add(x, x), Add(s, s), z) for every QuantizeLinear whose
output reaches a DequantizeLinear with a consumer the first rule does not take. (2x) / (2s) is x / s exactly in
IEEE arithmetic (both doublings are exact unless 2x overflows the io dtype), so ONNX Runtime computes the same
numbers; the DequantizeLinear keeps s, which is now a different value from the QuantizeLinear's scale, so
remove_qdq_pairs leaves the pair alone (and rewrite_quantization lowers both to float ops that round as they
should). Pairs feeding a quantizable dot are left as they are: their quantization survives as quant_dot.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

SKIP_TO_Q = ("Reshape", "Slice", "Pad")                   # remove_qdq_pairs' skip set, ONNX names
SKIP_AFTER_DQ = ("Expand", "Transpose", "Reshape", "Cast")  # skip_post_dq_ops, ONNX names
QUANT_TYPES = frozenset({onnx.TensorProto.INT8, onnx.TensorProto.FLOAT8E4M3FN, onnx.TensorProto.FLOAT8E4M3FNUZ,
                         onnx.TensorProto.FLOAT8E5M2, onnx.TensorProto.FLOAT8E5M2FNUZ})


def _const_types(initializers) -> dict[str, tuple[int, tuple[int, ...]]]:
    return {t.name: (t.data_type, tuple(t.dims)) for t in initializers}


def _subgraph_inputs(node: onnx.NodeProto) -> set[str]:
    names: set[str] = set()
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            for n in a.g.node:
                names.update(n.input)
                names |= _subgraph_inputs(n)
    return names


def _walk(nodes, consts: dict[str, int], counter: list[int], outputs: set[str]) -> list[onnx.NodeProto]:
    """Rewrite one graph's node list (returned, with the new Add nodes placed before their QuantizeLinear);
    consts maps constant names (initializers, Constant outputs, outer scopes) to (element type, dims); outputs are
    the graph's output names (a DequantizeLinear returned by the graph is a use the GPU rewrites too)."""
    consts = dict(consts)
    for n in nodes:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].type == onnx.AttributeProto.TENSOR:
            consts[n.output[0]] = (n.attribute[0].t.data_type, tuple(n.attribute[0].t.dims))
    producer = {o: n for n in nodes for o in n.output}
    users: dict[str, list[onnx.NodeProto]] = {}
    for n in nodes:
        for i in set(n.input) | _subgraph_inputs(n):  # an If branch reading an outer value uses it
            users.setdefault(i, []).append(n)

    def back(name: str, skip) -> onnx.NodeProto | None:
        n = producer.get(name)
        while n is not None and n.op_type in skip:
            n = producer.get(n.input[0])
        return n

    def quantized_type(name: str) -> int | None:
        if name in consts:
            return consts[name][0]
        q = producer.get(name)
        if q is None or q.op_type != "QuantizeLinear":
            return None
        if len(q.input) > 2 and q.input[2] in consts:
            return consts[q.input[2]][0]
        return next((a.i for a in q.attribute if a.name == "output_dtype"), onnx.TensorProto.UINT8)

    def dot_takes(matmul: onnx.NodeProto) -> bool:
        for x in matmul.input[:2]:
            dq = back(x, SKIP_AFTER_DQ)
            if dq is None or dq.op_type != "DequantizeLinear" or dq.input[1] not in consts:
                return False
            dims = consts[dq.input[1]][1]
            if len(dims) > 1 and int(np.prod(dims)) > 1:  # blocked: apply() returns unless per-tensor/per-axis
                return False
            if len(dq.input) > 2 and dq.input[2] and dq.input[2] not in consts:
                return False
            if quantized_type(dq.input[0]) not in QUANT_TYPES:
                return False
        return True

    def maybe_same(a: str, b: str) -> bool:  # is_same_value: one instruction, or literals (values unknown here)
        return a == b or (a in consts and b in consts)

    def same_params(q: onnx.NodeProto, d: onnx.NodeProto) -> bool:
        zq = q.input[2] if len(q.input) > 2 else ""
        zd = d.input[2] if len(d.input) > 2 else ""
        # is_same_scale_zero: equal input counts (a zero point on one side only: not a pair), then scale and zp
        return maybe_same(q.input[1], d.input[1]) and (zq == zd == "" or (bool(zq) and bool(zd)
                                                                           and maybe_same(zq, zd)))

    def reaches_dropped_dq(q: onnx.NodeProto) -> bool:
        frontier, seen = [q.output[0]], set()
        while frontier:
            name = frontier.pop()
            for u in users.get(name, []):
                if id(u) in seen:
                    continue
                seen.add(id(u))
                if u.op_type in SKIP_TO_Q and u.input[0] == name:
                    frontier.append(u.output[0])
                elif u.op_type == "DequantizeLinear" and u.input[0] == name and same_params(q, u):
                    if u.output[0] in outputs or any(not (c.op_type == "MatMul" and dot_takes(c))
                                                     for c in users.get(u.output[0], [])):
                        return True
        return False

    out: list[onnx.NodeProto] = []
    for n in nodes:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                sub = _walk(list(a.g.node), consts | _const_types(a.g.initializer), counter,
                            {o.name for o in a.g.output})
                del a.g.node[:]
                a.g.node.extend(sub)
        if n.op_type == "QuantizeLinear" and reaches_dropped_dq(n):
            base = n.name or n.output[0]
            x2 = helper.make_node("Add", [n.input[0], n.input[0]], [f"{base}/keep_x2"], name=f"{base}/KeepX2")
            s2 = helper.make_node("Add", [n.input[1], n.input[1]], [f"{base}/keep_s2"], name=f"{base}/KeepS2")
            out += [x2, s2]
            n.input[0], n.input[1] = x2.output[0], s2.output[0]
            counter[0] += 1
        out.append(n)
    return out


def keep_fake_quant(graph) -> int:
    """Rewrite graph.nodes (a builder.graph.GraphBuilder) in place; returns how many QuantizeLinear were rewritten."""
    consts = _const_types(graph.initializers)
    counter = [0]
    graph.nodes[:] = _walk(list(graph.nodes), consts, counter, {o.name for o in graph.outputs})
    if counter[0]:
        graph.op_counts["Add"] = graph.op_counts.get("Add", 0) + 2 * counter[0]
    return counter[0]


def count_dropped(graph: onnx.GraphProto) -> int:
    """How many QuantizeLinear of this graph (If branches included) have a pair MIGraphX's GPU drops; the graph is
    not changed (`python -m builder check`: ep_rules migraphx-gpu-drops-fake-quant)."""
    g = onnx.GraphProto()
    g.CopyFrom(graph)
    del g.initializer[:]  # their element types are all the walk needs
    consts = _const_types(graph.initializer)
    counter = [0]
    _walk(list(g.node), consts, counter, {o.name for o in g.output})
    return counter[0]
