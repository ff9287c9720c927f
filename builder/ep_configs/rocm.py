"""`-e rocm`: AMD GPUs through ONNX Runtime's MIGraphX path (the ROCm EP was removed in ORT 1.23).

Same graph and rules as `-e migraphx`; genai_config names onnxruntime-genai 0.18's AMDGPU provider, its AMD GPU
device path: it loads the AMDGPU plugin EP (libamdgpu-ep.so, or AMDGPU_EP_PATH), sets the ep.migraphx.* session
options (static prompt padding, HIP graphs) and keeps the KV cache on the GPU.
"""
from dataclasses import replace

from .migraphx import CONFIG as MIGRAPHX

CONFIG = replace(
    MIGRAPHX, name="rocm",
    genai_provider_options=({"AMDGPU": {}},),
    genai_provider_note="'AMDGPU' (aliases amdgpu, AMDGPUExecutionProvider) is onnxruntime-genai 0.18's AMD GPU "
                        "provider; it needs the AMDGPU plugin EP library (libamdgpu-ep.so) next to onnxruntime or "
                        "in AMDGPU_EP_PATH",
    notes=("-e rocm builds for ONNX Runtime's MIGraphX execution provider (the ROCm EP was removed in ORT 1.23); "
           "onnxruntime-genai 0.18 runs it through its AMDGPU provider (genai_config: AMDGPU). "
           "Use -e migraphx to name ORT's MIGraphX EP directly.",))
