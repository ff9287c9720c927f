"""Quantization scheme registry: the first scheme whose `accepts` matches a layer's resolved spec handles it."""
from __future__ import annotations

from ..errors import ConversionError
from ..quark_reader import QLayerSpec
from .base import LinearPlan, Scheme
from .float_linear import FloatLinear
from .fp8_w8a8 import Fp8W8A8
from .int8_w8a8 import Int8W8A8
from .int_weight_only import IntWeightOnly
from .mxfp4 import Mxfp4Linear
from .mxfp4_fp8 import Mxfp4Fp8Linear
from .nvfp4 import Nvfp4Linear

SCHEMES: list[type[Scheme]] = [FloatLinear, IntWeightOnly, Fp8W8A8, Int8W8A8, Mxfp4Linear, Mxfp4Fp8Linear,
                               Nvfp4Linear]


def register(scheme: type[Scheme]) -> type[Scheme]:
    SCHEMES.append(scheme)
    return scheme


def scheme_for(spec: QLayerSpec | None, layer: str, config_file: str) -> type[Scheme]:
    for scheme in SCHEMES:
        if scheme.accepts(spec):
            return scheme
    w = spec.weight[0] if spec.weight else None
    a = spec.input_tensors[0] if spec.input_tensors else None
    field, value = ("weight", w.short() if w else None) if w else ("input_tensors", a.short() if a else None)
    raise ConversionError("no converter for this layer's quantization spec", file=config_file, layer=layer,
                          field=f"{spec.source}.{field}", value=value,
                          accepted=", ".join(s.name for s in SCHEMES))


__all__ = ["LinearPlan", "Scheme", "SCHEMES", "register", "scheme_for"]
