"""--extra_options custom_ops_library=PATH: accepted only when PATH is an ONNX Runtime custom-op library.

Checked at plan time (convert.plan_model), before anything is written:
  1. a regular file with the platform's shared-object header (ELF on Linux, Mach-O on macOS, PE on Windows);
  2. a name that looks like a shared library (.so[.N], .dylib, .dll): it is copied into the output folder under
     its own name, so it must not be able to collide with model.onnx, genai_config.json or a tokenizer file;
  3. ONNX Runtime loads it: `SessionOptions.register_custom_ops_library(PATH)` (dlopen + its RegisterCustomOps) in
     a child process, so a library that crashes on load cannot take the converter down with it.
Any failure is one ConversionError line (exit 2).
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from .errors import ConversionError

FIELD = "--extra_options custom_ops_library"
LIBRARY_NAME = re.compile(r"\.(so(\.\d+)*|dylib|dll)$")
MAGIC = {"linux": (b"\x7fELF",), "darwin": (b"\xcf\xfa\xed\xfe", b"\xca\xfe\xba\xbe"), "win32": (b"MZ",)}
LOAD_TIMEOUT_S = 120
_LOAD_SCRIPT = ("import sys, onnxruntime as ort\n"
                "so = ort.SessionOptions()\n"
                "so.register_custom_ops_library(sys.argv[1])\n")


def _refuse(path: str, message: str) -> ConversionError:
    return ConversionError(message, file=path, field=FIELD, value=path)


def check_custom_ops_library(path: str) -> Path:
    """The library as a resolved Path, or ConversionError naming what is wrong with it."""
    lib = Path(path)
    if not lib.exists():
        raise _refuse(path, "custom-op library not found")
    if not lib.is_file():
        raise _refuse(path, "custom-op library is not a regular file")
    try:
        with open(lib, "rb") as f:
            head = f.read(4)
    except OSError as exc:
        raise _refuse(path, f"custom-op library cannot be read: {exc.strerror}") from None
    magics = MAGIC.get(sys.platform, MAGIC["linux"])
    if not any(head.startswith(m) for m in magics):
        raise _refuse(path, "not a shared library (no ELF/Mach-O/PE header for this platform)")
    if not LIBRARY_NAME.search(lib.name) or ".." in lib.name:  # genai refuses any ".." in the configured name
        raise _refuse(path, "custom-op library name must end in .so, .so.N, .dylib or .dll and hold no '..' (it is "
                            "copied into the output folder under that name)")
    try:
        result = subprocess.run([sys.executable, "-c", _LOAD_SCRIPT, str(lib.resolve())], capture_output=True,
                                text=True, timeout=LOAD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise _refuse(path, f"ONNX Runtime did not finish loading the library in {LOAD_TIMEOUT_S} s") from None
    if result.returncode != 0:
        lines = [ln.strip() for ln in (result.stderr or result.stdout).splitlines() if ln.strip()]
        reason = lines[-1] if lines else f"exit code {result.returncode}"
        if result.returncode < 0:
            reason = f"the loading process died with signal {-result.returncode}"
        raise _refuse(path, f"ONNX Runtime cannot load it as a custom-op library: {reason[:300]}")
    return lib.resolve()
