"""Execution-provider profiles, one data module each."""
from __future__ import annotations

from importlib import import_module

from ..errors import ConversionError
from .base import EPConfig

EP_NAMES = ("cpu", "cuda", "rocm", "migraphx")


def get_ep(name: str) -> EPConfig:
    if name not in EP_NAMES:
        raise ConversionError("unknown execution provider", field="--execution_provider", value=name,
                              accepted=", ".join(EP_NAMES))
    return import_module(f"{__name__}.{name}").CONFIG
