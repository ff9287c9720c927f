"""fp8_linear=custom_op: FP8 W8A8 linears as one com.quark_onnx node each, plus its ONNX-function fallback.

    static per-tensor activation  ->  MatMulFp8W8A8(x, W fp8 [N,K], s_w scalar|[N], s_x scalar)
    dynamic per-token activation  ->  MatMulFp8W8A8Dyn(x, W fp8 [N,K], s_w scalar|[N])   (PTPC)

The kernel (custom_ops library, CPU; CUDA when built with QO_WITH_CUDA) reads the 1-byte weight directly; without a
library ORT inlines the function, the same Q/DQ arithmetic in standard ops. Quark's numerics: x_q = sat_e4m3fn(x / s_x)
(float32 division, round half to even), W = fp8 * s_w, float32 accumulation. Per-token s_x = amax(row) / 448; the
kernel floors it at 1e-12 where the Q/DQ form puts float32 eps in place of 0 only: rows with 0 < amax < 4.5e-10
differ (both give ~0). With fp16 io the kernel computes s_x and x / s_x in float32 (the Q/DQ form in fp16).
Other activation modes (none, dynamic per-tensor) and bf16 io have no such op: they keep the EP's own FP8 form.
"""
from __future__ import annotations

import numpy as np

CUSTOM_OP_MODES = {"static": "MatMulFp8W8A8", "dynamic_token": "MatMulFp8W8A8Dyn"}
CUSTOM_OP_IO = (None, "fp32", "fp16")  # the kernels are registered for float and float16 A


def custom_op_for(mode: str, io: str | None) -> str | None:
    """The com.quark_onnx op for this activation mode and io dtype, or None when there is none."""
    return CUSTOM_OP_MODES.get(mode) if io in CUSTOM_OP_IO else None


def available() -> bool:
    """Whether the custom_ops package (the ops' ONNX-function fallbacks) is importable."""
    try:
        import custom_ops.functions  # noqa: F401
    except ImportError:
        return False
    return True


def emit_fp8_custom_op(ctx, plan, x: str, q: np.ndarray, scale: np.ndarray, mode: str,
                       input_scale: float | None) -> str:
    """One MatMulFp8W8A8[Dyn] node; q fp8 [N, K], scale [N, 1] or [1, 1]."""
    from custom_ops.functions import DOMAIN, FUNCTIONS

    op = CUSTOM_OP_MODES[mode]
    g, base = ctx.graph, plan.name
    g.add_function(FUNCTIONS[op](g.opsets[""]), opset_version=1)
    s = np.asarray(scale, np.float32).reshape(-1)
    inputs = [x, g.initializer(f"{base}.weight.fp8", np.ascontiguousarray(q)),
              g.initializer(f"{base}.weight_scale.f32", s if s.size > 1 else s.reshape(()))]
    if mode == "static":
        inputs.append(g.scalar(f"{base}.input_scale.f32", input_scale, np.float32))
    return g.op(op, inputs, f"{plan.node_prefix}/{op}", domain=DOMAIN)


def emit_matmul_fp8(ctx, plan, x: str, q: np.ndarray, scale: np.ndarray) -> str:
    """Weight-only com.quark_onnx MatMulFp8(x, W fp8 [N, K], s_w scalar|[N]) + its function (fp8_linear=compact)."""
    from custom_ops.functions import DOMAIN, FUNCTIONS

    g, base = ctx.graph, plan.name
    g.add_function(FUNCTIONS["MatMulFp8"](g.opsets[""]), opset_version=1)
    s = np.asarray(scale, np.float32).reshape(-1)
    inputs = [x, g.initializer(f"{base}.weight.fp8", np.ascontiguousarray(q)),
              g.initializer(f"{base}.weight_scale.f32", s if s.size > 1 else s.reshape(()))]
    return g.op("MatMulFp8", inputs, f"{plan.node_prefix}/MatMulFp8", domain=DOMAIN)
