"""Run single ONNX ops on fixed inputs with ORT CPU and save the outputs (npz), to diff across instruction sets.

    python tools/isa_op_outputs.py OUT.npz              # on this CPU
    qemu-x86_64 -cpu SandyBridge $(which python) tools/isa_op_outputs.py OUT.npz   # AVX, no AVX2/FMA (QEMU TCG)
    python tools/isa_op_outputs.py --diff A.npz B.npz   # which ops differ, by how many ulps

The ops are the ones the builder's CPU graph uses outside the weight matmuls, at SmolLM2-135M's shapes.
"""
from __future__ import annotations

import sys

import numpy as np

T, H, HKV, D, HID, FF = 64, 9, 3, 64, 576, 1536


def _model(nodes, inputs, outputs, opset=21, ms=1):
    from onnx import helper as h
    from onnx import TensorProto as TP
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info(n, TP.FLOAT if d is None else d, s) for n, s, d in inputs],
                     [h.make_tensor_value_info(n, TP.FLOAT, None) for n in outputs])
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset), h.make_opsetid("com.microsoft", ms)])


def cases():
    from onnx import helper as h
    from onnx import TensorProto as TP
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((1, T, HID)) * 3).astype(np.float32)
    w = (rng.standard_normal(HID) * 0.2 + 1).astype(np.float32)
    s = rng.standard_normal((1, T, HID)).astype(np.float32)
    big = (rng.standard_normal((T, FF)) * 4).astype(np.float32)
    a = (rng.standard_normal((T, HID)) * 2).astype(np.float32)
    b = (rng.standard_normal((HID, FF)) * 0.05).astype(np.float32)
    logits = (rng.standard_normal((1, H, T, T)) * 6).astype(np.float32)
    q = rng.standard_normal((1, T, H * D)).astype(np.float32)
    k = rng.standard_normal((1, T, HKV * D)).astype(np.float32)
    v = rng.standard_normal((1, T, HKV * D)).astype(np.float32)
    yield "MatMul", _model([h.make_node("MatMul", ["a", "b"], ["y"])], [("a", a.shape, None), ("b", b.shape, None)],
                           ["y"]), {"a": a, "b": b}
    yield "SimplifiedLayerNormalization", _model(
        [h.make_node("SimplifiedLayerNormalization", ["x", "w"], ["y"], axis=-1, epsilon=1e-5)],
        [("x", x.shape, None), ("w", w.shape, None)], ["y"]), {"x": x, "w": w}
    yield "SkipSimplifiedLayerNormalization", _model(
        [h.make_node("SkipSimplifiedLayerNormalization", ["x", "s", "w"], ["y", "", "", "sum"], domain="com.microsoft",
                     epsilon=1e-5)],
        [("x", x.shape, None), ("s", s.shape, None), ("w", w.shape, None)], ["y", "sum"]), {"x": x, "s": s, "w": w}
    for op in ("Sigmoid", "Exp", "Tanh", "Erf", "Softmax"):
        node = h.make_node(op, ["x"], ["y"], **({"axis": -1} if op == "Softmax" else {}))
        inp = big if op != "Softmax" else logits
        yield op, _model([node], [("x", inp.shape, None)], ["y"]), {"x": inp}
    yield "ReduceMax", _model([h.make_node("ReduceMax", ["x"], ["y"], keepdims=1, axes=None)],
                              [("x", logits.shape, None)], ["y"], opset=17), {"x": logits}
    yield "Div", _model([h.make_node("Div", ["x", "d"], ["y"])], [("x", big.shape, None), ("d", (), None)], ["y"]), \
        {"x": big, "d": np.array(0.0123, np.float32)}
    # the explicit attention's pieces at prefill shapes (builder/ops/fp8_attention.py, softmax_fixed_order)
    scores = (rng.standard_normal((1, H, 96, 96)) * 6).astype(np.float32)
    scores[..., np.triu_indices(96, 1)[0], np.triu_indices(96, 1)[1]] = np.finfo(np.float32).min
    ax = h.make_tensor("ax", TP.INT64, [1], [-1])
    yield "SoftmaxExplicit", _model(
        [h.make_node("Constant", [], ["ax"], value=ax), h.make_node("ReduceMax", ["x", "ax"], ["m"], keepdims=1), h.make_node("Sub", ["x", "m"], ["d"]),
         h.make_node("Exp", ["d"], ["e"]), h.make_node("ReduceSum", ["e", "ax"], ["s"], keepdims=1),
         h.make_node("Div", ["e", "s"], ["y"])], [("x", scores.shape, None)], ["y"], opset=21), {"x": scores}
    yield "Softmax96", _model([h.make_node("Softmax", ["x"], ["y"], axis=-1)], [("x", scores.shape, None)], ["y"]), \
        {"x": scores}
    qg = rng.standard_normal((1, HKV, 3 * 96, D)).astype(np.float32)
    kt = rng.standard_normal((1, HKV, D, 96)).astype(np.float32)
    pg = rng.random((1, HKV, 3 * 96, 96)).astype(np.float32)
    vv = rng.standard_normal((1, HKV, 96, D)).astype(np.float32)
    for name, (l, r) in (("MatMulQK", (qg, kt)), ("MatMulPV", (pg, vv))):
        yield name, _model([h.make_node("MatMul", ["a", "b"], ["y"])], [("a", l.shape, None), ("b", r.shape, None)],
                           ["y"]), {"a": l, "b": r}
    for name, do_rotary in (("GroupQueryAttention", 0),):
        nodes = [h.make_node("GroupQueryAttention", ["q", "k", "v", "pk", "pv", "sl", "tl"], ["y", "ok", "ov"],
                             domain="com.microsoft", num_heads=H, kv_num_heads=HKV, do_rotary=do_rotary)]
        inputs = [("q", q.shape, None), ("k", k.shape, None), ("v", v.shape, None), ("pk", (1, HKV, 0, D), None),
                  ("pv", (1, HKV, 0, D), None), ("sl", (1, 1), TP.INT32), ("tl", (), TP.INT32)]
        feeds = {"q": q, "k": k, "v": v, "pk": np.zeros((1, HKV, 0, D), np.float32),
                 "pv": np.zeros((1, HKV, 0, D), np.float32), "sl": np.array([[T - 1]], np.int32),
                 "tl": np.array(T, np.int32)}
        yield name, _model(nodes, inputs, ["y"]), feeds


def run(out: str) -> None:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    res = {}
    for name, model, feeds in cases():
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        for i, y in enumerate(sess.run(None, feeds)):
            res[f"{name}:{i}"] = y
    np.savez(out, **res)


def ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ia, ib = a.astype(np.float32).view(np.int32).astype(np.int64), b.astype(np.float32).view(np.int32).astype(np.int64)
    ia = np.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
    ib = np.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return np.abs(ia - ib)


def diff(pa: str, pb: str) -> None:
    a, b = np.load(pa), np.load(pb)
    for k in a.files:
        u = ulps(a[k], b[k])
        print(f"{k:36s} differ {float((u > 0).mean()):7.4f}  max {int(u.max()):6d} ulp")


if __name__ == "__main__":
    if sys.argv[1] == "--diff":
        diff(sys.argv[2], sys.argv[3])
    else:
        run(sys.argv[1])
