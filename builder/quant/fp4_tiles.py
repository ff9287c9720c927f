"""MXFP4 / NVFP4 dense linears on the cpu compact form as com.quark_onnx MatMulMxfp4R16 / MatMulNvfp4R16: the
checkpoint's bytes reordered into 16-row tiles (custom_ops/fp4_r16.py; the layout and arithmetic in
custom_ops/src/qo_kernels.h, the kernel in qo_cpu_fp4_r16.c), the same byte count as the export.

Where it applies: `fp4_linear=compact` (the cpu default), float32 io (the ops take float A), out_features % 16 == 0,
and for MXFP4 not when the graph quantizes A to MXFP4 in front of the node (w_mxfp4_a_mxfp4: MatMulMxfp4's exact
block-integer path for A on the MXFP4 grid is faster there). Elsewhere MatMulMxfp4 / MatMulNvfp4 on the checkpoint's
bytes stay. Measured: custom_ops/README.md, "FP4 weights in 16-row tiles"."""
from __future__ import annotations

import ml_dtypes
import numpy as np

from .base import LinearPlan

TILE_OPS = {"mxfp4": "MatMulMxfp4R16", "nvfp4": "MatMulNvfp4R16"}
TILE_IO = (None, "fp32")
TILE_ROWS = 16


def tiles_apply(plan: LinearPlan, ep, io: str | None, grid_activations: bool = False) -> bool:
    """True where the FP4 linear is written in 16-row tiles (module docstring)."""
    return (ep.fp4_linear == "compact" and io in TILE_IO and plan.out_features % TILE_ROWS == 0
            and not grid_activations)


def describe(kind: str, act: str = "") -> str:
    return (f"com.quark_onnx {TILE_OPS[kind]} on the checkpoint's bytes in 16-row tiles (compact CPU default, + "
            f"function fallback){act}")


def emit_fp4_tiles(ctx, plan: LinearPlan, x: str, kind: str) -> str | None:
    """x @ W^T through MatMulMxfp4R16 / MatMulNvfp4R16 (+ its function and the helper it calls); None without the
    custom_ops package."""
    try:
        from custom_ops import fp4_r16
        from custom_ops.functions import DOMAIN, function_protos
    except ImportError:
        return None
    g, ckpt, name, op = ctx.graph, ctx.ckpt, plan.name, TILE_OPS[kind]
    for proto in function_protos(op, g.opsets[""]):
        g.add_function(proto, opset_version=1)
    codes = np.asarray(ckpt.get(f"{name}.weight"), dtype=np.uint8)
    scale = np.asarray(ckpt.get(f"{name}.weight_scale"))
    b, s = fp4_r16.pack(codes, scale.view(np.uint8) if scale.dtype != np.uint8 else scale)
    inputs = [x, g.initializer(f"{name}.weight", b),
              g.initializer(f"{name}.weight_scale", s.view(ml_dtypes.float8_e4m3fn) if kind == "nvfp4" else s)]
    if kind == "nvfp4":
        inputs.append(g.initializer(f"{name}.weight_scale_2",
                                    np.asarray(ckpt.get_f32(f"{name}.weight_scale_2"), dtype=np.float32).reshape(())))
    return g.op(op, inputs, f"{plan.node_prefix}/{op}", domain=DOMAIN, K=plan.in_features, N=plan.out_features)
