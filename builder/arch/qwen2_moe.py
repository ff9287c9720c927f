"""Qwen2-MoE decoders (Qwen2MoeForCausalLM): the Qwen2 attention block (q/k/v bias, no q/k norms), and in the
sparse layers the Qwen MoE block of builder/arch/qwen3_moe.py with its shared expert:
    y = MoE(x) + sigmoid(shared_expert_gate(x)) · shared_expert(x)
(transformers' Qwen2MoeSparseMoeBlock; routing and the dense/sparse layer choice as Qwen3-MoE).
"""
from __future__ import annotations

from . import llama, qwen3_moe
from .base import DecoderHyper

MODEL_TYPES = {"Qwen2MoeForCausalLM": "qwen2"}
MOE_FAMILY = True  # tests/test_architecture_coverage.py: tested end to end with 4-bit and MXFP4 experts

default_attention = llama.default_attention
linear_layers = qwen3_moe.linear_layers
build_graph = qwen3_moe.build_graph
check_plans = qwen3_moe.check_plans
plan_notes = qwen3_moe.plan_notes


def refine_hyper(cfg: dict, hp: DecoderHyper, config_file: str) -> qwen3_moe.QwenMoEHyper:
    return qwen3_moe.refine_hyper(cfg, hp, config_file, shared_expert=True, router_is_linear=False)


def float_tensors(hp: qwen3_moe.QwenMoEHyper) -> list[tuple[str, tuple[int, ...]]]:
    return llama.float_tensors(hp) + qwen3_moe.moe_float_tensors(hp)
