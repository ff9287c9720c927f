"""Conversion time and peak memory: this builder vs onnxruntime-genai's builder on the same Quark export.

    python benchmarks/bench_convert.py EXPORT_DIR [--tokenizer_from DIR] [--skip_genai] [--json OUT]

Each converter runs in its own process under /usr/bin/time-like accounting (wait4 rusage), cold page cache not
enforced. The genai builder needs tokenizer files; --tokenizer_from copies them into a scratch copy of the export.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_measured(cmd: list[str], cwd: Path) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    with tempfile.TemporaryFile() as log:  # a file, not a pipe: a chatty child must never block on a full pipe
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        log.seek(0)
        output = log.read().decode(errors="replace")
    rc = os.waitstatus_to_exitcode(status)
    return {"cmd": " ".join(cmd), "rc": rc, "wall_s": round(wall, 2), "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
            "tail": output.strip().splitlines()[-3:] if rc else []}


def folder_mib(path: Path) -> float:
    return round(sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20, 1)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("export")
    ap.add_argument("--tokenizer_from", default=None)
    ap.add_argument("--skip_genai", action="store_true")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    src = Path(a.export).resolve()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        ours = tmp / "ours"
        results["quark-onnx-builder"] = run_measured(
            [sys.executable, "-m", "builder", "-i", str(src), "-o", str(ours), "-e", "cpu"], REPO)
        if ours.exists():
            results["quark-onnx-builder"]["output_mib"] = folder_mib(ours)
            shutil.rmtree(ours)
        if not a.skip_genai:
            scratch = src
            if a.tokenizer_from:
                scratch = tmp / "src"
                scratch.mkdir()
                for f in src.iterdir():
                    (scratch / f.name).symlink_to(f)
                for f in Path(a.tokenizer_from).glob("tokenizer*"):
                    if not (scratch / f.name).exists():
                        shutil.copy(f, scratch / f.name)
            theirs = tmp / "genai"
            results["onnxruntime-genai builder"] = run_measured(
                [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(scratch), "-o", str(theirs),
                 "-p", "int4", "-e", "cpu", "-c", str(tmp / "cache")], tmp)
            if theirs.exists():
                results["onnxruntime-genai builder"]["output_mib"] = folder_mib(theirs)
    print(f"export: {src} ({folder_mib(src)} MiB)")
    for name, r in results.items():
        print(f"  {name:<28} rc={r['rc']} wall={r['wall_s']:>7.2f}s peak_rss={r['peak_rss_mib']:>8.1f} MiB "
              f"out={r.get('output_mib', '-')} MiB")
        for line in r["tail"]:
            print(f"      {line}")
    if a.json:
        Path(a.json).write_text(json.dumps({"export": str(src), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
