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


# MIGraphX's GroupQueryAttention is the shared-buffer form only (src/onnx/parse_group_query_attention.cpp: present
# = concat_past_present(new, seqlens_k, past), whose shape is past's; src/include/migraphx/op/concat_past_present.hpp
# writes the new K/V at row seqlens_k of that buffer, at row 0 for a prompt). genai feeds it that way when the
# genai_config says past_present_share_buffer (a [1, kv, max_length, hd] buffer, attention_mask [1, total]); a
# growing past (length 0 for the prompt, S - 1 then) would make MIGraphX write outside the buffer. So the feeds
# follow the model's genai_config, as genai does: a BUFFER-row buffer when shared, a growing past otherwise.
BUFFER = 16  # > the 8-token prompt, so rows past the total length are masked on both runtimes


def _kv_inputs(sess) -> list:
    return [i for i in sess.get_inputs() if i.name.startswith("past_key_values")]


def _empty_past(sess, shared: bool) -> dict:
    return {i.name: np.zeros((1, i.shape[1], BUFFER if shared else 0, i.shape[3]),
                             np.float16 if "float16" in i.type else np.float32) for i in _kv_inputs(sess)}


def _feeds(ids: np.ndarray, past: dict, past_len: int) -> dict:
    total = past_len + ids.shape[1]
    return {"input_ids": ids.astype(np.int64), "attention_mask": np.ones((1, total), np.int64), **past}


def _migraphx_run(model: Path, feeds: dict, output_names: list[str]) -> dict:
    """parse_onnx + compile for `ref` + run; an exception says which stage failed."""
    import migraphx
    stage = "parse"
    try:
        prog = migraphx.parse_onnx(str(model), map_input_dims={k: list(v.shape) for k, v in feeds.items()})
        stage = "compile"
        prog.compile(migraphx.get_target("ref"))
        stage = "run"
        results = prog.run({k: migraphx.argument(np.ascontiguousarray(v)) for k, v in feeds.items()})
        return {name: np.array(r) for name, r in zip(output_names, results)}
    except Exception as e:  # noqa: BLE001 - re-raised with the stage named
        raise MigraphxError(stage, str(e)) from e


class MigraphxError(Exception):
    def __init__(self, stage: str, message: str):
        super().__init__(f"{stage}: {message}")
        self.stage = stage


def compare(model_dir: Path, ids: np.ndarray) -> dict:
    model = model_dir / "model.onnx"
    genai = json.loads((model_dir / "genai_config.json").read_text())
    shared = bool(genai["search"].get("past_present_share_buffer", False))
    sess = _ort_session(model)
    names = [o.name for o in sess.get_outputs()]
    row = {"model": str(model_dir), "share_buffer": shared, "parses": None}
    # decode: KV cache of the first S - 1 tokens from ORT, then one token on both runtimes
    head = dict(zip(names, sess.run(None, _feeds(ids[:, :-1], _empty_past(sess, shared), 0))))
    past = {n.replace("present", "past_key_values"): v for n, v in head.items() if n.startswith("present")}
    cases = {"prompt": _feeds(ids, _empty_past(sess, shared), 0),
             "decode": _feeds(ids[:, -1:], past, ids.shape[1] - 1)}
    for case, feeds in cases.items():
        ort_logits = sess.run(["logits"], feeds)[0].astype(np.float32)
        try:
            mgx = _migraphx_run(model, feeds, names)
            row[case] = float(np.abs(mgx["logits"].astype(np.float32) - ort_logits).max())
            row["parses"] = True
        except MigraphxError as e:
            row[case] = f"{e.stage} error: {str(e).split(': ', 1)[1].strip().splitlines()[0][:300]}"
            row["parses"] = row["parses"] or e.stage != "parse"
    return row


# (shape, recipe) beyond the llama_h64 recipes: one export per MoE / MLA family already made by the family tests
FAMILY_CASES = (("mixtral", "uint4_g32"), ("mixtral", "mxfp4"), ("mixtral", "fp8_w8a8"),
                ("qwen3_moe", "mxfp4"), ("qwen3_moe", "fp8_w8a8_kv"), ("qwen3_moe", "ptpc_fp8"),
                ("qwen2_moe", "mxfp4"),
                ("deepseek_v3", "uint4_g32"), ("deepseek_v3", "fp8_w8a8_kv"), ("deepseek_v3", "mxfp4_attn_kv"),
                ("gpt_oss", "uint4_g32"), ("gpt_oss", "mxfp4"))


def tiny_models(work: Path, cases) -> list[tuple[str, Path | str, np.ndarray | None]]:
    """Convert each (shape, recipe) tiny export (made or reused through tests/quark_factory.py) with -e rocm -p fp32;
    a conversion the builder refuses is returned as its message instead of a folder."""
    sys.path.insert(0, str(REPO / "tests"))
    sys.path.insert(0, str(REPO))
    from conftest import fixture_cache_dir
    from quark_factory import RECIPES, SHAPES, ensure_exports

    from builder.convert import convert
    from builder.errors import ConversionError
    items = [(SHAPES[shape], RECIPES[recipe]) for shape, recipe in cases]
    out = []
    for (shape, recipe), export in zip(cases, ensure_exports(fixture_cache_dir(), items)):
        name = recipe if shape == "llama_h64" else f"{shape} {recipe}"
        dest = work / f"{shape}-{recipe}"
        try:
            convert(export / "quark", dest, "rocm", "fp32", log=lambda _m: None)
        except ConversionError as e:
            out.append((name, f"refused by -e rocm: {str(e).splitlines()[0][:300]}", None))
            continue
        out.append((name, dest, np.load(export / "reference.npz")["input_ids"]))
    return out


def _cell(v) -> str:
    return f"{v:.1e}" if isinstance(v, float) else str(v)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", type=Path, help="converted model folders (fp32 -e rocm outputs)")
    ap.add_argument("--tiny", action="store_true", help="convert and compare every scheme's tiny export")
    ap.add_argument("--recipes", default=",".join(TINY_RECIPES), help="llama_h64 recipes for --tiny")
    ap.add_argument("--families", default=",".join(f"{s}:{r}" for s, r in FAMILY_CASES),
                    help="shape:recipe pairs for --tiny beyond llama_h64 ('' for none)")
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
        cases = [("llama_h64", r) for r in args.recipes.split(",") if r]
        cases += [tuple(c.split(":", 1)) for c in args.families.split(",") if c]
        models = tiny_models(Path(tmp), cases) if args.tiny else []
        ids = np.array([[1, 5, 9, 13, 17, 21, 25, 29]], np.int64)
        models += [(p.name, p, ids) for p in args.models]
        print("| model | parses | prompt max abs logit diff | decode max abs logit diff |\n|---|---|---|---|")
        for name, path, model_ids in models:
            if isinstance(path, str):  # refused by the builder
                row = {"name": name, "refused": path, "parses": None, "prompt": path, "decode": path}
                print(f"| {name} | - | {path} | |", flush=True)
            else:
                row = compare(path, model_ids)
                row["name"] = name
                parses = {True: "yes", False: "no", None: "?"}[row["parses"]]
                print(f"| {name} | {parses} | {_cell(row['prompt'])} | {_cell(row['decode'])} |", flush=True)
            rows.append(row)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
