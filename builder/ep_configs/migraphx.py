"""MIGraphX execution provider (AMD GPUs), named as ONNX Runtime names it.

genai_config names ONNX Runtime's own "MIGraphX" EP: onnxruntime-genai 0.18 has no dispatcher of its own for that
name and passes it to OrtSessionOptions::AppendExecutionProvider, which works with an onnxruntime-migraphx wheel;
inputs, outputs and the KV cache then live in CPU memory between steps. `-e rocm` writes genai's AMDGPU provider
instead (GPU-resident cache). Both build the same graph: see docs/execution_providers.md.

Every tensor type in that graph is one MIGraphX's ONNX parser reads (AMDMIGraphX src/onnx/onnx_parser.cpp get_type,
commit f729a52): FP8 is float8e4m3fnuz with doubled scales (ops/fnuz.py), MXFP4/NVFP4 weights are INT8
DequantizeLinear with blocked halved scales (quant/fp4_int8_dq.py). builder/ep_rules.py checks it.
"""
import re

from ..ep_rules import MIGRAPHX_MODEL_RULES, MIGRAPHX_RULES
from .base import EPConfig

FP8_NOTE = ("FP8 tensors are float8e4m3fnuz with doubled scales (MIGraphX's ONNX parser reads no float8e4m3fn: "
            "onnx_parser.cpp get_type); MIGraphX runs FNUZ fp8 GEMMs natively on gfx94x (MI300) only, and computes "
            "them in float on gfx950 (MI350), gfx12 and gfx90a (eliminate_data_type_for_gpu.cpp for_fp8fnuz, "
            "device_name.cpp gfx_has_fp8fnuz_intrinsics): same numbers, no fp8 speed-up there")
FP4_NOTE = ("FP4 weights are INT8 DequantizeLinear (2*e2m1, blocked scale/2, exact) -> MatMul: MIGraphX's parser "
            "misreads float4e2m1 initializers (onnx_parser.cpp parse_tensor_shape halves INT4/UINT4 only), so no "
            "native FP4 GEMM is used; the GEMM runs in the io dtype on every chip")
MX_ACT_NOTE = ("MXFP4/NVFP4 activation fake-quantization is plain float ops (Abs, ReduceMax, Log, Floor, Round, "
               "...; NVFP4 block scales through float8e4m3fnuz Q/DQ), not MIGraphX's MXQuantizeDequantize: "
               "parse_mxqdq.cpp computes 2^floor(log2 amax) / 4, Quark's scale_calculation_mode 'floor', not its "
               "default 'even', and divides by 0 on an all-zero block")

REFUSED = {
    "fp8_linear": {"matmul_block_fp8": "com.microsoft MatMulBlockQuantizedFp8Weight has no MIGraphX parser and "
                   "takes float8e4m3fn, which MIGraphX's parser refuses (onnx_parser.cpp get_type)"},
    "fp4_linear": {"dq_fp8": "float8e4m3fn is refused by MIGraphX's parser (onnx_parser.cpp get_type)",
                   "native": "the FP4 custom ops have no MIGraphX parser (float4e2m1 is misread: "
                   "onnx_parser.cpp parse_tensor_shape)",
                   "matmul_nbits8": "MIGraphX parses 4-bit MatMulNBits only (parse_matmulnbits.cpp)"},
}


GFX950_MX_NOTE = ("amd_arch=gfx950: {n} MXFP4 linear(s) take gfx950's MX GEMM form: float4e2m1 Q/DQ with e8m0 "
                  "block scales on both MatMul operands (opset 23), which simplify_qdq match_find_mx_quantizable_ops "
                  "lowers to a 4-input quant_dot on gfx950 only (elsewhere the Q/DQ is computed in float); ONNX "
                  "Runtime CPU has no float4e2m1 Quantize/DequantizeLinear kernel, so this graph runs on the MIGraphX "
                  "EP only (builder/quant/mx_gemm.py)")
GFX950_ROUTED_MX_NOTE = ("amd_arch=gfx950: {n} routed MoE expert projection(s) (stacks over the experts, in {layers} "
                         "MoE layer(s)) take the same form batched: the chosen experts' gathered e2m1 values "
                         "re-quantized to float4e2m1 with unit scales and dequantized with their gathered e8m0 block "
                         "scales, the activations through Quark's even block scale (builder/quant/mx_gemm.py "
                         "emit_routed_weight_mx)")
GFX950_FP8_NOTE = ("amd_arch=gfx950: FP8 stays float8e4m3fnuz (MIGraphX's ONNX parser refuses float8e4m3fn, "
                   "onnx_parser.cpp get_type): gfx950 computes these GEMMs in float, not with its OCP FP8 GEMM")


def _routed(model_plan, name: str) -> bool:
    """An expert linear of the routed standard-op form (ops/routed_experts.py: moe=routed or gather on this EP)."""
    return ".experts." in name and model_plan.options.extra.get("moe", "routed") != "dense"


def _mx_gemm_layers(model_plan, routed: bool = False) -> list[str]:
    """The MXFP4 linears that take the amd_arch=gfx950 MX form: dense ones, or (routed) the routed experts' ones
    (the stack's condition is each expert's: quant/mx_gemm.py routed_mx_applies)."""
    from ..quant.mx_gemm import mx_gemm_applies, routed_mx_applies
    applies = routed_mx_applies if routed else mx_gemm_applies
    return [name for name, lp in model_plan.linears.items() if lp.scheme.name == "mxfp4"
            and _routed(model_plan, name) == routed
            and applies(model_plan.ep, lp, model_plan.options.mx_activations) is None]


def _fp4_layers(model_plan) -> int:
    return sum(1 for lp in model_plan.linears.values() if lp.scheme.name in ("mxfp4", "nvfp4", "mxfp4-fp8"))


def _slots(spec):
    return () if spec is None else tuple(spec.weight) + tuple(spec.input_tensors) + tuple(spec.output_tensors)


def plan_notes(model_plan) -> list[str]:
    """What `inspect` and the log say about this model on MIGraphX (only the forms it actually uses)."""
    specs = [lp.spec for lp in model_plan.linears.values()]
    quant = model_plan.quant
    dtypes = {t.dtype for s in specs for t in _slots(s)}
    if quant is not None and quant.softmax_spec is not None:
        dtypes.add(quant.softmax_spec.dtype)
    schemes = {lp.scheme.name for lp in model_plan.linears.values()}
    notes = []
    if "fp8_e4m3" in dtypes:
        notes.append(FP8_NOTE)
        if model_plan.ep.amd_arch == "gfx950":
            notes.append(GFX950_FP8_NOTE)
    n_mx = len(_mx_gemm_layers(model_plan))
    routed_mx = _mx_gemm_layers(model_plan, routed=True)
    if n_mx:
        notes.append(GFX950_MX_NOTE.format(n=n_mx))
    if routed_mx:
        stacks = {re.sub(r"\.experts\.\d+\.", ".experts.*.", n) for n in routed_mx}
        notes.append(GFX950_ROUTED_MX_NOTE.format(n=len(stacks), layers=len({s.split(".experts.")[0] for s in stacks})))
    n_mx += len(routed_mx)
    if schemes & {"mxfp4", "nvfp4"} and model_plan.ep.fp4_linear == "dq_int8" and n_mx < _fp4_layers(model_plan):
        notes.append(FP4_NOTE)
    n_fp4_act = sum(1 for s in specs if s is not None and s.input_tensors and s.input_tensors[0].dtype == "fp4")
    if schemes & {"mxfp4", "nvfp4"} and n_fp4_act > n_mx and model_plan.options.mx_activations == "emulate":
        notes.append(MX_ACT_NOTE)
    return notes


# Per layer and AMD generation: where the GEMM runs natively (AMDMIGraphX f729a52, read from source, not run on a
# GPU): src/simplify_qdq.cpp match_find_quantizable_ops makes quant_dot of dot(DQ(int8/fp8, constant scale),
# DQ(int8/fp8, constant scale)) with per-tensor or per-axis scales; src/targets/gpu/eliminate_data_type_for_gpu.cpp
# for_fp8fnuz computes fnuz dot/quant_dot in float where gfx_has_fp8fnuz_intrinsics() is false (device_name.cpp:
# gfx94x only); the ONNX parser reads no float8e4m3fn (onnx_parser.cpp get_type), so no OCP-FP8 GEMM is reachable;
# MX quant_dot (match_find_mx_quantizable_ops, gfx950 only) needs block-scaled DQ of float4e2m1 on both operands,
# which these graphs do not hold (docs/amd_generations.md).
FLOAT_GEMM = "AMD: io-dtype GEMM on every gfx"


MX_GEMM = ("AMD: MX FP4 GEMM (4-input quant_dot) on gfx950; on gfx94x, gfx12 and older the same float4e2m1 Q/DQ "
           "computed in float, io-dtype GEMM (amd_arch=gfx950 form)")
ROUTED_MX_GEMM = ("AMD: MX FP4 GEMM (batched 4-input quant_dot) on gfx950 (routed expert: the gathered experts' e2m1 "
                  "values and the activations through float4e2m1 Q/DQ with run-time e8m0 block scales); on gfx94x, "
                  "gfx12 and older the same Q/DQ computed in float, io-dtype GEMM (amd_arch=gfx950 form)")
NO_MX = "no MX FP4 GEMM: gfx950's needs float4e2m1 Q/DQ on both operands"
OCP_FP8_REFUSED = "amd_arch=gfx950 keeps fnuz: MIGraphX's parser refuses float8e4m3fn"


def layer_note(model_plan, name: str, lp) -> str | None:
    from ..quant.fp8_w8a8 import activation_mode
    from ..quant.mx_gemm import MX_ARCH, mx_gemm_applies, routed_mx_applies
    scheme = lp.scheme.name
    gfx950 = model_plan.ep.amd_arch == MX_ARCH
    if _routed(model_plan, name):
        why = routed_mx_applies(model_plan.ep, lp, model_plan.options.mx_activations) if scheme == "mxfp4" else ""
        if why is None:
            return ROUTED_MX_GEMM
        why = f"; amd_arch=gfx950 does not apply: {why}" if gfx950 and why else ""
        return FLOAT_GEMM + f" (routed expert: weights decoded in ops{why})"
    if scheme == "fp8-w8a8" and model_plan.ep.fp8_linear == "qdq":
        # static: Q/DQ(x, s); dynamic (per tensor / per token): Q/DQ(x / s_dyn, unit) -> MatMul -> * s_dyn
        # (ops/qdq.py fp8_dynamic_unit): both give dot(DQ(fp8, constant scale), DQ(weight)) -> quant_dot
        if activation_mode(lp.spec) != "none":
            return ("AMD: FP8 GEMM (fnuz quant_dot) on gfx94x; float GEMM on gfx950, gfx12 and older"
                    + (f" ({OCP_FP8_REFUSED})" if gfx950 else ""))
        return FLOAT_GEMM + " (FP8 weight-only: the weight is dequantized)"
    if scheme == "int8-w8a8":
        static = lp.spec.input_tensors and not lp.spec.input_tensors[0].is_dynamic
        return "AMD: int8 quant_dot" if static else FLOAT_GEMM
    if scheme == "mxfp4":
        why = mx_gemm_applies(model_plan.ep, lp, model_plan.options.mx_activations)
        if why is None:
            return MX_GEMM
        return FLOAT_GEMM + f" ({NO_MX}" + (f"; amd_arch=gfx950 does not apply: {why})" if why else ")")
    if scheme in ("nvfp4", "mxfp4-fp8"):
        extra = {"nvfp4": "NVFP4's e4m3 block scales of 16 are not MX", "mxfp4-fp8": "its activations are FP8, "
                 "per tensor"}[scheme]
        return FLOAT_GEMM + f" ({NO_MX}" + (f"; amd_arch=gfx950 does not apply: {extra})" if gfx950 else ")")
    return FLOAT_GEMM


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
    keep_fake_quant=True,                  # simplify_qdq remove_qdq_pairs drops same-scale Q/DQ pairs on the GPU
    matmul_nbits_bias_input=False,         # parse_matmulnbits.cpp ignores inputs 4 (g_idx) and 5 (bias)
    fp8_linear="qdq",
    fp8_format="e4m3fnuz",                 # onnx_parser.cpp get_type: 18 is the only fp8 type it reads
    fp4_linear="dq_int8",
    refused_forms=REFUSED,
    plan_notes=plan_notes,
    layer_note=layer_note,
    custom_ops_backend="hip",
    constraints=MIGRAPHX_RULES,
    model_constraints=MIGRAPHX_MODEL_RULES,
)
