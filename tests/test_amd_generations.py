"""`inspect` on -e rocm / -e migraphx says per layer on which AMD generations its GEMM runs natively
(builder/ep_configs/migraphx.py layer_note; the facts: docs/amd_generations.md, read from MIGraphX's source)."""
from __future__ import annotations

import pytest

QUARK_EXPORTS = [("llama_h64", "fp8_w8a8_kv"), ("llama_h64", "mxfp4"), ("llama_h64", "ptpc_fp8"),
                 ("qwen3_moe", "fp8_w8a8"), ("llama_h64", "uint4_g64")]


def _layer_lines(export, ep: str, extra=()):
    from builder.convert import describe_plan, plan_model
    from builder.options import parse_extra_options
    plan, ckpt = plan_model(export / "quark", ep, None, parse_extra_options(list(extra)))
    ckpt.close()
    return {line.split()[0]: line for line in describe_plan(plan).splitlines() if line.startswith("  ")}


@pytest.mark.parametrize("shape,recipe,layer,expect", [
    ("llama_h64", "fp8_w8a8_kv", "model.layers.0.self_attn.q_proj",
     "AMD: FP8 GEMM (fnuz quant_dot) on gfx94x; float GEMM on gfx950, gfx12 and older"),
    # PTPC: x / s_token -> unit-scale Q/DQ -> MatMul(DQ(W)) -> * s_token: still dot(DQ, DQ), so quant_dot
    ("llama_h64", "ptpc_fp8", "model.layers.0.mlp.down_proj", "AMD: FP8 GEMM (fnuz quant_dot) on gfx94x"),
    ("llama_h64", "mxfp4", "model.layers.1.mlp.up_proj", "(no MX FP4 GEMM: gfx950's needs float4e2m1 Q/DQ"),
    ("qwen3_moe", "fp8_w8a8", "model.layers.0.self_attn.o_proj", "AMD: FP8 GEMM (fnuz quant_dot) on gfx94x"),
    ("qwen3_moe", "fp8_w8a8", "model.layers.2.mlp.experts.3.up_proj", "(routed expert: weights decoded in ops)"),
    ("llama_h64", "uint4_g64", "model.layers.0.self_attn.k_proj", "[AMD: io-dtype GEMM on every gfx]"),
])
def test_inspect_names_the_native_generations_per_layer(quark_exports, shape, recipe, layer, expect):
    export = quark_exports(shape, recipe)
    for ep in ("rocm", "migraphx"):
        assert expect in _layer_lines(export, ep)[layer], ep
    assert "AMD:" not in _layer_lines(export, "cpu")[layer]


def test_dense_experts_get_their_scheme_tag(quark_exports):
    lines = _layer_lines(quark_exports("qwen3_moe", "fp8_w8a8"), "rocm", ["moe=dense"])
    assert "AMD: FP8 GEMM (fnuz quant_dot) on gfx94x" in lines["model.layers.2.mlp.experts.3.up_proj"]
