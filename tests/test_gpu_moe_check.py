"""tools/gpu_moe_check.py, the GPU check of the MoE graphs, exercised without a GPU (--dry-run: the conversions, the
CPU side against Quark, the cuda genai_config), so that a short GPU window runs a script known to work."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
QUARK_EXPORTS = [("qwen3_moe", "mxfp4")]


def test_dry_run_converts_and_checks_the_cpu_side(quark_exports, tmp_path):
    quark_exports("qwen3_moe", "mxfp4")  # made (or found) in the fixture cache the script reads
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, str(REPO / "tools" / "gpu_moe_check.py"), "--dry-run", "--cases",
                        "qwen3_moe:mxfp4", "--out", str(tmp_path / "out"), "--json", str(tmp_path / "r.json")],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    [row] = json.loads((tmp_path / "r.json").read_text())
    assert row["passed"] and row["cpu_greedy_ok"] and row["cpu_vs_quark"] <= 1e-4
    assert row["cuda_fp16"] == row["cuda_fp32"] == "built (dry run)"
    assert (tmp_path / "out" / "qwen3_moe-mxfp4-cuda-fp16" / "model.onnx").is_file()


def test_without_cuda_it_says_so(tmp_path):
    r = subprocess.run([sys.executable, str(REPO / "tools" / "gpu_moe_check.py"), "--cases", "qwen3_moe:mxfp4"],
                       capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r.returncode == 2 and "no CUDAExecutionProvider" in r.stderr
