"""Run `-e rocm` outputs through MIGraphX's own ONNX parser and CPU `ref` target and compare with ONNX Runtime CPU.

    python tools/migraphx_ref_compare.py [--json OUT] [--recipes r1,r2,...] MODEL_DIR_OR_EXPORT ...
    python tools/migraphx_ref_compare.py --tiny [--json OUT]   # every scheme's tiny export (tests/quark_factory.py)

Needs the `migraphx` Python module (tools/migraphx_ref.sh builds it and puts it on PYTHONPATH). Each model is run
as onnxruntime-genai runs it, on both runtimes side by side:
  prompt  input_ids [1, S] with an empty KV cache (past length 0)
  decode  --decode-steps tokens, one at a time, each runtime fed back ITS OWN present KV as the next step's past
          (past lengths S, S + 1, ...); both get the same token, ORT CPU's greedy choice
and the max |logit difference| (prompt; worst decode step) is printed as a table row (a parse or compile error is
reported in its place). MIGraphX compiles per input shape (the MIGraphX EP does the same), so each step is parsed
and compiled again with that step's shapes.
--eps rocm,migraphx converts each export for both EPs; where the two graphs are byte-identical the second row
repeats the first's figures (`same_graph_as`).
--ort-extra_options KEY=VALUE ...: ORT CPU runs the same export converted with THESE options instead (e.g. none for
the default forms while --extra_options amd_arch=gfx950 builds the float4e2m1 graph ORT CPU has no kernel for); each
row then also gives both runtimes' prompt logits against Quark's own (reference.npz `logits`, tests/quark_factory.py).
ORT CPU runs at graph optimization level basic, so its DQ(int8) -> MatMul -> MatMulNBits fusion (accuracy_level 4)
does not quantize activations (ort_facts.md); MIGraphX computes the same graph in fp32.
Output order: MIGraphX's parser returns the graph outputs in graph.output order (onnx_parser.cpp parse_graph,
`prog_output = graph.output()`), so outputs are matched by position.
"""
from __future__ import annotations

import argparse
import hashlib
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


DECODE_STEPS = 3


def compare(model_dir: Path, ids: np.ndarray, decode_steps: int = DECODE_STEPS, ort_dir: Path | None = None,
            quark_logits: np.ndarray | None = None) -> dict:
    """MIGraphX ref on model_dir vs ORT CPU on ort_dir (default: the same graph); with quark_logits (Quark's prompt
    logits for ids), both runtimes' prompt logits against them too (`quark_prompt`, `ort_quark_prompt`)."""
    model = model_dir / "model.onnx"
    genai = json.loads((model_dir / "genai_config.json").read_text())
    shared = bool(genai["search"].get("past_present_share_buffer", False))
    if ort_dir is not None:
        ort_genai = json.loads((ort_dir / "genai_config.json").read_text())
        if bool(ort_genai["search"].get("past_present_share_buffer", False)) != shared:
            raise ValueError(f"{ort_dir} and {model_dir} feed their caches differently (past_present_share_buffer)")
    if shared and ids.shape[1] + decode_steps > BUFFER:
        raise ValueError(f"{ids.shape[1]} + {decode_steps} tokens do not fit the {BUFFER}-row shared buffer")
    sess = _ort_session((ort_dir or model_dir) / "model.onnx")
    names = [o.name for o in sess.get_outputs()]
    row = {"model": model_dir.name, "share_buffer": shared, "parses": None, "decode_steps": []}

    def presents(out: dict) -> dict:
        return {n.replace("present", "past_key_values"): v for n, v in out.items() if n.startswith("present")}

    ort_feeds = mgx_feeds = _feeds(ids, _empty_past(sess, shared), 0)
    past_len, tok = 0, ids
    for step in range(decode_steps + 1):
        ort_out = dict(zip(names, sess.run(None, ort_feeds)))
        try:
            mgx_out = _migraphx_run(model, mgx_feeds, names)
        except MigraphxError as e:
            msg = f"{e.stage} error: {str(e).split(': ', 1)[1].strip().splitlines()[0][:300]}"
            row["parses"] = row["parses"] or e.stage != "parse"
            row["prompt" if step == 0 else "decode"] = msg
            if step == 0:
                row["decode"] = msg
            break
        row["parses"] = True
        diff = float(np.abs(mgx_out["logits"].astype(np.float32)
                            - ort_out["logits"].astype(np.float32)).max())
        if step == 0:
            row["prompt"] = diff
            if quark_logits is not None:
                for key, out in (("quark_prompt", mgx_out), ("ort_quark_prompt", ort_out)):
                    row[key] = float(np.abs(out["logits"].astype(np.float32) - quark_logits).max())
        else:
            row["decode_steps"].append(diff)
            row["decode"] = max(row["decode_steps"])
        past_len += tok.shape[1]
        tok = np.array([[int(ort_out["logits"][0, -1].argmax())]], np.int64)
        ort_feeds = _feeds(tok, presents(ort_out), past_len)
        mgx_feeds = _feeds(tok, {k: v.astype(ort_feeds[k].dtype) for k, v in presents(mgx_out).items()}, past_len)
    row.setdefault("decode", "-")  # --decode-steps 0
    return row


def _graph_digest(folder: Path) -> str:
    """The model's graph and external data, without its metadata_props (which name the EP) and genai_config.json."""
    import onnx
    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    del model.metadata_props[:]
    h = hashlib.sha256(model.SerializeToString(deterministic=True))
    for f in sorted(folder.glob("*.data")):
        h.update(f.read_bytes())
    return h.hexdigest()


# (shape, recipe) beyond the llama_h64 recipes: every MoE family x expert scheme of docs/moe.md's table (routed
# standard-op form; the 8-token prompt takes its every-expert If branch, since 8 > E/k, and each decoded token the
# routed Gather branch), plus the KV-cache / attention variants the family tests make. gpt-oss: the explicit sink
# attention subgraph (builder/ops/sink_attention.py) with a growing cache.
sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "tests")]
from quark_factory import MOE_TABLE  # noqa: E402  (light: Quark and transformers are imported lazily there)

FAMILY_CASES = tuple((f, r) for f, rs in MOE_TABLE.items() for r in rs) + (
    ("qwen3_moe", "fp8_w8a8_kv"), ("qwen3_moe", "ptpc_fp8"), ("deepseek_v3", "fp8_w8a8_kv"),
    ("deepseek_v3", "mxfp4_attn_kv"), ("gpt_oss_yarn", "mxfp4"))


def tiny_models(work: Path, cases, eps=("rocm",), extra: tuple[str, ...] = (), ort_extra: tuple[str, ...] | None = None
                ) -> list[tuple]:
    """Convert each (shape, recipe) tiny export (made or reused through tests/quark_factory.py) with -e EP -p fp32
    (and these --extra_options); a conversion the builder refuses is returned as its message instead of a folder.
    Rows are named as before for -e rocm ("recipe" for llama_h64, "shape recipe" otherwise), "... [EP]" else.
    With ort_extra (a tuple, maybe empty), each export is also converted with those options for ORT CPU: rows are
    then (name, folder, ids, ORT folder, Quark's prompt logits); else (name, folder, ids)."""
    sys.path.insert(0, str(REPO / "tests"))
    sys.path.insert(0, str(REPO))
    from conftest import fixture_cache_dir
    from quark_factory import RECIPES, SHAPES, ensure_exports

    from builder.convert import convert
    from builder.errors import ConversionError
    from builder.options import parse_extra_options
    items = [(SHAPES[shape], RECIPES[recipe]) for shape, recipe in cases]
    out = []
    cache = fixture_cache_dir()
    for (shape, recipe), export in zip(cases, ensure_exports(cache, items)):
        for ep in eps:
            name = recipe if shape == "llama_h64" else f"{shape} {recipe}"
            name += "" if ep == "rocm" else f" [{ep}]"
            dest = work / f"{shape}-{recipe}-{ep}"
            try:
                convert(export / "quark", dest, ep, "fp32", parse_extra_options(list(extra)) if extra else None,
                        log=lambda _m: None, warn=lambda _m: None)
                if ort_extra is not None:
                    convert(export / "quark", work / f"{shape}-{recipe}-{ep}-ort", ep, "fp32",
                            parse_extra_options(list(ort_extra)) if ort_extra else None, log=lambda _m: None,
                            warn=lambda _m: None)
            except ConversionError as e:
                # the cache's own path is this machine's: the report names it as $QO_FIXTURE_CACHE
                reason = str(e).splitlines()[0].replace(str(cache), "$QO_FIXTURE_CACHE")[:300]
                out.append((name, f"refused by -e {ep}: {reason}", None))
                continue
            ref = np.load(export / "reference.npz")
            out.append((name, dest, ref["input_ids"]) if ort_extra is None else
                       (name, dest, ref["input_ids"], work / f"{shape}-{recipe}-{ep}-ort", ref["logits"]))
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
    ap.add_argument("--eps", default="rocm", help="EPs to convert for with --tiny (rocm,migraphx)")
    ap.add_argument("--extra_options", nargs="*", default=[], help="KEY=VALUE conversion options for --tiny")
    ap.add_argument("--ort-extra_options", nargs="*", default=None, metavar="KEY=VALUE",
                    help="with --tiny: ORT CPU runs the export converted with these options instead (none: the "
                         "defaults), and both runtimes are compared with Quark's prompt logits too")
    ap.add_argument("--decode-steps", type=int, default=DECODE_STEPS,
                    help="decoded tokens after the prompt, each runtime fed back its own KV cache")
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
        ort_extra = None if args.ort_extra_options is None else tuple(args.ort_extra_options)
        models = tiny_models(Path(tmp), cases, tuple(args.eps.split(",")), tuple(args.extra_options), ort_extra) \
            if args.tiny else []
        ids = np.array([[1, 5, 9, 13, 17, 21, 25, 29]], np.int64)
        models += [(p.name, p, ids) for p in args.models]
        quark_cols = ort_extra is not None
        print(f"| model | parses | prompt max abs logit diff | decode ({args.decode_steps} steps, own cache) max abs "
              "logit diff |" + (" MIGraphX vs Quark (prompt) | ORT vs Quark (prompt) |" if quark_cols else "")
              + "\n|---|---|---|---|" + ("---|---|" if quark_cols else ""))
        done: dict[str, dict] = {}  # graph digest -> its row
        for name, path, model_ids, *ort_side in models:
            if isinstance(path, str):  # refused by the builder
                row = {"name": name, "refused": path, "parses": None, "prompt": path, "decode": path}
                print(f"| {name} | - | {path} | |", flush=True)
                rows.append(row)
                continue
            digest = _graph_digest(path) + (_graph_digest(ort_side[0]) if ort_side else "")
            if digest in done:
                row = {**done[digest], "name": name, "model": path.name, "same_graph_as": done[digest]["name"]}
            else:
                row = compare(path, model_ids, args.decode_steps, *ort_side)
                row["name"] = name
                done[digest] = row
            parses = {True: "yes", False: "no", None: "?"}[row["parses"]]
            same = f" (graph = {row['same_graph_as']})" if "same_graph_as" in row else ""
            quark = (f" {_cell(row.get('quark_prompt', '-'))} | {_cell(row.get('ort_quark_prompt', '-'))} |"
                     if quark_cols else "")
            print(f"| {name}{same} | {parses} | {_cell(row['prompt'])} | {_cell(row['decode'])} |{quark}", flush=True)
            rows.append(row)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
