"""The MoE table of docs/moe.md, measured: per family x expert scheme x EP, the form the converter picks by default,
the expert bytes a decoded token reads (from the graph), and the max logit difference against Quark's model on the
tiny test exports, the ONNX graph run on ORT CPU (fp32 builds of what each EP gets).

    QO_FIXTURE_CACHE=... python benchmarks/moe_forms_table.py [--eps cpu,cuda,migraphx] [--families ...]
                                                              [--recipes nvfp4,int8_w8a8]

Bytes per decoded token, per sparse layer: routed standard-op form: bytes of the Gathered stacked initializers x k/E
(builder/ops/routed_experts.gathered_bytes_per_token); QMoE: its expert initializers x k/E; dense: every expert
initializer (names holding ".experts."). Logit diff: the prompt (8 tokens) through the routed branch
(moe_routed_tokens=64) and through the default threshold (every-expert branch for 8 > E/k tokens).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from quark_factory import MOE_TABLE as CASES  # noqa: E402  (docs/moe.md's family x scheme table)

TOP_K_E = {"qwen3_moe": (2, 8), "qwen2_moe": (2, 8), "mixtral": (2, 4), "gpt_oss": (2, 4), "deepseek_v3": (3, 8)}


def _nbytes(t) -> int:
    return int(np.prod(t.dims, dtype=np.int64)) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize


def expert_bytes(model: onnx.ModelProto, k: int, e: int) -> tuple[str, str, int, int]:
    """(form, op, bytes read per decoded token, all expert bytes) for the first sparse layer."""
    from builder.ops.routed_experts import gathered_bytes_per_token
    ops = {n.op_type for n in model.graph.node}
    inits = [t for t in model.graph.initializer]
    if "If" in ops:
        layer = next(n for n in model.graph.node if n.op_type == "If").name.split("/moe")[0]
        layer_name = layer.replace("/model/layers.", "model.layers.") + ".mlp."
        stacked = sum(_nbytes(t) for t in inits if t.name.startswith(layer_name) and ".experts." in t.name
                      and ".routed." in t.name)
        first = next(iter(gathered_bytes_per_token(model).values()))
        return "routed", "Gather + decode + MatMul (If)", first, stacked
    experts_op = sorted(o for o in ops if o.startswith("MatMulExperts"))
    if experts_op:  # CPU with the custom-op library: the k chosen experts of each stack [E, ...] read in place
        node = next(n for n in model.graph.node if n.op_type in experts_op)
        layer = node.name.split("/moe")[0].replace("/model/layers.", "model.layers.") + ".mlp."
        total = sum(_nbytes(t) for t in inits if t.name.startswith(layer) and ".experts." in t.name
                    and ".experts_op." in t.name)
        return "routed", f"com.quark_onnx {'/'.join(experts_op)}", round(total * k / e), total
    if "QMoE" in ops:
        node = next(n for n in model.graph.node if n.op_type == "QMoE")
        total = sum(_nbytes(t) for t in inits if t.name in set(node.input) and ".experts." in t.name)
        return "routed", "com.microsoft QMoE", round(total * k / e), total
    layer = "model.layers.0." if any(t.name.startswith("model.layers.0.mlp.experts") for t in inits) \
        else "model.layers.1."
    total = sum(_nbytes(t) for t in inits if t.name.startswith(layer) and ".experts." in t.name)
    return "dense", "every expert", total, total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--eps", default="cpu,cuda,migraphx")
    ap.add_argument("--families", default=",".join(CASES))
    ap.add_argument("--recipes", default="", help="only these expert schemes (default: every one of CASES)")
    a = ap.parse_args()
    from onnx_helpers import build, prompt_logits
    from test_migraphx_forms import CPU_DQ_EXACT
    from quark_factory import RECIPES, SHAPES, ensure_exports
    from conftest import fixture_cache_dir
    print("| family | expert scheme | EP | form | op | expert bytes / decoded token / sparse layer | of all "
          "expert bytes | max logit diff vs Quark: routed branch / every-expert branch |")
    print("|---|---|---|---|---|---:|---:|---|")
    tmp = Path(tempfile.mkdtemp(prefix="moe_table_"))
    for fam in a.families.split(","):
        k, e = TOP_K_E[fam]
        for recipe in CASES[fam]:
            if a.recipes and recipe not in a.recipes.split(","):
                continue
            [export] = ensure_exports(fixture_cache_dir(), [(SHAPES[fam], RECIPES[recipe])])
            ref = np.load(export / "reference.npz")
            for ep in a.eps.split(","):
                if fam == "deepseek_v3" and ep == "cuda":
                    continue
                acc = 1 if ep == "cpu" else None
                exact = CPU_DQ_EXACT if ep != "cpu" else None
                out = build(export, tmp / f"{fam}-{recipe}-{ep}", ep, "fp32", accuracy_level=acc,
                            moe_routed_tokens="64")
                model = onnx.load(str(out / "model.onnx"), load_external_data=False)
                form, op, per_token, total = expert_bytes(model, k, e)
                diffs = [float(np.abs(prompt_logits(out, ref["input_ids"], exact) - ref["logits"]).max())]
                if op.startswith("Gather"):
                    out2 = build(export, tmp / f"{fam}-{recipe}-{ep}-default", ep, "fp32", accuracy_level=acc)
                    diffs.append(float(np.abs(prompt_logits(out2, ref["input_ids"], exact) - ref["logits"]).max()))
                print(f"| {fam} | {recipe} | {ep} | {form} | {op} | {per_token} | {per_token / total:.3f} | "
                      f"{' / '.join(f'{d:.1e}' for d in diffs)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
