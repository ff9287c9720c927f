"""Sparse mixture-of-experts block (Mixtral), emitted densely: every expert runs on every token, and the router's
renormalized top-k probabilities (zero for the experts not picked) weight the sum.

    x ─► MatMul(router Wᵀ) ─► Softmax ─► TopK(k) ─► values / Σ values ─► ScatterElements into zeros ─► w [B,S,E]
    x ─► gate/up_proj of ALL experts (fused MatMulNBits per 4 experts when schemes agree) ─► Split ─► SiLU(g_e)·u_e
      ─► down_proj_e ─► y_e ;   out = Σ_e  y_e · w[..., e]

As transformers' MixtralSparseMoeBlock at inference: softmax over the router logits in fp32, top-k, renormalize to
sum 1 (normalize=False, Qwen3-MoE's norm_topk_prob false: the top-k softmax probabilities as they are). Exact (a non-selected expert gets weight 0 exactly), and made only of ops every EP runs; the price is that
all E experts are computed (E/k times the expert FLOPs of a routed kernel), fine for small models and correctness.

Routed form (routed_moe, the default where routed_block_size() accepts the experts): one com.microsoft QMoE per layer, which
computes only the k chosen experts per token. Used on the CPU EP when every expert linear is 4-bit integer weight-only
(int4/uint4, per_group or per_channel) with one dtype and one MatMulNBits block size that divides hidden and
intermediate sizes; otherwise (other EPs, 8-bit, MXFP4, NVFP4, FP8, INT8 W8A8 or float experts) the routed form in
standard ops (on CPU with the custom-op library: com.quark_onnx MatMulExperts*)
(builder/ops/routed_experts.py) where the experts stack, and dense_moe for mixed experts, dynamic FP8 activations
or --extra_options moe=dense
(expert_form()).
QMoE on onnxruntime 1.32 CPU, as emitted: activation_type="swiglu", swiglu_fusion=1 (fc1 rows interleaved
g0,u0,g1,u1...; 0 and 2 are refused on CPU), activation_alpha=1, activation_beta=0, normalize_routing_weights=1,
router_probs = the raw router logits [tokens, E] (softmax, top-k and renormalization happen inside; the CPU
kernel renormalizes even with normalize_routing_weights=0, so normalize=False (Qwen's norm_topk_prob false) passes
router_weights = softmax(logits) [tokens, E], input 14, whose values at the chosen experts are the mixing weights),
expert_weight_bits=4, weights_prepacked=0, block_size=bs: weights uint8 [E, N, K/2], scales [E, N, K/bs], packed
zero points [E, N, ceil(K/bs/2)] in MatMulNBits' per-row layout (signed int4 shifted to unsigned, zero point 8,
which is also QMoE's default when no zero points are given). Not routed: 8-bit experts (QMoE's CPU 8-bit kernel
quantizes activations to int8 at every accuracy level, so it would not match the dense form), and other EPs (their
QMoE kernels were not checked against a reference here).
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from ..quant.base import LinearPlan
from ..quant.int_packing import pack_uint_lowfirst
from ..quant.int_weight_only import BITS, IntWeightOnly
from ..errors import ConversionError
from .linear import emit_linear, emit_linears

# --extra_options moe=...: routed (default): QMoE where it is exact (CPU, 4-bit integer experts), else the routed
# standard-op form (ops/routed_experts.py) where the experts stack, else dense; gather: the standard-op form wherever
# the experts stack (CPU 4-bit included); dense: every expert on every token
MOE_FORMS = ("routed", "gather", "dense")
# --extra_options int4_experts=...: the cpu routed form of 4-bit integer experts: compact (the cpu default with the
# custom-op library: com.quark_onnx MatMulExpertsUint4 / MatMulExpertsInt4, the stacked MatMulNBits bytes read in
# place; at accuracy_level 1, the default, Quark's exact fp32 product, at 4 int8 activations as QMoE's) | qmoe (com.microsoft
# QMoE, which pre-packs the experts at session creation: about 1.4x their bytes; the default without the library)
INT4_EXPERTS_FORMS = ("qmoe", "compact")
ROUTED_EPS = ("cpu",)
ROUTED_BITS = (4,)


def router_matmul(ctx, x: str, router, prefix: str) -> str:
    """x [B,S,H] -> router logits [B,S,E]. router: the name of a float [E, H] tensor (a router that is not an
    nn.Linear, never quantized: Mixtral) or the LinearPlan of a router Linear, emitted as Quark left it (Qwen-MoE's
    router once Quark preprocessed it; excluded by its template, but an export may quantize it)."""
    if isinstance(router, LinearPlan):
        return emit_linear(ctx, router, x)
    w_t = ctx.float_initializer(f"{router}.T", router, transpose=True)
    return ctx.graph.op("MatMul", [x, w_t], f"{prefix}/gate/MatMul")


def router_topk(ctx, x: str, router_weight, top_k: int, name: str, prefix: str,
                normalize: bool = True) -> tuple[str, str, str]:
    """x [B,S,H] -> (top-k indices [B,S,k], their mixing weights [B,S,k] in fp32, the dense routing weights [B,S,E]
    in the io dtype: top-k softmax, renormalized to sum 1 when `normalize`, zeros elsewhere). name: the MoE
    block's module name, prefix of the constants made here."""
    g = ctx.graph
    logits = router_matmul(ctx, x, router_weight, prefix)
    if ctx.io_type != TensorProto.FLOAT:  # transformers: softmax(router_logits.float())
        logits = g.op("Cast", [logits], f"{prefix}/gate/Cast", to=TensorProto.FLOAT)
    probs = g.op("Softmax", [logits], f"{prefix}/router/Softmax", axis=-1)
    k = g.const_i64(f"{name}.router.top_k", [top_k])
    top_vals, top_idx = g.node("TopK", [probs, k], f"{prefix}/router/TopK", outputs=2, axis=-1, largest=1,
                               sorted=1)
    norm = top_vals
    if normalize:
        axes = g.const_i64(f"{name}.router.reduce_axes", [-1])
        total = g.op("ReduceSum", [top_vals, axes], f"{prefix}/router/ReduceSum", keepdims=1)
        norm = g.op("Div", [top_vals, total], f"{prefix}/router/Div")
    zeros = g.op("Mul", [probs, g.scalar(f"{name}.router.zero", 0.0, "float32")], f"{prefix}/router/Zeros")
    dense = g.op("ScatterElements", [zeros, top_idx, norm], f"{prefix}/router/ScatterElements", axis=-1)
    if ctx.io_type != TensorProto.FLOAT:
        dense = g.op("Cast", [dense], f"{prefix}/router/CastBack", to=ctx.io_type)
    return top_idx, norm, dense


def router_weights(ctx, x: str, router_weight, top_k: int, name: str, prefix: str,
                   normalize: bool = True) -> str:
    """x [B,S,H] -> dense routing weights [B,S,E] in the io dtype (router_topk)."""
    return router_topk(ctx, x, router_weight, top_k, name, prefix, normalize)[2]


def dense_moe(ctx, x: str, router_weight: str, experts: list[tuple], top_k: int, name: str,
              prefix: str, normalize: bool = True) -> str:
    """x [B,S,H] -> [B,S,H]. experts: [(gate_plan, up_plan, down_plan), ...] in expert order; name: the block's
    module name (model.layers.0.mlp), prefix: its ONNX node prefix."""
    g = ctx.graph
    weights = router_weights(ctx, x, router_weight, top_k, name, prefix, normalize)
    # every expert's gate and up in one matmul (their Split sizes stay inline: GraphBuilder.const_i64)
    gate_up = emit_linears(ctx, [p for gate, up, _ in experts for p in (gate, up)], x,
                           f"{name}.experts.gate_up_proj", f"{prefix}/experts/gate_up_proj")
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


def check_expert_plans(plans: dict, expert_names: list[str], config_file: str) -> None:
    """Refuse, before anything is written, the expert quantizations whose Quark numerics the graph cannot follow.

    Dynamic per_channel activations with ch_axis 1 (the PTPC "per token" spec): Quark's expert forward
    (QuarkExperts, transformers 5) feeds each expert the 2-D [routed tokens, hidden] rows, where axis 1 is the hidden
    channel, so the "per-token" scale becomes a per-channel amax over the tokens routed to that expert (it depends on
    the batch and the routing). On the 3-D attention inputs the same spec is per token, as elsewhere."""
    for name in expert_names:
        spec = plans[name].spec
        for t in (spec.input_tensors if spec is not None else ()):
            if t.is_dynamic and t.qscheme == "per_channel":
                raise ConversionError("dynamic per-channel (PTPC) activations on MoE experts are not supported: "
                                      "Quark quantizes each expert's 2-D input per hidden channel over its routed "
                                      "tokens", file=config_file, layer=name, field=f"{spec.source}.input_tensors",
                                      value=t.short(), accepted="static or MX activations, or weight-only")


def expert_form(ctx, experts: list[tuple], biases: bool = False) -> tuple[str, int | None]:
    """("qmoe", block size) | ("gather", None) | ("dense", None) for one MoE block's experts."""
    from . import routed_experts
    form = moe_form(ctx)
    if form == "dense":
        return "dense", None
    bs = routed_block_size(ctx, experts, biases)
    if bs is not None:
        return "qmoe", bs
    return ("gather", None) if routed_experts.applies(experts) else ("dense", None)


def form_note(model_plan, blocks: dict[int, list[tuple]], biases: bool = False) -> str:
    """One line for `inspect` and the conversion log: how the MoE blocks {layer: experts} will be emitted."""
    from types import SimpleNamespace
    from . import routed_experts
    ctx = SimpleNamespace(ep=model_plan.ep, options=model_plan.options, io=model_plan.io)
    forms = {i: expert_form(ctx, experts, biases) for i, experts in blocks.items()}
    op_blocks = [i for i, (f, _) in forms.items() if f == "gather" and routed_experts.experts_op_applies(ctx, blocks[i])]
    n_op = len(op_blocks)
    if op_blocks and model_plan.ckpt is not None:  # what `inspect` says of each expert, and the kernel notes' counts
        scales = SimpleNamespace(ep=model_plan.ep, options=model_plan.options, io=model_plan.io, ckpt=model_plan.ckpt)
        for i in op_blocks:
            ops, layer_forms = routed_experts.planned_experts_ops(scales, blocks[i])
            model_plan.layer_forms.update(layer_forms)
            for op in ops:
                model_plan.block_ops[op] = model_plan.block_ops.get(op, 0) + 1
    parts = []
    qmoe = sorted({bs for f, bs in forms.values() if f == "qmoe"})
    n_qmoe = sum(f == "qmoe" for f, _ in forms.values())
    n_gather = sum(f == "gather" for f, _ in forms.values())
    n_dense = len(forms) - n_qmoe - n_gather
    first_dense = next((i for i, (f, _) in sorted(forms.items()) if f == "dense"), None)
    if n_qmoe:
        parts.append(f"{n_qmoe} sparse layer(s) as one com.microsoft QMoE each (routed, 4-bit experts, "
                     f"block_size {', '.join(str(b) for b in qmoe)})")
    if n_op:
        int4 = any(f == "gather" and (routed_experts.stack_key(blocks[i][0][0]) or ("",))[0] == "int"
                   for i, (f, _) in forms.items())
        level = routed_experts.int4_experts_level(ctx) if int4 else None
        how = {4: "; 4-bit experts at accuracy_level 4: int8 activations, QMoE's arithmetic",
               1: "; 4-bit experts at accuracy_level 1: fp32 activations, Quark's exact product"}.get(level, "")
        parts.append(f"{n_op} sparse layer(s) routed through com.quark_onnx MatMulExperts* (the chosen experts' "
                     f"compact weights read in place by the custom-op library's kernel; ONNX-function fallback{how})")
        n_gather -= n_op
    if n_gather:
        parts.append(f"{n_gather} sparse layer(s) routed in standard ops (Gather of the chosen experts' stacked "
                     "weights; If: every expert, chunked, past E/k tokens)")
    if n_dense:
        why = ("--extra_options moe=dense" if moe_form(ctx) == "dense" else
               f"experts that do not stack (layer {first_dense}: {routed_experts.why_not(blocks[first_dense])})")
        parts.append(f"{n_dense} of {len(forms)} sparse layer(s) dense (every expert runs, weighted by the routing) "
                     f"because of {why}")
    return "MoE: " + "; ".join(parts)


def moe_form(ctx) -> str:
    return ctx.options.extra.get("moe", "routed")  # validated in convert.check_options


def int4_experts_form(ctx) -> str:
    return ctx.ep.int4_experts  # the EP's default, or --extra_options int4_experts (convert.apply_ep_overrides)


def routed_block_size(ctx, experts: list[tuple], biases: bool = False) -> int | None:
    """The QMoE block size for these experts ((gate, up, down) or (gate_up, down) plans each), or None when the
    routed form does not apply to them. biases: the caller passes the experts' biases to QMoE (gpt-oss)."""
    if moe_form(ctx) != "routed" or ctx.ep.name not in ROUTED_EPS:
        return None
    from . import routed_experts
    if int4_experts_form(ctx) == "compact" and routed_experts.experts_op_applies(ctx, experts):
        return None  # MatMulExpertsUint4 / MatMulExpertsInt4 (routed_experts.emit_experts_op)
    plans = [p for expert in experts for p in expert]
    if any(p.scheme is not IntWeightOnly or (p.has_bias and not biases) for p in plans):
        return None
    if len({(p.spec.weight[0].dtype, p.spec.weight[0].qscheme, p.spec.weight[0].group_size) for p in plans}) != 1:
        return None
    w = plans[0].spec.weight[0]
    if BITS[w.dtype] not in ROUTED_BITS:
        return None
    hidden, inter = experts[0][0].in_features, experts[0][-1].in_features
    groups = (w.group_size, w.group_size) if w.qscheme == "per_group" else (hidden, inter)
    common = int(np.gcd.reduce([*groups, hidden, inter]))
    bs = min(common & -common, 128)  # a power of two dividing every group: the groups' scales are replicated
    return bs if bs >= 16 else None


def stack_expert(iws, bs: int):
    """IntWeights of one fc (rows of all parts in order) -> packed weight [N, K/2], scales [N, K/bs], zp packed."""
    q_u, zp_u, scales = [], [], []
    for iw in iws:
        u, zpu = iw.to_unsigned()
        rep = iw.group_size // bs
        q_u.append(u)
        zp_u.append(np.repeat(zpu, rep, axis=1))
        scales.append(np.repeat(iw.scale, rep, axis=1))
    return np.concatenate(q_u), np.concatenate(scales), np.concatenate(zp_u)


def routed_moe(ctx, x: str, router_weight: str, experts: list[tuple], top_k: int, name: str, prefix: str,
               bs: int, normalize: bool = True) -> str:
    """One QMoE node for the block (see the module docstring); bs from routed_block_size()."""
    g = ctx.graph
    pack = ctx.quant.export.pack_method
    fc1_w, fc1_s, fc1_z, fc2_w, fc2_s, fc2_z = [], [], [], [], [], []
    for gate, up, down in experts:
        gi, ui, di = (IntWeightOnly.load(p, ctx.ckpt, pack) for p in (gate, up, down))
        n = gi.q.shape[0]
        q, s, z = stack_expert([gi, ui], bs)
        order = np.stack([np.arange(n), np.arange(n) + n], axis=1).reshape(-1)  # g0,u0,g1,u1,...
        q, s, z = q[order], s[order], z[order]
        fc1_w.append(pack_uint_lowfirst(q, 4)), fc1_s.append(s), fc1_z.append(pack_uint_lowfirst(z, 4))
        q, s, z = stack_expert([di], bs)
        fc2_w.append(pack_uint_lowfirst(q, 4)), fc2_s.append(s), fc2_z.append(pack_uint_lowfirst(z, 4))
        if ctx.progress:
            for p in (gate, up, down):
                ctx.progress(p)
    inputs = [x, _router_logits(ctx, x, router_weight, len(experts), name, prefix)]
    for fc, (w, s, z) in (("fc1", (fc1_w, fc1_s, fc1_z)), ("fc2", (fc2_w, fc2_s, fc2_z))):
        w_name = g.initializer(f"{name}.experts.{fc}.QMoE.weights", np.stack(w))
        s_name = g.initializer(f"{name}.experts.{fc}.QMoE.scales", np.stack(s).astype(ctx.io_np))
        z_name = g.initializer(f"{name}.experts.{fc}.QMoE.zero_points", np.stack(z))
        inputs += [w_name, s_name, ""]
        if fc == "fc1":
            zp1 = z_name
        else:
            zp2 = z_name
    inputs += ["", "", "", zp1, zp2]  # fc3 weights, scales, bias (fused into fc1); fc1/fc2 zero points
    if not normalize:  # the CPU kernel renormalizes whatever normalize_routing_weights says (measured on ORT 1.32):
        # router_weights (input 14) = the full softmax, gathered at the top-k experts, are the mixing weights
        inputs += ["", _router_softmax(ctx, inputs[1], name, prefix)]
    acc = ctx.options.accuracy_level
    if acc is None:
        acc = ctx.ep.default_accuracy_level(4)
    return g.op("QMoE", inputs, f"{prefix}/QMoE", domain="com.microsoft", k=top_k, activation_type="swiglu",
                swiglu_fusion=1, activation_alpha=1.0, activation_beta=0.0, normalize_routing_weights=int(normalize),
                use_sparse_mixer=0, expert_weight_bits=4, block_size=bs, weights_prepacked=0,
                accuracy_level=acc)


def _router_softmax(ctx, logits: str, name: str, prefix: str) -> str:
    """softmax over every expert's logit (in fp32, as transformers), in the io dtype: QMoE's router_weights."""
    g = ctx.graph
    if ctx.io_type != TensorProto.FLOAT:
        logits = g.op("Cast", [logits], f"{prefix}/router/Cast", to=TensorProto.FLOAT)
    probs = g.op("Softmax", [logits], f"{prefix}/router/Softmax", axis=-1)
    if ctx.io_type != TensorProto.FLOAT:
        probs = g.op("Cast", [probs], f"{prefix}/router/CastBack", to=ctx.io_type)
    return probs


def _router_logits(ctx, x: str, router_weight: str, num_experts: int, name: str, prefix: str) -> str:
    """x [B,S,H] -> router logits [B*S, E] in the io dtype (QMoE wants one row per token)."""
    g = ctx.graph
    logits = router_matmul(ctx, x, router_weight, prefix)
    shape = g.const_i64(f"{name}.router.rows_shape", [-1, num_experts])
    return g.op("Reshape", [logits, shape], f"{prefix}/gate/Reshape")


def emit_moe(ctx, x: str, router_weight: str, experts: list[tuple], top_k: int, name: str, prefix: str,
             normalize: bool = True) -> str:
    """The MoE block in the form expert_form() chooses (--extra_options moe).
    normalize: renormalize the top-k router probabilities to sum 1 (Mixtral; Qwen-MoE's norm_topk_prob)."""
    from . import routed_experts
    form, bs = expert_form(ctx, experts)
    if form == "qmoe":
        return routed_moe(ctx, x, router_weight, experts, top_k, name, prefix, bs, normalize)
    if form == "dense":
        return dense_moe(ctx, x, router_weight, experts, top_k, name, prefix, normalize)
    top_idx, top_w, dense = router_topk(ctx, x, router_weight, top_k, name, prefix, normalize)
    routing = routed_experts.routing_from_topk(ctx, top_idx, top_w, dense, top_k, len(experts), name, prefix)
    return routed_experts.emit_routed_experts(ctx, x, routing, experts, routed_experts.silu_activation, top_k,
                                              name, prefix)
