"""Rotary embedding caches (cos/sin [max_positions, rotary_dim/2]) for GroupQueryAttention's fused rotary."""
from __future__ import annotations

import math

import numpy as np

from ..errors import ConversionError


def inv_frequencies(rotary_dim: int, theta: float, scaling: dict | None, config_file: str) -> np.ndarray:
    inv = 1.0 / (theta ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim))
    rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if rope_type in (None, "default"):
        return inv
    if rope_type == "linear":
        return inv / float(scaling["factor"])
    if rope_type == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_ctx = float(scaling["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        wavelen = 2 * math.pi / inv
        smooth = (old_ctx / wavelen - low) / (high - low)
        scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
        mid = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
        return np.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)
    raise ConversionError("rope scaling type not supported", file=config_file, field="rope_parameters.rope_type",
                          value=rope_type, accepted="default, linear, llama3")


def cos_sin_caches(rotary_dim: int, max_positions: int, theta: float, scaling: dict | None,
                   config_file: str) -> tuple[np.ndarray, np.ndarray]:
    inv = inv_frequencies(rotary_dim, theta, scaling, config_file)
    cos = np.empty((max_positions, inv.size), np.float32)
    sin = np.empty_like(cos)
    for start in range(0, max_positions, 1 << 16):  # float64 angles a block at a time, not the whole table
        angles = np.outer(np.arange(start, min(start + (1 << 16), max_positions), dtype=np.float64), inv)
        cos[start:start + len(angles)] = np.cos(angles)
        sin[start:start + len(angles)] = np.sin(angles)
    return cos, sin
