"""Run a Python tool under QEMU user mode as another x86 CPU, at AMD-host speed on an Intel host too.

    python tools/qemu_user.py Haswell tools/isa_eval.py ONNX_DIR EXPORT OUT.npz
    # = qemu-x86_64 -cpu Haswell $(which python) tools/isa_eval.py ..., plus the FMA shim below

On an Intel host, plain `qemu-x86_64 -cpu Haswell` runs every emulated FMA lane through a host SSE -> VEX -> SSE
round trip with dirty upper YMM halves (tools/qemu_fma_shim.c), about 130 ns each: the SmolLM2-135M INT8 evaluation
(tools/isa_eval.py, 96 tokens) did not finish in 20 minutes. This wrapper builds tools/qemu_fma_shim.c once into
build/qemu_fma_shim/ and preloads it into the qemu-x86_64 process only: `-U LD_PRELOAD` (or `-E LD_PRELOAD=...` with
the caller's own value) keeps it out of the emulated program, whose arithmetic is untouched (the shim is the same
FMA instruction glibc's fmaf runs, after a VZEROUPPER). Without an FMA-capable host, a C compiler or a dynamically
linked qemu-x86_64, it runs plain QEMU and says why on stderr.
"""
from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHIM_SOURCE = REPO / "tools" / "qemu_fma_shim.c"
SHIM_LIBRARY = REPO / "build" / "qemu_fma_shim" / "libqemu_fma_shim.so"
QEMU = "qemu-x86_64"


class ShimUnavailable(RuntimeError):
    pass


def host_has_fma(cpuinfo: str | None = None) -> bool:
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    flags = next((ln.split(":", 1)[1].split() for ln in cpuinfo.splitlines() if ln.startswith("flags")), [])
    return "avx" in flags and "fma" in flags


def is_dynamic_elf(path: str) -> bool:
    """Whether the 64-bit ELF at path has a PT_INTERP (a dynamic loader that honours LD_PRELOAD)."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:5] != b"\x7fELF\x02":
            return False
        phoff, = struct.unpack_from("<Q", head, 32)
        phentsize, phnum = struct.unpack_from("<HH", head, 54)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    return any(struct.unpack_from("<I", table, i * phentsize)[0] == 3 for i in range(phnum))  # 3: PT_INTERP


def build_shim(library: Path = SHIM_LIBRARY) -> Path:
    """The shim library, compiled if missing or older than its source; ShimUnavailable when it cannot be."""
    if library.exists() and library.stat().st_mtime >= SHIM_SOURCE.stat().st_mtime:
        return library
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise ShimUnavailable("no C compiler (set CC)")
    library.parent.mkdir(parents=True, exist_ok=True)
    tmp = library.with_suffix(f".{os.getpid()}.tmp")
    result = subprocess.run([cc, "-O2", "-shared", "-fPIC", str(SHIM_SOURCE), "-o", str(tmp)],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise ShimUnavailable(f"{cc} failed: {(result.stderr or result.stdout).strip()[-300:]}")
    tmp.replace(library)
    return library


def qemu_command(cpu: str, args: list[str], env: dict, shim: Path | None, python: str = sys.executable,
                 qemu: str = QEMU) -> tuple[list[str], dict]:
    """(argv, environment) for qemu-x86_64 -cpu CPU PYTHON ARGS, the shim preloaded into QEMU alone."""
    if shim is None:
        return [qemu, "-cpu", cpu, python, *args], dict(env)
    guest = ["-E", f"LD_PRELOAD={env['LD_PRELOAD']}"] if env.get("LD_PRELOAD") else ["-U", "LD_PRELOAD"]
    return [qemu, *guest, "-cpu", cpu, python, *args], {**env, "LD_PRELOAD": str(shim)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2 or argv[0].startswith("-"):
        print("usage: python tools/qemu_user.py CPU_MODEL SCRIPT.py [ARGS...]   (e.g. Haswell, SandyBridge)",
              file=sys.stderr)
        return 2
    if shutil.which(QEMU) is None:
        print(f"error: {QEMU} not on PATH (Debian: apt-get install qemu-user)", file=sys.stderr)
        return 2
    shim = None
    if not is_dynamic_elf(shutil.which(QEMU)):
        print(f"qemu_user: {QEMU} is statically linked: no FMA shim; plain QEMU, slow on Intel hosts", file=sys.stderr)
    elif host_has_fma():
        try:
            shim = build_shim()
        except ShimUnavailable as exc:
            print(f"qemu_user: no FMA shim ({exc}); plain QEMU, slow on Intel hosts", file=sys.stderr)
    cmd, env = qemu_command(argv[0], argv[1:], dict(os.environ), shim)
    return subprocess.run(cmd, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
