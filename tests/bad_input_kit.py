"""Helpers for the bad-input corpus: run the CLI, hash an input tree, read/write raw safetensors.

run_cli() runs `builder.__main__.main(argv)` in a child process forked from the (already warm) test process, with
its own cwd, stdout/stderr files, exit code and a timeout (a hang is killed and reported). The converter's imports
(ml_dtypes, onnx, numpy) cost 1.5-4 s per fresh interpreter here, so forking keeps a 60-case corpus at a few
seconds. The child uses only numpy/onnx and file I/O (never torch or ORT thread pools the parent may have started),
and a child that hangs is killed at the timeout and fails its case. QO_CORPUS_SPAWN=1 runs every case as a fresh
`python -m builder` instead (same assertions).
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False


def run_cli(args, cwd: Path | None = None, timeout: float = 60.0, spawn: bool | None = None) -> Result:
    args = [str(a) for a in args]
    if spawn is None:
        spawn = os.environ.get("QO_CORPUS_SPAWN") == "1"
    if spawn:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        try:
            r = subprocess.run([sys.executable, "-m", "builder", *args], cwd=cwd or REPO, capture_output=True,
                               text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired as exc:
            return Result(-9, exc.stdout or "", exc.stderr or "", timed_out=True)
        return Result(r.returncode, r.stdout, r.stderr)
    return _run_forked(args, cwd, timeout)


def _run_forked(args: list[str], cwd: Path | None, timeout: float) -> Result:
    import gc
    import tempfile

    import builder.__main__  # noqa: F401  (imported before the fork: the child starts warm)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        # The child must not run the destructors of the parent's garbage: an onnxruntime session freed there waits
        # in pthread_cond_destroy on its thread pool's threads, which do not exist after fork (py-spy of a hung child,
        # 2026-12-04). So collect here, and freeze what is left for the child's cyclic GC; the parent unfreezes.
        gc.collect()
        gc.freeze()
        pid = os.fork()
        if pid != 0:
            gc.unfreeze()
        if pid == 0:  # child: behave like `python -m builder ARGS`
            rc = 99
            try:
                os.setpgid(0, 0)
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                    signal.signal(sig, signal.SIG_DFL if sig != signal.SIGINT else signal.default_int_handler)
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                sys.stdout = open(1, "w", closefd=False)
                sys.stderr = open(2, "w", closefd=False)
                os.chdir(cwd or REPO)
                from builder.__main__ import main
                rc = main(args)
            except SystemExit as exc:
                rc = exc.code if isinstance(exc.code, int) else 1
            except BaseException:  # noqa: BLE001 - what `python -m` would print
                import traceback
                traceback.print_exc()
                rc = 1
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(rc)
        deadline, timed_out = time.monotonic() + timeout, False
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                timed_out = True
                os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                status = -9
                break
            time.sleep(0.01)
        rc = -9 if timed_out else os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return Result(rc, out.read().decode(errors="replace"), err.read().decode(errors="replace"), timed_out)


def tree_digest(root: Path) -> str:
    """Names, types, modes, link targets and contents of everything under root (symlinks not followed)."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            st = p.lstat()
            h.update(f"{p.relative_to(root)}|{stat.S_IFMT(st.st_mode)}|{stat.S_IMODE(st.st_mode)}|".encode())
            if stat.S_ISLNK(st.st_mode):
                h.update(os.readlink(p).encode())
            elif stat.S_ISREG(st.st_mode):
                h.update(p.read_bytes())
    return h.hexdigest()


# ---- raw safetensors (safetensors.numpy has no bf16/fp8 round trip for every dtype) -----------------------------
def read_safetensors(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_raw_safetensors(path: Path, header: dict | bytes, data: bytes) -> None:
    head = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + data)


def load_tensors(path: Path) -> dict[str, np.ndarray]:
    from builder.checkpoint import SAFETENSORS_DTYPES
    header, data = read_safetensors(path)
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        b, e = meta["data_offsets"]
        out[name] = np.frombuffer(data[b:e], SAFETENSORS_DTYPES[meta["dtype"]]).reshape(meta["shape"]).copy()
    return out


def save_tensors(tensors: dict[str, np.ndarray], path: Path) -> None:
    from builder.checkpoint import SAFETENSORS_DTYPES
    names = {dtype: name for name, dtype in SAFETENSORS_DTYPES.items()}
    header, blobs, offset = {}, [], 0
    for name, value in tensors.items():
        raw = np.ascontiguousarray(value).tobytes()
        header[name] = {"dtype": names[value.dtype], "shape": list(value.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    write_raw_safetensors(path, header, b"".join(blobs))
