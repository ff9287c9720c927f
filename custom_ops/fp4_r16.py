"""The 16-row tile layout of MXFP4 / NVFP4 weights ("r16", custom_ops/src/qo_kernels.h, qo_matmul_mxfp4_r16_f32): the
checkpoint's bytes reordered so that a 64-byte chunk holds 8 consecutive k of 16 rows (4 bytes a row) and a float32
vector's lanes are rows. numpy only (the builder writes it; the kernels and the ONNX-function fallback read it)."""
from __future__ import annotations

import numpy as np

ROWS = 16


def pack(b_packed: np.ndarray, b_scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(B uint8 [N, K/2], B_scale uint8 [N, K/block]) -> (B uint8 [N/16, K/8, 64], B_scale uint8 [N/16, K/block, 16])."""
    n, half_k = b_packed.shape
    if n % ROWS or half_k % 4 or b_scale.shape[0] != n:
        raise ValueError(f"fp4 r16: B {b_packed.shape} / B_scale {b_scale.shape}: N % 16 and K % 8 must be 0")
    b = np.ascontiguousarray(b_packed, dtype=np.uint8).reshape(n // ROWS, ROWS, half_k // 4, 4)
    s = np.ascontiguousarray(b_scale).view(np.uint8).reshape(n // ROWS, ROWS, -1)
    return (np.ascontiguousarray(b.transpose(0, 2, 1, 3)).reshape(n // ROWS, half_k // 4, 4 * ROWS),
            np.ascontiguousarray(s.transpose(0, 2, 1)))


def unpack(b_r16: np.ndarray, s_r16: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of pack: the checkpoint's [N, K/2] codes and [N, K/block] scale codes."""
    tiles, chunks, _ = b_r16.shape
    b = b_r16.reshape(tiles, chunks, ROWS, 4).transpose(0, 2, 1, 3).reshape(tiles * ROWS, chunks * 4)
    s = s_r16.transpose(0, 2, 1).reshape(tiles * ROWS, -1)
    return np.ascontiguousarray(b), np.ascontiguousarray(s)
