"""CUDA execution provider."""
from .base import EPConfig

CONFIG = EPConfig(
    name="cuda",
    default_precision="fp16",
    precisions=("fp16", "bf16", "fp32"),
    genai_provider_options=({"cuda": {}},),
    gqa_kv_quant=frozenset({"fp8", "int8"}),
    fp8_linear="matmul_block_fp8",
    custom_ops_backend="cuda",
)
