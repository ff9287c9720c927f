"""What an execution provider accepts, as data. One module per EP fills in an EPConfig."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class EPConfig:
    name: str                                  # cpu | cuda | rocm | migraphx
    default_precision: str                     # io dtype when -p is not given
    precisions: tuple[str, ...]                # io dtypes this EP's kernels (GQA, MatMulNBits) take
    genai_provider_options: tuple[dict, ...]   # genai_config decoder.session_options.provider_options
    genai_session_options: tuple[tuple, ...] = ()  # (key, value) pairs added to decoder.session_options
    matmul_nbits_bits: frozenset = frozenset({2, 4, 8})
    int_weight_dequantize_fallback: bool = False  # widths MatMulNBits lacks: DequantizeLinear -> MatMul
    matmul_nbits_bias_input: bool = True       # False: emit bias as a separate Add (MIGraphX ignores it)
    accuracy_level_4bit: int = 0
    accuracy_level_8bit: int = 0
    gqa_kv_quant: frozenset = frozenset()      # cache dtypes GroupQueryAttention quantizes natively ("fp8", "int8")
    gqa_head_sink: bool = True                 # GroupQueryAttention's head_sink input (attention sinks, gpt-oss)
    keep_fake_quant: bool = False              # Q/DQ pairs rewritten so MIGraphX's GPU keeps them (ops/keep_fake_quant.py)
    fp8_linear: str = "qdq"                    # FP8 linears: qdq | dequantized_weight | matmul_block_fp8 | custom_op
    int8_linear: str = "qdq"                   # INT8 W8A8 linears: qdq | dequantized_weight (quant/int8_w8a8.py)
    int4_linear: str = "matmul_nbits"          # 4-bit weight-only: matmul_nbits | compact (MatMulUint4, exact; cpu default)
    fp4_linear: str = "matmul_nbits8"          # MXFP4/NVFP4: matmul_nbits8 | native | dq_fp8 | dq_int8 | dense (quant/mxfp4.py)
    int4_experts: str = "qmoe"                 # routed 4-bit integer experts (cpu): qmoe | compact (ops/moe.py)
    amd_arch: str = "any"                      # rocm/migraphx: any | gfx950 (amd_arch option, quant/mx_gemm.py)
    fp8_format: str = "e4m3fn"                 # fp8 tensors: e4m3fn | e4m3fnuz (same bits, doubled scales: ops/fnuz.py)
    refused_forms: dict = field(default_factory=dict)  # {"fp8_linear": {form: why}, ...}: --extra_options refused
    plan_notes: object = None                  # callable(model_plan) -> [str]: what `inspect` adds for this EP
    layer_note: object = None                  # callable(model_plan, name, linear_plan) -> str | None: per layer
    fp4_accuracy_level: int = 1                # MatMulNBits accuracy_level of the 8-bit FP4 re-encoding (docs/fp4.md)
    custom_ops_backend: str | None = None      # cpu | cuda | hip: which custom_ops library build applies
    notes: tuple[str, ...] = ()                # what `inspect` should tell the user about this EP
    constraints: tuple = field(default=())     # static rules checked on the built graph (builder/ep_check.py)
    model_constraints: tuple = field(default=())  # whole-graph rules given the per-node findings (ep_rules.ModelRule)
    genai_provider_note: str = ""              # why genai_provider_options is what it is (docs, `inspect`)

    def default_accuracy_level(self, bits: int) -> int:
        return self.accuracy_level_4bit if bits <= 4 else self.accuracy_level_8bit
