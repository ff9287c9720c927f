"""CPU execution provider."""
from ..ep_rules import CPU_RULES
from .base import EPConfig

CONFIG = EPConfig(
    name="cpu",
    default_precision="fp32",
    # bf16: MatMul/Add/Mul/MatMulNBits/GroupQueryAttention have no bf16 CPU kernel in onnxruntime 1.32
    precisions=("fp32", "fp16"),
    # No entry: onnxruntime-genai 0.18 always has the CPU EP and throws when "cpu" is given provider options.
    genai_provider_options=(),
    genai_provider_note="empty provider_options: the CPU EP is always registered (genai rejects options for it)",
    # One intra-op thread per physical core. onnxruntime-genai sets intra_op_num_threads to
    # hardware_concurrency() / 2 when the config has none (src/models/model.cpp CreateSessionOptionsFromConfig, 0.18):
    # right with two hardware threads per core, half the cores without SMT (1 thread on a 2-core VM, measured:
    # gpt-oss-20b slice decode 19.7 against 10.2-10.9 ms a token). 0 hands the choice to ONNX Runtime, whose default
    # is the number of physical cores (onnxruntime/core/util/thread_utils.h: "0: Use default setting. (All the
    # physical cores or half of the logical cores)"): the same count where SMT is on, every core where it is off.
    genai_session_options=(("intra_op_num_threads", 0),),
    # MatMulNBits' accuracy_level 4 (int8 activations) is its fast CPU path; 8-bit weights are 13-167x slower at
    # level 0 (ort_facts.md). It applies where MatMulNBits stays: 4-bit linears without the custom-op library (or
    # with int4_linear=matmul_nbits), 8-bit weight-only linears, and the routed 4-bit experts' level (below).
    accuracy_level_4bit=4,
    accuracy_level_8bit=4,
    # Compact default (builder/compact_forms.py): the checkpoint's FP8 / INT8 / FP4 bytes through com.quark_onnx
    # kernels of the custom-op library the converter finds or builds; without it, the dense fp32 forms of before:
    # fp8_linear/int8_linear=dequantized_weight (fp32 GEMM; ORT's fused u8s8 integer MatMul saturates int16 pair sums
    # on CPUs without VNNI, quant/int8_w8a8.py, so int8_linear=qdq is opt-in only) and fp4_linear=dense (8-bit
    # MatMulNBits is exact only at accuracy_level 1, 17x slower).
    fp8_linear="compact",
    int8_linear="compact",
    fp4_linear="compact",
    # 4-bit weight-only linears: com.quark_onnx MatMulUint4 / Int4 on MatMulNBits' bytes, fp32 activations and
    # Quark's exact decode, the same bits on every CPU (custom_ops/src/qo_cpu_int4.c, qo_cpu_int4_panel.c); without
    # the library MatMulNBits at accuracy_level 4 (docs/benchmarks.md, "The exact 4-bit default").
    int4_linear="compact",
    # 4-bit integer MoE experts: com.quark_onnx MatMulExpertsUint4 / Int4, reading the stacked bytes in place, at the
    # dense 4-bit linears' arithmetic (routed_experts.int4_experts_level: level 1, exact, with int4_linear=compact;
    # 4, QMoE's int8 activations, at an explicit accuracy_level=4); QMoE pre-packs a 1.4x copy at session creation
    # (docs/moe.md). Without the library: QMoE.
    int4_experts="compact",
    custom_ops_backend="cpu",
    constraints=CPU_RULES,
)
