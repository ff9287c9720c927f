"""SIGTERM, SIGINT and SIGHUP during the emit phase: nothing left behind, the previous output intact.

The export is benchmarks/synthetic_quark_export.py's "signals" preset (a ~100 MB uint4 Llama written in about two
seconds, ~160 MB of output emitted in about three): big enough that the signal reliably lands while
model.onnx.data is being written (the test waits for a mid-emit progress line, and checks the temporary folder
holds data at that moment).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bad_input_kit import REPO, tree_digest

sys.path.insert(0, str(REPO / "benchmarks"))


@pytest.fixture(scope="module")
def big_export(tmp_path_factory) -> Path:
    from synthetic_quark_export import write
    out = tmp_path_factory.mktemp("signals") / "export"
    write(out, "signals", group=64)
    return out


def _default_signals() -> None:
    """A shell runs background jobs with SIGINT ignored, and Python keeps an ignored SIGINT ignored: a test run
    started with `&` would otherwise never see the SIGINT it sends."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def _previous_output(out: Path) -> None:
    from builder.output_dir import write_marker
    out.mkdir()
    write_marker(out, {"ep": "cpu", "io": "fp32"})
    (out / "model.onnx").write_bytes(b"previous build")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_signal_mid_emit_leaves_nothing(big_export, tmp_path, sig):
    out = tmp_path / "out"
    _previous_output(out)
    before_out, before_src = tree_digest(out), tree_digest(big_export)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "builder", "-i", big_export, "-o", out], cwd=REPO, env=env,
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            preexec_fn=_default_signals)
    seen = []
    deadline = time.monotonic() + 120
    try:
        for line in proc.stderr:
            seen.append(line)
            if line.startswith("[2/3] emitted") and "/43 " in line and int(line.split()[2].split("/")[0]) >= 10:
                break
            assert time.monotonic() < deadline, seen
        tmp = [p for p in tmp_path.iterdir() if p.name.startswith(".out.tmp-")]
        assert len(tmp) == 1 and (tmp[0] / "model.onnx.data").stat().st_size > 0, "not caught mid-write"
        proc.send_signal(sig)
        rest = proc.stderr.read()
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 128 + sig, (rc, "".join(seen) + rest)
    errors = [l for l in rest.splitlines() if l.startswith("error:")]
    assert errors == [f"error: interrupted ({sig.name}); nothing was written"], rest
    assert "Traceback" not in rest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"], "temporary folder left behind"
    assert tree_digest(out) == before_out, "previous output changed"
    assert tree_digest(big_export) == before_src


def test_sigkill_leftover_is_deleted_by_the_next_run(big_export, tmp_path):
    """SIGKILL (or the OOM killer) cannot be caught: the temporary folder stays, and the next conversion into the
    same -o deletes it (its owner process is gone) with a warning, while a live run's folder is never touched."""
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "builder", "-i", big_export, "-o", out], cwd=REPO, env=env,
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    for line in proc.stderr:
        if line.startswith("[2/3] emitted"):
            break
    proc.kill()
    proc.wait()
    proc.stderr.close()
    (stale,) = [p for p in tmp_path.iterdir() if p.name.startswith(".out.tmp-")]
    live = tmp_path / ".out.tmp-live"
    live.mkdir()
    (live / ".quark_onnx_builder.owner").write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
    small = tmp_path / "small"  # any export will do for the second run
    from synthetic_quark_export import write
    write(small, "tiny", group=16)
    r = subprocess.run([sys.executable, "-m", "builder", "-i", small, "-o", out, "-q"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"warning: deleted {stale}, left by an earlier conversion that was killed" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.tmp-live", "out", "small"]


def test_nohup_keeps_sighup_ignored(big_export, tmp_path):
    """Under `nohup` (SIGHUP ignored) a SIGHUP must not stop the conversion."""
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(REPO))

    def nohup():
        _default_signals()
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    proc = subprocess.Popen([sys.executable, "-m", "builder", "-i", big_export, "-o", out], cwd=REPO, env=env,
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, preexec_fn=nohup)
    for line in proc.stderr:
        if line.startswith("[2/3] emitted"):
            break
    proc.send_signal(signal.SIGHUP)
    rest = proc.stderr.read()
    assert proc.wait(timeout=300) == 0, rest
    assert (out / "model.onnx").is_file() and "done:" in rest
