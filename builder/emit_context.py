"""Everything a subgraph emitter needs, passed around as one object."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable
from pathlib import Path

import numpy as np

from .checkpoint import Checkpoint
from .ep_configs.base import EPConfig
from .graph import IO_DTYPES, IO_NUMPY, GraphBuilder
from .quark_reader import QuarkConfig


@dataclass
class BuildOptions:
    accuracy_level: int | None = None    # MatMulNBits accuracy_level; None: the EP's default
    fp8_attention: str = "auto"          # auto | off  (off: fused GQA, checkpoint's Q/prob scales ignored)
    kv_cache: str = "auto"               # auto | emulate | native | off
    mx_activations: str = "emulate"      # emulate | skip (MXFP4/NVFP4 dynamic activation quantization)
    custom_ops_library: str | None = None
    fuse_projections: bool = True        # q/k/v and gate/up share one matmul where their schemes agree
    extra: dict = field(default_factory=dict)
    given: tuple[str, ...] = ()          # the --extra_options keys the user gave (for "does not apply" warnings)


@dataclass
class EmitContext:
    graph: GraphBuilder
    ckpt: Checkpoint
    ep: EPConfig
    io: str                        # fp32 | fp16 | bf16
    options: BuildOptions
    quant: QuarkConfig | None
    notes: list[str] = field(default_factory=list)   # things `inspect` and the log should say
    progress: Callable | None = None                 # called with each LinearPlan once emitted

    @property
    def io_type(self) -> int:
        return IO_DTYPES[self.io]

    @property
    def io_np(self) -> np.dtype:
        return IO_NUMPY[self.io]

    def float_weight(self, name: str) -> np.ndarray:
        """A float checkpoint tensor converted to the io dtype."""
        raw = self.ckpt.get(name)
        if raw.dtype == self.io_np:
            return raw
        return np.asarray(raw, dtype=np.float32).astype(self.io_np, copy=False)

    def float_initializer(self, init_name: str, tensor: str, transpose: bool = False) -> str:
        """A float checkpoint tensor as an initializer in the io dtype, converted chunk by chunk."""
        raw = self.ckpt.get(tensor)
        if transpose:
            return self.graph.initializer_transposed(init_name, raw, cast_to=self.io_np)
        return self.graph.initializer(init_name, raw, cast_to=self.io_np)

    @property
    def source(self) -> Path:
        return self.ckpt.model_dir
