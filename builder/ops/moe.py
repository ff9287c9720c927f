"""Sparse mixture-of-experts block (Mixtral), emitted densely: every expert runs on every token, and the router's
renormalized top-k probabilities (zero for the experts not picked) weight the sum.

    x ─► MatMul(router Wᵀ) ─► Softmax ─► TopK(k) ─► values / Σ values ─► ScatterElements into zeros ─► w [B,S,E]
    x ─► gate/up_proj of ALL experts (one fused MatMulNBits when schemes agree) ─► Split ─► SiLU(g_e)·u_e
      ─► down_proj_e ─► y_e ;   out = Σ_e  y_e · w[..., e]

As transformers' MixtralSparseMoeBlock at inference: softmax over the router logits in fp32, top-k, renormalize to
sum 1. Exact (a non-selected expert gets weight 0 exactly), and made only of ops every EP runs; the price is that
all E experts are computed (E/k times the expert FLOPs of a routed kernel), fine for small models and correctness.

Faster form not done yet (measured on onnxruntime 1.32 CPU with a numpy reference, not wired in): com.microsoft QMoE
runs on CPU with activation_type="swiglu", swiglu_fusion=1 (gate/up rows interleaved g0,u0,g1,u1...; 0 and 2 are
refused on CPU), activation_alpha=1, activation_beta=0, normalize_routing_weights=1, router_probs = the router
logits (softmax + top-k + renormalize inside), expert_weight_bits=4, block_size=32: weights uint8 [E, N, K/2] and
scales [E, N, K/block] and packed zero points [E, N, K/block/2] in MatMulNBits' per-row layout; max |diff| 3.6e-7.
The float MoE op needs the same interleaved fc1 (its separate fc3 input is "not implemented for CPU MoE").
"""
from __future__ import annotations

from onnx import TensorProto

from .linear import emit_linear, emit_linears


def router_weights(ctx, x: str, router_weight: str, top_k: int, name: str, prefix: str) -> str:
    """x [B,S,H] -> dense routing weights [B,S,E] in the io dtype (renormalized top-k softmax, zeros elsewhere).
    name: the MoE block's module name, prefix of the constants made here."""
    g = ctx.graph
    w_t = ctx.float_initializer(f"{router_weight}.T", router_weight, transpose=True)
    logits = g.op("MatMul", [x, w_t], f"{prefix}/gate/MatMul")
    if ctx.io_type != TensorProto.FLOAT:  # transformers: softmax(router_logits.float())
        logits = g.op("Cast", [logits], f"{prefix}/gate/Cast", to=TensorProto.FLOAT)
    probs = g.op("Softmax", [logits], f"{prefix}/router/Softmax", axis=-1)
    k = g.const_i64(f"{name}.router.top_k", [top_k])
    top_vals, top_idx = g.node("TopK", [probs, k], f"{prefix}/router/TopK", outputs=2, axis=-1, largest=1,
                               sorted=1)
    axes = g.const_i64(f"{name}.router.reduce_axes", [-1])
    total = g.op("ReduceSum", [top_vals, axes], f"{prefix}/router/ReduceSum", keepdims=1)
    norm = g.op("Div", [top_vals, total], f"{prefix}/router/Div")
    zeros = g.op("Mul", [probs, g.scalar(f"{name}.router.zero", 0.0, "float32")], f"{prefix}/router/Zeros")
    dense = g.op("ScatterElements", [zeros, top_idx, norm], f"{prefix}/router/ScatterElements", axis=-1)
    if ctx.io_type != TensorProto.FLOAT:
        dense = g.op("Cast", [dense], f"{prefix}/router/CastBack", to=ctx.io_type)
    return dense


def dense_moe(ctx, x: str, router_weight: str, experts: list[tuple], top_k: int, name: str,
              prefix: str) -> str:
    """x [B,S,H] -> [B,S,H]. experts: [(gate_plan, up_plan, down_plan), ...] in expert order; name: the block's
    module name (model.layers.0.mlp), prefix: its ONNX node prefix."""
    g = ctx.graph
    weights = router_weights(ctx, x, router_weight, top_k, name, prefix)
    gate_up = emit_linears(ctx, [p for gate, up, _ in experts for p in (gate, up)], x, f"{name}.experts.gate_up_proj",
                           f"{prefix}/experts/gate_up_proj")
    outs = []
    for e, (_, _, down) in enumerate(experts):
        gate, up = gate_up[2 * e], gate_up[2 * e + 1]
        p = f"{prefix}/experts.{e}"
        act = g.op("Mul", [gate, g.op("Sigmoid", [gate], f"{p}/act_fn/Sigmoid")], f"{p}/act_fn/Mul")
        y = emit_linear(ctx, down, g.op("Mul", [act, up], f"{p}/Mul"))
        n = f"{name}.experts.{e}.routing"
        w_e = g.op("Slice", [weights, g.const_i64(f"{n}.start", [e]), g.const_i64(f"{n}.end", [e + 1]),
                             g.const_i64(f"{n}.axes", [-1])], f"{p}/RoutingWeight")
        outs.append(g.op("Mul", [y, w_e], f"{p}/Weighted"))
    return outs[0] if len(outs) == 1 else g.op("Sum", outs, f"{prefix}/experts/Sum")
