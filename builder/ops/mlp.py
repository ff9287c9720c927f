"""SiLU-gated MLP:   x ──► gate_proj ──► SiLU ──┐
                     x ──► up_proj   ─────────► Mul ──► down_proj ──► y"""
from __future__ import annotations

from .linear import emit_linear, emit_linears


def silu_mlp(ctx, x: str, gate, up, down, prefix: str) -> str:
    g, u = emit_linears(ctx, [gate, up], x, gate.name.rsplit(".", 1)[0] + ".gate_up_proj", f"{prefix}/gate_up_proj")
    sig = ctx.graph.op("Sigmoid", [g], f"{prefix}/act_fn/Sigmoid")
    act = ctx.graph.op("Mul", [g, sig], f"{prefix}/act_fn/Mul")
    h = ctx.graph.op("Mul", [act, u], f"{prefix}/Mul")
    return emit_linear(ctx, down, h)
