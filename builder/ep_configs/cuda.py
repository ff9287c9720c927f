"""CUDA execution provider."""
from .base import EPConfig

CONFIG = EPConfig(
    name="cuda",
    default_precision="fp16",
    precisions=("fp16", "bf16", "fp32"),
    genai_provider_options=({"cuda": {}},),
    gqa_kv_quant=frozenset({"fp8", "int8"}),
    fp8_linear="qdq",
    fp4_linear="native",
    custom_ops_backend="cuda",
)
