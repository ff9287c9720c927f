"""`--extra_options amd_arch=gfx950` on -e rocm / -e migraphx: MXFP4 linears in the form MIGraphX lowers to gfx950's
native MX FP4 GEMM (a 4-input quant_dot), instead of today's io-dtype GEMM on a decoded weight.

    x ─► [Cast f32] ─► QuantizeLinear(s_x, float4e2m1, axis -1, block 32) ─► DequantizeLinear(s_x) ─┐
         s_x = Quark's `even` e8m0 block scale, computed in ops (ops/mx_activation.py)                │
    int8 2*e2m1 [K, N] ─► DequantizeLinear(0.5) ─► QuantizeLinear(1, float4e2m1, axis 0, block 32)  MatMul (f32)
        ─► DequantizeLinear(e8m0 block scales [K/32, N], axis 0, block 32) ─────────────────────────┘    │
                                                                                              [Cast io] ◄┘

Why this form (AMDMIGraphX f729a52, read from source; docs/amd_generations.md):
  - src/targets/gpu/target.cpp runs simplify_qdq{.use_mx_quant = gfx_has_mx_intrinsics()} (gfx950 only:
    device_name.cpp gfx_has_mx_intrinsics_impl); src/simplify_qdq.cpp match_find_mx_quantizable_ops turns
    dot(dequantizelinear(a, s_a), dequantizelinear(b, s_b)) into a 4-input quant_dot when both dequantizelinear have
    no zero point (nargs(2)) and a block scale (block_dq: neither scalar nor 1-D), reached through
    broadcast/reshape/convert only (skip_post_dq_ops). Both operands therefore need a blocked 2-input
    DequantizeLinear; the activations' QuantizeLinear to float4e2m1 parses as quantizelinear + pack_fp4 + unpack_fp4
    (op/builder/quantizelinear.cpp handle_fp4x2).
  - the weight cannot be a float4e2m1 initializer (onnx_parser.cpp parse_tensor_shape misreads it), so it is
    today's exact int8 2*e2m1 bytes (quant/fp4_int8_dq.py), halved to the e2m1 values and re-quantized to
    float4e2m1 with unit scales (exact: they are e2m1 values); propagate_constant folds that constant chain up to
    pack_fp4 (src/propagate_constant.cpp skip_propagate stops at unpack_fp4), so the compiled program holds the
    weight at 4 bits.
  - a blocked scale needs more than one block along K (op/builder/.../quantize_dequantize_linear.hpp: si > 1):
    a layer with K = 32 keeps the dq_int8 form (per-axis scale, float activation emulation).
  - the activation pair reaches a MatMul the per-tensor quant_dot rule does not take, so ops/keep_fake_quant.py
    doubles its QuantizeLinear inputs: on a chip without MX (gfx94x, gfx12) remove_qdq_pairs then keeps the pair
    and the same numbers are computed in float; on gfx950 the MX rule runs before remove_qdq_pairs and reads only
    the DequantizeLinear.
The numbers are today's: e2m1 * s on both operands, exactly (e8m0 scales; x / s_x is exact in float32). ONNX
Runtime CPU has no float4e2m1 Quantize/DequantizeLinear kernel, so the graph runs where the MIGraphX EP takes these
nodes; it is checked in MIGraphX's `ref` target (tools/migraphx_ref_compare.py --ort-extra_options).
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from . import fp4_codes

AMD_ARCHES = ("any", "gfx950")  # --extra_options amd_arch: any = the forms every gfx parses (the default)
MX_ARCH = "gfx950"
MX_GEMM_OPSET = 23                # QuantizeLinear output_dtype / DequantizeLinear input float4e2m1
MX_GROUP = 32


def mx_gemm_applies(ep, plan, mx_activations: str = "emulate") -> str | None:
    """None when this MXFP4 linear takes the gfx950 MX GEMM form, else why not ('' when the option is not given)."""
    if getattr(ep, "amd_arch", None) != MX_ARCH:
        return ""
    if ep.fp4_linear != "dq_int8":
        return f"fp4_linear={ep.fp4_linear} chosen"
    a = plan.spec.input_tensors if plan.spec is not None else ()
    if not a or a[0].dtype != "fp4":
        return "MXFP4 weight-only: the activation operand is float, and the MX quant_dot needs both operands MX"
    if mx_activations != "emulate":
        return "mx_activations=skip: the activation operand is float"
    if plan.in_features // MX_GROUP < 2:
        return (f"one FP4 block along K={plan.in_features}: MIGraphX's blocked Q/DQ needs more than one "
                "(quantize_dequantize_linear.hpp)")
    return None


def emit_weight_mx(ctx, plan, w) -> str:
    """The weight operand [K, N] in float32: DQ(int8 2*e2m1, 0.5) -> Q(ones, float4e2m1) -> DQ(block scales)."""
    from .mxfp4 import scales_in_io  # late: mxfp4 imports this module
    g = ctx.graph
    g.opsets[""] = max(g.opsets[""], MX_GEMM_OPSET)
    q_kn = np.ascontiguousarray(fp4_codes.E2M1_DOUBLED[w.codes].T)              # int8 [K, N]
    # float32 [K/32, N] (values the io dtype holds: scales_in_io refuses others). The whole chain stays float32, as
    # the activation side does: MIGraphX's 4-input quant_dot needs both block scales of one type (check_shapes
    # same_type), and remove_qdq_pairs' compare_literals throws on literals of two types (raw_data.hpp visit_all;
    # both measured on fp16 graphs).
    s_kn = np.ascontiguousarray(scales_in_io(ctx, plan, w).T).astype(np.float32)
    p = plan.node_prefix
    wq = g.initializer(f"{plan.name}.weight_e2m1x2.T", q_kn)
    half, ones = "mx_gemm.half", f"mx_gemm.ones_{s_kn.shape[0]}x{s_kn.shape[1]}"  # shared by the layers
    if not g.has(half):
        g.initializer(half, np.array(0.5, np.float32))
    if not g.has(ones):  # blocked like the scales (the form tools/migraphx_gfx950_probe.py's mx_dot checks)
        g.initializer(ones, np.ones(s_kn.shape, np.float32))
    values = g.op("DequantizeLinear", [wq, half], f"{p}/WeightE2m1")           # float32 e2m1 values
    fp4 = g.op("QuantizeLinear", [values, ones], f"{p}/WeightToFp4", axis=0, block_size=w.group,
               output_dtype=TensorProto.FLOAT4E2M1)
    ws = g.initializer(f"{plan.name}.weight_block_scale.T", s_kn)
    return g.op("DequantizeLinear", [fp4, ws], f"{p}/WeightFromFp4", axis=0, block_size=w.group)


def emit_mx_matmul(ctx, plan, xq: str, wt: str) -> str:
    """MatMul of the two float32 MX operands, then the io dtype. Not a MatMul in the io dtype: on an fp16 graph the
    MX rule's quant_dot (float output) would replace the half dot without a convert back (simplify_qdq.cpp
    match_find_mx_quantizable_ops::apply, unlike match_find_quantizable_ops), and the next half op fails to compile
    ("concat: Types do not match", measured with tools/migraphx_mx_matcher_check.py)."""
    g = ctx.graph
    y = g.op("MatMul", [xq, wt], f"{plan.node_prefix}/MatMul")
    return y if ctx.io == "fp32" else g.op("Cast", [y], f"{plan.node_prefix}/CastIo", to=ctx.io_type)


def routed_mx_applies(ep, plan, mx_activations: str = "emulate") -> str | None:
    """None when this MXFP4 expert projection, in the routed standard-op form (ops/routed_experts.py), takes the
    gfx950 MX form (emit_routed_weight_mx), else why not ('' when the option is not given). The same conditions as a
    dense linear: MXFP4 activations emulated, more than one 32-block along K."""
    return mx_gemm_applies(ep, plan, mx_activations)


def emit_routed_weight_mx(ctx, values: str, scale: str, nb: int, p: str) -> str:
    """The chosen experts' weight operand in float32, [..., K, N] (nb leading routing axes): their e2m1 values
    (float32, decoded from the gathered codes) re-quantized to float4e2m1 with unit block scales (exact: they are
    e2m1 values), then DequantizeLinear with the gathered e8m0 block scales `scale` (float32 [..., K/32, N]):

        values ─► QuantizeLinear(Expand(1, Shape(scale)), float4e2m1, axis nb, block 32)
               ─► DequantizeLinear(scale, axis nb, block 32)

    The dense form's weight chain (emit_weight_mx) with run-time tensors: MIGraphX's matcher takes them
    (simplify_qdq.cpp block_dq reads only the scale's rank, no constant check; quant_dot takes any rank >= 2 with
    equal batch dimensions: op/quant_dot.hpp compute_shape). The unit scale is a run-time Expand of the scale's shape
    (the parser's blocked Q/DQ needs the scale at x's rank with x's dims off the axis:
    quantize_dequantize_linear.hpp); its DequantizeLinear partner has the gathered scale, so remove_qdq_pairs keeps
    the pair on chips without MX (is_same_scale_zero: a run-time value is no literal)."""
    g = ctx.graph
    g.opsets[""] = max(g.opsets[""], MX_GEMM_OPSET)
    one = "mx_gemm.one"
    if not g.has(one):
        g.initializer(one, np.array(1.0, np.float32))
    ones = g.op("Expand", [one, g.op("Shape", [scale], f"{p}/ScaleShape")], f"{p}/UnitScale")
    fp4 = g.op("QuantizeLinear", [values, ones], f"{p}/WeightToFp4", axis=nb, block_size=MX_GROUP,
               output_dtype=TensorProto.FLOAT4E2M1)
    return g.op("DequantizeLinear", [fp4, scale], f"{p}/WeightFromFp4", axis=nb, block_size=MX_GROUP)


DESCRIBE = ("MXFP4 activations (Quark's even block scale) and weights (int8 2*e2m1 -> DQ(0.5)) each through "
            "QuantizeLinear(float4e2m1, block 32) + DequantizeLinear(e8m0 block scales) -> MatMul (amd_arch=gfx950 "
            "MX GEMM form, opset 23)")
