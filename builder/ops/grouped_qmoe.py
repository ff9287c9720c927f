"""DeepSeek-V3's routed experts as one com.microsoft QMoE (CPU, 4-bit integer experts), fed with routing weights
that the grouped sigmoid router (grouped_topk_router.py) already chose:

    x ─► grouped_topk_weights ─► w [B,S,E] (exactly 0 off the chosen k) ─Reshape [B*S, E]─► QMoE router_probs
    QMoE(k, normalize_routing_weights=0, swiglu_fusion=1, 4-bit fc1/fc2 in MatMulNBits' layout) ─► routed output

onnxruntime 1.32's CPU QMoE picks, per token, the k largest router_probs and, when the optional router_weights
input (14) is given and normalize_routing_weights=0, takes each chosen expert's weight from router_weights as it is
(moe_quantization_cpu.cc; without router_weights it would softmax the chosen router_probs). Both inputs are the
dense weights here: the k chosen are > 0 (sigmoid scores times a positive factor), the others exactly 0, so QMoE's
top-k is the router's choice and its weights are the router's weights (checked against the dense form and Quark's
model by tests/test_deepseek_v3.py).
Weight packing is builder/ops/moe.py's (Mixtral's routed form): fc1 rows interleaved g0,u0,g1,u1,... (swiglu_fusion
1), scales and zero points replicated to a power-of-two block size that divides every Quark group.
"""
from __future__ import annotations

import numpy as np

from ..quant.int_packing import pack_uint_lowfirst
from ..quant.int_weight_only import IntWeightOnly
from .moe import stack_expert


def routed_qmoe(ctx, x: str, weights: str, experts: list[tuple], top_k: int, name: str, prefix: str,
                bs: int) -> str:
    """x [B,S,H] and dense routing weights [B,S,E] in the io dtype -> the routed experts' weighted sum [B,S,H]."""
    g = ctx.graph
    pack = ctx.quant.export.pack_method
    packed = {"fc1": ([], [], []), "fc2": ([], [], [])}
    for gate, up, down in experts:
        gi, ui, di = (IntWeightOnly.load(p, ctx.ckpt, pack) for p in (gate, up, down))
        n = gi.q.shape[0]
        q, s, z = stack_expert([gi, ui], bs)
        order = np.stack([np.arange(n), np.arange(n) + n], axis=1).reshape(-1)  # g0,u0,g1,u1,...
        for fc, (q_, s_, z_) in (("fc1", (q[order], s[order], z[order])), ("fc2", stack_expert([di], bs))):
            packed[fc][0].append(pack_uint_lowfirst(q_, 4))
            packed[fc][1].append(s_)
            packed[fc][2].append(pack_uint_lowfirst(z_, 4))
        if ctx.progress:
            for p in (gate, up, down):
                ctx.progress(p)
    rows = g.op("Reshape", [weights, g.const_i64(f"{name}.router.rows_shape", [-1, len(experts)])],
                f"{prefix}/router/Rows")
    inputs, zps = [x, rows], []
    for fc, (w, s, z) in packed.items():
        inputs += [g.initializer(f"{name}.experts.{fc}.QMoE.weights", np.stack(w)),
                   g.initializer(f"{name}.experts.{fc}.QMoE.scales", np.stack(s).astype(ctx.io_np)), ""]
        zps.append(g.initializer(f"{name}.experts.{fc}.QMoE.zero_points", np.stack(z)))
    # fc3 weights, scales, bias (fused into fc1); fc1/fc2/fc3 zero points; router_weights (input 14)
    inputs += ["", "", "", *zps, "", rows]
    acc = ctx.options.accuracy_level
    if acc is None:
        acc = ctx.ep.default_accuracy_level(4)
    return g.op("QMoE", inputs, f"{prefix}/QMoE", domain="com.microsoft", k=top_k, activation_type="swiglu",
                swiglu_fusion=1, activation_alpha=1.0, activation_beta=0.0, normalize_routing_weights=0,
                use_sparse_mixer=0, expert_weight_bits=4, block_size=bs, weights_prepacked=0, accuracy_level=acc)
