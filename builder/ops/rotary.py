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
    if rope_type == "yarn":
        return _yarn_inv_frequencies(inv, rotary_dim, theta, scaling, config_file)
    raise ConversionError("rope scaling type not supported", file=config_file, field="rope_parameters.rope_type",
                          value=rope_type, accepted="default, linear, llama3, yarn")


def _yarn_field(scaling: dict, key: str, config_file: str) -> float:
    value = scaling.get(key)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise ConversionError("yarn rope needs a positive number", file=config_file, field=f"rope_parameters.{key}",
                              value=value)
    return float(value)


def _yarn_inv_frequencies(inv: np.ndarray, rotary_dim: int, theta: float, scaling: dict,
                          config_file: str) -> np.ndarray:
    """transformers' _compute_yarn_parameters (modeling_rope_utils.py): interpolated (inv / factor) low frequencies,
    extrapolated high ones, a linear ramp between the correction dimensions of beta_fast / beta_slow rotations over
    original_max_position_embeddings (floored/ceiled unless `truncate` is false, as gpt-oss sets it)."""
    factor = _yarn_field(scaling, "factor", config_file)
    original = _yarn_field(scaling, "original_max_position_embeddings", config_file)
    beta_fast, beta_slow = float(scaling.get("beta_fast") or 32), float(scaling.get("beta_slow") or 1)

    def correction_dim(rotations: float) -> float:
        return rotary_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(rotary_dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    return inv / factor * (1 - extrapolation) + inv * extrapolation


def yarn_mscale(scale: float, m: float = 1.0) -> float:
    """transformers' get_mscale (modeling_rope_utils.py _compute_yarn_parameters)."""
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def rope_attention_factor(scaling: dict | None) -> float:
    """The factor transformers multiplies cos and sin by (yarn: attention_factor, else from factor / mscale)."""
    if (scaling or {}).get("rope_type", (scaling or {}).get("type")) != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor = float(scaling["factor"])
    if scaling.get("mscale") and scaling.get("mscale_all_dim"):
        return yarn_mscale(factor, float(scaling["mscale"])) / yarn_mscale(factor, float(scaling["mscale_all_dim"]))
    return yarn_mscale(factor)


def cos_sin_caches(rotary_dim: int, max_positions: int, theta: float, scaling: dict | None,
                   config_file: str) -> tuple[np.ndarray, np.ndarray]:
    inv = inv_frequencies(rotary_dim, theta, scaling, config_file)
    scale = rope_attention_factor(scaling)
    cos = np.empty((max_positions, inv.size), np.float32)
    sin = np.empty_like(cos)
    for start in range(0, max_positions, 1 << 16):  # float64 angles a block at a time, not the whole table
        angles = np.outer(np.arange(start, min(start + (1 << 16), max_positions), dtype=np.float64), inv)
        cos[start:start + len(angles)] = scale * np.cos(angles)
        sin[start:start + len(angles)] = scale * np.sin(angles)
    return cos, sin
