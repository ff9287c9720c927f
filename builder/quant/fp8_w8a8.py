"""FP8 e4m3 weights (per_tensor / per_channel), with static, dynamic (per-tensor or per-token) or no activation
quantization: Quark's `fp8` template (amd/Llama-3.1-8B-Instruct-FP8-KV) and `ptpc_fp8`.

Tensors (quark_format.md section 2): weight float8_e4m3fn [out, in]; weight_scale [] or [out] (any float dtype);
input_scale [] when the activation is static; nothing for dynamic activations. k/v/q_proj output scales belong to the
attention (builder/attention_variants.py). Quark's numerics: W = fp8 * s_w; x_q = fp8(clip(x / s_x, +-448)) * s_x,
s_x = amax(x) / 448 per token (ptpc) or per tensor when dynamic.

Emitted per EP (EPConfig.fp8_linear):
  compact            : x ─Q/DQ(s_x)─► com.quark_onnx MatMulFp8 ◄─ fp8 W [out,in] (checkpoint bytes), s_w  (CPU default:
                       builder/compact_forms.py; the activation emulation is the dequantized_weight form's)
  qdq                : x ─Q/DQ(s_x)─► MatMul ◄─ DQ(fp8 W.T [in,out], s_w scalar or axis=1)   (MIGraphX: FP8 GEMM)
  dequantized_weight : x ─Q/DQ(s_x)─► MatMul ◄─ fp32 initializer fp8*s_w  (CPU: same logits, float MatMul speed;
                       fp8*s_w is the same correctly rounded fp32 product DequantizeLinear computes)
  matmul_block_fp8   : com.microsoft MatMulBlockQuantizedFp8Weight(x, fp8 W [out,in], s_w per 128-block, a_scale)
                       when io is fp16/bf16 and the activation is static or float; the qdq form otherwise (CUDA)
  custom_op          : com.quark_onnx MatMulFp8W8A8 (static) / MatMulFp8W8A8Dyn (per-token) + function fallback,
                       cpu and cuda, fp32/fp16 io; other modes keep the EP's own form (quant/fp8_custom_op.py)
Dynamic activations: u = DQ(Q(x / s_x, 1.0)); dequantized_weight: u * s_x ─► MatMul (Quark's order);
qdq: u ─► MatMul ─► * s_x (per-token scale after the GEMM, so that the GEMM's inputs are both DQ outputs).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from ..errors import ConversionError
from ..ops.qdq import fp8_dynamic_unit, qdq_static, weight_dq
from . import fp8_custom_op
from .base import LinearPlan, Scheme

BLOCK_FP8_K = 128
OUTPUT_QUANT_LAYERS = ("q_proj", "k_proj", "v_proj")


def _fail(ckpt, layer, message, field=None, value=None, accepted=None):
    raise ConversionError(message, file=ckpt.model_dir if ckpt else None, layer=layer, field=field, value=value,
                          accepted=accepted)


FP8_LINEAR_FORMS = ("compact", "dequantized_weight", "qdq", "matmul_block_fp8", "custom_op")
COMPACT_IO = (None, "fp32", "fp16")  # MatMulFp8 takes float and float16 A (docs/custom_op_contract.md)  # EPConfig.fp8_linear values


def scalar_scale(ckpt, tensor: str) -> float:
    s = ckpt.get_scale(tensor)
    if s.size != 1:
        _fail(ckpt, tensor, "per-tensor scale must hold one value", "shape", list(s.shape), "[] or [1]")
    value = float(s.reshape(()))
    if not np.isfinite(value) or value <= 0:
        _fail(ckpt, tensor, "scale must be positive and finite", "value", value)
    return value


def activation_mode(spec) -> str:
    """none | static | dynamic_tensor | dynamic_token."""
    if not spec.input_tensors:
        return "none"
    a = spec.input_tensors[0]
    if not a.is_dynamic:
        return "static"
    return "dynamic_token" if a.qscheme == "per_channel" else "dynamic_tensor"


class Fp8W8A8(Scheme):
    name = "fp8-w8a8"

    @classmethod
    def accepts(cls, spec) -> bool:
        return spec is not None and len(spec.weight) == 1 and spec.weight[0].dtype.startswith("fp8")

    @classmethod
    def check(cls, plan: LinearPlan, ckpt, ep) -> None:
        spec, base = plan.spec, plan.name
        w = spec.weight[0]
        if ep.fp8_linear == "custom_op" and ep.custom_ops_backend not in ("cpu", "cuda"):
            _fail(None, base, f"fp8_linear=custom_op has no kernel on {ep.name} (an AMD session cannot run the "
                  "com.quark_onnx kernels: docs/custom_ops_amd.md)", "--extra_options fp8_linear", "custom_op",
                  "qdq, dequantized_weight")
        if w.dtype != "fp8_e4m3":
            _fail(ckpt, base, "only fp8_e4m3 weights are supported", "weight.dtype", w.dtype, "fp8_e4m3")
        if w.qscheme not in ("per_tensor", "per_channel"):
            _fail(ckpt, base, "FP8 weight scales must be per_tensor or per_channel (per-block/per-group FP8 is not "
                  "supported)", "weight.qscheme", w.qscheme, "per_tensor, per_channel")
        if w.qscheme == "per_channel" and w.ch_axis not in (0, None):
            _fail(ckpt, base, "per_channel FP8 weights must use the output axis", "weight.ch_axis", w.ch_axis, "0")
        if w.symmetric is False:
            _fail(ckpt, base, "asymmetric FP8 is not supported", "weight.symmetric", False, "true")
        if spec.bias:
            _fail(ckpt, base, "quantized bias is not supported", "bias.dtype", spec.bias[0].dtype)
        if len(spec.input_tensors) > 1:
            _fail(ckpt, base, "two-stage activation quantization is not supported with FP8 weights",
                  "input_tensors", [t.short() for t in spec.input_tensors])
        if spec.input_tensors:
            a = spec.input_tensors[0]
            if a.dtype != "fp8_e4m3":
                _fail(ckpt, base, "FP8 weights need fp8_e4m3 activations (or none)", "input_tensors.dtype", a.dtype,
                      "fp8_e4m3")
            if a.symmetric is False:
                _fail(ckpt, base, "asymmetric FP8 is not supported", "input_tensors.symmetric", False, "true")
            if a.is_dynamic and not (a.qscheme == "per_tensor" or (a.qscheme == "per_channel"
                                                                   and a.ch_axis in (1, -2))):
                _fail(ckpt, base, "dynamic FP8 activations must be per_tensor or per-token (per_channel ch_axis=1)",
                      "input_tensors.qscheme", f"{a.qscheme} ch_axis={a.ch_axis}")
            if not a.is_dynamic:
                if a.qscheme != "per_tensor":
                    _fail(ckpt, base, "static FP8 activations must be per_tensor", "input_tensors.qscheme",
                          a.qscheme, "per_tensor")
                if f"{base}.input_scale" not in ckpt:
                    _fail(ckpt, f"{base}.input_scale", "static activation spec but no input_scale tensor",
                          "input_tensors.is_dynamic", False)
                scalar_scale(ckpt, f"{base}.input_scale")
        if spec.output_tensors and not base.endswith(OUTPUT_QUANT_LAYERS):
            _fail(ckpt, base, "output quantization is supported only on q/k/v projections (FP8 KV cache and "
                  "attention)", "output_tensors", spec.output_tensors[0].short())
        for suffix in ("weight", "weight_scale"):
            if f"{base}.{suffix}" not in ckpt:
                _fail(ckpt, f"{base}.{suffix}", "tensor missing for an FP8 layer", "weight.dtype", w.dtype)
        n, k = plan.out_features, plan.in_features
        if tuple(ckpt.shape(f"{base}.weight")) != (n, k):
            _fail(ckpt, f"{base}.weight", "FP8 weight has the wrong shape", "shape",
                  list(ckpt.shape(f"{base}.weight")), str([n, k]))
        if ckpt.dtype(f"{base}.weight") not in ("F8_E4M3", "F32", "F16", "BF16"):
            _fail(ckpt, f"{base}.weight", "FP8 weight must be stored as F8_E4M3 (or float when fake_quantized)",
                  "dtype", ckpt.dtype(f"{base}.weight"))
        ssize = int(np.prod(ckpt.shape(f"{base}.weight_scale"), dtype=np.int64))
        want = 1 if w.qscheme == "per_tensor" else n
        if ssize != want:
            _fail(ckpt, f"{base}.weight_scale", f"{w.qscheme} FP8 weight scale must hold {want} value(s)",
                  "shape", list(ckpt.shape(f"{base}.weight_scale")))
        scale = ckpt.get_scale(f"{base}.weight_scale")  # small: one value per tensor or per output channel
        bad = ~np.isfinite(scale) | (scale < 0)
        if bad.any():
            _fail(ckpt, f"{base}.weight_scale", f"{int(bad.sum())} negative or non-finite scale(s) (corrupt "
                  "checkpoint?)", "value", float(scale[bad][0]))

    @staticmethod
    def load(plan: LinearPlan, ckpt) -> tuple[np.ndarray, np.ndarray]:
        """(fp8 [out, in], fp32 scale [out, 1] or [1, 1])."""
        base = plan.name
        scale = ckpt.get_scale(f"{base}.weight_scale").reshape(-1, 1)
        raw = ckpt.get(f"{base}.weight")
        if ckpt.dtype(f"{base}.weight") == "F8_E4M3":
            return np.asarray(raw), scale
        # fake_quantized: the float weight is fp8 * s exactly; recover the fp8 codes
        return (np.asarray(raw, np.float32) / scale).astype(ml_dtypes.float8_e4m3fn), scale

    @classmethod
    def form(cls, plan: LinearPlan, ep, io: str | None = None) -> str:
        mode = activation_mode(plan.spec)
        if ep.fp8_linear == "custom_op":
            if fp8_custom_op.custom_op_for(mode, io) and fp8_custom_op.available():
                return "custom_op"
            from dataclasses import replace
            from ..ep_configs import get_ep
            return cls.form(plan, replace(ep, fp8_linear=get_ep(ep.name).fp8_linear), io)  # the EP's own form
        if ep.fp8_linear == "compact":
            return "compact" if io in COMPACT_IO and fp8_custom_op.available() else "dequantized_weight"
        if ep.fp8_linear == "matmul_block_fp8":
            if io in (None, "fp16", "bf16") and mode in ("none", "static"):
                return "matmul_block_fp8"
            return "qdq"
        return ep.fp8_linear

    @classmethod
    def custom_op(cls, plan: LinearPlan, ep, io: str | None = None) -> str | None:
        """The com.quark_onnx op this layer becomes, or None."""
        form = cls.form(plan, ep, io)
        if form == "compact":
            return "MatMulFp8"
        if form != "custom_op":
            return None
        return fp8_custom_op.custom_op_for(activation_mode(plan.spec), io)

    @classmethod
    def describe(cls, plan: LinearPlan, ep, io: str | None = None) -> str:
        mode = activation_mode(plan.spec)
        act = {"none": "float activation", "static": "static per-tensor FP8 activation (Q/DQ)",
               "dynamic_tensor": "dynamic per-tensor FP8 activation", "dynamic_token":
               "dynamic per-token FP8 activation"}[mode]
        form = cls.form(plan, ep)
        what = {"qdq": "MatMul on DequantizeLinear(fp8 weight)",
                "dequantized_weight": "MatMul on the fp32 dequantized FP8 weight (exact)",
                "matmul_block_fp8": "MatMulBlockQuantizedFp8Weight (fp16/bf16 io; Q/DQ + MatMul for fp32 io)",
                "custom_op": f"com.quark_onnx {fp8_custom_op.custom_op_for(mode, None)} (+ function fallback)",
                "compact": "com.quark_onnx MatMulFp8 on the checkpoint's fp8 weight and scale (compact CPU default, "
                           "+ function fallback; a static activation's Q/DQ as one QuantizeDequantizeFp8 node with the "
                           "library's kernel, fp32 io)"}[form]
        return f"{what}, {act}"

    @classmethod
    def emit(cls, ctx, plan: LinearPlan, x: str) -> str:
        g, base, pre = ctx.graph, plan.name, plan.node_prefix
        q, scale = cls.load(plan, ctx.ckpt)
        mode = activation_mode(plan.spec)
        form = cls.form(plan, ctx.ep, ctx.io)
        if form == "matmul_block_fp8":
            return _emit_block_fp8(ctx, plan, x, q, scale, mode)
        if form == "custom_op":
            a_scale = scalar_scale(ctx.ckpt, f"{base}.input_scale") if mode == "static" else None
            return fp8_custom_op.emit_fp8_custom_op(ctx, plan, x, q, scale, mode, a_scale)
        post_scale = None
        if mode == "static":
            x = qdq_static(ctx, x, scalar_scale(ctx.ckpt, f"{base}.input_scale"), "fp8_e4m3", f"{pre}/input_quant")
        elif mode != "none":
            x, post_scale = fp8_dynamic_unit(ctx, x, mode == "dynamic_token", f"{pre}/input_quant")
        if form in ("dequantized_weight", "compact"):
            if post_scale is not None:
                # Quark's order: the fake-quantized x = fp8(x / s) * s goes into the GEMM. Rescaling after the
                # GEMM is the same product in another rounding order (rel. 3e-7 per linear on SmolLM2-135M PTPC,
                # 1.5e-7 this way), and on a real model those differences compound (tests/test_real_model.py).
                x = g.op("Mul", [x, post_scale], f"{pre}/Mul_input_scale")
                post_scale = None
            if form == "compact":  # the checkpoint's fp8 bytes [N, K] + scale; the same fp8 * s_w product
                return fp8_custom_op.emit_matmul_fp8(ctx, plan, x, q, scale)
            w = (q.astype(np.float32) * scale).T
            w_t = g.initializer(f"{base}.weight.T", np.ascontiguousarray(w.astype(ctx.io_np)))
        else:
            w_t = weight_dq(ctx, base, q.T, scale.reshape(-1), None, f"{pre}/weight_dq")
        y = g.op("MatMul", [x, w_t], f"{pre}/MatMul")
        if post_scale is not None:
            y = g.op("Mul", [y, post_scale], f"{pre}/Mul_input_scale")
        return y


def _emit_block_fp8(ctx, plan: LinearPlan, x: str, q: np.ndarray, scale: np.ndarray, mode: str) -> str:
    g, base = ctx.graph, plan.name
    n, k = q.shape
    blocks = -(-k // BLOCK_FP8_K)
    b_scale = np.ascontiguousarray(np.broadcast_to(scale.reshape(-1, 1), (n, blocks)), dtype=np.float32)
    inputs = [x, g.initializer(f"{base}.weight.fp8", np.ascontiguousarray(q)),
              g.initializer(f"{base}.weight_scale.blocks", b_scale)]
    if mode == "static":
        inputs.append(g.scalar(f"{base}.input_scale.f32", scalar_scale(ctx.ckpt, f"{base}.input_scale"),
                               np.float32))
    return g.op("MatMulBlockQuantizedFp8Weight", inputs, f"{plan.node_prefix}/MatMulBlockQuantizedFp8Weight",
                domain="com.microsoft", block_size=BLOCK_FP8_K)
