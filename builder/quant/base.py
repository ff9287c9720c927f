"""What every quantization scheme module provides, and the per-layer plan they work from.

One scheme = one module under builder/quant/, declaring which Quark layer specs it accepts, checking the tensors it
needs before anything is written, describing what it will emit (for `inspect`), and emitting the nodes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from ..quark_reader import QLayerSpec

if TYPE_CHECKING:
    from ..checkpoint import Checkpoint
    from ..emit_context import EmitContext
    from ..ep_configs.base import EPConfig


@dataclass(frozen=True)
class LinearPlan:
    """One nn.Linear of the source model and how it will be converted."""
    name: str                 # module name, e.g. model.layers.0.self_attn.q_proj
    in_features: int
    out_features: int
    spec: QLayerSpec | None   # None: stays float
    scheme: "Scheme"
    has_bias: bool
    node_prefix: str          # hierarchical ONNX node name prefix, e.g. /model/layers.0/attn/q_proj
    weight_name: str | None = None  # tensor to read the weight from, when not `<name>.weight` (tied lm_head)


class Scheme:
    """Base class; subclasses are stateless and registered in builder/quant/__init__.py."""
    name: ClassVar[str] = "?"

    @classmethod
    def accepts(cls, spec: QLayerSpec | None) -> bool:
        raise NotImplementedError

    @classmethod
    def check(cls, plan: LinearPlan, ckpt: "Checkpoint", ep: "EPConfig") -> None:
        """Raise ConversionError when tensors are missing or of the wrong shape/dtype. Runs before any output."""

    @classmethod
    def describe(cls, plan: LinearPlan, ep: "EPConfig", io: str | None = None) -> str:
        raise NotImplementedError

    @classmethod
    def emit(cls, ctx: "EmitContext", plan: LinearPlan, x: str) -> str:
        """Emit nodes computing x @ W.T (no bias) in the io dtype; returns the output value name."""
        raise NotImplementedError
