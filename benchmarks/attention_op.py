"""One attention node on ORT's CPU EP: com.quark_onnx GroupQueryAttentionFixedOrder (our kernel, the cpu default)
against com.microsoft GroupQueryAttention, the same inputs, interleaved, best of --rounds. Not a test.

    python benchmarks/attention_op.py [--heads 9 --kv_heads 3 --head_dim 64] [--prompt 128,512,2048] [--threads 2]

Per prompt length: the prompt (S tokens, empty cache), then one decode step against that cache (non-shared
buffers, as a plain ORT session binds them). The default shape is SmolLM2-135M's; Llama-3.1-8B's is
--heads 32 --kv_heads 8 --head_dim 128.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

NAMES = ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache",
         "sin_cache"]


def session(op: str, domain: str, heads: int, kv_heads: int, head_dim: int, threads: int, library: str | None):
    import onnxruntime as ort
    from onnx import TensorProto, helper
    attrs = dict(num_heads=heads, kv_num_heads=kv_heads, scale=head_dim ** -0.5, local_window_size=-1)
    if op == "GroupQueryAttention":
        attrs.update(do_rotary=1, rotary_interleaved=0)
    node = helper.make_node(op, NAMES, ["out", "present_key", "present_value"], domain=domain, **attrs)
    ints = ("seqlens_k", "total_sequence_length")
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT32 if n in ints else TensorProto.FLOAT, None)
              for n in NAMES]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("out", "present_key", "present_value")]
    functions = []
    if domain != "com.microsoft":
        from custom_ops.functions import FUNCTIONS
        functions = [FUNCTIONS[op](21)]
    model = helper.make_model(helper.make_graph([node], "attention", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(domain, 1)],
                              functions=functions)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    if library:
        so.register_custom_ops_library(library)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv_heads", type=int, default=3)
    ap.add_argument("--head_dim", type=int, default=64)
    ap.add_argument("--prompt", default="128,512,2048")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args(argv)
    from custom_ops import ort_library
    library = str(ort_library.build(fetch=True, log=lambda m: None))
    h, hkv, d = a.heads, a.kv_heads, a.head_dim
    forms = {"fixed-order (ours)": session("GroupQueryAttentionFixedOrder", "com.quark_onnx", h, hkv, d, a.threads,
                                           library),
             "GroupQueryAttention": session("GroupQueryAttention", "com.microsoft", h, hkv, d, a.threads, None)}
    print(f"H {h}, Hkv {hkv}, D {d}, {a.threads} threads, best of {a.rounds}")
    print("| prompt | form | prompt ms | decode step ms |")
    print("|---|---|---|---|")
    for s in (int(x) for x in a.prompt.split(",")):
        rng = np.random.default_rng(s)
        inv = 1.0 / 10000.0 ** (np.arange(0, d, 2) / d)
        angles = np.outer(np.arange(s + 8), inv)
        cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
        q, k, v = (rng.standard_normal((1, s, n * d)).astype(np.float32) for n in (h, hkv, hkv))
        empty = np.zeros((1, hkv, 0, d), np.float32)
        prompt = [q, k, v, empty, empty, np.array([s - 1], np.int32), np.array(s, np.int32), cos, sin]
        best = {name: [1e9, 1e9] for name in forms}
        for _ in range(a.rounds):
            for name, sess in forms.items():
                t0 = time.perf_counter()
                _, pk, pv = sess.run(None, dict(zip(NAMES, prompt)))
                t1 = time.perf_counter()
                step = [x[:, :1] for x in (q, k, v)] + [pk, pv, np.array([s], np.int32), np.array(s + 1, np.int32),
                                                        cos, sin]
                t2 = time.perf_counter()
                sess.run(None, dict(zip(NAMES, step)))
                t3 = time.perf_counter()
                best[name] = [min(best[name][0], t1 - t0), min(best[name][1], t3 - t2)]
        for name, (p, dec) in best.items():
            print(f"| {s} | {name} | {p * 1e3:.2f} | {dec * 1e3:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
