"""Run `-e rocm` outputs through MIGraphX's own ONNX parser and CPU `ref` target and compare with ONNX Runtime CPU.

    python tools/migraphx_ref_compare.py [--json OUT] [--recipes r1,r2,...] MODEL_DIR_OR_EXPORT ...
    python tools/migraphx_ref_compare.py --tiny [--json OUT]   # every scheme's tiny export (tests/quark_factory.py)

Needs the `migraphx` Python module (tools/migraphx_ref.sh builds it and puts it on PYTHONPATH). Each model is run
twice with identical inputs on both runtimes:
  prompt  input_ids [1, S] with an empty KV cache (past length 0)
  decode  one new token on the KV cache ORT CPU produced for the first S - 1 tokens (past length S - 1)
and the max |logit difference| is printed as a table row (a parse or compile error is reported in its place).
ORT CPU runs at graph optimization level basic, so its DQ(int8) -> MatMul -> MatMulNBits fusion (accuracy_level 4)
does not quantize activations (ort_facts.md); MIGraphX computes the same graph in fp32.
Output order: MIGraphX's parser returns the graph outputs in graph.output order (onnx_parser.cpp parse_graph,
`prog_output = graph.output()`), so outputs are matched by position.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
TINY_RECIPES = ("uint4_g64", "uint4_g32", "int4_per_channel", "int8_wo_g64", "int8_w8a8", "fp8_w8a8_kv",
                "fp8_w8a8_kv_attn", "ptpc_fp8", "uint4_g64_kv_attn", "mxfp4", "nvfp4")


def _ort_session(model: Path):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    return ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])


def _feeds(sess, ids: np.ndarray, past: dict | None) -> dict:
    total = ids.shape[1] + (next(iter(past.values())).shape[2] if past else 0)
    feeds = {"input_ids": ids.astype(np.int64), "attention_mask": np.ones((1, total), np.int64)}
    for inp in sess.get_inputs():
        if inp.name.startswith("past_key_values"):
            dtype = np.float16 if "float16" in inp.type else np.float32
            feeds[inp.name] = past[inp.name] if past else np.zeros((1, inp.shape[1], 0, inp.shape[3]), dtype)
    return feeds


def _migraphx_run(model: Path, feeds: dict, output_names: list[str]) -> dict:
    import migraphx
    dims = {k: list(v.shape) for k, v in feeds.items()}
    prog = migraphx.parse_onnx(str(model), map_input_dims=dims)
    prog.compile(migraphx.get_target("ref"))
    args = {k: migraphx.argument(np.ascontiguousarray(v)) for k, v in feeds.items()}
    results = prog.run(args)
    return {name: np.array(r) for name, r in zip(output_names, results)}


def compare(model_dir: Path, ids: np.ndarray) -> dict:
    model = model_dir / "model.onnx"
    sess = _ort_session(model)
    names = [o.name for o in sess.get_outputs()]
    row = {"model": str(model_dir)}
    # decode: KV cache of the first S - 1 tokens from ORT, then one token on both runtimes
    head = sess.run(None, _feeds(sess, ids[:, :-1], None))
    past = {n.replace("present", "past_key_values"): v for n, v in zip(names, head) if n.startswith("present")}
    for case, (case_ids, case_past) in {"prompt": (ids, None), "decode": (ids[:, -1:], past)}.items():
        feeds = _feeds(sess, case_ids, case_past)
        ort_logits = sess.run(["logits"], feeds)[0].astype(np.float32)
        try:
            mgx = _migraphx_run(model, feeds, names)
            row[case] = float(np.abs(mgx["logits"].astype(np.float32) - ort_logits).max())
        except Exception as e:  # noqa: BLE001 - the table reports what MIGraphX said
            row[case] = f"error: {str(e).splitlines()[0][:200]}"
    return row


def tiny_models(work: Path, recipes) -> list[tuple[str, Path, np.ndarray]]:
    """Convert each recipe's tiny export (made or reused through tests/quark_factory.py) with -e rocm -p fp32."""
    sys.path.insert(0, str(REPO / "tests"))
    sys.path.insert(0, str(REPO))
    from conftest import fixture_cache_dir
    from quark_factory import RECIPES, SHAPES, ensure_exports

    from builder.convert import convert
    items = [(SHAPES["llama_h64"], RECIPES[r]) for r in recipes]
    out = []
    for recipe, export in zip(recipes, ensure_exports(fixture_cache_dir(), items)):
        dest = work / recipe
        convert(export / "quark", dest, "rocm", "fp32", log=lambda _m: None)
        out.append((recipe, dest, np.load(export / "reference.npz")["input_ids"]))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", type=Path, help="converted model folders (fp32 -e rocm outputs)")
    ap.add_argument("--tiny", action="store_true", help="convert and compare every scheme's tiny export")
    ap.add_argument("--recipes", default=",".join(TINY_RECIPES))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    try:
        import migraphx  # noqa: F401
    except ImportError as e:
        print(f"error: the migraphx Python module is not importable ({e}); build it with tools/migraphx_ref.sh",
              file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        models = tiny_models(Path(tmp), args.recipes.split(",")) if args.tiny else []
        ids = np.array([[1, 5, 9, 13, 17, 21, 25, 29]], np.int64)
        models += [(p.name, p, ids) for p in args.models]
        print(f"| model | prompt max abs logit diff | decode max abs logit diff |\n|---|---|---|")
        for name, path, model_ids in models:
            row = compare(path, model_ids)
            row["name"] = name
            rows.append(row)
            fmt = [f"{v:.1e}" if isinstance(v, float) else v for v in (row["prompt"], row["decode"])]
            print(f"| {name} | {fmt[0]} | {fmt[1]} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
