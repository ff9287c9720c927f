"""INT8/UINT8 W8A8: int8/uint8 weights (per_tensor or per_channel) with a static per-tensor activation scale and
zero point (Quark's `int8` template, SmoothQuant-style exports).

Tensors (quark_format.md section 2): weight int8/uint8 [out, in]; weight_scale [] or [out] (float32 in the template);
weight_zero_point [] or [out]; input_scale []; input_zero_point [] (int8 or uint8, 0 when symmetric).
Quark's numerics: q = clamp(round_half_even(x * fp32(1 / s)) + zp), x_q = (q - zp) * s (PyTorch's
fake_quantize_per_tensor_affine, which Quark's CPU path calls: quark/torch/kernel/hw_emulation/hw_emulation_interface.py
fake_quantize_int_per_tensor_affine); weights W = (q_w - zp_w) * s_w.

Emitted per EP (EPConfig.int8_linear, --extra_options int8_linear=...):
  compact (CPU default, builder/compact_forms.py; symmetric int8 weights):
    symmetric int8 activation (zero point 0), fp32 io:
    x ─► com.quark_onnx MatMulInt8W8A8(x, W int8 [out, in] (the checkpoint's bytes), s_w, s_x)
    The node quantizes x itself with Quark's quantizer (x * fp32(1/s_x), round half to even, clamp) and sums q @ W^T
    exactly in integers (custom_ops/src/qo_cpu_int8_w8a8.c: VNNI / int16 products, never a saturating pair sum), then
    scales once: the real product of the Q/DQ'd operands up to three final roundings, the same bits on every CPU.
    otherwise (a uint8 or asymmetric activation, fp16 io):
    x ─► Mul(1/s_x) ─► QuantizeLinear(1, zp_x) ─► DequantizeLinear(s_x, zp_x) ─► com.quark_onnx MatMulInt8 ◄─ int8 W
    [out, in] (the checkpoint's bytes), s_w: the same float32 product q_w * s_w as the form below, float GEMM.
  dequantized_weight (CPU default):
    x ─► Mul(1/s_x) ─► QuantizeLinear(1, zp_x) ─► DequantizeLinear(s_x, zp_x) ─► MatMul ◄─ fp32 (q_w - zp_w) * s_w
    Only the activation is Q/DQ'd, so ORT has no DQ·DQ MatMul to fuse: the GEMM is float, and the logits are the
    same on every CPU ((q - zp) * s is the correctly rounded fp32 product DequantizeLinear computes).
  qdq (GPU EPs; opt-in on CPU):
    x ─► Mul(1/s_x) ─► Q(1, zp_x) ─► DQ(s_x, zp_x) ─► MatMul ◄─ DequantizeLinear(int8 W.T [in,out], s_w, zp_w)
    ORT CPU fuses this into MatMulIntegerToFloat (integer GEMM); MIGraphX's simplify_qdq into an INT8 quant_dot.
    On x86 CPUs without AVX-VNNI / AVX512-VNNI, ORT's u8s8 integer kernel (MLAS qgemm_kernel_avx2.cpp, the U8S8
    AVX2 path built on vpmaddubsw) adds int8 products in int16 pairs with saturation: the logits then depend on the
    CPU (issue #11, measured on an AVX2-only machine: max logit difference 0.15-0.26 on the tiny test models,
    perplexity +17.7 % on a 135M model; 7e-7 with graph optimizations off). Not reproducible on a VNNI machine.
"""
from __future__ import annotations

import numpy as np

from ..errors import ConversionError
from ..ops.qdq import dequantize, quantize, weight_dq
from .base import LinearPlan, Scheme

INT_DTYPES = {"int8": np.int8, "uint8": np.uint8}
SAFETENSORS = {"int8": "I8", "uint8": "U8"}
INT8_LINEAR_FORMS = ("compact", "dequantized_weight", "qdq")  # EPConfig.int8_linear values
COMPACT_IO = ("fp32", "fp16")  # MatMulInt8 takes float and float16 A (docs/custom_op_contract.md)


def _fail(ckpt, layer, message, field=None, value=None, accepted=None):
    raise ConversionError(message, file=ckpt.model_dir, layer=layer, field=field, value=value, accepted=accepted)


class Int8W8A8(Scheme):
    name = "int8-w8a8"

    @classmethod
    def accepts(cls, spec) -> bool:
        return (spec is not None and len(spec.weight) == 1 and spec.weight[0].dtype in INT_DTYPES
                and spec.weight[0].qscheme in ("per_tensor", "per_channel") and len(spec.input_tensors) == 1
                and spec.input_tensors[0].dtype in INT_DTYPES)

    @classmethod
    def check(cls, plan: LinearPlan, ckpt, ep) -> None:
        spec, base = plan.spec, plan.name
        w, a = spec.weight[0], spec.input_tensors[0]
        if a.is_dynamic:
            _fail(ckpt, base, "dynamic INT8 activations are not supported", "input_tensors.is_dynamic", True, "false")
        if a.qscheme != "per_tensor":
            _fail(ckpt, base, "INT8 activations must be per_tensor", "input_tensors.qscheme", a.qscheme, "per_tensor")
        if w.qscheme == "per_channel" and w.ch_axis not in (0, None):
            _fail(ckpt, base, "per_channel weights must use the output axis", "weight.ch_axis", w.ch_axis, "0")
        if spec.output_tensors:
            _fail(ckpt, base, "output quantization with INT8 W8A8 is not supported", "output_tensors",
                  spec.output_tensors[0].short())
        if spec.bias:
            _fail(ckpt, base, "quantized bias is not supported", "bias.dtype", spec.bias[0].dtype)
        n, k = plan.out_features, plan.in_features
        for suffix in ("weight", "weight_scale", "input_scale"):
            if f"{base}.{suffix}" not in ckpt:
                _fail(ckpt, f"{base}.{suffix}", "tensor missing for an INT8 W8A8 layer", "weight.dtype", w.dtype)
        if tuple(ckpt.shape(f"{base}.weight")) != (n, k):
            _fail(ckpt, f"{base}.weight", "INT8 weight has the wrong shape", "shape",
                  list(ckpt.shape(f"{base}.weight")), str([n, k]))
        if ckpt.dtype(f"{base}.weight") != SAFETENSORS[w.dtype]:
            _fail(ckpt, f"{base}.weight", f"{w.dtype} weight stored with another dtype", "dtype",
                  ckpt.dtype(f"{base}.weight"), SAFETENSORS[w.dtype])
        want = 1 if w.qscheme == "per_tensor" else n
        for suffix in ("weight_scale", "weight_zero_point"):
            name = f"{base}.{suffix}"
            if name in ckpt and int(np.prod(ckpt.shape(name), dtype=np.int64)) != want:
                _fail(ckpt, name, f"{w.qscheme} weight {suffix} must hold {want} value(s)", "shape",
                      list(ckpt.shape(name)))
        for suffix in ("input_scale", "input_zero_point"):
            name = f"{base}.{suffix}"
            if name in ckpt and int(np.prod(ckpt.shape(name), dtype=np.int64)) != 1:
                _fail(ckpt, name, "per-tensor activation parameter must hold one value", "shape",
                      list(ckpt.shape(name)))
        s = float(ckpt.get_scale(f"{base}.input_scale").reshape(()))
        if not np.isfinite(s) or s <= 0:
            _fail(ckpt, f"{base}.input_scale", "scale must be positive and finite", "value", s)

    @staticmethod
    def _zp(ckpt, name: str, qtype: str, size: int) -> np.ndarray:
        if name not in ckpt:
            return np.zeros(size, INT_DTYPES[qtype])
        if ckpt.dtype(name) not in ("I8", "U8", "I16", "I32", "I64"):
            raise ConversionError("zero point must be an integer tensor", file=ckpt.model_dir, layer=name,
                                  field="dtype", value=ckpt.dtype(name), accepted="I8, U8, I32")
        z = np.asarray(ckpt.get(name)).astype(np.int64).reshape(-1)
        info = np.iinfo(INT_DTYPES[qtype])
        if z.min() < info.min or z.max() > info.max:
            raise ConversionError("zero point out of range for its dtype", file=ckpt.model_dir, layer=name,
                                  field="value", value=int(z.min()))
        return z.astype(INT_DTYPES[qtype])

    @classmethod
    def form(cls, plan: LinearPlan, ep) -> str:
        """compact needs symmetric int8 weights (MatMulInt8 has no zero point); others keep the fp32 weight."""
        if ep.int8_linear != "compact":
            return ep.int8_linear
        w = plan.spec.weight[0]
        return "compact" if w.dtype == "int8" and w.symmetric is not False and _functions_available() \
            else "dequantized_weight"

    @classmethod
    def custom_op(cls, plan: LinearPlan, ep, io: str | None = None) -> str | None:
        if cls.form(plan, ep) != "compact" or io not in (None, *COMPACT_IO):
            return None
        return "MatMulInt8W8A8" if _fused(plan, io) else "MatMulInt8"

    @classmethod
    def describe(cls, plan: LinearPlan, ep, io: str | None = None) -> str:
        w, a = plan.spec.weight[0], plan.spec.input_tensors[0]
        form = cls.form(plan, ep)
        if form == "compact" and _fused(plan, None):
            return (f"com.quark_onnx MatMulInt8W8A8: the {a.dtype} activation quantized inside, an exact integer "
                    f"GEMM on the checkpoint's int8 {w.qscheme} weight and scale (compact CPU default at fp32 io, "
                    "+ function fallback)")
        if form == "compact":
            return (f"Q/DQ {a.dtype} activation -> com.quark_onnx MatMulInt8 on the checkpoint's int8 {w.qscheme} "
                    "weight and scale (compact CPU default, + function fallback)")
        if ep.int8_linear == "compact":
            why = "uint8" if w.dtype != "int8" else "asymmetric"
            return (f"Q/DQ {a.dtype} activation -> MatMul on the fp32 dequantized {w.dtype} {w.qscheme} weight "
                    f"(MatMulInt8 takes symmetric int8 weights; this one is {why})")
        if ep.int8_linear == "dequantized_weight":
            return (f"Q/DQ {a.dtype} activation -> MatMul on the fp32 dequantized {w.dtype} {w.qscheme} weight "
                    "(exact, independent of the CPU's instruction set)")
        fused = (" (ORT CPU fuses it into MatMulIntegerToFloat: saturates on CPUs without VNNI)"
                 if ep.name == "cpu" else "")
        return (f"Q/DQ {a.dtype} activation + DequantizeLinear({w.dtype} {w.qscheme} weight) -> MatMul{fused}")

    @classmethod
    def emit(cls, ctx, plan: LinearPlan, x: str) -> str:
        g, ckpt, base, pre = ctx.graph, ctx.ckpt, plan.name, plan.node_prefix
        w, a = plan.spec.weight[0], plan.spec.input_tensors[0]
        n = plan.out_features
        q = np.asarray(ckpt.get(f"{base}.weight"))
        scale = ckpt.get_scale(f"{base}.weight_scale").reshape(-1)
        wzp = cls._zp(ckpt, f"{base}.weight_zero_point", w.dtype, scale.size)
        if w.qscheme == "per_channel" and scale.size == 1:
            scale, wzp = np.repeat(scale, n), np.repeat(wzp, n)
        form = cls.form(plan, ctx.ep)
        if form == "compact" and (ctx.io not in COMPACT_IO or np.any(wzp != 0)):  # zero point: config disagrees
            form = "dequantized_weight"
            if ctx.io in COMPACT_IO:
                ctx.notes.append(f"{base}: nonzero weight_zero_point: dense fp32 weight instead of MatMulInt8")
        w_t = None  # compact: the checkpoint's int8 bytes, after the activation Q/DQ below
        if form == "dequantized_weight":
            w = (q.astype(np.float32) - wzp.astype(np.float32).reshape(-1, 1)) * scale.astype(np.float32).reshape(-1, 1)
            w_t = g.initializer(f"{base}.weight.T", np.ascontiguousarray(w.T.astype(ctx.io_np)))
        elif form == "qdq":
            w_t = weight_dq(ctx, base, q.T, scale, wzp, f"{pre}/weight_dq")
        s_x = np.float32(ckpt.get_scale(f"{base}.input_scale").reshape(()))
        if form == "compact" and _fused(plan, ctx.io):
            if not np.any(cls._zp(ckpt, f"{base}.input_zero_point", a.dtype, 1)):
                return _emit_matmul_int8_w8a8(ctx, plan, x, q, scale, s_x)
            ctx.notes.append(f"{base}: nonzero input_zero_point: activation Q/DQ + MatMulInt8 instead of MatMulInt8W8A8")
        s = g.scalar(f"{base}.input_scale.q", float(s_x), ctx.io_np)
        zp = g.initializer(f"{base}.input_zero_point.q",
                           cls._zp(ckpt, f"{base}.input_zero_point", a.dtype, 1).reshape(()))
        # Quark's int8 fake quantizer is torch.fake_quantize_per_tensor_affine: round(x * (1/s)) with 1/s rounded to
        # fp32 first (not x / s, which QuantizeLinear computes). The two differ in the last bit for some x, and on a
        # real model those flipped roundings compound layer by layer (measured: SmolLM2-135M W8A8, x / s gives
        # ppl -1.8 % and top-1 0.58 against Quark; x * (1/s) is bit-identical in a PyTorch emulation).
        inv = g.scalar(f"{base}.input_scale.reciprocal", float(np.float32(1.0) / s_x), ctx.io_np)
        one = g.scalar(f"{base}.input_scale.unit", 1.0, ctx.io_np)
        xs = g.op("Mul", [x, inv], f"{pre}/input_quant/Mul_reciprocal")
        xq = dequantize(ctx, quantize(ctx, xs, one, zp, f"{pre}/input_quant"), s, zp, f"{pre}/input_quant")
        if form == "compact":
            return _emit_matmul_int8(ctx, plan, xq, q, scale)
        return g.op("MatMul", [xq, w_t], f"{pre}/MatMul")


def _fused(plan: LinearPlan, io: str | None) -> bool:
    """MatMulInt8W8A8 (the activation quantizer inside the node) takes symmetric int8 activations at fp32 io; a
    checkpoint whose zero point turns out nonzero gets the Q/DQ + MatMulInt8 form at emit time."""
    a = plan.spec.input_tensors[0]
    return a.dtype == "int8" and a.symmetric is not False and io in (None, "fp32") and plan.in_features <= 1 << 24


def _functions_available() -> bool:
    try:
        import custom_ops.functions  # noqa: F401
    except ImportError:
        return False
    return True


def _emit_matmul_int8(ctx, plan: LinearPlan, x: str, q: np.ndarray, scale: np.ndarray) -> str:
    """com.quark_onnx MatMulInt8(x, W int8 [N, K] (the checkpoint's bytes), s_w scalar|[N]) + its function."""
    from custom_ops.functions import DOMAIN, FUNCTIONS

    g, base = ctx.graph, plan.name
    g.add_function(FUNCTIONS["MatMulInt8"](g.opsets[""]), opset_version=1)
    s = np.asarray(scale, np.float32).reshape(-1)
    inputs = [x, g.initializer(f"{base}.weight.int8", np.ascontiguousarray(q, dtype=np.int8)),
              g.initializer(f"{base}.weight_scale.f32", s if s.size > 1 else s.reshape(()))]
    return g.op("MatMulInt8", inputs, f"{plan.node_prefix}/MatMulInt8", domain=DOMAIN)


def _emit_matmul_int8_w8a8(ctx, plan: LinearPlan, x: str, q: np.ndarray, scale: np.ndarray, s_x) -> str:
    """com.quark_onnx MatMulInt8W8A8(x, W int8 [N, K], s_w scalar|[N], s_x scalar) + its function."""
    from custom_ops.functions import DOMAIN, FUNCTIONS

    g, base = ctx.graph, plan.name
    g.add_function(FUNCTIONS["MatMulInt8W8A8"](g.opsets[""]), opset_version=1)
    s = np.asarray(scale, np.float32).reshape(-1)
    inputs = [x, g.initializer(f"{base}.weight.int8", np.ascontiguousarray(q, dtype=np.int8)),
              g.initializer(f"{base}.weight_scale.f32", s if s.size > 1 else s.reshape(())),
              g.initializer(f"{base}.input_scale.f32", np.asarray(s_x, np.float32).reshape(()))]
    return g.op("MatMulInt8W8A8", inputs, f"{plan.node_prefix}/MatMulInt8W8A8", domain=DOMAIN)
