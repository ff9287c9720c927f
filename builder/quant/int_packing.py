"""Quark's integer weight layouts, decoded to plain integer matrices [out, in].

Packing (quark_format.md section 3): 8 nibbles per int32 word along the last axis. With pack_method "reorder", nibble
slot i (bits 4i..4i+3) of word c holds logical element 8c + REORDER_SLOT_TO_ELEMENT[i]; with "order" slot i holds
element 8c + i. Padding nibbles past the real length are dropped by the caller.
"""
from __future__ import annotations

import numpy as np

REORDER_SLOT_TO_ELEMENT = np.array([0, 2, 4, 6, 1, 3, 5, 7])
ORDER_SLOT_TO_ELEMENT = np.arange(8)


def unpack_int4_words(words: np.ndarray, pack_method: str, signed: bool) -> np.ndarray:
    """int32 [..., W] -> int8 [..., 8W] logical nibble values (sign-extended when `signed`)."""
    u = np.ascontiguousarray(words).view(np.uint32)
    shifts = (4 * np.arange(8, dtype=np.uint32))
    slots = ((u[..., None] >> shifts) & 0xF).astype(np.int8)  # [..., W, slot]
    slot_to_element = REORDER_SLOT_TO_ELEMENT if pack_method == "reorder" else ORDER_SLOT_TO_ELEMENT
    logical = np.empty_like(slots)
    logical[..., slot_to_element] = slots
    if signed:
        logical = np.where(logical >= 8, logical - 16, logical).astype(np.int8)
    return logical.reshape(*words.shape[:-1], words.shape[-1] * 8)


def pack_uint_lowfirst(values: np.ndarray, bits: int) -> np.ndarray:
    """Pack unsigned ints along the last axis, LSB first (MatMulNBits' B/zero_points layout). Pads with 0."""
    values = np.asarray(values, dtype=np.uint8)
    if bits == 8:
        return values
    per_byte = 8 // bits
    n = values.shape[-1]
    pad = (-n) % per_byte
    if pad:
        values = np.concatenate([values, np.zeros((*values.shape[:-1], pad), np.uint8)], axis=-1)
    values = values.reshape(*values.shape[:-1], -1, per_byte)
    out = np.zeros(values.shape[:-1], np.uint8)
    for i in range(per_byte):
        out |= (values[..., i] << (bits * i)).astype(np.uint8)
    return out
