"""custom_ops/gpu_check.py's CPU-side self-test: the whole GPU check (every case, the timing, the JSON report) on the
HIP-CPU build, so the script a drawn GPU runs is exercised in CI. Skips without the HIP-CPU tarball, fails then
with QO_REQUIRE_HIP_CPU=1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from custom_ops import gpu_cases as gc
from custom_ops import gpu_check, hip_cpu

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def hip_cpu_available():
    if hip_cpu.find_tarball() is None or hip_cpu.find_compiler() is None:
        why = f"HIP-CPU unavailable: {hip_cpu.HOW_TO}"
        if os.environ.get("QO_REQUIRE_HIP_CPU") == "1":
            pytest.fail(f"QO_REQUIRE_HIP_CPU=1 but {why}")
        pytest.skip(why)


def test_self_test_runs_every_case_and_writes_the_report(tmp_path):
    out = tmp_path / "report.json"
    result = subprocess.run([sys.executable, str(ROOT / "custom_ops" / "gpu_check.py"), "--self-test", "--out",
                             str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["backend"] == "hip-cpu" and report["all_pass"]
    assert [c["case"] for c in report["cases"]] == [c.name for c in gc.cases()]
    assert all(c["pass"] for c in report["cases"])
    assert len(report["timed"]) == len(gc.OPS) * len(gpu_check.SELF_TEST_TIMED_SHAPES)
    assert all(t["weight_GBps"] > 0 and t["ms"] > 0 for t in report["timed"])
    assert report["copy_GBps"] > 0
    assert set(report["max_error_over_sum_abs_f32"]) == set(gc.OPS)
    assert max(report["max_error_over_sum_abs_f32"].values()) <= gc.SUM_RTOL


def test_self_test_reports_a_wrong_answer(tmp_path, monkeypatch):
    """A case whose answer is off makes the check exit 1 and say which case."""
    original = gc.make_inputs

    def off_by_one(case, seed=None):
        inputs = original(case, seed)
        if case.name == "nvfp4-f32-M3-N67-K528":
            inputs.expected = inputs.expected.copy()
            inputs.expected[1, 5] += 1.0
        return inputs

    monkeypatch.setattr(gc, "make_inputs", off_by_one)
    out = tmp_path / "report.json"
    assert gpu_check.main(["--self-test", "--out", str(out)]) == 1
    report = json.loads(out.read_text())
    assert [c["case"] for c in report["cases"] if not c["pass"]] == ["nvfp4-f32-M3-N67-K528"]
