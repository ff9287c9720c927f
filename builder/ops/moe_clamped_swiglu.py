"""gpt-oss's mixture of experts: a router with bias, top-k then softmax over the k logits, and experts with biases
and the clamped SwiGLU on a fused, interleaved gate_up_proj (transformers' GptOssExperts._apply_gate, which
Quark's QuarkGptOssExperts repeats per expert):

    gate_up = x @ W_guᵀ + b_gu          rows interleaved: gate = gate_up[..., 0::2], up = gate_up[..., 1::2]
    gate = min(gate, limit) ;  up = clip(up, -limit, limit)
    act  = (up + 1) · gate · sigmoid(alpha · gate)            alpha = 1.702 (config swiglu_alpha), limit swiglu_limit
    y_e  = act @ W_downᵀ + b_down ;  out = Σ_{e in top-k} softmax(top-k logits)_e · y_e

Routed form (CPU, 4-bit integer experts, --extra_options moe=routed, the default): one com.microsoft QMoE per
layer, activation_type="swiglu", swiglu_fusion=1 (the checkpoint's interleaved rows as they are),
activation_alpha=alpha, activation_beta=1 (the "+ 1"), swiglu_limit=limit, fc1/fc2 biases [E, 2I] / [E, hidden],
router_probs = router logits with bias (softmax over the top-k logits = the renormalized top-k softmax, which the
kernel computes). Measured on onnxruntime 1.32 CPU against the formula above with clamps active (gate and up
outside +-limit): max |diff| 9e-5 on outputs of magnitude 430 (fp32 rounding).
Other EPs and schemes: the routed standard-op form (ops/routed_experts.py) with clamped_swiglu as its activation;
Dense form (moe=dense, mixed experts): every expert runs on every token with standard ops (Slice with step 2,
Min/Clip, Sigmoid), weighted by the scattered routing weights, as QuarkGptOssExperts.forward does.
"""
from __future__ import annotations

import numpy as np

from ..quant.int_packing import pack_uint_lowfirst
from ..quant.int_weight_only import IntWeightOnly
from .linear import emit_linear, emit_linears
from .moe import expert_form, stack_expert


def _scalar(ctx, name: str, value: float) -> str:
    return ctx.graph.scalar(name, value, ctx.io_np)


def router_logits(ctx, x: str, router, prefix: str) -> str:
    """x [B,S,H] -> router logits [B,S,E] (the router linear as Quark left it, with its bias)."""
    return emit_linear(ctx, router, x)


def topk_routing(ctx, logits: str, top_k: int, name: str, prefix: str) -> tuple[str, str, str]:
    """logits [B,S,E] -> (top-k indices [B,S,k], softmax over the top-k logits [B,S,k], the same scattered into
    zeros [B,S,E])."""
    g = ctx.graph
    k = g.const_i64(f"{name}.router.top_k", [top_k])
    top_vals, top_idx = g.node("TopK", [logits, k], f"{prefix}/router/TopK", outputs=2, axis=-1, largest=1,
                               sorted=1)
    scores = g.op("Softmax", [top_vals], f"{prefix}/router/Softmax", axis=-1)
    zeros = g.op("Mul", [logits, _scalar(ctx, f"{name}.router.zero", 0.0)], f"{prefix}/router/Zeros")
    dense = g.op("ScatterElements", [zeros, top_idx, scores], f"{prefix}/router/ScatterElements", axis=-1)
    return top_idx, scores, dense


def dense_routing(ctx, logits: str, top_k: int, name: str, prefix: str) -> str:
    """logits [B,S,E] -> routing weights [B,S,E]: softmax over the top-k logits, zeros elsewhere."""
    return topk_routing(ctx, logits, top_k, name, prefix)[2]


def clamped_swiglu(ctx, gate_up: str, inter: int, alpha: float, limit: float, name: str, prefix: str) -> str:
    """[..., 2I] interleaved gate/up -> [..., I]."""
    g = ctx.graph
    ax, step = g.const_i64(f"{name}.act.axes", [-1]), g.const_i64(f"{name}.act.step", [2])
    end = g.const_i64(f"{name}.act.end", [2 * inter])
    gate = g.op("Slice", [gate_up, g.const_i64(f"{name}.act.start0", [0]), end, ax, step], f"{prefix}/act/Gate")
    up = g.op("Slice", [gate_up, g.const_i64(f"{name}.act.start1", [1]), end, ax, step], f"{prefix}/act/Up")
    lim, neg = _scalar(ctx, f"{name}.act.limit", limit), _scalar(ctx, f"{name}.act.neg_limit", -limit)
    gate = g.op("Min", [gate, lim], f"{prefix}/act/GateClamp")
    up = g.op("Clip", [up, neg, lim], f"{prefix}/act/UpClamp")
    scaled = g.op("Mul", [gate, _scalar(ctx, f"{name}.act.alpha", alpha)], f"{prefix}/act/Alpha")
    glu = g.op("Mul", [gate, g.op("Sigmoid", [scaled], f"{prefix}/act/Sigmoid")], f"{prefix}/act/Glu")
    up1 = g.op("Add", [up, _scalar(ctx, f"{name}.act.one", 1.0)], f"{prefix}/act/UpPlusOne")
    return g.op("Mul", [up1, glu], f"{prefix}/act/Mul")


def dense_moe(ctx, x: str, router, experts: list[tuple], top_k: int, alpha: float, limit: float, name: str,
              prefix: str) -> str:
    """experts: [(gate_up_plan, down_plan), ...]; router: the router's LinearPlan."""
    g = ctx.graph
    weights = dense_routing(ctx, router_logits(ctx, x, router, prefix), top_k, name, prefix)
    gate_up = emit_linears(ctx, [gu for gu, _ in experts], x, f"{name}.experts.gate_up_proj",
                           f"{prefix}/experts/gate_up_proj")
    outs = []
    for e, (gu_plan, down) in enumerate(experts):
        p, n = f"{prefix}/experts.{e}", f"{name}.experts.{e}"
        act = clamped_swiglu(ctx, gate_up[e], gu_plan.out_features // 2, alpha, limit, n, p)
        y = emit_linear(ctx, down, act)
        w_e = g.op("Slice", [weights, g.const_i64(f"{n}.routing.start", [e]), g.const_i64(f"{n}.routing.end", [e + 1]),
                             g.const_i64(f"{n}.routing.axes", [-1])], f"{p}/RoutingWeight")
        outs.append(g.op("Mul", [y, w_e], f"{p}/Weighted"))
    return outs[0] if len(outs) == 1 else g.op("Sum", outs, f"{prefix}/experts/Sum")


def routed_moe(ctx, x: str, router, experts: list[tuple], top_k: int, alpha: float, limit: float, name: str,
               prefix: str, bs: int) -> str:
    """One QMoE node (module docstring); bs from moe.routed_block_size(..., biases=True)."""
    g = ctx.graph
    pack = ctx.quant.export.pack_method
    fc = {"fc1": ([], [], [], []), "fc2": ([], [], [], [])}
    for gate_up, down in experts:
        for key, plan in (("fc1", gate_up), ("fc2", down)):
            q, s, z = stack_expert([IntWeightOnly.load(plan, ctx.ckpt, pack)], bs)
            w_l, s_l, z_l, b_l = fc[key]
            w_l.append(pack_uint_lowfirst(q, 4)), s_l.append(s), z_l.append(pack_uint_lowfirst(z, 4))
            b_l.append(ctx.float_weight(f"{plan.name}.bias") if plan.has_bias
                       else np.zeros(plan.out_features, ctx.io_np))
            if ctx.progress:
                ctx.progress(plan)
    logits = router_logits(ctx, x, router, prefix)
    rows = g.op("Reshape", [logits, g.const_i64(f"{name}.router.rows_shape", [-1, len(experts)])],
                f"{prefix}/router/Reshape")
    inputs, zps = [x, rows], []
    for key, (w_l, s_l, z_l, b_l) in fc.items():
        inputs += [g.initializer(f"{name}.experts.{key}.QMoE.weights", np.stack(w_l)),
                   g.initializer(f"{name}.experts.{key}.QMoE.scales", np.stack(s_l).astype(ctx.io_np)),
                   g.initializer(f"{name}.experts.{key}.QMoE.bias", np.stack(b_l).astype(ctx.io_np))]
        zps.append(g.initializer(f"{name}.experts.{key}.QMoE.zero_points", np.stack(z_l)))
    inputs += ["", "", "", *zps]  # fc3 (fused into fc1); fc1/fc2 zero points
    acc = ctx.options.accuracy_level
    if acc is None:
        acc = ctx.ep.default_accuracy_level(4)
    return g.op("QMoE", inputs, f"{prefix}/QMoE", domain="com.microsoft", k=top_k, activation_type="swiglu",
                swiglu_fusion=1, activation_alpha=float(alpha), activation_beta=1.0, swiglu_limit=float(limit),
                normalize_routing_weights=1, use_sparse_mixer=0, expert_weight_bits=4, block_size=bs,
                weights_prepacked=0, accuracy_level=acc)


def emit_moe(ctx, x: str, router, experts: list[tuple], top_k: int, alpha: float, limit: float, name: str,
             prefix: str) -> str:
    from . import routed_experts
    form, bs = expert_form(ctx, experts, biases=True)
    if form == "qmoe":
        return routed_moe(ctx, x, router, experts, top_k, alpha, limit, name, prefix, bs)
    if form == "dense":
        return dense_moe(ctx, x, router, experts, top_k, alpha, limit, name, prefix)
    top_idx, scores, dense = topk_routing(ctx, router_logits(ctx, x, router, prefix), top_k, name, prefix)
    routing = routed_experts.routing_from_topk(ctx, top_idx, scores, dense, top_k, len(experts), name, prefix)
    inter = experts[0][0].out_features // 2

    def activation(ctx_, ys, p):
        return clamped_swiglu(ctx_, ys[0], inter, alpha, limit, f"{name}.{p}", p)

    return routed_experts.emit_routed_experts(ctx, x, routing, experts, activation, top_k, name, prefix)
