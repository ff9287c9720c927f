"""Chooses how each layer's attention core is emitted (fused GQA by default).

Attention variants (FP8 KV-cache emulation, FP8 attention with quantized Q/K/V/probabilities) register a chooser
here; the first chooser that returns a callable wins.
"""
from __future__ import annotations

from typing import Callable

CHOOSERS: list[Callable] = []


def register_chooser(fn: Callable) -> Callable:
    CHOOSERS.append(fn)
    return fn


def choose_attention(model_plan, ckpt) -> None:
    from . import attention_variants  # noqa: F401  (registers the FP8 KV-cache / FP8 attention chooser)
    if hasattr(model_plan.family, "plan_attention"):  # a family with its own attention block (DeepSeek's MLA)
        model_plan.attention = model_plan.family.plan_attention(model_plan, ckpt)
        return
    for chooser in CHOOSERS:
        attention = chooser(model_plan, ckpt)
        if attention is not None:
            model_plan.attention = attention
            return
    model_plan.attention = model_plan.family.default_attention
