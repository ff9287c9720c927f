"""CUDA execution provider."""
from ..ep_rules import CUDA_RULES
from .base import EPConfig

CONFIG = EPConfig(
    name="cuda",
    default_precision="fp16",
    precisions=("fp16", "bf16", "fp32"),  # fp32: GroupQueryAttention then runs on CPU (warning cuda-gqa-dtype)
    genai_provider_options=({"cuda": {}},),
    genai_provider_note="onnxruntime-genai 0.18 dispatches 'cuda' to its CUDA device interface "
                        "(libonnxruntime-genai-cuda.so, shipped by the onnxruntime-genai-cuda package)",
    gqa_kv_quant=frozenset({"fp8", "int8"}),
    fp8_linear="matmul_block_fp8",
    fp4_linear="native",
    custom_ops_backend="cuda",
    constraints=CUDA_RULES,
)
