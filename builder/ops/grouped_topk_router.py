"""DeepSeek-V3 routing (transformers 5's DeepseekV3TopkRouter) as ONNX ops, giving dense per-expert weights.

    x ─Cast fp32─► MatMul(router Wᵀ, fp32) ─► Sigmoid = s [B,S,E] ;  c = s + e_score_correction_bias
    c ─Reshape [B,S,G,E/G]─► TopK(2) ─► ReduceSum = group score [B,S,G] ─► TopK(topk_group) ─► group mask
    Where(group mask expanded to its experts, c, -inf) ─► TopK(k) indices ─► GatherElements(s) = w
    w / (Σ w + 1e-20)  (norm_topk_prob) ─► * routed_scaling_factor ─► ScatterElements into zeros ─► [B,S,E]
The correction bias only chooses experts; the weights are the uncorrected sigmoid scores, as in transformers.
A weight is exactly 0 for an expert that was not chosen, so weighting every expert's output by it is exact.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto


def grouped_topk_weights(ctx, x: str, router_weight: str, bias_tensor: str, hp, name: str, prefix: str) -> str:
    """x [B,S,H] (io dtype) -> routing weights [B,S,E] (fp32). name: the MoE block's module name."""
    g = ctx.graph
    e, groups = hp.num_experts, hp.n_group
    per_group = e // groups

    def i64(suffix, values):
        return g.const_i64(f"{name}.router.{suffix}", values)

    w_t = g.initializer_transposed(f"{router_weight}.T", ctx.ckpt.get(router_weight), cast_to=np.float32)
    bias = g.initializer(bias_tensor, ctx.ckpt.get(bias_tensor), cast_to=np.float32)
    if ctx.io_type != TensorProto.FLOAT:  # transformers: F.linear(hidden.float(), weight.float())
        x = g.op("Cast", [x], f"{prefix}/gate/Cast", to=TensorProto.FLOAT)
    logits = g.op("MatMul", [x, w_t], f"{prefix}/gate/MatMul")
    scores = g.op("Sigmoid", [logits], f"{prefix}/router/Sigmoid")
    choice = g.op("Add", [scores, bias], f"{prefix}/router/AddCorrectionBias")
    grouped = g.op("Reshape", [choice, i64("group_shape", [0, 0, groups, per_group])], f"{prefix}/router/Groups")
    top2, _ = g.node("TopK", [grouped, i64("two", [2])], f"{prefix}/router/GroupTop2", outputs=2, axis=-1)
    group_score = g.op("ReduceSum", [top2, i64("last_axis", [-1])], f"{prefix}/router/GroupScore", keepdims=0)
    kept, kept_idx = g.node("TopK", [group_score, i64("topk_group", [hp.topk_group])], f"{prefix}/router/TopGroups",
                            outputs=2, axis=-1)
    zero = g.scalar(f"{name}.router.zero", 0.0, np.float32)
    one = g.scalar(f"{name}.router.one", 1.0, np.float32)
    ones = g.op("Add", [g.op("Mul", [kept, zero], f"{prefix}/router/KeptZero"), one], f"{prefix}/router/KeptOnes")
    group_mask = g.op("ScatterElements", [g.op("Mul", [group_score, zero], f"{prefix}/router/GroupZeros"),
                                          kept_idx, ones], f"{prefix}/router/GroupMask", axis=-1)
    expert_mask = g.op("Expand", [g.op("Unsqueeze", [group_mask, i64("unsq_axes", [-1])], f"{prefix}/router/Unsq"),
                                  i64("expand_shape", [1, 1, 1, per_group])], f"{prefix}/router/ExpandMask")
    expert_mask = g.op("Reshape", [expert_mask, i64("expert_shape", [0, 0, e])], f"{prefix}/router/ExpertMask")
    allowed = g.op("Greater", [expert_mask, g.scalar(f"{name}.router.half", 0.5, np.float32)],
                   f"{prefix}/router/Allowed")
    masked = g.op("Where", [allowed, choice, g.scalar(f"{name}.router.neg_inf", -np.inf, np.float32)],
                  f"{prefix}/router/Masked")
    _, top_idx = g.node("TopK", [masked, i64("top_k", [hp.experts_per_token])], f"{prefix}/router/TopK", outputs=2,
                        axis=-1)
    weights = g.op("GatherElements", [scores, top_idx], f"{prefix}/router/GatherScores", axis=-1)
    if hp.norm_topk_prob:
        total = g.op("ReduceSum", [weights, i64("sum_axes", [-1])], f"{prefix}/router/ReduceSum", keepdims=1)
        total = g.op("Add", [total, g.scalar(f"{name}.router.tiny", 1e-20, np.float32)], f"{prefix}/router/AddTiny")
        weights = g.op("Div", [weights, total], f"{prefix}/router/Normalize")
    weights = g.op("Mul", [weights, g.scalar(f"{name}.router.scaling", hp.routed_scaling_factor, np.float32)],
                   f"{prefix}/router/RoutedScaling")
    zeros = g.op("Mul", [scores, zero], f"{prefix}/router/Zeros")
    return g.op("ScatterElements", [zeros, top_idx, weights], f"{prefix}/router/ScatterElements", axis=-1)
