"""Decode (M = 1) time of one MoE layer's 4-bit experts at Qwen3-30B-A3B's shape (hidden 2048, 128 experts of
width 768, top-8, uint4 block 32 with zero points): com.microsoft QMoE at accuracy_level 4 (MLAS SQNBit, int8
activations) and 1 (fp32 activations) against our com.quark_onnx MatMulExpertsUint4 pair (fc1 gate/up, then fc2
on the 8 rows; the SwiGLU between them is not timed) at accuracy_level 1 (fp32 activations) and 4 (int8), and,
to separate the kernel from the routing, the dense MatMulNBits (al 4 / al 1) and MatMulUint4 on the 8 chosen
experts' rows stacked into one weight. The same 8 experts every call (they may stay in the L3), and each session in
its own thread pool: with 2 threads the pools of the sessions spin against each other, so compare 1-thread rows. ORT CPU sessions,
1 intra-op thread, process CPU time per call (the machine is shared), best and median of --rounds interleaved rounds
of --reps calls; the bytes of weight a call reads (codes + scales + zero points of the 8 experts, or QMoE's packed
form) over the best time.

    python benchmarks/qmoe_vs_experts_int4.py [--rounds 7] [--reps 20] [--experts 128] [--hidden 2048] [--inter 768]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]
from onnx import TensorProto, helper, numpy_helper

from custom_ops import functions, ort_library, single_op
from custom_ops.single_op import single_op_model

BS, TOP = 32, 8


def _model(nodes, inputs, inits, opsets):
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(n, t, None) for n, t in inputs],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    m.ir_version = 10
    return m


def qmoe(w, acc):
    node = helper.make_node("QMoE", ["A", "router", "w1", "s1", "", "w2", "s2", "", "", "", "", "z1", "z2"], ["Y"],
                            domain="com.microsoft", k=TOP, activation_type="swiglu", swiglu_fusion=1,
                            activation_alpha=1.0, activation_beta=0.0, normalize_routing_weights=1,
                            use_sparse_mixer=0, expert_weight_bits=4, block_size=BS, weights_prepacked=0,
                            accuracy_level=acc)
    inits = [numpy_helper.from_array(w[f"{k}{i}"], f"{k}{i}") for i in (1, 2) for k in "wsz"]
    return _model([node], [("A", TensorProto.FLOAT), ("router", TensorProto.FLOAT)], inits,
                  [("", 21), ("com.microsoft", 1)])


def experts_op(b, s, z, level=1):
    """MatMulExpertsUint4: B [E, N, K/bs, bs/2], scales [E, N, K/bs], zero points [E, N, ceil(K/bs/2)];
    accuracy_level 1 (fp32 activations) or 4 (int8 activations)."""
    e, n, kh = b.shape
    names = list(functions.OP_INPUTS["MatMulExpertsUint4"])
    node = functions.make_node("MatMulExpertsUint4", names, ["Y"], name="experts", accuracy_level=level)
    inits = [numpy_helper.from_array(b.reshape(e, n, kh * 2 // BS, BS // 2), "B"),
             numpy_helper.from_array(s, "scales"), numpy_helper.from_array(z, "zero_points")]
    return _model([node], [("A", TensorProto.FLOAT), ("expert_ids", TensorProto.INT64)], inits,
                  [("", 21), (functions.DOMAIN, functions.DOMAIN_VERSION)])


def dense(kind, b, s, z, acc=4):
    """One [N, K] weight (the chosen experts' rows stacked): MatMulNBits (accuracy_level acc) or MatMulUint4."""
    n, kh = b.shape
    k = kh * 2
    if kind == "nbits":
        node = helper.make_node("MatMulNBits", ["A", "B", "scales", "zero_points"], ["Y"], domain="com.microsoft",
                                K=k, N=n, bits=4, block_size=BS, accuracy_level=acc)
        inits = [numpy_helper.from_array(b.reshape(n, k // BS, BS // 2), "B"),
                 numpy_helper.from_array(s.reshape(-1), "scales"),
                 numpy_helper.from_array(z.reshape(-1), "zero_points")]
        return _model([node], [("A", TensorProto.FLOAT)], inits, [("", 21), ("com.microsoft", 1)])
    return single_op_model("MatMulUint4", np.float32, k, {"B": b.reshape(n, k // BS, BS // 2),
                                                          "scales": s.reshape(-1), "zero_points": z},
                           attributes=dict(K=k, N=n, block_size=BS), attach_function=False)


def session(model, lib):
    return single_op.session(model, lib, threads=1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=768)
    a = ap.parse_args()
    lib = str(ort_library.build(log=lambda m: None))
    rng = np.random.default_rng(0)
    e, h, i = a.experts, a.hidden, a.inter
    w = {}
    for fc, n, k in ((1, 2 * i, h), (2, h, i)):
        w[f"w{fc}"] = rng.integers(0, 256, (e, n, k // 2), dtype=np.uint8)
        w[f"s{fc}"] = (rng.random((e, n, k // BS), dtype=np.float32) * 0.01 + 0.001).astype(np.float32)
        w[f"z{fc}"] = rng.integers(0, 256, (e, n, (k // BS + 1) // 2), dtype=np.uint8)
    router = rng.standard_normal((1, e)).astype(np.float32)
    ids = np.argsort(-router[0])[:TOP].astype(np.int64).reshape(1, TOP)
    x = rng.standard_normal((1, h)).astype(np.float32)
    x8 = rng.standard_normal((1, TOP, i)).astype(np.float32)
    chosen = lambda fc, key: w[f"{key}{fc}"][ids[0]].reshape(-1, w[f"{key}{fc}"].shape[2])

    def nbytes(fc):
        return sum(w[f"{key}{fc}"][:TOP].nbytes for key in "wsz")

    per_block_packed = 16 + 4 + 4  # MLAS CompInt8: codes, fp32 scale copy, fp32 block sum (per block of 32)
    blocks = TOP * (2 * i * h + h * i) // BS
    cases = {  # name: (session, feeds, weight bytes read per call)
        "QMoE al4 (fc1+SwiGLU+fc2)": (session(qmoe(w, 4), None), {"A": x, "router": router},
                                      blocks * (per_block_packed + 0.5)),
        "QMoE al1 (fc1+SwiGLU+fc2)": (session(qmoe(w, 1), None), {"A": x, "router": router},
                                      nbytes(1) + nbytes(2)),
        "MatMulExpertsUint4 fc1": (session(experts_op(w["w1"], w["s1"], w["z1"]), lib),
                                   {"A": x, "expert_ids": ids}, nbytes(1)),
        "MatMulExpertsUint4 fc2": (session(experts_op(w["w2"], w["s2"], w["z2"]), lib),
                                   {"A": x8, "expert_ids": ids}, nbytes(2)),
        "MatMulExpertsUint4 al4 fc1": (session(experts_op(w["w1"], w["s1"], w["z1"], 4), lib),
                                       {"A": x, "expert_ids": ids}, nbytes(1)),
        "MatMulExpertsUint4 al4 fc2": (session(experts_op(w["w2"], w["s2"], w["z2"], 4), lib),
                                       {"A": x8, "expert_ids": ids}, nbytes(2)),
    }
    for fc, k in ((1, h), (2, i)):
        b, s, z = chosen(fc, "w"), chosen(fc, "s"), chosen(fc, "z")
        xa = rng.standard_normal((1, k)).astype(np.float32)
        cases[f"MatMulNBits al4, fc{fc} rows of 8 experts"] = (session(dense("nbits", b, s, z, 4), None), {"A": xa},
                                                              nbytes(fc))
        cases[f"MatMulNBits al1, fc{fc} rows of 8 experts"] = (session(dense("nbits", b, s, z, 1), None), {"A": xa},
                                                              nbytes(fc))
        cases[f"MatMulUint4, fc{fc} rows of 8 experts"] = (session(dense("uint4", b, s, z), lib), {"A": xa},
                                                          nbytes(fc))
    times = {name: [] for name in cases}
    for name, (sess, feeds, _) in cases.items():
        for _ in range(3):
            sess.run(None, feeds)
    for _ in range(a.rounds):
        for name, (sess, feeds, _) in cases.items():
            t = time.process_time()
            for _ in range(a.reps):
                sess.run(None, feeds)
            times[name].append((time.process_time() - t) / a.reps * 1e3)
    print(f"E={e} hidden={h} inter={i} top-{TOP} block {BS}, M = 1, 1 thread, CPU ms per call "
          f"({a.rounds} rounds x {a.reps} calls)")
    print("| case | best ms | median ms | weight MB read | GB/s at best |")
    print("|---|---|---|---|---|")
    for name, (_, _, nb) in cases.items():
        best = min(times[name])
        print(f"| {name} | {best:.3f} | {statistics.median(times[name]):.3f} | {nb / 1e6:.2f} | "
              f"{nb / best / 1e6:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
