"""Build the ONNX Runtime custom-op library: CPU kernels + the ORT registration layer (src/ort_register.cc).

    python -m custom_ops.ort_library            # fetch the ORT C API header if needed, build, print the path
    python -m custom_ops.ort_library --check    # print the path or the reason it is unavailable; builds nothing

Output: custom_ops/build/ort/libquark_onnx_ops.so, exporting RegisterCustomOps(OrtSessionOptions*, const OrtApiBase*)
for `SessionOptions.register_custom_ops_library(path)` and onnxruntime-genai's `session_options.custom_ops_library`.
Idempotent: the header is fetched once into the cache (ort_headers.py) and the library is rebuilt only when a
source is newer. CMake (custom_ops/CMakeLists.txt, -DQO_WITH_ORT=ON) when cmake is on PATH, else one c++ call.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no build lock
    fcntl = None

from . import ort_headers

PACKAGE_DIR = Path(__file__).resolve().parent
SOURCE_DIR = PACKAGE_DIR / "src"
BUILD_DIR = PACKAGE_DIR / "build" / "ort"
LIBRARY_FILE = "libquark_onnx_ops.so"
SOURCES = ("qo_cpu_kernels.c", "qo_cpu_experts.c", "qo_cpu_int4.c", "qo_cpu_int4_panel.c", "qo_cpu_int4_a8.c", "qo_cpu_int8_w8a8.c", "qo_cpu_attention.c", "qo_cpu_fp4_r16.c", "qo_cpu_fp8_qdq.c", "qo_cpu_fp4_act.c", "qo_version.c", "ort_register.cc")
HEADERS = ("qo_fp_formats.h", "qo_kernels.h", "qo_cpu_simd.h", "qo_cpu_int4_panel.h")


class BuildFailed(RuntimeError):
    pass


def library_path() -> Path:
    return BUILD_DIR / LIBRARY_FILE


def _is_stale(path: Path, include: Path) -> bool:
    if not path.exists():
        return True
    inputs = [SOURCE_DIR / n for n in SOURCES + HEADERS]
    inputs += [PACKAGE_DIR / "CMakeLists.txt", include / ort_headers.HEADER]
    built = path.stat().st_mtime
    return any(p.exists() and p.stat().st_mtime > built for p in inputs)


def _run(cmd: list[str]) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise BuildFailed(f"command failed ({result.returncode}): {' '.join(cmd)}\n{result.stdout[-4000:]}\n"
                          f"{result.stderr[-4000:]}")


def _build_cmake(cmake: str, include: Path) -> None:
    work = BUILD_DIR / "cmake"
    _run([cmake, "-S", str(PACKAGE_DIR), "-B", str(work), "-DCMAKE_BUILD_TYPE=Release", "-DQO_WITH_CPU=ON",
          "-DQO_WITH_ORT=ON", f"-DONNXRUNTIME_ROOT={include}", "-DQO_WITH_CUDA=OFF", "-DQO_WITH_HIP=OFF",
          "-DCMAKE_C_FLAGS=-Wall -Wextra -ffp-contract=off", "-DCMAKE_CXX_FLAGS=-Wall -Wextra",
          f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={BUILD_DIR}"])
    _run([cmake, "--build", str(work), "--config", "Release", "-j", "2"])


def _build_direct(include: Path) -> None:
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cxx or not cc:
        raise BuildFailed("no C and C++ compiler found (set CC/CXX) to build the ORT custom-op library")
    objects = []
    for name in SOURCES:
        is_cxx = name.endswith(".cc")
        obj = BUILD_DIR / f"{name}.o"
        cmd = [cxx if is_cxx else cc, "-c", "-O3", "-ffp-contract=off", "-fPIC", "-fvisibility=hidden", "-fopenmp", "-DQO_WITH_CPU",
               "-std=c++17" if is_cxx else "-std=c99", "-I", str(SOURCE_DIR), "-I", str(include),
               str(SOURCE_DIR / name), "-o", str(obj)]
        _run(cmd)
        objects.append(str(obj))
    _run([cxx, "-shared", "-fopenmp", *objects, "-lm", "-o", str(library_path())])


def build(force: bool = False, fetch: bool = True, log=print) -> Path:
    """The library, built if missing or stale; raises ort_headers.HeadersUnavailable or BuildFailed."""
    include = ort_headers.ensure(log=log) if fetch else ort_headers.find()
    if include is None:
        raise ort_headers.HeadersUnavailable(f"no {ort_headers.HEADER} found; {ort_headers.HOW_TO}")
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    with open(BUILD_DIR / ".build.lock", "w") as lock:  # test processes and CI must not build at once
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        if force or _is_stale(library_path(), include):
            cmake = shutil.which("cmake")
            _build_cmake(cmake, include) if cmake else _build_direct(include)
            if not library_path().exists():
                raise BuildFailed(f"build finished but {library_path()} is missing")
            log(f"ort_library: built {library_path()} ({'cmake' if cmake else 'c++'}, ORT header {include})")
    return library_path()


def available() -> tuple[Path | None, str]:
    """(library path, "") when it is built and up to date, else (None, why). Never fetches or builds."""
    include = ort_headers.find()
    if include is None:
        return None, (f"ORT custom-op library not built: no {ort_headers.HEADER} ({ort_headers.HOW_TO}; then "
                      "`python -m custom_ops.ort_library`)")
    if _is_stale(library_path(), include):
        return None, "ORT custom-op library missing or older than its sources: run `python -m custom_ops.ort_library`"
    return library_path(), ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m custom_ops.ort_library", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="report only; fetch and build nothing")
    parser.add_argument("--force", action="store_true", help="rebuild even when up to date")
    args = parser.parse_args(argv)
    if args.check:
        path, why = available()
        print(path if path else f"unavailable: {why}")
        return 0 if path else 1
    try:
        print(build(force=args.force, log=lambda m: print(m, file=sys.stderr)))
    except (ort_headers.HeadersUnavailable, BuildFailed) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
