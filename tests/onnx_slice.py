"""Graph walking for the tests that evaluate part of an output: every node (main graph and If branches), who
produces a value, and the slice of a model that computes some values from others, as a model of its own."""
from __future__ import annotations

import onnx
from onnx import helper


def all_nodes(graph) -> list[onnx.NodeProto]:
    """The graph's nodes and those of its If branches (names are unique across them)."""
    out = []
    for n in graph.node:
        out.append(n)
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                out += all_nodes(a.g)
    return out


def producers(nodes) -> dict[str, onnx.NodeProto]:
    return {o: n for n in nodes for o in n.output}


def back(prod, name, skip=("Cast",)):
    """The producer of `name`, walking up through the ops in `skip` (first input each)."""
    n = prod.get(name)
    while n is not None and n.op_type in skip:
        n = prod.get(n.input[0])
    return n


def slice_model(model, inputs: dict[str, int], outputs: list[str], out_type: int) -> onnx.ModelProto:
    """The nodes (main graph and If branches) computing `outputs` (elem type out_type) from `inputs` (name -> elem
    type) and the initializers, in topological order, as a model."""
    nodes = all_nodes(model.graph)
    prod = producers(nodes)
    inits = {t.name: t for t in model.graph.initializer}
    keep, used, stack, seen = set(), set(), list(outputs), set()
    while stack:
        v = stack.pop()
        if v in seen or v in inputs or not v:
            continue
        seen.add(v)
        if v in inits:
            used.add(v)
            continue
        n = prod[v]
        keep.add(id(n))
        stack.extend(n.input)
    order = [n for n in nodes if id(n) in keep]
    done, ranked = set(inputs) | set(inits), []  # a branch node may come after its If in the flat list
    while order:
        ready = [n for n in order if all(not i or i in done for i in n.input)]
        assert ready, "cycle"
        for n in ready:
            ranked.append(n)
            done.update(n.output)
        order = [n for n in order if id(n) not in {id(r) for r in ready}]
    g = helper.make_graph(ranked, "slice", [helper.make_tensor_value_info(k, t, None) for k, t in inputs.items()],
                          [helper.make_tensor_value_info(o, out_type, None) for o in outputs],
                          [inits[u] for u in sorted(used)])
    m = helper.make_model(g, opset_imports=list(model.opset_import))
    m.ir_version = model.ir_version
    return m
