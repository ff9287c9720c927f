"""Integer weight-only linears (int4/uint4/int8/uint8, per_group or per_channel) -> MatMulNBits.

Layouts (quark_format.md sections 2-3, pitfall 2), real_quantized:
  per_group  : weight [in, ceil(out/P)], scale [in/g, out], zero_point [in/g, ceil(out/P)]   (transposed; P=8 for
               4-bit packed in int32, P=1 for 8-bit stored as int8/uint8)
  per_channel: weight [out, in/P], scale [out], zero_point [ceil(out/P)]                        (not transposed)
fake_quantized: weight float [out, in] (already QDQ'd), scale [out, in/g] (or [out]), zero_point int32 unpacked.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ConversionError
from ..ops.matmul_nbits import block_size_for, emit_int4_compact, emit_matmul_nbits
from . import int4_repack
from .base import LinearPlan, Scheme
from .int_packing import pack_uint_lowfirst, unpack_int4_words

BITS = {"int4": 4, "uint4": 4, "int8": 8, "uint8": 8}
# --extra_options int4_linear: MatMulNBits (accuracy_level decides exactness and speed), or compact: the same bytes
# through com.quark_onnx MatMulUint4 / MatMulInt4 (fp32 activations, Quark's exact decode; cpu, custom_ops library;
# the cpu default, ep_configs/cpu.py)
INT4_LINEAR_FORMS = ("matmul_nbits", "compact")
COMPACT_IO = ("fp32", "fp16")
SIGNED = {"int4": True, "uint4": False, "int8": True, "uint8": False}


@dataclass
class IntWeight:
    q: np.ndarray      # int16 [out, in], values in the checkpoint's domain (signed or unsigned)
    scale: np.ndarray  # float32 [out, groups]
    zp: np.ndarray     # int16 [out, groups]
    bits: int
    signed: bool
    group_size: int

    def to_unsigned(self) -> tuple[np.ndarray, np.ndarray]:
        """Shift signed values by 2^(bits-1) so that (u - zpu) == (q - zp): MatMulNBits is unsigned."""
        off = (1 << (self.bits - 1)) if self.signed else 0
        return (self.q + off).astype(np.uint8), (self.zp + off).astype(np.uint8)

    def dequantize(self) -> np.ndarray:
        g = self.group_size
        return ((self.q - np.repeat(self.zp, g, axis=1)[:, : self.q.shape[1]])
                * np.repeat(self.scale, g, axis=1)[:, : self.q.shape[1]]).astype(np.float32)


def _fail(ckpt, layer, message, field, value, accepted=None):
    raise ConversionError(message, file=ckpt.model_dir, layer=layer, field=field, value=value, accepted=accepted)


def _expect_shape(ckpt, tensor, shape, alternatives=()):
    got = tuple(ckpt.shape(tensor))
    if got != tuple(shape) and got not in [tuple(a) for a in alternatives]:
        _fail(ckpt, tensor, "tensor has the wrong shape for this layer's spec", "shape", list(got), str(list(shape)))


def _expect_dtype(ckpt, tensor, dtypes):
    if ckpt.dtype(tensor) not in dtypes:
        _fail(ckpt, tensor, "tensor has the wrong dtype for this layer's spec", "dtype", ckpt.dtype(tensor),
              ", ".join(dtypes))


class IntWeightOnly(Scheme):
    name = "int-weight-only"

    @classmethod
    def accepts(cls, spec) -> bool:
        if spec is None or len(spec.weight) != 1 or spec.input_tensors:
            return False
        w = spec.weight[0]
        return w.dtype in BITS and w.qscheme in ("per_group", "per_channel")

    @staticmethod
    def _group_size(plan: LinearPlan) -> int:
        w = plan.spec.weight[0]
        return w.group_size if w.qscheme == "per_group" else plan.in_features

    @classmethod
    def check(cls, plan: LinearPlan, ckpt, ep) -> None:
        w = plan.spec.weight[0]
        n, k = plan.out_features, plan.in_features
        g = cls._group_size(plan)
        if w.qscheme == "per_channel" and w.ch_axis not in (0, None):
            _fail(ckpt, plan.name, "per_channel weights must use the output axis", "weight.ch_axis", w.ch_axis, "0")
        if w.qscheme == "per_group" and w.ch_axis not in (-1, 1, None):
            _fail(ckpt, plan.name, "per_group weights must group along in-features", "weight.ch_axis", w.ch_axis,
                  "-1, 1")
        if k % g:
            _fail(ckpt, plan.name, f"group size does not divide in_features={k}", "weight.group_size", g)
        block_size_for(g, k, plan.name)
        bits = BITS[w.dtype]
        if bits not in ep.matmul_nbits_bits and not ep.int_weight_dequantize_fallback:
            _fail(ckpt, plan.name, f"execution provider {ep.name} runs MatMulNBits only with "
                  f"{sorted(ep.matmul_nbits_bits)} bits", "weight.dtype", w.dtype)
        base = plan.name
        for suffix in ("weight", "weight_scale"):
            if f"{base}.{suffix}" not in ckpt:
                _fail(ckpt, f"{base}.{suffix}", "tensor missing for a quantized layer", "weight.dtype", w.dtype)
        groups = k // g
        fake = _is_fake(ckpt, base)
        pack = 8 if bits == 4 else 1
        packed_dtypes = ("I32",) if bits == 4 else ("I8", "U8")
        zp_name = f"{base}.weight_zero_point"
        if w.symmetric is False and zp_name not in ckpt:
            _fail(ckpt, zp_name, "asymmetric spec but no zero point tensor", "weight.symmetric", False)
        has_zp = zp_name in ckpt
        if fake:  # float QDQ'd weight, scale [out, in/g] (or [out]), zero point unpacked int [out, in/g]
            _expect_shape(ckpt, f"{base}.weight", (n, k))
            _expect_shape(ckpt, f"{base}.weight_scale", (n, groups), alternatives=[(n,)] if groups == 1 else [])
            if has_zp:
                _expect_shape(ckpt, zp_name, (n, groups), alternatives=[(n,)] if groups == 1 else [])
                _expect_dtype(ckpt, zp_name, ("I32", "I8", "U8", "I64"))
        elif w.qscheme == "per_group":
            _expect_shape(ckpt, f"{base}.weight", (k, -(-n // pack)))
            _expect_dtype(ckpt, f"{base}.weight", packed_dtypes)
            _expect_shape(ckpt, f"{base}.weight_scale", (groups, n))
            if has_zp:
                _expect_shape(ckpt, zp_name, (groups, -(-n // pack)))
                _expect_dtype(ckpt, zp_name, packed_dtypes)
        else:
            _expect_shape(ckpt, f"{base}.weight", (n, -(-k // pack)))
            _expect_dtype(ckpt, f"{base}.weight", packed_dtypes)
            _expect_shape(ckpt, f"{base}.weight_scale", (n,), alternatives=[(n, 1)])
            if has_zp:
                _expect_shape(ckpt, zp_name, (-(-n // pack),), alternatives=[(-(-n // pack), 1)])
                _expect_dtype(ckpt, zp_name, packed_dtypes)
        _expect_dtype(ckpt, f"{base}.weight_scale", ("F32", "F16", "BF16"))

    @classmethod
    def load(cls, plan: LinearPlan, ckpt, pack_method: str) -> IntWeight:
        w = plan.spec.weight[0]
        n, k = plan.out_features, plan.in_features
        bits, signed = BITS[w.dtype], SIGNED[w.dtype]
        g = cls._group_size(plan)
        groups = k // g
        base = plan.name
        zp_name = f"{base}.weight_zero_point"
        has_zp = zp_name in ckpt
        if _is_fake(ckpt, base):
            wf = ckpt.get_f32(f"{base}.weight")
            scale = ckpt.get_scale(f"{base}.weight_scale").reshape(n, groups)
            zp = (ckpt.get(zp_name).astype(np.int16).reshape(n, groups) if has_zp
                  else np.zeros((n, groups), np.int16))
            q = np.round(wf / np.repeat(scale, g, axis=1)) + np.repeat(zp, g, axis=1)
            lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
            q = np.clip(q, lo, hi).astype(np.int16)
            _check_finite(ckpt, f"{base}.weight_scale", scale)
            return IntWeight(q, scale, zp, bits, signed, g)
        raw = ckpt.get(f"{base}.weight")
        if bits == 4:
            if raw.dtype != np.int32:
                _fail(ckpt, f"{base}.weight", "4-bit weights must be packed in int32", "dtype", str(raw.dtype))
            q = unpack_int4_words(raw, pack_method, signed).astype(np.int16)
        else:
            q = raw.astype(np.int16)
        scale = ckpt.get_scale(f"{base}.weight_scale")
        if w.qscheme == "per_group":
            q = q[:, :n].T                        # [in, out] -> [out, in]
            scale = scale.T.reshape(n, groups)
            if has_zp:
                zraw = ckpt.get(zp_name)
                zp = (unpack_int4_words(zraw, pack_method, signed) if bits == 4 else zraw)[:, :n]
                zp = zp.astype(np.int16).T.reshape(n, groups)
            else:
                zp = np.zeros((n, groups), np.int16)
        else:
            q = q[:, :k]
            scale = scale.reshape(n, 1)
            if has_zp:
                zraw = ckpt.get(zp_name).reshape(-1)
                zp = (unpack_int4_words(zraw[None], pack_method, signed)[0] if bits == 4 else zraw)[:n]
                zp = zp.astype(np.int16).reshape(n, 1)
            else:
                zp = np.zeros((n, 1), np.int16)
        _check_finite(ckpt, f"{base}.weight_scale", scale)
        return IntWeight(np.ascontiguousarray(q), np.ascontiguousarray(scale), zp, bits, signed, g)

    @classmethod
    def describe(cls, plan: LinearPlan, ep, io: str | None = None) -> str:
        w = plan.spec.weight[0]
        g = cls._group_size(plan)
        if BITS[w.dtype] not in ep.matmul_nbits_bits:
            return (f"DequantizeLinear({w.dtype} [K,N], "
                    f"{'per-axis' if w.qscheme == 'per_channel' else f'block_size={g}'}) -> MatMul "
                    f"({ep.name} has no {BITS[w.dtype]}-bit MatMulNBits)")
        bs = block_size_for(g, plan.in_features, plan.name)
        if cls._compact(plan, ep):
            return (f"com.quark_onnx {cls.custom_op(plan, ep)} block_size={bs} on MatMulNBits' 4-bit bytes (fp32 "
                    "activations, exact: the cpu default with the custom-op library, int4_linear=compact; + function "
                    "fallback)")
        return (f"MatMulNBits bits={BITS[w.dtype]} block_size={bs}"
                f"{' (per-channel scale replicated)' if w.qscheme == 'per_channel' else ''}"
                f"{' (signed, shifted by 2^(bits-1))' if SIGNED[w.dtype] else ''}")

    @classmethod
    def fuse_key(cls, plan: LinearPlan, ep):
        """Plans with equal keys can share one MatMulNBits (concatenated along N)."""
        w = plan.spec.weight[0]
        if BITS[w.dtype] not in ep.matmul_nbits_bits:
            return None
        return (cls.name, w.dtype, cls._group_size(plan), plan.in_features, cls._compact(plan, ep))

    @staticmethod
    def _compact(plan: LinearPlan, ep, io: str | None = None) -> bool:
        """int4_linear=compact applies: a 4-bit weight MatMulNBits would take, an io dtype the op takes."""
        return (getattr(ep, "int4_linear", "matmul_nbits") == "compact" and BITS[plan.spec.weight[0].dtype] == 4
                and 4 in ep.matmul_nbits_bits and io in (None, *COMPACT_IO))

    @classmethod
    def custom_op(cls, plan: LinearPlan, ep, io: str | None = None) -> str | None:
        if not cls._compact(plan, ep, io):
            return None
        return "MatMulUint4" if plan.spec.weight[0].dtype == "uint4" else "MatMulInt4"

    @classmethod
    def _streamable(cls, ctx, plan: LinearPlan) -> bool:
        """Real-quantized 4-bit per-group weights are repacked block by block on the packed bits (int4_repack.py);
        other layouts (8-bit, per-channel, fake_quantized) are decoded whole."""
        w = plan.spec.weight[0]
        if BITS[w.dtype] != 4 or w.qscheme != "per_group" or 4 not in ctx.ep.matmul_nbits_bits:
            return False
        if _is_fake(ctx.ckpt, plan.name) or ctx.ckpt.dtype(f"{plan.name}.weight") != "I32":
            return False
        k = plan.in_features
        return k % 2 == 0 and k % block_size_for(cls._group_size(plan), k, plan.name) == 0

    @classmethod
    def _emit_streamed(cls, ctx, plans: list[LinearPlan], name: str, node_name: str, x: str) -> str:
        """MatMulNBits for one or more (fused along N) 4-bit per-group linears, B streamed in row blocks; the same
        bytes emit_matmul_nbits writes from the decoded matrix."""
        first, pm = plans[0], ctx.quant.export.pack_method
        w = first.spec.weight[0]
        signed, k, g = SIGNED[w.dtype], first.in_features, cls._group_size(first)
        bs = block_size_for(g, k, first.name)
        groups, k_blocks = k // g, k // bs
        rep = g // bs if g != k else k_blocks
        b = int4_repack.stream_b(ctx, name, [(f"{p.name}.weight", p.out_features) for p in plans], k, bs, pm, signed)
        scales, zps = [], []
        for p in plans:
            scale = ctx.ckpt.get_scale(f"{p.name}.weight_scale").T.reshape(p.out_features, groups)
            _check_finite(ctx.ckpt, f"{p.name}.weight_scale", scale)
            scales.append(scale)
            zp_name = f"{p.name}.weight_zero_point"
            zps.append(int4_repack.unsigned_zero_points(ctx.ckpt.get(zp_name) if zp_name in ctx.ckpt else None,
                                                        p.out_features, groups, pm, signed))
        scale, zp = np.concatenate(scales), np.concatenate(zps)
        gb = ctx.graph
        scale_b = np.repeat(scale, rep, axis=1)[:, :k_blocks]
        if cls._compact(first, ctx.ep, ctx.io):
            return emit_int4_compact(ctx, name, node_name, x, b, scale_b, np.repeat(zp, rep, axis=1)[:, :k_blocks],
                                     k, len(zp), bs)
        inputs = [x, b, gb.initializer(f"{name}.MatMulNBits.scales", scale_b.astype(ctx.io_np).reshape(-1))]
        if np.any(zp != 8):
            zp_b = np.repeat(zp, rep, axis=1)[:, :k_blocks]
            inputs.append(gb.initializer(f"{name}.MatMulNBits.zero_points", pack_uint_lowfirst(zp_b, 4).reshape(-1)))
        acc = ctx.options.accuracy_level
        if acc is None:
            acc = ctx.ep.default_accuracy_level(4)
        return gb.op("MatMulNBits", inputs, node_name, domain="com.microsoft", K=k, N=len(zp), bits=4,
                     block_size=bs, accuracy_level=acc)

    @classmethod
    def emit_fused(cls, ctx, plans: list[LinearPlan], x: str, fused_name: str, fused_prefix: str) -> str:
        if all(cls._streamable(ctx, p) for p in plans):
            return cls._emit_streamed(ctx, plans, fused_name, f"{fused_prefix}/MatMulNBits", x)
        parts = [cls.load(p, ctx.ckpt, ctx.quant.export.pack_method) for p in plans]
        first = parts[0]
        fused = IntWeight(np.concatenate([p.q for p in parts]), np.concatenate([p.scale for p in parts]),
                          np.concatenate([p.zp for p in parts]), first.bits, first.signed, first.group_size)
        return cls._emit_matmul_nbits(ctx, fused, fused_name, f"{fused_prefix}/MatMulNBits", x, plans[0])

    @classmethod
    def _emit_matmul_nbits(cls, ctx, iw: IntWeight, name: str, node_name: str, x: str, plan=None) -> str:
        u, zpu = iw.to_unsigned()
        acc = ctx.options.accuracy_level
        if acc is None:
            acc = ctx.ep.default_accuracy_level(iw.bits)
        compact = plan is not None and cls._compact(plan, ctx.ep, ctx.io)
        return emit_matmul_nbits(ctx, name, node_name, x, u, iw.scale,
                                 zpu if (iw.signed is False or np.any(iw.zp != 0)) else None,
                                 iw.bits, iw.group_size, acc, compact=compact)

    @classmethod
    def emit(cls, ctx, plan: LinearPlan, x: str) -> str:
        if cls._streamable(ctx, plan):
            return cls._emit_streamed(ctx, [plan], plan.name, f"{plan.node_prefix}/MatMulNBits", x)
        iw = cls.load(plan, ctx.ckpt, ctx.quant.export.pack_method)
        if iw.bits not in ctx.ep.matmul_nbits_bits:
            return _emit_dequantize_matmul(ctx, plan, x, iw)
        return cls._emit_matmul_nbits(ctx, iw, plan.name, f"{plan.node_prefix}/MatMulNBits", x, plan)


def _emit_dequantize_matmul(ctx, plan: LinearPlan, x: str, iw: IntWeight) -> str:
    """x @ DequantizeLinear(W.T): for EPs without a MatMulNBits of this width (MIGraphX parses 4-bit only).
    The integer weight is stored as int8/uint8 [K, N]; per-channel scales are per-axis (axis 1), group scales are
    blocked along K (axis 0, block_size g)."""
    g = ctx.graph
    dtype = np.int8 if iw.signed else np.uint8
    per_channel = iw.scale.shape[1] == 1
    w = g.initializer(f"{plan.name}.weight_q.T", np.ascontiguousarray(iw.q.T).astype(dtype))
    scale = iw.scale[:, 0] if per_channel else iw.scale.T
    zp = iw.zp[:, 0] if per_channel else iw.zp.T
    inputs = [w, g.initializer(f"{plan.name}.weight_scale.T", np.ascontiguousarray(scale).astype(ctx.io_np))]
    if np.any(zp != 0):
        inputs.append(g.initializer(f"{plan.name}.weight_zero_point.T", np.ascontiguousarray(zp).astype(dtype)))
    attrs = {"axis": 1} if per_channel else {"axis": 0, "block_size": iw.group_size}
    wf = g.op("DequantizeLinear", inputs, f"{plan.node_prefix}/weight/DequantizeLinear", **attrs)
    return g.op("MatMul", [x, wf], f"{plan.node_prefix}/MatMul")


def _check_finite(ckpt, tensor: str, scale: np.ndarray) -> None:
    bad = ~np.isfinite(scale)
    if bad.any():
        _fail(ckpt, tensor, f"{int(bad.sum())} non-finite scale(s) (corrupt checkpoint?)", "value",
              float(scale[bad][0]))


def _is_fake(ckpt, base: str) -> bool:
    return ckpt.dtype(f"{base}.weight") in ("F32", "F16", "BF16")
