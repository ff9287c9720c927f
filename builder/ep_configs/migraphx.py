"""MIGraphX execution provider (AMD GPUs), named as ONNX Runtime names it.

genai_config names ONNX Runtime's own "MIGraphX" EP: onnxruntime-genai 0.18 has no dispatcher of its own for that
name and passes it to OrtSessionOptions::AppendExecutionProvider, which works with an onnxruntime-migraphx wheel;
inputs, outputs and the KV cache then live in CPU memory between steps. `-e rocm` writes genai's AMDGPU provider
instead (GPU-resident cache). Both build the same graph: see docs/execution_providers.md.
"""
from ..ep_rules import MIGRAPHX_MODEL_RULES, MIGRAPHX_RULES
from .base import EPConfig

CONFIG = EPConfig(
    name="migraphx",
    default_precision="fp16",
    precisions=("fp16", "fp32", "bf16"),
    genai_provider_options=({"MIGraphX": {}},),
    genai_provider_note="'MIGraphX' is ONNX Runtime's EP name; onnxruntime-genai 0.18 appends it through ORT's "
                        "generic AppendExecutionProvider (needs an onnxruntime build with the MIGraphX EP)",
    matmul_nbits_bits=frozenset({4}),      # parse_matmulnbits.cpp: bits must be 4
    int_weight_dequantize_fallback=True,   # 8-bit weight-only: DequantizeLinear(int8) -> MatMul instead
    gqa_head_sink=False,                   # parse_group_query_attention.cpp reads inputs 0-10 (no head_sink)
    matmul_nbits_bias_input=False,         # parse_matmulnbits.cpp ignores inputs 4 (g_idx) and 5 (bias)
    fp8_linear="qdq",
    fp4_linear="dq_fp8",
    custom_ops_backend="hip",
    constraints=MIGRAPHX_RULES,
    model_constraints=MIGRAPHX_MODEL_RULES,
)
