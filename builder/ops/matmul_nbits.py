"""com.microsoft MatMulNBits from integer weights, group-wise scales and zero points.

       x [.., K] ──► MatMulNBits(B uint8 [N, k_blocks, bs*bits/8], scales [N*k_blocks], zero_points) ──► y [.., N]

Inputs are in the *unsigned* domain MatMulNBits wants: values u in [0, 2^bits) with W = (u - zp) * scale.
A group size g that is not a power of two is expressed with the largest power-of-two block bs >= 16 dividing it,
replicating each group's scale and zero point g/bs times (exact).
"""
from __future__ import annotations

import numpy as np

from ..errors import ConversionError
from ..quant.int_packing import pack_uint_lowfirst


def block_size_for(group_size: int, in_features: int, layer: str) -> int:
    """MatMulNBits block size representing `group_size` exactly (group_size == in_features: per-channel)."""
    if group_size == in_features:  # one group per row: any block works, replicate the channel scale
        for bs in (128, 64, 32, 16):
            if in_features % bs == 0:
                return bs
        return 32
    bs = group_size & -group_size  # largest power of two dividing g
    bs = min(bs, 256)
    if bs < 16:
        raise ConversionError("MatMulNBits needs a group size divisible by 16", layer=layer,
                              field="weight.group_size", value=group_size, accepted="multiples of 16")
    return bs


INT4_OPS = ("MatMulUint4", "MatMulInt4")  # com.quark_onnx: the exact 4-bit form (custom_ops/src/qo_cpu_int4.c)


def emit_int4_compact(ctx, name: str, node_name: str, x: str, b: str, scale_b: np.ndarray, zp_b: np.ndarray | None,
                      k: int, n: int, bs: int) -> str:
    """com.quark_onnx MatMulUint4 (zero points) / MatMulInt4 (all 8) on MatMulNBits' B bytes `b` (an initializer
    name): fp32 activations, W = (u - z) * s decoded exactly, fp32 sums; + the ONNX-function fallback.
    scale_b float [N, k_blocks], zp_b uint8 [N, k_blocks] (unsigned domain) or None."""
    from custom_ops.functions import DOMAIN, FUNCTIONS

    g = ctx.graph
    op = "MatMulUint4" if zp_b is not None and np.any(zp_b != 8) else "MatMulInt4"
    g.add_function(FUNCTIONS[op](g.opsets[""]), opset_version=1)
    inputs = [x, b, g.initializer(f"{name}.{op}.scales", np.ascontiguousarray(scale_b, np.float32).reshape(-1))]
    if op == "MatMulUint4":
        inputs.append(g.initializer(f"{name}.{op}.zero_points", pack_uint_lowfirst(zp_b, 4).reshape(-1)))
    return g.op(op, inputs, node_name.replace("/MatMulNBits", f"/{op}"), domain=DOMAIN, K=k, N=n, block_size=bs)


def emit_matmul_nbits(ctx, name: str, node_name: str, x: str, u: np.ndarray, scale: np.ndarray,
                      zero_point: np.ndarray | None, bits: int, group_size: int, accuracy_level: int,
                      compact: bool = False) -> str:
    """u: uint8 [N, K]; scale: float32 [N, K/g]; zero_point: uint8 [N, K/g] or None (means 2^(bits-1)).
    compact (4-bit only): the same B bytes through com.quark_onnx MatMulUint4 / MatMulInt4 (emit_int4_compact)."""
    n, k = u.shape
    bs = block_size_for(group_size, k, name)
    rep = group_size // bs if group_size != k else -(-k // bs)
    k_blocks = -(-k // bs)
    scale_b = np.repeat(scale, rep, axis=1)[:, :k_blocks]
    if k_blocks * bs != k:
        u = np.concatenate([u, np.zeros((n, k_blocks * bs - k), np.uint8)], axis=1)
    b = pack_uint_lowfirst(u.reshape(n, k_blocks, bs), bits)
    g = ctx.graph
    if compact:
        zp_b = None if zero_point is None else np.repeat(zero_point, rep, axis=1)[:, :k_blocks]
        return emit_int4_compact(ctx, name, node_name, x, g.initializer(f"{name}.MatMulNBits.B", b), scale_b, zp_b,
                                 k, n, bs)
    inputs = [x, g.initializer(f"{name}.MatMulNBits.B", b),
              g.initializer(f"{name}.MatMulNBits.scales", scale_b.astype(ctx.io_np).reshape(-1))]
    default_zp = 1 << (bits - 1)
    if zero_point is not None and np.any(zero_point != default_zp):
        zp_b = np.repeat(zero_point, rep, axis=1)[:, :k_blocks]
        inputs.append(g.initializer(f"{name}.MatMulNBits.zero_points", pack_uint_lowfirst(zp_b, bits).reshape(-1)))
    return g.op("MatMulNBits", inputs, node_name, domain="com.microsoft", K=k, N=n, bits=bits, block_size=bs,
                accuracy_level=accuracy_level)
