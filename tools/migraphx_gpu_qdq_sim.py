"""What MIGraphX's GPU target does to Q/DQ pairs that its ref target keeps, simulated on the ONNX graph and run on
ORT CPU: how far a `-e rocm` graph's logits move on an AMD GPU because of it.

    python tools/migraphx_gpu_qdq_sim.py MODEL_DIR ...          (fp32 -e rocm / -e migraphx outputs)

MIGraphX's GPU pipeline runs simplify_qdq (src/targets/gpu/target.cpp required_pipeline, commit f729a52); its ref
target does not (src/targets/ref/target.cpp get_passes), so tools/migraphx_ref_compare.py cannot see this.
simplify_qdq (src/simplify_qdq.cpp):
  1. match_find_quantizable_ops: dot(dq(a), dq(b)), each dq reached through broadcast/multibroadcast/contiguous/
     transpose/reshape/convert only (match/dq_helpers.hpp skip_post_dq_ops), with constant scale and zero point
     (dequantizelinear_op) and int8/fp8 inputs, becomes quant_dot on the quantized values: the quantization stays.
  2. remove_qdq_pairs: every other dequantizelinear whose input is a quantizelinear (skipping pack_fp4, unpack_fp4,
     broadcast, slice, reshape, reshape_lazy, pad) with the same scale and zero point (the same instruction, or
     literals of equal values: is_same_scale_zero / compare_literals) is replaced by the quantizelinear's input:
     that fake quantization is dropped.
This tool applies rule 2 to the ONNX graph (main graph and If branches) where rule 1 does not take the pair, and
prints ORT CPU's max |logit difference| between the graph and its simulated GPU form (prompt of 8 tokens).
A simulation of source read, not a GPU run; pairs with different scales on Q and DQ are left alone, as MIGraphX does.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

SKIP_TO_Q = {"Reshape", "Slice", "Pad"}                       # remove_qdq_pairs' skip_set, ONNX names
SKIP_TO_DQ = {"Expand", "Transpose", "Reshape", "Cast"}       # skip_post_dq_ops, ONNX names
QUANT_TYPES = {onnx.TensorProto.INT8, onnx.TensorProto.FLOAT8E4M3FN, onnx.TensorProto.FLOAT8E4M3FNUZ,
               onnx.TensorProto.FLOAT8E5M2, onnx.TensorProto.FLOAT8E5M2FNUZ}


def _const_values(name: str, consts: dict) -> np.ndarray | None:
    return consts.get(name)


def _same(a: str, b: str, consts: dict) -> bool:
    if a == b:
        return True
    va, vb = _const_values(a, consts), _const_values(b, consts)
    return va is not None and vb is not None and va.size == vb.size and np.array_equal(va.ravel(), vb.ravel())


def _simulate_graph(graph: onnx.GraphProto, consts: dict, dtypes: dict) -> int:
    """Rewire in place; returns how many DequantizeLinear uses were dropped. consts: name -> array (outer scopes
    included); dtypes: name -> elem type of initializers and Q outputs."""
    consts = dict(consts)
    for t in graph.initializer:
        consts[t.name] = numpy_helper.to_array(t)
    for n in graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    producer = {o: n for n in graph.node for o in n.output}

    def back(name: str, skip: set[str]):
        n = producer.get(name)
        while n is not None and n.op_type in skip:
            n = producer.get(n.input[0])
        return n

    def qtype(q) -> int | None:
        zp = q.input[2] if len(q.input) > 2 and q.input[2] else None
        if zp is not None and zp in consts:
            return onnx.helper.np_dtype_to_tensor_dtype(consts[zp].dtype) if consts[zp].dtype != object else None
        return next((a.i for a in q.attribute if a.name == "output_dtype"), onnx.TensorProto.UINT8)

    def absorbed(matmul) -> bool:
        """rule 1: both MatMul inputs are DQ (through the skip ops) of int8/fp8 with constant scale/zero point."""
        for x in matmul.input[:2]:
            dq = back(x, SKIP_TO_DQ)
            if dq is None or dq.op_type != "DequantizeLinear":
                return False
            if dq.input[1] not in consts or (len(dq.input) > 2 and dq.input[2] and dq.input[2] not in consts):
                return False
            sc = consts[dq.input[1]]
            if sc.ndim > 1 and sc.size > 1:  # is_valid_qparam: per-tensor or per-axis only (blocked: no quant_dot)
                return False
            src = back(dq.input[0], set())
            t = dtypes.get(dq.input[0])
            if t is None and src is not None and src.op_type == "QuantizeLinear":
                t = qtype(src)
            if t not in QUANT_TYPES:
                return False
        return True

    dropped = 0
    for d in list(graph.node):
        if d.op_type != "DequantizeLinear":
            continue
        q = back(d.input[0], SKIP_TO_Q)
        if q is None or q.op_type != "QuantizeLinear" or q.input[0] == "":
            continue
        if not _same(d.input[1], q.input[1], consts):
            continue
        zq = q.input[2] if len(q.input) > 2 else ""
        zd = d.input[2] if len(d.input) > 2 else ""
        if (zq or zd) and not (zq and zd and _same(zq, zd, consts)):
            continue
        users = [n for n in graph.node if d.output[0] in n.input]
        for u in users:
            if u.op_type == "MatMul" and absorbed(u):
                continue
            for i, name in enumerate(u.input):
                if name == d.output[0]:
                    u.input[i] = q.input[0]
                    dropped += 1
    for n in graph.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                dropped += _simulate_graph(a.g, consts, dtypes)
    return dropped


def simulate_recip(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """The GPU's QuantizeLinear with a constant scale: src/rewrite_quantization.cpp lowers it to div(x, scale), and
    src/simplify_algebra.cpp find_div_const rewrites a div by a constant into mul(x, recip(c)). Simulated as
    QuantizeLinear(Mul(x, fp32(1 / s)), 1): x * (1/s) instead of x / s, which differs in the last bit where s is
    not a power of two. Main graph and If branches; returns (model, QuantizeLinear rewritten)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    count = [0]

    def walk(graph, consts):
        consts = dict(consts)
        for t in graph.initializer:
            if t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16):
                consts[t.name] = numpy_helper.to_array(t)
        nodes = []
        for n in graph.node:
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g, consts)
            if n.op_type == "QuantizeLinear" and n.input[1] in consts:
                s = consts[n.input[1]]
                base = n.name or n.output[0]
                r = numpy_helper.from_array((np.float32(1) / s.astype(np.float32)).astype(s.dtype), f"{base}/recip")
                one = numpy_helper.from_array(np.ones_like(s), f"{base}/one")
                graph.initializer.extend([r, one])
                nodes.append(onnx.helper.make_node("Mul", [n.input[0], r.name], [f"{base}/x_recip"]))
                n.input[0], n.input[1] = f"{base}/x_recip", one.name
                count[0] += 1
            nodes.append(n)
        del graph.node[:]
        graph.node.extend(nodes)

    walk(m.graph, {})
    return m, count[0]


def simulate(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    dtypes = {t.name: t.data_type for t in m.graph.initializer}
    return m, _simulate_graph(m.graph, {}, dtypes)


def compare(model_dir: Path, ids: np.ndarray, recip: bool = False) -> tuple[int, float]:
    import json

    import onnxruntime as ort
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from migraphx_ref_compare import _empty_past, _feeds
    model = onnx.load(str(model_dir / "model.onnx"))
    sim, dropped = simulate_recip(model) if recip else simulate(model)
    shared = json.loads((model_dir / "genai_config.json").read_text())["search"].get("past_present_share_buffer")
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    out = []
    for m in (model, sim):
        sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        out.append(sess.run(["logits"], _feeds(ids, _empty_past(sess, bool(shared)), 0))[0])
    return dropped, float(np.abs(out[0] - out[1]).max())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", type=Path)
    ap.add_argument("--tiny", action="store_true", help="the tiny exports of tools/migraphx_ref_compare.py")
    ap.add_argument("--recipes", default=None)
    ap.add_argument("--families", default=None)
    ap.add_argument("--recip", action="store_true",
                    help="simulate find_div_const (x * (1/s) in every constant-scale QuantizeLinear) instead")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import tempfile

    import migraphx_ref_compare as mrc
    ids = np.array([[1, 5, 9, 13, 17, 21, 25, 29]], np.int64)
    print("| model | DequantizeLinear uses dropped | max abs logit diff, graph vs simulated GPU form |\n|---|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        models = [(d.name, d, ids) for d in args.models]
        if args.tiny:
            recipes = mrc.TINY_RECIPES if args.recipes is None else [r for r in args.recipes.split(",") if r]
            fams = mrc.FAMILY_CASES if args.families is None else \
                [tuple(c.split(":", 1)) for c in args.families.split(",") if c]
            models += mrc.tiny_models(Path(tmp), [("llama_h64", r) for r in recipes] + list(fams))
        for name, d, model_ids in models:
            if isinstance(d, str):
                print(f"| {name} | - | {d} |", flush=True)
                continue
            dropped, diff = compare(d, model_ids, args.recip)
            print(f"| {name} | {dropped} | {diff:.1e} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
