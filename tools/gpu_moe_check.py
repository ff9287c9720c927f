"""On a machine with a CUDA GPU: convert the tiny MoE exports for -e cuda, run them with onnxruntime-genai on the GPU,
and compare with the -e cpu conversion run on the CPU (and with Quark's reference tokens). One command, prepared
here so that a short GPU window is enough:

    QO_FIXTURE_CACHE=DIR python tools/gpu_moe_check.py [--out DIR] [--json report.json] [--dry-run]
                                                       [--cases qwen3_moe:mxfp4,gpt_oss:uint4_g32,...]

Per case (family x expert scheme; the exports must already be in QO_FIXTURE_CACHE, made by the tests):
  cpu   the default CPU conversion (fp32, accuracy_level 1): prompt logits on ORT CPU, 16 greedy tokens on og CPU
  cuda  the default -e cuda conversion in fp16 and in fp32: prompt logits through an ORT session on
        CUDAExecutionProvider (the If of the routed MoE form included), 16 greedy tokens through og with the
        genai_config as written (cuda provider)
Reported: max |logit diff| cuda vs cpu and vs Quark's reference, greedy tokens equal to Quark's, the providers the
session used. --dry-run: everything but the GPU runs (the conversions, the CPU side, the checks of the written
genai_config), so the script is exercised on a machine without a GPU (tests/test_gpu_moe_check.py).
Exit code 0 when every fp32 case is within 1e-3 of the CPU logits and every greedy sequence equals Quark's, 1 else.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

CASES = ("qwen3_moe:uint4_g32", "qwen3_moe:mxfp4", "qwen3_moe:fp8_w8a8", "qwen3_moe:int8_wo_g32",
         "qwen2_moe:mxfp4", "mixtral:uint4_g32", "mixtral:mxfp4", "gpt_oss:uint4_g32", "gpt_oss:mxfp4",
         "gpt_oss:mxfp4_fp8")
FP32_TOL = 1e-3   # fp32 on the GPU: summation order and TF32 off (ORT's default); the CPU runs match Quark to ~1e-6
FP16_TOL = 5e-2   # fp16 activations; reported, not failed on


def _export(family: str, recipe: str) -> Path:
    from conftest import fixture_cache_dir
    from quark_factory import RECIPES, SHAPES, export_dir_for, is_complete
    path = export_dir_for(fixture_cache_dir(), SHAPES[family], RECIPES[recipe])
    if not is_complete(path):
        raise SystemExit(f"error: no export for {family}:{recipe} in {fixture_cache_dir()} (run the MoE tests once, "
                         "or set QO_FIXTURE_CACHE)")
    return path


def _logits(model_dir: Path, ids: np.ndarray, providers: list[str]) -> tuple[np.ndarray, list[str]]:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "1")
    sess = ort.InferenceSession(str(model_dir / "model.onnx"), so, providers=providers)
    dtype = np.float16 if "float16" in sess.get_inputs()[2].type else np.float32
    feeds = {"input_ids": ids.astype(np.int64), "attention_mask": np.ones_like(ids, np.int64)}
    for inp in sess.get_inputs():
        if inp.name.startswith("past_key_values"):
            feeds[inp.name] = np.zeros((ids.shape[0], inp.shape[1], 0, inp.shape[3]), dtype)
    return sess.run(["logits"], feeds)[0].astype(np.float32), sess.get_providers()


def check_case(family: str, recipe: str, out: Path, dry_run: bool) -> dict:
    from onnx_helpers import build, genai_greedy
    export = _export(family, recipe)
    ref = np.load(export / "reference.npz")
    ids = ref["input_ids"]
    row = {"case": f"{family}:{recipe}"}
    cpu = build(export, out / f"{family}-{recipe}-cpu", "cpu", "fp32", accuracy_level=1)
    cpu_logits, _ = _logits(cpu, ids, ["CPUExecutionProvider"])
    row["cpu_vs_quark"] = float(np.abs(cpu_logits - ref["logits"]).max())
    row["cpu_greedy_ok"] = genai_greedy(cpu, ids) == ref["greedy"].tolist()
    for precision in ("fp32", "fp16"):
        gpu = build(export, out / f"{family}-{recipe}-cuda-{precision}", "cuda", precision)
        cfg = json.loads((gpu / "genai_config.json").read_text())
        assert cfg["model"]["decoder"]["session_options"]["provider_options"] == [{"cuda": {}}], cfg
        if dry_run:
            row[f"cuda_{precision}"] = "built (dry run)"
            continue
        logits, providers = _logits(gpu, ids, ["CUDAExecutionProvider", "CPUExecutionProvider"])
        row[f"cuda_{precision}_providers"] = providers
        row[f"cuda_{precision}_vs_cpu"] = float(np.abs(logits - cpu_logits).max())
        row[f"cuda_{precision}_vs_quark"] = float(np.abs(logits - ref["logits"]).max())
        row[f"cuda_{precision}_greedy_ok"] = genai_greedy(gpu, ids) == ref["greedy"].tolist()
    return row


def passed(row: dict, dry_run: bool) -> bool:
    ok = row["cpu_greedy_ok"] and row["cpu_vs_quark"] <= 1e-4
    if not dry_run:
        ok = ok and row["cuda_fp32_vs_cpu"] <= FP32_TOL and row["cuda_fp32_greedy_ok"]
        ok = ok and "CUDAExecutionProvider" in row["cuda_fp32_providers"]
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args()
    out = Path(a.out or tempfile.mkdtemp(prefix="gpu_moe_check_"))
    if not a.dry_run:
        import onnxruntime as ort
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            print("error: this onnxruntime has no CUDAExecutionProvider (use --dry-run without a GPU)",
                  file=sys.stderr)
            return 2
    rows, ok = [], True
    for case in a.cases.split(","):
        family, recipe = case.split(":")
        row = check_case(family, recipe, out, a.dry_run)
        row["passed"] = passed(row, a.dry_run)
        ok &= row["passed"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    print(f"{sum(r['passed'] for r in rows)}/{len(rows)} cases passed{' (dry run: no GPU)' if a.dry_run else ''}")
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("QO_WRITER_THREAD", "1")
    sys.exit(main())
