"""Every intermediate tensor of a converted model's forward pass, saved per CPU, to find the first ONNX node whose
output depends on the instruction set (issue 21; docs/real_model_numerics.md).

    python tools/isa_op_diff.py dump ONNX_DIR EXPORT_DIR OUT.npz [--tokens N] [--threads N]   # natively
    qemu-x86_64 -cpu Haswell $(which python) tools/isa_op_diff.py dump ... OUT_HSW.npz  # AVX2 + FMA (QEMU TCG)
    # (on an Intel host: python tools/qemu_user.py Haswell tools/isa_op_diff.py dump ...; tools/qemu_fma_shim.c)
    python tools/isa_op_diff.py diff A.npz B.npz [--all]     # the first differing node, in topological order

dump: a plain ONNX Runtime session (no onnxruntime-genai) on ONNX_DIR/model.onnx with the custom-op library and
session options of its genai_config.json, fed the first N tokens (default 16) of the export's reference.npz
eval_ids as one prefill (empty KV cache). The graph is first optimized by ORT on this CPU (the same optimization
level as the real session, written to a temporary model file), because ORT's rewrites can depend on the CPU (e.g.
QDQS8ToU8Transformer runs only where int8 Q/DQ is not "allowed"): the optimized graph is what runs. That graph is then
run unoptimized with every node output added as a graph output, so each node computes what it computes in the
optimized session. Saved: each tensor (t0, t1, ...), its name, its node's name and op type, in topological order, and
the optimized graph's op list.

diff: the optimized graphs' op lists (a difference there is itself the answer), then per node in A's order the
largest |difference| of its outputs against B's tensor of the same name: the first node whose output differs while
all its inputs agree is the op whose result depends on the instruction set.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _session_options(onnx_dir: Path, threads: int):
    """ORT SessionOptions as genai_config.json's session_options set them (library, optimization level)."""
    import onnxruntime as ort

    cfg = json.loads((onnx_dir / "genai_config.json").read_text())["model"]["decoder"]
    opts = cfg.get("session_options", {})
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads  # 0: ORT's default (one per core), as onnxruntime-genai leaves it
    lib = opts.get("custom_ops_library")
    if lib:
        so.register_custom_ops_library(str((onnx_dir / lib) if not Path(lib).is_absolute() else lib))
    level = opts.get("graph_optimization_level", "ORT_ENABLE_ALL")
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    for key, value in (opts.get("config_entries") or {}).items():
        so.add_session_config_entry(key, str(value))
    return so, cfg


def _feeds(model, ids: np.ndarray) -> dict:
    """Prefill inputs: the tokens, an all-ones mask, positions 0..T-1, an empty KV cache."""
    from onnx import helper

    t = ids.size
    feeds = {}
    for inp in model.graph.input:
        dtype = helper.tensor_dtype_to_np_dtype(inp.type.tensor_type.elem_type)
        dims = [d.dim_value if d.HasField("dim_value") else None for d in inp.type.tensor_type.shape.dim]
        name = inp.name
        if name == "input_ids":
            feeds[name] = ids.reshape(1, t).astype(dtype)
        elif name == "attention_mask":
            feeds[name] = np.ones((1, t), dtype)
        elif name == "position_ids":
            feeds[name] = np.arange(t, dtype=dtype).reshape(1, t)
        elif name.startswith("past_key_values"):
            shape = [1, dims[1], 0, dims[3]]
            feeds[name] = np.zeros(shape, dtype)
        else:
            raise SystemExit(f"isa_op_diff: no feed rule for graph input {name!r} {dims}")
    return feeds


def dump(onnx_dir: str, export_dir: str, out: str, tokens: int, threads: int) -> None:
    import onnx
    import onnxruntime as ort

    onnx_dir_p = Path(onnx_dir)
    ids = np.load(Path(export_dir) / "reference.npz")["eval_ids"].reshape(-1)[:tokens]
    so, cfg = _session_options(onnx_dir_p, threads)
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        opt_path = str(Path(tmp) / "optimized.onnx")
        so.optimized_model_filepath = opt_path
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name", "optimized.onnx.data")
        so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        ort.InferenceSession(str(onnx_dir_p / cfg["filename"]), so, providers=["CPUExecutionProvider"])
        model = onnx.load(opt_path)
    graph_out = {o.name for o in model.graph.output}
    order = []  # (node name, op type, output names) in the graph's (topological) order
    for node in model.graph.node:
        outs = [o for o in node.output if o]
        order.append((node.name, node.op_type, outs))
        for o in outs:
            if o not in graph_out:
                model.graph.output.append(onnx.ValueInfoProto(name=o))
                graph_out.add(o)
    so2, _ = _session_options(onnx_dir_p, threads)
    so2.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "all_outputs.onnx")
        onnx.save(model, path, save_as_external_data=True, location="all_outputs.onnx.data")
        sess = ort.InferenceSession(path, so2, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    values = sess.run(names, _feeds(model, ids))
    res = {f"t{i}": v for i, v in enumerate(values)}
    res["names"] = np.array(names)
    res["order"] = np.array(json.dumps(order))
    np.savez(out, **res)
    print(f"{out}: {len(names)} tensors, {len(order)} nodes, {ids.size} tokens, {time.time() - t0:.1f}s", flush=True)


def _load(path: str):
    z = np.load(path)
    names = [str(n) for n in z["names"]]
    return {n: z[f"t{i}"] for i, n in enumerate(names)}, json.loads(str(z["order"]))


def _max_diff(a: np.ndarray, b: np.ndarray) -> float | None:
    if a.shape != b.shape:
        return None
    if a.dtype.kind == "f" or a.dtype.kind == "V" or str(a.dtype).startswith("float8"):
        a, b = a.astype(np.float64), b.astype(np.float64)
    else:
        a, b = a.astype(np.int64), b.astype(np.int64)
    same = (a == b) | (np.isnan(a) & np.isnan(b)) if a.dtype.kind == "f" else (a == b)
    return 0.0 if same.all() else float(np.nanmax(np.abs(a - b)))


def diff(pa: str, pb: str, show_all: bool) -> int:
    ta, order_a = _load(pa)
    tb, order_b = _load(pb)
    ops_a, ops_b = [(n, op) for n, op, _ in order_a], [(n, op) for n, op, _ in order_b]
    if ops_a != ops_b:
        only_a = sorted(set(ops_a) - set(ops_b))
        only_b = sorted(set(ops_b) - set(ops_a))
        print(f"optimized graphs differ: {len(only_a)} nodes only in A (e.g. {only_a[:5]}), {len(only_b)} only in B "
              f"(e.g. {only_b[:5]})")
    else:
        print(f"optimized graphs: the same {len(ops_a)} nodes")
    first = None
    n_diff = 0
    for name, op, outs in order_a:
        diffs = [(o, _max_diff(ta[o], tb[o])) for o in outs if o in ta and o in tb]
        bad = [(o, d) for o, d in diffs if d is None or d > 0]
        if bad:
            n_diff += 1
            if first is None or show_all:
                print(f"{'FIRST ' if first is None else ''}differs: {op} {name}: "
                      + ", ".join(f"{o} max |diff| {d if d is not None else 'shape'}" for o, d in bad))
            first = first or name
    print(f"{n_diff} of {len(order_a)} nodes differ" + ("" if first else ": none"))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("onnx_dir")
    d.add_argument("export_dir")
    d.add_argument("out")
    d.add_argument("--tokens", type=int, default=16)
    d.add_argument("--threads", type=int, default=0, help="ORT intra-op threads (0: ORT's default)")
    c = sub.add_parser("diff")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--all", action="store_true", help="every differing node, not only the first")
    args = ap.parse_args(argv)
    if args.cmd == "dump":
        dump(args.onnx_dir, args.export_dir, args.out, args.tokens, args.threads)
        return 0
    return diff(args.a, args.b, args.all)


if __name__ == "__main__":
    sys.exit(main())
