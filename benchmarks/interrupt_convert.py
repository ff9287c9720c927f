"""SIGTERM a conversion half-way through writing, and check that nothing is left and the previous output is intact.

    python benchmarks/interrupt_convert.py WORK_DIR [--preset 1b] [--at 0.5] [--signal TERM]

Makes a synthetic export (benchmarks/synthetic_quark_export.py), converts it once (the "previous output"), hashes
that output, starts a second conversion into the same -o, waits until its temporary model.onnx.data reaches
`--at` of the previous data file's size, sends the signal, and prints: the size written at the signal, how long
the converter took to exit after it, the exit code and stderr's last line, what is left beside the output, and
whether the previous output's hash is unchanged.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))


def digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        h.update(str(p.relative_to(folder)).encode())
        if p.is_file():
            with open(p, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 24), b""):
                    h.update(block)
    return h.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("work")
    ap.add_argument("--preset", default="1b")
    ap.add_argument("--at", type=float, default=0.5)
    ap.add_argument("--signal", default="TERM")
    a = ap.parse_args()
    work = Path(a.work)
    export, out = work / "export", work / "out"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    if not (export / "config.json").exists():
        from synthetic_quark_export import write
        t = time.perf_counter()
        write(export, a.preset)
        print(f"export: {sum(p.stat().st_size for p in export.iterdir()) / 1e9:.2f} GB in "
              f"{time.perf_counter() - t:.1f}s")
    cmd = [sys.executable, "-m", "builder", "-i", str(export), "-o", str(out), "-q"]
    t = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, cwd=REPO)
    full = (out / "model.onnx.data").stat().st_size
    print(f"previous output: {full / 1e9:.2f} GB data in {time.perf_counter() - t:.1f}s")
    before = digest(out)
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stderr=subprocess.PIPE, text=True)
    written, t0 = 0, time.perf_counter()
    while proc.poll() is None:
        tmps = list(work.glob(".out.tmp-*/model.onnx.data"))
        if tmps:
            try:
                written = tmps[0].stat().st_size
            except FileNotFoundError:
                written = 0
            if written >= a.at * full:
                break
        time.sleep(0.005)
    if proc.poll() is not None:
        print("conversion finished before the signal; nothing measured")
        return 1
    sig = getattr(signal, f"SIG{a.signal}")
    t_sig = time.perf_counter()
    proc.send_signal(sig)
    err = proc.stderr.read()
    rc = proc.wait()
    t_exit = time.perf_counter() - t_sig
    left = sorted(p.name for p in work.iterdir() if p.name not in ("export", "out"))
    print(f"signal SIG{a.signal} after {t_sig - t0:.1f}s at {written / 1e9:.2f} GB of {full / 1e9:.2f} GB "
          f"({100 * written / full:.0f} %)")
    print(f"exit code {rc} after {t_exit * 1000:.0f} ms; stderr: {err.strip().splitlines()[-1] if err.strip() else ''}")
    print(f"left beside the output: {left or 'nothing'}")
    intact = digest(out) == before
    print(f"previous output intact (sha256 of every file): {intact}")
    return 0 if intact and not left and rc == 128 + sig else 1


if __name__ == "__main__":
    sys.exit(main())
