"""Attention with sinks (gpt-oss) as explicit standard ops, for EPs whose GroupQueryAttention has no head_sink input:
MIGraphX's parser reads GroupQueryAttention inputs 0-10 only (AMDMIGraphX src/onnx/parse_group_query_attention.cpp,
commit f729a52: "Wrong number of inputs provided" above 11; head_sink is input 11), and GQA gives no log-sum-exp to
correct its output by afterwards.

The subgraph is builder/ops/fp8_attention.py's (no Q/DQ scales), with, per layer:
    scores [B, H, S, T] ─Where(mask of this layer: causal & not padding & (windowed layers) key > query - window)
      ─► Concat(sinks [H] expanded to [B, H, S, 1]) ─► Softmax ─► Slice off the last column ─► P
as transformers' eager_attention_forward for gpt-oss (sinks appended to every row before the softmax, their
probability dropped after). Cache: present = Concat(past, new) in genai's [B, kv_heads, seq, head_dim] layout
(genai past_present_share_buffer false).
"""
from __future__ import annotations

import weakref
from dataclasses import replace

import numpy as np

from .fp8_attention import LayerScales, SharedAttention, fp8_attention, shared_values


def append_sink_column(ctx, scores: str, sinks: str, heads: int, p: str) -> str:
    """scores [B, H, S, T] -> [B, H, S, T + 1], the layer's sink logit per head as the last column."""
    g = ctx.graph
    col = g.op("Reshape", [sinks, g.const_i64(f"{p}/sink_shape", [1, heads, 1, 1])], f"{p}/sink/Reshape")
    bhs = g.op("Shape", [scores], f"{p}/sink/ScoresShape", start=0, end=3)
    shape = g.op("Concat", [bhs, g.const_i64(f"{p}/sink_one", [1])], f"{p}/sink/Shape", axis=0)
    col = g.op("Expand", [col, shape], f"{p}/sink/Expand")
    return g.op("Concat", [scores, col], f"{p}/sink/Concat", axis=-1)


def drop_sink_column(ctx, probs: str, p: str) -> str:
    g = ctx.graph
    return g.op("Slice", [probs, g.const_i64(f"{p}/sink_start", [0]), g.const_i64(f"{p}/sink_end", [-1]),
                          g.const_i64(f"{p}/sink_axes", [-1])], f"{p}/sink/Drop")


class SinkAttention:
    """The attention callable (llama.build_graph's `attention`) for a family with sinks: sinks_of(i) names the
    layer's [H] sink tensor in the checkpoint."""
    explicit_fp8 = True  # families refusing the explicit subgraph's features see it as such

    def __init__(self, sinks_of):
        self.sinks_of = sinks_of
        self._masks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # graph -> its masks

    def _shared(self, ctx, shared, hp) -> tuple[SharedAttention, dict[int, SharedAttention]]:
        key = ctx.graph
        if key not in self._masks:
            full = shared_values(ctx, shared, replace(hp, sliding_window=-1, windowed_layers=None),
                                 "/model/sink_attn")
            g, by_window = ctx.graph, {}
            for w in sorted({hp.layer_window(i) for i in range(hp.num_layers)} - {-1}):
                lo = g.op("Sub", [full.query_index, g.scalar(f"/model/sink_attn/window{w}", w, np.int64)],
                          f"/model/sink_attn/win{w}_lo")
                inside = g.op("Greater", [full.key_index, lo], f"/model/sink_attn/in_window{w}")
                by_window[w] = replace(full, allowed=g.op("And", [full.allowed, inside],
                                                          f"/model/sink_attn/windowed{w}"))
            self._masks[key] = (full, by_window)
        return self._masks[key]

    def __call__(self, ctx, i, q, k, v, past_k, past_v, present_k, present_v, shared, hp):
        full, by_window = self._shared(ctx, shared, hp)
        sa = by_window.get(hp.layer_window(i), full)
        sinks = ctx.float_initializer(self.sinks_of(i), self.sinks_of(i))
        return fp8_attention(ctx, i, q, k, v, past_k, past_v, present_k, present_v, sa, hp, LayerScales(),
                             sinks=sinks)
