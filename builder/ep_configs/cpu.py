"""CPU execution provider."""
from .base import EPConfig

CONFIG = EPConfig(
    name="cpu",
    default_precision="fp32",
    precisions=("fp32", "fp16"),
    genai_provider_options=(),
    # accuracy_level 4 (int8 activations) is the fast CPU path; 8-bit weights are 13-167x slower at level 0
    # (ort_facts.md). Pass --extra_options accuracy_level=1 for fp32-exact results.
    accuracy_level_4bit=4,
    accuracy_level_8bit=4,
    fp8_linear="dequantized_weight",
    fp4_linear="dense",  # exact and fast; 8-bit MatMulNBits is exact only at accuracy_level 1 (17x slower)
    custom_ops_backend="cpu",
)
