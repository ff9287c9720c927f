"""Everything a subgraph emitter needs, passed around as one object."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import ml_dtypes
import numpy as np

from .checkpoint import Checkpoint
from .ep_configs.base import EPConfig
from .graph import IO_DTYPES, IO_NUMPY, GraphBuilder, cast_block, transpose_tiled
from .pipeline import ordered_map
from .quark_reader import QuarkConfig


BLOCK_BYTES = 16 << 20  # output bytes per streamed block; a few are in flight at once (builder/pipeline.py)
TRANSPOSED_BLOCK_BYTES = 32 << 20


def row_block(shape: tuple[int, ...], dtype, block_bytes: int = BLOCK_BYTES) -> int:
    """Rows of a [rows, ...] tensor per streamed block of about `block_bytes` in `dtype`."""
    row = int(np.prod(shape[1:], dtype=np.int64)) * max(4, np.dtype(dtype).itemsize)  # fp32 staging of a cast
    return max(1, block_bytes // max(1, row))


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
        """A float checkpoint tensor as an initializer in the io dtype (transposed: [in, out] from [out, in]),
        streamed from the file in row blocks: read, cast (and transposed) by the worker threads while the main
        thread writes, so memory holds a few blocks, never the tensor (a 128k-vocabulary lm_head is 4 GiB in fp32)."""
        if init_name == tensor and not transpose and self.graph.has(init_name):
            return init_name  # already emitted as this very tensor in the io dtype (a tied lm_head's embedding)
        shape, dtype = self.ckpt.shape(tensor), self.io_np
        rows = shape[0]
        # transposed: each block becomes `shape[1]` scattered writes, so blocks are larger (fewer, longer writes)
        step = row_block(shape, dtype, TRANSPOSED_BLOCK_BYTES if transpose else BLOCK_BYTES)
        if transpose:  # at least 8 KiB per scattered write in fp32 (hidden 8192: 64 MiB blocks)
            step = max(step, 2048)

        def load(start: int) -> np.ndarray:
            block = self.ckpt.read_rows(tensor, start, start + step)
            return cast_block(transpose_tiled(block) if transpose else block, dtype)  # transposed while narrow

        blocks = ordered_map(load, range(0, rows, step))
        if transpose:
            return self.graph.stream_columns(init_name, dtype, (shape[1], rows), blocks)
        return self.graph.stream(init_name, dtype, shape, blocks)

    def bf16_initializer(self, tensor: str) -> str:
        """A BF16 checkpoint tensor with its bits unchanged (`<tensor>.bf16`), streamed in row blocks; emitted once
        and shared (a tied lm_head=bf16 reads the embedding=bf16 initializer)."""
        name = f"{tensor}.bf16"
        if self.graph.has(name):
            return name
        shape = self.ckpt.shape(tensor)
        step = row_block(shape, np.uint16)
        blocks = ordered_map(lambda start: self.ckpt.read_rows(tensor, start, start + step), range(0, shape[0], step))
        return self.graph.stream(name, ml_dtypes.bfloat16, shape, (b.view(ml_dtypes.bfloat16) for b in blocks))

    def embedding(self, input_ids: str, tensor: str = "model.embed_tokens.weight") -> str:
        """Gather of the token embeddings in the io dtype. `--extra_options embedding=bf16` keeps the checkpoint's
        bf16 table (half the bytes of fp32 in the file and in the session) and casts the gathered rows: exact."""
        g = self.graph
        if self.options.extra.get("embedding") == "bf16":
            gathered = g.op("Gather", [self.bf16_initializer(tensor), input_ids], "/model/embed_tokens/Gather")
            return g.op("Cast", [gathered], "/model/embed_tokens/Cast", to=IO_DTYPES[self.io])
        return g.op("Gather", [self.float_initializer(tensor, tensor), input_ids], "/model/embed_tokens/Gather")

    @property
    def source(self) -> Path:
        return self.ckpt.model_dir
