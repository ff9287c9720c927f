"""MIGraphX execution provider (AMD GPUs). onnxruntime-genai 0.18 reaches it through its AMDGPU plugin provider."""
from .base import EPConfig

CONFIG = EPConfig(
    name="migraphx",
    default_precision="fp16",
    precisions=("fp16", "fp32", "bf16"),
    genai_provider_options=({"AMDGPU": {}},),
    matmul_nbits_bits=frozenset({4}),
    matmul_nbits_bias_input=False,
    fp8_linear="qdq",
    fp4_linear="dq_fp8",
    custom_ops_backend="hip",
)
