"""The compact CPU default: quantized weights keep their checkpoint bytes, and the custom-op library that reads them
is found or built by the converter itself and shipped in the output folder.

On the cpu EP, unless the user chose otherwise with --extra_options:
  FP8 (per-tensor / per-channel)  fp8_linear=compact   com.quark_onnx MatMulFp8(x, W e4m3fn [N, K], s_w)
  INT8 W8A8 (int8, symmetric)     int8_linear=compact  com.quark_onnx MatMulInt8W8A8(x, W int8 [N, K], s_w, s_x)
                                                       (symmetric int8 activations, fp32 io: the activation's
                                                       quantizer inside, an exact integer GEMM), else
                                                       Q/DQ + MatMulInt8(x, W int8 [N, K], s_w)
  MXFP4                           fp4_linear=compact   com.quark_onnx MatMulMxfp4(x, W u8 [N, K/2], e8m0 [N, K/32])
  NVFP4                           fp4_linear=compact   com.quark_onnx MatMulNvfp4(x, W u8 [N, K/2], e4m3 [N, K/16], s2)
  uint4 / int4 weight-only        int4_linear=compact  com.quark_onnx MatMulUint4 / Int4(x, MatMulNBits' B, scales,
                                                       zero points): fp32 activations, exact (without the
                                                       library, or at an explicit accuracy_level other than 1:
                                                       MatMulNBits)
  4-bit integer MoE experts       int4_experts=compact com.quark_onnx MatMulExpertsUint4 / Int4 (the stacked
                                                       MatMulNBits bytes in place, accuracy_level 1: exact, as
                                                       the dense 4-bit linears; 4 at an explicit accuracy_level=4:
                                                       int8 activations as QMoE's; without the library: QMoE)
  bf16 lm_head                    lm_head=bf16         com.quark_onnx MatMulBf16 (builder/quant/float_bf16.py)
  bf16 embedding                  embedding=bf16       Gather + Cast (standard ops; set with the others)
The activation emulation of each scheme stays in front of the node, so the logits are the dense fp32 form's (the
weight product fp8 * s is the same float32 value; only the summation order of the GEMM differs): FP8 (static and the
dynamic per-token pairs), MXFP4 and NVFP4 activations as one com.quark_onnx QuantizeDequantizeFp8 / Mxfp4 / Nvfp4 node
each where the library has it (the standard-op subgraph's bits: builder/ops/qdq.py, builder/ops/mx_activation.py),
the rest in standard ops.
Every com.quark_onnx node carries its ONNX-function fallback: the output runs without the library too (ORT then
constant-folds the weight into the dense fp32 one at load: the old form's speed, and a higher peak memory while it
folds). A library built before an op's kernel existed therefore does not get that op's compact form by default: those
layers keep the dense fp32 form, with a note (missing_kernels).

The library (custom_ops/ort_library.py: the ORT C API header, fetched once, and a C/C++ compiler) is looked up or built
at plan time. When that fails (no compiler, no header, no network) the conversion prints one warning naming the reason
and the command to run, and writes the fp32 forms of before (fp8_linear/int8_linear=dequantized_weight,
fp4_linear=dense, lm_head=float, embedding=float). `--extra_options custom_ops_library=none` asks for those forms directly.
"""
from __future__ import annotations

from dataclasses import replace

COMPACT = "compact"
COMPACT_ROWS = "compact_rows"  # fp4_linear: MatMulMxfp4 / MatMulNvfp4 on the checkpoint's byte order (quant/fp4_tiles.py)
CPU_ONLY_FORMS = (COMPACT, COMPACT_ROWS)
NO_LIBRARY = "none"  # --extra_options custom_ops_library=none
# the fp32 forms each compact default falls back to (today's pre-compact CPU default)
FP32_FORMS = {"fp8_linear": "dequantized_weight", "int8_linear": "dequantized_weight", "fp4_linear": "dense",
              "int4_linear": "matmul_nbits", "int4_experts": "qmoe"}
BUILD_COMMAND = "python -m custom_ops.ort_library"
EMBEDDING = "model.embed_tokens.weight"


def is_cpu_default(ep) -> bool:
    return ep.name == "cpu"


def bf16_defaults(options, ckpt, ep, with_library: bool) -> dict:
    """lm_head / embedding defaults for a BF16 checkpoint on the cpu EP (only keys the user did not give)."""
    if not is_cpu_default(ep) or not with_library:  # no library: everything as before the compact default
        return {}
    out = {}
    if "embedding" not in options.extra and EMBEDDING in ckpt and ckpt.dtype(EMBEDDING) == "BF16":
        out["embedding"] = "bf16"
    head = "lm_head.weight" if "lm_head.weight" in ckpt else EMBEDDING
    if "lm_head" not in options.extra and head in ckpt and ckpt.dtype(head) == "BF16":
        out["lm_head"] = "bf16"
    return out


def fp32_ep(ep, options, only=None):
    """The EP profile with the fp32 forms for every compact default the user did not choose explicitly (`only`: for
    these keys only)."""
    return replace(ep, **{k: v for k, v in FP32_FORMS.items() if getattr(ep, k) == COMPACT and k not in options.extra
                          and (only is None or k in only)})


# which default each com.quark_onnx op comes from
OP_KEYS = {"MatMulFp8": "fp8_linear", "MatMulInt8": "int8_linear", "MatMulInt8W8A8": "int8_linear", "MatMulMxfp4": "fp4_linear",
           "MatMulNvfp4": "fp4_linear", "MatMulMxfp4R16": "fp4_linear", "MatMulNvfp4R16": "fp4_linear",
           "MatMulBf16": "lm_head", "MatMulUint4": "int4_linear",
           "MatMulInt4": "int4_linear"}


def missing_kernels(plan, library: str, options) -> dict[str, str]:
    """{default key: op} for the default compact forms whose op `library` has no CPU kernel for (a build older than
    the op). Keys the user chose explicitly are kept as chosen."""
    from .custom_ops_library import OP_SYMBOLS, exported_kernels
    symbols = exported_kernels(str(library))
    out = {}
    for lp in plan.linears.values():
        op = getattr(lp.scheme, "custom_op", lambda *_: None)(lp, plan.ep, plan.io)
        key = OP_KEYS.get(op)
        if key and key not in options.extra and OP_SYMBOLS[op] not in symbols:
            out[key] = op
    return out


# the 16-row-tile FP4 ops (builder/quant/fp4_tiles.py) and the checkpoint-order op a library older than them has
TILE_ROWS_OPS = {"MatMulMxfp4R16": "MatMulMxfp4", "MatMulNvfp4R16": "MatMulNvfp4"}


def rows_instead(missing: dict[str, str], library: str) -> bool:
    """True when the FP4 default's missing kernel is a 16-row-tile op whose checkpoint-order op `library` has: the
    default then takes `fp4_linear=compact_rows` instead of the dense fp32 form."""
    from .custom_ops_library import OP_SYMBOLS, exported_kernels
    op = missing.get("fp4_linear")
    return op in TILE_ROWS_OPS and OP_SYMBOLS[TILE_ROWS_OPS[op]] in exported_kernels(str(library))


def rows_note(op: str, library: str) -> str:
    return (f"fp4_linear: {TILE_ROWS_OPS[op]} on the checkpoint's order, not the 16-row tiles of the compact default: "
            f"{library} has no {op} kernel (built before it existed). `{BUILD_COMMAND} --force` rebuilds it")


def missing_note(key: str, op: str, library: str) -> str:
    return (f"{key}: the dense fp32 form, not the compact default: {library} has no {op} kernel (built before it "
            f"existed; through its ONNX function ORT would fold the weight to fp32 at load). `{BUILD_COMMAND} "
            "--force` rebuilds it from the current sources")


def find_or_build(build: bool = True, log=None) -> tuple[str | None, str]:
    """(library path, "") or (None, why). `build`: fetch the header and compile when not built yet (the conversion);
    False: only look (inspect)."""
    try:
        from custom_ops import ort_headers, ort_library
    except ImportError as exc:
        return None, f"the custom_ops package is not importable ({exc})"
    path, why = ort_library.available()
    if path is not None:
        return str(path), ""
    if not build:
        return None, why
    if log:
        log(f"building the custom-op library once ({BUILD_COMMAND}) ...")
    try:
        return str(ort_library.build(fetch=True, log=lambda m: None)), ""
    except (ort_headers.HeadersUnavailable, ort_library.BuildFailed, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return None, first[:200]


def fallback_warning(why: str) -> str:
    return (f"compact CPU weights unavailable ({why}): writing the dense fp32 forms; run `{BUILD_COMMAND}` "
            "(a C/C++ compiler, network once for the ORT header) and convert again")
