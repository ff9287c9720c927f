"""Unquantized (excluded or float-checkpoint) linears: a plain MatMul on W.T in the io dtype."""
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
    def describe(cls, plan: LinearPlan, ep) -> str:
        return "MatMul (float weight)"

    @classmethod
    def emit(cls, ctx, plan: LinearPlan, x: str) -> str:
        w_t = ctx.float_initializer(f"{plan.name}.weight.T", plan.weight_name or f"{plan.name}.weight",
                                    transpose=True)
        return ctx.graph.op("MatMul", [x, w_t], f"{plan.node_prefix}/MatMul")
