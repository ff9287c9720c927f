"""One MatMulExpertsMxfp4 node (T = 1 token, k of E experts chosen at random) against one MatMulMxfp4 node over the
same number of weight bytes (the k experts' rows stacked into one [k * N, K] weight): the kernel's own overhead for
routing, per-expert dispatch and reading experts spread over a large stack. ORT CPU session, best of --repeats,
interleaved, 1 and 2 intra-op threads.

    python benchmarks/matmul_experts_cpu.py [--experts 128] [--top_k 8] [--n 768] [--k 2048] [--repeats 40]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from custom_ops import ort_library  # noqa: E402
from custom_ops.single_op import session  # noqa: E402
from test_matmul_experts import _init, dense_model, experts_model  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--top_k", type=int, default=8)
    ap.add_argument("--n", type=int, default=768)
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=40)
    a = ap.parse_args()
    lib = str(ort_library.build(log=lambda m: None))
    rng = np.random.default_rng(0)
    e, top, n, k = a.experts, a.top_k, a.n, a.k
    b = rng.integers(0, 256, (e, n, k // 2), dtype=np.uint8)
    s = rng.integers(118, 123, (e, n, k // 32), dtype=np.uint8)
    m_op = experts_model("Mxfp4", {"B": _init("B", b), "B_scale": _init("B_scale", s)})
    m_dense = dense_model("Mxfp4", {"B": _init("B", b[:top].reshape(top * n, k // 2)),
                                    "B_scale": _init("B_scale", s[:top].reshape(top * n, k // 32))},
                          {"K": k, "N": top * n})
    mb = top * n * k * (0.5 + 1 / 32) / 1e6
    print(f"E {e}, top-{top}, N {n}, K {k}: {mb:.1f} MB of MXFP4 weight per call")
    for threads in (1, 2):
        s_op, s_dense = session(m_op, library=lib, threads=threads), session(m_dense, library=lib, threads=threads)
        a_row = rng.standard_normal((1, k)).astype(np.float32)
        best = {"MatMulExpertsMxfp4": float("inf"), "MatMulMxfp4 (same bytes)": float("inf")}
        for _ in range(a.repeats):
            ids = rng.choice(e, top, replace=False).reshape(1, top).astype(np.int64)
            t = time.perf_counter()
            s_op.run(None, {"A": a_row, "expert_ids": ids})
            best["MatMulExpertsMxfp4"] = min(best["MatMulExpertsMxfp4"], time.perf_counter() - t)
            t = time.perf_counter()
            s_dense.run(None, {"A": a_row})
            best["MatMulMxfp4 (same bytes)"] = min(best["MatMulMxfp4 (same bytes)"], time.perf_counter() - t)
        print(f"threads {threads}: " + ", ".join(f"{name} {v * 1e3:.2f} ms ({mb / v / 1e3:.1f} GB/s)"
                                                 for name, v in best.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
