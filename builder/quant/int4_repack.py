"""Quark's packed 4-bit per-group words -> MatMulNBits B, one block of output rows at a time, on the packed bits.

Quark (quark_format.md section 3) stores a per_group 4-bit weight transposed, [in=K, ceil(out/8)] int32, nibble slot
s of word c holding output row 8c + slot_to_element[s]. MatMulNBits wants B [N, K/bs, bs/2] uint8, row n holding
u[n, 0..K) two per byte, low nibble first. Per block of output rows this takes the two source rows k, k+1 as uint32
words a, b and forms every byte pair at once:

    E = (a & 0x0F0F0F0F) | (b & 0x0F0F0F0F) << 4     byte j: (u[k], u[k+1]) of slot 2j
    O = (a >> 4 & 0x0F0F0F0F) | (b & 0xF0F0F0F0)     byte j: slot 2j + 1

then transposes those words (4 bytes at a time) and takes each output row as one byte lane of them. Signed int4
becomes MatMulNBits' unsigned domain by u = q + 8, which on a nibble is q ^ 8 (so words ^ 0x88888888). Nothing is
widened to int16 and no [N, K] matrix exists: memory is the packed source of the layer being written (K*N/2 bytes)
plus a few blocks. Blocks are repacked by the worker threads while the main thread writes (builder/pipeline.py).
"""
from __future__ import annotations

import numpy as np

from ..graph import transpose_tiled
from ..pipeline import ordered_map
from .int_packing import ORDER_SLOT_TO_ELEMENT, REORDER_SLOT_TO_ELEMENT, unpack_int4_words

BLOCK_BYTES = 8 << 20  # bytes of B per repacked block


def element_to_slot(pack_method: str) -> np.ndarray:
    slot_to_element = REORDER_SLOT_TO_ELEMENT if pack_method == "reorder" else ORDER_SLOT_TO_ELEMENT
    return np.argsort(slot_to_element)


def repack_rows(words: np.ndarray, n0: int, n1: int, pack_method: str, signed: bool) -> np.ndarray:
    """Output rows [n0, n1) (n0 a multiple of 8) of a [K, ceil(N/8)] int32 Quark weight as uint8 [n1-n0, K/2].

    The pairing (E, O) runs on the source's contiguous rows; only the uint32 results are transposed (4 bytes at a
    time), and each output row is then one byte lane of a transposed word: row 8c + e is byte j of E (slot 2j) or
    O (slot 2j + 1) in word column c, with e the element that slot holds."""
    k = words.shape[0]
    src = words[:, n0 // 8: -(-n1 // 8)].view(np.uint32)
    if signed:
        src = src ^ np.uint32(0x88888888)
    a, b = src[0::2], src[1::2]
    low = np.uint32(0x0F0F0F0F)
    even = transpose_tiled((a & low) | ((b & low) << np.uint32(4)))      # [words, K/2]: slots 0, 2, 4, 6
    odd = transpose_tiled(((a >> np.uint32(4)) & low) | (b & ~low))      # slots 1, 3, 5, 7
    out = np.empty((src.shape[1], 8, k // 2), np.uint8)
    for element, slot in enumerate(element_to_slot(pack_method)):
        lane = even if slot % 2 == 0 else odd
        shift = 8 * (int(slot) // 2)
        out[:, element, :] = (lane >> np.uint32(shift)) if shift else lane  # assignment keeps the low byte
    return out.reshape(-1, k // 2)[: n1 - n0]


def unsigned_zero_points(zp_words: np.ndarray | None, n: int, groups: int, pack_method: str,
                         signed: bool) -> np.ndarray:
    """[groups, ceil(N/8)] packed zero points -> uint8 [N, groups] in the unsigned domain (absent: 0 -> 0 + shift)."""
    off = 8 if signed else 0
    if zp_words is None:
        return np.full((n, groups), off, np.uint8)
    zp = unpack_int4_words(zp_words, pack_method, signed)[:, :n].astype(np.int16)
    return np.ascontiguousarray((zp + off).astype(np.uint8).T)


def stream_b(ctx, name: str, parts: list[tuple[str, int]], k: int, block_size: int, pack_method: str,
             signed: bool) -> str:
    """Write the B initializer of one MatMulNBits whose N rows are the concatenated output rows of `parts`
    ((weight tensor, out_features) each, all with in_features k), block by block."""
    n_total = sum(n for _, n in parts)
    step = max(8, (BLOCK_BYTES // max(1, k // 2)) // 8 * 8)

    def items():
        for tensor, n in parts:
            words = ctx.ckpt.get(tensor)  # packed: K*N/2 bytes; released once its last block is packed
            for n0 in range(0, n, step):
                yield words, n0, min(n0 + step, n)

    def pack(item) -> np.ndarray:
        words, n0, n1 = item
        return repack_rows(words, n0, n1, pack_method, signed).reshape(n1 - n0, k // block_size, block_size // 2)

    return ctx.graph.stream(f"{name}.MatMulNBits.B", np.uint8, (n_total, k // block_size, block_size // 2),
                            ordered_map(pack, items()))
