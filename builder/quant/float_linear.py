"""Unquantized (excluded or float-checkpoint) linears: a plain MatMul on W.T in the io dtype.

The float lm_head on the CPU EP with fp32 io is the exception: it keeps the checkpoint's [vocab, hidden] row order
and multiplies with Gemm(transB=1) (x reshaped to 2-D and back). On ORT 1.32's CPU EP that measured the same speed
and session memory as the MatMul on the transposed copy (hidden 2048, vocab 128256: 36.5 vs 36.9 ms at M=1, 234.7 vs
229.2 ms at M=128, 1148 MiB RSS each; benchmarks/lm_head_forms.py has both rows), while conversion writes it as a sequential row stream instead of
scattering every column band of a transposed copy (at the Llama-3 8B shape the scattered writes were 6.9 s of the
main thread's 13 s of writes: docs/benchmarks.md). A tied lm_head then is the embedding's own initializer: one copy
in model.onnx.data instead of two.
"""
from __future__ import annotations

from ..errors import ConversionError
from .base import LinearPlan, Scheme


class FloatLinear(Scheme):
    name = "float"

    @classmethod
    def accepts(cls, spec) -> bool:
        # float weights whose only quantization is of the output (an FP8 KV cache on an excluded projection, e.g.
        # DeepSeek's kv_b_proj): the attention emitter reads the output spec, the matmul itself is float
        return spec is None or (not spec.weight and not spec.input_tensors and bool(spec.output_tensors))

    @classmethod
    def check(cls, plan: LinearPlan, ckpt, ep) -> None:
        wname = plan.weight_name or f"{plan.name}.weight"
        shape = ckpt.shape(wname)
        if shape != (plan.out_features, plan.in_features):
            raise ConversionError("float weight has the wrong shape", file=ckpt.model_dir, layer=wname,
                                  field="shape", value=list(shape),
                                  accepted=str([plan.out_features, plan.in_features]))
        if ckpt.dtype(wname) not in ("F32", "F16", "BF16"):
            raise ConversionError("layer has no quantization spec but its weight is not float", file=ckpt.model_dir,
                                  layer=wname, field="dtype", value=ckpt.dtype(wname))

    @classmethod
    def describe(cls, plan: LinearPlan, ep, io: str | None = None) -> str:
        if row_order_gemm(plan, ep.name, "fp32"):
            return "Gemm transB=1 on the checkpoint's [out, in] float weight (fp32 io; MatMul otherwise)"
        return "MatMul (float weight)"

    @classmethod
    def emit(cls, ctx, plan: LinearPlan, x: str) -> str:
        tensor = plan.weight_name or f"{plan.name}.weight"
        if row_order_gemm(plan, ctx.ep.name, ctx.io):
            return emit_gemm_trans_b(ctx, plan, x, ctx.float_initializer(tensor, tensor))
        w_t = ctx.float_initializer(f"{plan.name}.weight.T", tensor, transpose=True)
        return ctx.graph.op("MatMul", [x, w_t], f"{plan.node_prefix}/MatMul")


def row_order_gemm(plan: LinearPlan, ep_name: str, io: str) -> bool:
    """The lm_head on CPU with fp32 io: Gemm on the [out, in] weight (module docstring)."""
    return plan.name == "lm_head" and ep_name == "cpu" and io == "fp32"


def emit_gemm_trans_b(ctx, plan: LinearPlan, x: str, weight: str) -> str:
    """x [..., K] -> Reshape [-1, K] -> Gemm(transB=1) with weight [N, K] -> Reshape [..., N]."""
    g, p = ctx.graph, plan.node_prefix
    flat = g.op("Reshape", [x, g.const_i64(f"{p}/flat_shape", [-1, plan.in_features])], f"{p}/Reshape_in")
    y = g.op("Gemm", [flat, weight], f"{p}/Gemm", transB=1)
    lead = g.op("Shape", [x], f"{p}/Shape", end=-1)
    shape = g.op("Concat", [lead, g.const_i64(f"{p}/out_features", [plan.out_features])], f"{p}/Concat", axis=0)
    return g.op("Reshape", [y, shape], f"{p}/Reshape_out")
