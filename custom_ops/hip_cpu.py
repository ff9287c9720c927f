"""Build the GPU kernels (src/qo_gpu_kernels.cu) for the CPU with HIP-CPU and load them through ctypes.

HIP-CPU (ROCm/HIP-CPU, MIT) is a header-only HIP runtime for CPUs: kernels compiled by g++ run block by block,
each thread of a block a fiber, `__syncthreads` and the warp shuffles barriers across the block. Nothing of it is in
this repository: its source tarball is looked up outside the project, checked against a SHA-256, and unpacked into
custom_ops/build/hip-cpu/ (gitignored). Where the tarball is:
  1. $QO_HIP_CPU_TARBALL;
  2. <folder>/shared/tools/hip-cpu/hip-cpu-e112c93.tar.gz for every folder above this repository.

    python -m custom_ops.hip_cpu [--warp-size 32|64]   # build, print the library path(s)

Two facts of HIP-CPU shape the build (measured with g++ 12 on Debian 12, 2 cores, no TBB):
  - its `warpSize` is a constant 64 (include/hip/hip_constants.h). The unpacked copy is patched to read it from
    QO_HIP_CPU_WARP_SIZE, and one library is built per warp size (32: NVIDIA, RDNA; 64: CDNA);
  - without TBB, libstdc++'s parallel algorithms run the blocks one after another; the runtime thread that waits
    for work spins, so YieldProcessor() is defined to std::this_thread::yield() (hip/detail/helpers.hpp).
What it checks: arithmetic, indexing, tails, block-uniform shuffles. Not GPU speed, nor the GPU memory model.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no build lock
    fcntl = None

PACKAGE_DIR = Path(__file__).resolve().parent
SOURCE_DIR = PACKAGE_DIR / "src"
BUILD_DIR = PACKAGE_DIR / "build" / "hip-cpu"
TARBALL_NAME = "hip-cpu-e112c93.tar.gz"
TARBALL_SHA256 = "5735699f9f5feb206b8b3a40fc8d2649691e38157f070557fe3f07f1414776a2"
UNPACKED = BUILD_DIR / "hip-cpu-e112c93"
WARP_SIZES = (32, 64)
SOURCES = ("qo_gpu_kernels.cu", "qo_hip_cpu_shim.cc")
HEADERS = ("qo_gpu_compat.h", "qo_fp_formats.h", "qo_kernels.h")
# hip_constants.h at e112c93: the one line the warp-size patch replaces.
WARP_SIZE_LINE = "inline constexpr int warpSize{64}; // TODO: this is untrue and a problem."
WARP_SIZE_PATCH = ("#ifndef QO_HIP_CPU_WARP_SIZE\n#define QO_HIP_CPU_WARP_SIZE 64\n#endif\n"
                   "inline constexpr int warpSize{QO_HIP_CPU_WARP_SIZE}; /* patched by custom_ops/hip_cpu.py */")
HOW_TO = (f"set QO_HIP_CPU_TARBALL to {TARBALL_NAME} (ROCm/HIP-CPU at commit e112c93, sha256 {TARBALL_SHA256[:12]}...)"
          " or place it in ../shared/tools/hip-cpu/ next to the repository")


class Unavailable(RuntimeError):
    """No tarball, or no C++17 compiler: the HIP-CPU run cannot happen here."""


class BuildFailed(RuntimeError):
    pass


def find_tarball() -> Path | None:
    explicit = os.environ.get("QO_HIP_CPU_TARBALL")
    if explicit:
        return Path(explicit) if Path(explicit).is_file() else None
    for folder in PACKAGE_DIR.parent.resolve().parents:
        candidate = folder / "shared" / "tools" / "hip-cpu" / TARBALL_NAME
        if candidate.is_file():
            return candidate
    return None


def find_compiler() -> str | None:
    return os.environ.get("QO_HIP_CPU_CXX") or shutil.which("g++") or shutil.which("clang++")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def unpack(tarball: Path) -> Path:
    """HIP-CPU's tree in build/hip-cpu/, checked and patched once; returns its root (holds include/)."""
    marker = UNPACKED / ".qo-unpacked"
    if marker.exists():
        return UNPACKED
    digest = _sha256(tarball)
    if digest != TARBALL_SHA256:
        raise Unavailable(f"{tarball}: sha256 {digest}, expected {TARBALL_SHA256} (HIP-CPU e112c93)")
    staging = BUILD_DIR / "unpacking"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    with tarfile.open(tarball) as archive:
        for member in archive.getmembers():
            if member.name.startswith("/") or ".." in Path(member.name).parts or member.issym() or member.islnk():
                raise Unavailable(f"{tarball}: unexpected member {member.name!r}")
        try:
            archive.extractall(staging, filter="data")
        except TypeError:  # Python without extraction filters; the members were checked above
            archive.extractall(staging)
    constants = staging / "include" / "hip" / "hip_constants.h"
    text = constants.read_text()
    if text.count(WARP_SIZE_LINE) != 1:
        raise BuildFailed(f"{constants}: the warpSize line to patch was not found (not HIP-CPU e112c93?)")
    constants.write_text(text.replace(WARP_SIZE_LINE, WARP_SIZE_PATCH))
    shutil.rmtree(UNPACKED, ignore_errors=True)
    staging.rename(UNPACKED)
    marker.write_text(f"{tarball}\n{TARBALL_SHA256}\n")
    return UNPACKED


def library_path(warp_size: int) -> Path:
    return BUILD_DIR / f"libqo_gpu_kernels_hipcpu_w{warp_size}.so"


def compile_command(compiler: str, hip_cpu_root: Path, warp_size: int, output: Path) -> list[str]:
    # No -DNDEBUG on purpose: HIP-CPU's __forceinline__ is then empty, the case qo_fp_formats.h must survive.
    return [compiler, "-std=c++17", "-O1", "-fPIC", "-shared", "-pthread", "-x", "c++", "-DQO_WITH_HIP",
            f"-DQO_HIP_CPU_WARP_SIZE={warp_size}", "-DYieldProcessor()=std::this_thread::yield()",
            "-Wno-attributes", "-I", str(hip_cpu_root / "include"), "-I", str(SOURCE_DIR),
            *(str(SOURCE_DIR / name) for name in SOURCES), "-o", str(output)]


def _is_stale(path: Path, command: list[str]) -> bool:
    """Missing, older than a source, or built with another command (flags, compiler, HIP-CPU folder)."""
    if not path.exists() or not _command_file(path).exists():
        return True
    built = path.stat().st_mtime
    return any((SOURCE_DIR / name).stat().st_mtime > built for name in SOURCES + HEADERS) or \
        _command_file(path).read_text() != " ".join(command)


def _command_file(path: Path) -> Path:
    return path.with_name(path.name + ".command")


def build(warp_sizes=WARP_SIZES, log=print) -> dict[int, Path]:
    """{warp size: library}, built when missing or older than a source (the warp sizes compile in parallel)."""
    tarball = find_tarball()
    if tarball is None:
        raise Unavailable(f"HIP-CPU tarball {TARBALL_NAME} not found: {HOW_TO}")
    compiler = find_compiler()
    if compiler is None:
        raise Unavailable("no C++17 compiler (g++ or clang++; or set QO_HIP_CPU_CXX) to build the HIP-CPU kernels")
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    with open(BUILD_DIR / ".build.lock", "w") as lock:  # test processes and CI must not build at once
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        root = unpack(tarball)
        jobs = {}
        for warp_size in warp_sizes:
            out = library_path(warp_size)
            partial = out.with_suffix(".so.partial")
            command = compile_command(compiler, root, warp_size, partial)
            if _is_stale(out, command):
                jobs[warp_size] = (subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                    text=True), command, partial, out)
        for warp_size, (process, command, partial, out) in jobs.items():
            _, stderr = process.communicate()
            if process.returncode != 0:
                raise BuildFailed(f"HIP-CPU build failed ({process.returncode}): {' '.join(command)}\n"
                                  f"{stderr[-4000:]}")
            partial.replace(out)
            _command_file(out).write_text(" ".join(command))
            log(f"hip_cpu: built {out} (warp size {warp_size})")
    return {warp_size: library_path(warp_size) for warp_size in warp_sizes}


def load(path: Path) -> ctypes.CDLL:
    """The HIP-CPU library with the kernels' and the shim's argtypes set."""
    from .gpu_cases import declare_kernels

    lib = declare_kernels(ctypes.CDLL(str(path)))
    lib.qo_hip_cpu_warp_size.restype = ctypes.c_int
    lib.qo_hip_cpu_synchronize.restype = ctypes.c_int
    lib.qo_hip_cpu_f16_to_f32.argtypes, lib.qo_hip_cpu_f16_to_f32.restype = [ctypes.c_uint16], ctypes.c_float
    return lib


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m custom_ops.hip_cpu", description=__doc__.split("\n")[0])
    parser.add_argument("--warp-size", type=int, choices=WARP_SIZES, action="append")
    args = parser.parse_args(argv)
    try:
        for path in build(tuple(args.warp_size or WARP_SIZES), log=lambda m: print(m, file=sys.stderr)).values():
            print(path)
    except (Unavailable, BuildFailed) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
