"""Where one og-style step of a converted model spends its time, per op type, from ORT's own profiler
(SessionOptions.enable_profiling; the library shipped next to the model is registered when present).

    python benchmarks/ort_node_profile.py MODEL_DIR [--threads 1] [--past 128] [--prefill 0] [--runs 12]

Decode (default): one new token on `--past` cached positions (random KV cache); `--prefill N`: one N-token prompt on
an empty cache. Prints the median model_run time and each op type's time per run (sum over its nodes, wall clock as
ORT records it; on a shared machine compare shares within one run, not absolute times).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import tempfile

import numpy as np
import onnxruntime as ort


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--past", type=int, default=128)
    ap.add_argument("--prefill", type=int, default=0)
    ap.add_argument("--runs", type=int, default=12)
    a = ap.parse_args(argv)
    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "profile")
    so.intra_op_num_threads = a.threads
    library = os.path.join(a.model_dir, "libquark_onnx_ops.so")
    if os.path.exists(library):
        so.register_custom_ops_library(library)
    sess = ort.InferenceSession(os.path.join(a.model_dir, "model.onnx"), so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    new, past = (a.prefill, 0) if a.prefill else (1, a.past)
    feeds = {"input_ids": rng.integers(3, 1000, (1, new)).astype(np.int64),
             "attention_mask": np.ones((1, past + new), np.int64)}
    for i in sess.get_inputs():
        if i.name.startswith("past"):
            heads, dim = i.shape[1], i.shape[3]
            feeds[i.name] = (rng.standard_normal((1, heads, past, dim)) * 0.1).astype(np.float32)
        elif i.name in feeds and i.type == "tensor(int32)":
            feeds[i.name] = feeds[i.name].astype(np.int32)
    for _ in range(a.runs):
        sess.run(None, feeds)
    events = json.load(open(sess.end_profiling()))
    per_op, nodes, runs = collections.Counter(), collections.Counter(), []
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per_op[e["args"]["op_name"]] += e["dur"]
            nodes[e["args"]["op_name"]] += 1
        elif e.get("name") == "model_run":
            runs.append(e["dur"])
    runs = runs[-a.runs:]
    total = sum(per_op.values())
    print(f"{a.model_dir}: {'prefill %d' % a.prefill if a.prefill else 'decode, %d cached' % a.past}, "
          f"{a.threads} thread(s), load {os.getloadavg()[0]:.1f}; model_run median {sorted(runs)[len(runs) // 2] / 1e3:.1f} ms")
    for op, t in per_op.most_common():
        print(f"  {op:36s} {t / a.runs / 1e3:9.2f} ms/run  {100 * t / total:5.1f} %  ({nodes[op] // a.runs} nodes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
