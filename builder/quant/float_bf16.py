"""`lm_head=bf16` (the cpu default for a BF16 lm_head, builder/compact_forms.py): a bf16 float lm_head kept as the
checkpoint's own bf16 bits, multiplied by the com.quark_onnx MatMulBf16 kernel (custom_ops library, CPU).

    x ──► MatMulBf16(x, B bfloat16 [vocab, hidden]) ──► logits        (+ its ONNX-function fallback)

Exact: bf16 -> float32 is a shift, so the kernel computes what the float lm_head computes, x @ float32(W).T with
float32 sums (in a fixed order, the same bits on every x86 CPU: custom_ops/src/qo_cpu_kernels.c). It reads half the
bytes of the fp32 MatMul per token (the lm_head is the largest tensor a decode step reads at a 128k vocabulary), and
the file holds the checkpoint's 2 bytes per weight. Without the library in the session (no `custom_ops_library=PATH`)
ORT runs the function fallback: Cast + Transpose of the initializer, constant-folded into the default fp32 form.
Only for a BF16 checkpoint tensor (an F16 or F32 lm_head would be rounded) on the CPU EP (no GPU kernel; MIGraphX
cannot read custom ops). Streamed from the checkpoint in row blocks, no transposed copy.
"""
from __future__ import annotations

from ..errors import ConversionError
from . import fp8_custom_op
from .base import LinearPlan
from .float_linear import FloatLinear

OP = "MatMulBf16"  # registered for float and float16 A: every io the cpu EP allows (ep_configs/cpu.py)
EMBEDDING = "model.embed_tokens.weight"


def check_embedding(ckpt, ep) -> None:
    """`--extra_options embedding=bf16` (EmitContext.embedding): a BF16 table, on the CPU EP (whose Gather and Cast
    take bfloat16; not checked on the GPU EPs)."""
    field = "--extra_options embedding"
    if ep.name != "cpu":
        raise ConversionError(f"embedding=bf16 is for the cpu EP, not {ep.name}", field=field, value="bf16",
                              accepted="float")
    if EMBEDDING in ckpt and ckpt.dtype(EMBEDDING) != "BF16":
        raise ConversionError(f"embedding=bf16 keeps the checkpoint's bf16 bits, but {EMBEDDING} is "
                              f"{ckpt.dtype(EMBEDDING)}", file=ckpt.model_dir, layer=EMBEDDING, field=field,
                              value="bf16", accepted="float")


class FloatBf16Linear(FloatLinear):
    name = "float->bf16 kernel"

    @classmethod
    def accepts(cls, spec) -> bool:
        return False  # chosen by --extra_options lm_head=bf16 (convert.plan_model), never by a spec

    @classmethod
    def check(cls, plan: LinearPlan, ckpt, ep) -> None:
        super().check(plan, ckpt, ep)
        tensor = plan.weight_name or f"{plan.name}.weight"
        if ep.name != "cpu":
            raise ConversionError(f"{ep.name} has no MatMulBf16 kernel (CPU only)", layer=plan.name,
                                  field="--extra_options lm_head", value="bf16", accepted="float, int8")
        if ckpt.dtype(tensor) != "BF16":
            raise ConversionError(f"lm_head=bf16 keeps the checkpoint's bf16 bits, but {tensor} is "
                                  f"{ckpt.dtype(tensor)}", file=ckpt.model_dir, layer=plan.name,
                                  field="--extra_options lm_head", value="bf16", accepted="float, int8")
        if not fp8_custom_op.available():
            raise ConversionError("lm_head=bf16 needs the custom_ops package (its ONNX-function fallback)",
                                  layer=plan.name, field="--extra_options lm_head", value="bf16",
                                  accepted="float, int8")

    @classmethod
    def custom_op(cls, plan: LinearPlan, ep, io: str | None = None) -> str | None:
        return OP

    @classmethod
    def describe(cls, plan: LinearPlan, ep, io: str | None = None) -> str:
        return ("com.quark_onnx MatMulBf16 on the checkpoint's bf16 weight (exact; the cpu default for a bf16 lm_head, "
                "lm_head=float for the fp32 Gemm)")

    @classmethod
    def emit(cls, ctx, plan: LinearPlan, x: str) -> str:
        from custom_ops.functions import DOMAIN, FUNCTIONS

        g = ctx.graph
        b = ctx.bf16_initializer(plan.weight_name or f"{plan.name}.weight")  # tied + embedding=bf16: shared
        g.add_function(FUNCTIONS[OP](g.opsets[""]), opset_version=1)
        return g.op(OP, [x, b], f"{plan.node_prefix}/{OP}", domain=DOMAIN)
