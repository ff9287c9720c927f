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
# After ORT accepted it: which com.quark_onnx kernel builds it holds (a quark_onnx_ops build exports its C ABI).
_LOAD_SCRIPT = ("import ctypes, sys, onnxruntime as ort\n"
                "so = ort.SessionOptions()\n"
                "so.register_custom_ops_library(sys.argv[1])\n"
                "lib = ctypes.CDLL(sys.argv[1])\n"
                "kinds = ['cpu'] if hasattr(lib, 'qo_matmul_mxfp4_f32') else []\n"
                "if hasattr(lib, 'qo_gpu_backend'):\n"
                "    lib.qo_gpu_backend.restype = ctypes.c_char_p\n"
                "    kinds.append(lib.qo_gpu_backend().decode())\n"
                "print('QO_KERNELS=' + ','.join(kinds))\n"
                "print('QO_SYMBOLS=' + ','.join(n for n in sys.argv[2:] if hasattr(lib, n)))\n")
# The C entry point behind each com.quark_onnx CPU kernel (custom_ops/src/qo_kernels.h, docs/custom_op_contract.md): a library built
# before an op's kernel existed runs that op through its ONNX function.
OP_SYMBOLS = {"MatMulMxfp4": "qo_matmul_mxfp4_f32", "MatMulFp8W8A8": "qo_matmul_fp8_w8a8_f32",
              "MatMulFp8W8A8Dyn": "qo_matmul_fp8_w8a8_dyn_f32", "MatMulBf16": "qo_matmul_bf16_f32",
              "MatMulFp8": "qo_matmul_fp8_f32", "MatMulInt8": "qo_matmul_int8_f32",
              "MatMulInt8W8A8": "qo_matmul_int8_w8a8_f32", "MatMulNvfp4": "qo_matmul_nvfp4_f32",
              "MatMulMxfp4R16": "qo_matmul_mxfp4_r16_f32", "MatMulNvfp4R16": "qo_matmul_nvfp4_r16_f32",
              "MatMulExpertsMxfp4R16": "qo_matmul_experts_mxfp4_r16_f32",
              "MatMulExpertsNvfp4R16": "qo_matmul_experts_nvfp4_r16_f32",
              "MatMulExpertsMxfp4": "qo_matmul_experts_mxfp4_f32", "MatMulExpertsNvfp4": "qo_matmul_experts_nvfp4_f32",
              "MatMulExpertsFp8": "qo_matmul_experts_fp8_f32", "MatMulExpertsInt8": "qo_matmul_experts_int8_f32",
              "MatMulUint4": "qo_matmul_int4_f32", "MatMulInt4": "qo_matmul_int4_f32",
              "MatMulExpertsUint4": "qo_matmul_experts_int4_f32", "MatMulExpertsInt4": "qo_matmul_experts_int4_f32",
              "GroupQueryAttentionFixedOrder": "qo_gqa_fixed_order_f32",
              "GroupQueryAttentionFixedOrderSinks": "qo_gqa_fixed_order_f32",
              "QuantizeDequantizeFp8": "qo_qdq_fp8_f32", "QuantizeDequantizeMxfp4": "qo_qdq_mxfp4_act_f32",
              "QuantizeDequantizeNvfp4": "qo_qdq_nvfp4_act_rows_f32"}  # rows: the per-row scales too
# MatMulExpertsUint4 / Int4 at accuracy_level 4 (int8 activations) need this kernel too (a library built before it
# has only the exact one)
INT4_EXPERTS_A8_SYMBOL = "qo_matmul_experts_int4_a8_f32"
_SYMBOLS: dict[str, frozenset] = {}  # library path -> the OP_SYMBOLS values it exports (filled by the check)


def _refuse(path: str, message: str) -> ConversionError:
    return ConversionError(message, file=path, field=FIELD, value=path)


_CHECKED: dict[tuple, tuple[str, ...]] = {}  # (path, size, mtime) -> kernels: one loading process per library file


def check_custom_ops_library(path: str) -> tuple[str, ...]:
    """The kernel builds the library holds (("cpu",), ("cpu", "cuda"), () for a foreign custom-op library), or
    ConversionError naming what is wrong with it."""
    try:
        st = Path(path).stat()
        key = (str(path), st.st_size, st.st_mtime_ns)
    except OSError:
        key = None
    if key in _CHECKED and str(path) in _SYMBOLS:
        return _CHECKED[key]
    kernels = _check(path)
    if key is not None:
        _CHECKED[key] = kernels
    return kernels


def exported_kernels(path: str) -> frozenset:
    """The OP_SYMBOLS entry points the library at `path` exports (checked and loaded once per file)."""
    check_custom_ops_library(path)
    return _SYMBOLS.get(str(path), frozenset())


def has_kernel(library: str | None, op: str) -> bool:
    """Whether the custom-op library at `library` (None: no library) exports com.quark_onnx `op`'s kernel."""
    return bool(library) and OP_SYMBOLS[op] in exported_kernels(str(library))


def _check(path: str) -> tuple[str, ...]:
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
        result = subprocess.run([sys.executable, "-c", _LOAD_SCRIPT, str(lib.resolve()),
                                 *OP_SYMBOLS.values(), INT4_EXPERTS_A8_SYMBOL], capture_output=True,
                                text=True, timeout=LOAD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise _refuse(path, f"ONNX Runtime did not finish loading the library in {LOAD_TIMEOUT_S} s") from None
    if result.returncode != 0:
        lines = [ln.strip() for ln in (result.stderr or result.stdout).splitlines() if ln.strip()]
        reason = lines[-1] if lines else f"exit code {result.returncode}"
        if result.returncode < 0:
            reason = f"the loading process died with signal {-result.returncode}"
        raise _refuse(path, f"ONNX Runtime cannot load it as a custom-op library: {reason[:300]}")
    symbols = [ln for ln in result.stdout.splitlines() if ln.startswith("QO_SYMBOLS=")]
    _SYMBOLS[str(path)] = frozenset(s for s in symbols[-1].split("=", 1)[1].split(",") if s) if symbols else frozenset()
    marker = [ln for ln in result.stdout.splitlines() if ln.startswith("QO_KERNELS=")]
    return tuple(k for k in marker[-1].split("=", 1)[1].split(",") if k) if marker else ()


def kernel_note(op: str, count: int, ep_name: str, library: str | None, kernels: tuple[str, ...]) -> str:
    """What runs a com.quark_onnx node on this EP, for `inspect` and the conversion log."""
    head = f"com.quark_onnx.{op} x{count} on {ep_name}: "
    if not library:
        return head + ("its ONNX function (standard ops; ORT constant-folds the weight into a dense float one at load: "
                       "the default form's speed and memory). For the kernel: "
                       "--extra_options custom_ops_library=PATH (`python -m custom_ops.ort_library` builds one)")
    if not kernels:
        return head + f"the kernel of {Path(library).name} if it registers {op} (not a quark_onnx_ops build), else " \
                      "its ONNX function"
    symbols = _SYMBOLS.get(str(library))
    if ep_name == "cpu" and "cpu" in kernels and symbols is not None and OP_SYMBOLS.get(op) not in symbols:
        return head + (f"its ONNX function: {Path(library).name} has no {op} kernel yet (built before it existed; "
                       "ORT constant-folds the weight into a dense float one at load)")
    if ep_name == "cpu" and "cpu" in kernels:
        return head + f"the CPU kernel of {Path(library).name}"
    if ep_name == "cuda" and "cuda" in kernels:
        return head + f"the CUDA kernel of {Path(library).name} on ORT's CUDA stream"
    if "cpu" in kernels:
        return head + (f"the CPU kernel of {Path(library).name}: ORT places the node on the CPU EP and copies its "
                       "input/output across (build with -DQO_WITH_CUDA=ON for a CUDA kernel)")
    return head + "its ONNX function (the library has no kernel for this EP)"
