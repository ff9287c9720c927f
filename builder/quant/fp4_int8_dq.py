"""MXFP4 / NVFP4 weights for MIGraphX: INT8 DequantizeLinear with blocked scales -> MatMul (EPConfig.fp4_linear
"dq_int8"). Exact: W = e2m1 * s = (2 * e2m1) * (s / 2), and 2 * e2m1 is an integer in -12..12; halving a float
scale is exact (no subnormal or fp16 underflow: scales_in_io refuses a block scale the io dtype cannot hold).

    x ─► MatMul ◄─ DequantizeLinear(int8 [K, N] = 2*e2m1, scale [K/g, N] = block_scale/2, axis=0, block_size=g)

Why this form for MIGraphX (AMDMIGraphX, commit f729a52):
  - float4e2m1 initializers are misread: src/onnx/onnx_parser.cpp parse_tensor_shape halves the packed last dim for
    INT4/UINT4 only (is_type_packed_int4), so a FLOAT4E2M1 tensor gets the wrong byte count; and the ref target
    cannot visit fp4x2_type (measured, issue 9). The float8e4m3fn coding of e2m1 is refused by get_type (17).
  - int8 and blocked scales parse: get_type(3) = int8_type; parse_dequantizelinear.cpp passes axis/block_size to
    op::builder::transform_quantize_dequantize_linear_inputs
    (src/op/builder/include/migraphx/op/builder/quantize_dequantize_linear.hpp),
    which needs scale rank == x rank, equal dims except `axis`, more than one block along it (si > 1) and
    block_size in [ceil(Di/Si), ceil(Di/(Si-1)) - 1]. A layer with a single block along K (K == g) gets the
    per-axis form (scale [N], axis=1) instead, which is the same numbers.
  - no zero point: the 2-input DequantizeLinear (int8, zero point 0) is what ORT and MIGraphX default to.
"""
from __future__ import annotations

import numpy as np

from . import fp4_codes


def emit_weight_dq_int8(ctx, plan, x: str, w) -> str:
    from .mxfp4 import scales_in_io  # late: mxfp4 imports this module's emitter
    g = ctx.graph
    q_kn = np.ascontiguousarray(fp4_codes.E2M1_DOUBLED[w.codes].T)              # int8 [K, N]
    s_kn = np.ascontiguousarray(scales_in_io(ctx, plan, w, 0.5).T)             # io dtype [K/g, N]
    wq = g.initializer(f"{plan.name}.weight_e2m1x2.T", q_kn)
    if s_kn.shape[0] == 1:  # one block along K: MIGraphX's blocked path needs > 1 block (per-axis is the same)
        ws = g.initializer(f"{plan.name}.weight_scale_half", np.ascontiguousarray(s_kn.reshape(-1)))
        wt = g.op("DequantizeLinear", [wq, ws], f"{plan.node_prefix}/DequantizeLinear", axis=1)
    else:
        ws = g.initializer(f"{plan.name}.weight_block_scale_half.T", s_kn)
        wt = g.op("DequantizeLinear", [wq, ws], f"{plan.node_prefix}/DequantizeLinear", axis=0,
                  block_size=w.group)
    return g.op("MatMul", [x, wt], f"{plan.node_prefix}/MatMul")


DESCRIBE = "DequantizeLinear(int8 2*e2m1, block {group}, scale/2) -> MatMul (exact)"
