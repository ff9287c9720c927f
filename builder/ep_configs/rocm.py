"""`-e rocm`: AMD GPUs through ONNX Runtime's MIGraphX path (the ROCm EP was removed in ORT 1.23)."""
from dataclasses import replace

from .migraphx import CONFIG as MIGRAPHX

CONFIG = replace(MIGRAPHX, name="rocm", notes=(
    "-e rocm builds for ONNX Runtime's MIGraphX execution provider (the ROCm EP was removed in ORT 1.23); "
    "onnxruntime-genai 0.18 runs it through its AMDGPU provider.",))
