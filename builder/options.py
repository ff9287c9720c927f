"""`--extra_options KEY=VALUE`: every key the builder knows, its values, and which models it applies to.

One table, OPTIONS: key -> Option(parse, applies, help). `parse` turns the text into the value stored on
BuildOptions (an attribute of that name, or BuildOptions.extra[key] when there is no such attribute) and raises
ConversionError for a value it does not accept; `applies(plan)` says whether the key changes anything for the
model at hand (False: a warning is printed, the conversion goes on). To add an option, add one entry.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .emit_context import BuildOptions
from .errors import ConversionError


@dataclass(frozen=True)
class Option:
    parse: Callable[[str, str], object]          # (key, text) -> value
    applies: Callable[[object], bool] | None     # (ModelPlan) -> bool; None: every model
    help: str


def choice(*values: str, convert: Callable[[str], object] | None = None):
    def parse(key: str, text: str):
        if text not in values:
            raise ConversionError(f"unknown {key} value", field=f"--extra_options {key}", value=text,
                                  accepted=", ".join(values))
        return convert(text) if convert else text
    return parse


def _choices_of(module_attr: tuple[str, str]):
    """Choices owned by a scheme module (imported when first used, so this table stays import-light)."""
    import importlib
    module, attr = module_attr

    def parse(key: str, text: str):
        return choice(*getattr(importlib.import_module(module), attr))(key, text)
    return parse


def _path(key: str, text: str):
    if text == "none":  # custom_ops_library=none: no library, the dense fp32 CPU forms (builder/compact_forms.py)
        return text
    if not text:
        raise ConversionError("needs a path", field=f"--extra_options {key}", value=text)
    return text  # loadability is checked where the library is bundled


def _positive_int(key: str, text: str):
    if not text.isdigit() or int(text) <= 0:
        raise ConversionError("must be a positive integer", field=f"--extra_options {key}", value=text)
    return int(text)


# ---- which models a key applies to ------------------------------------------------------------------------------
def _specs(plan):
    return [lp.spec for lp in plan.linears.values() if lp.spec is not None]


def _has_matmul_nbits(plan) -> bool:
    return any(lp.scheme.__name__ in ("IntWeightOnly", "Mxfp4Linear", "Nvfp4Linear") for lp in plan.linears.values())


def _has_dtype(plan, *prefixes: str, slot: str = "weight") -> bool:
    return any(t.dtype.startswith(prefixes) for s in _specs(plan) for t in getattr(s, slot))


def _has_kv(plan) -> bool:
    return any(s.output_tensors for s in _specs(plan) if plan.quant is not None)


def _has_fp8_attention(plan) -> bool:
    q = plan.quant
    if q is None:
        return False
    return q.softmax_spec is not None or bool(q.raw.get("attention_quant_config")) or any(
        name.endswith("q_proj") and lp.spec is not None and lp.spec.output_tensors
        for name, lp in plan.linears.items())


def _has_standard_attention(plan) -> bool:
    from .attention_variants import explicit_attention_supported, fixed_order_unsupported
    return explicit_attention_supported(plan) is None or fixed_order_unsupported(plan, need_kernel=False) is None


def _has_int4(plan) -> bool:
    return any(lp.scheme.__name__ == "IntWeightOnly" and lp.spec.weight[0].dtype in ("int4", "uint4")
               for lp in plan.linears.values())


def _has_fp4(plan) -> bool:
    """Some linear has FP4 weights and dynamic FP4 activations (what mx_activations acts on)."""
    return any(lp.scheme.__name__ in ("Mxfp4Linear", "Nvfp4Linear") for lp in plan.linears.values())


def _has_fp4_weight(plan) -> bool:
    """Some linear has FP4 weights (fp4_linear: MXFP4 with FP8 activations too, builder/quant/mxfp4_fp8.py)."""
    return any(lp.scheme.__name__ in ("Mxfp4Linear", "Nvfp4Linear", "Mxfp4Fp8Linear") for lp in plan.linears.values())


def _has_mx_gemm(plan) -> bool:
    """amd_arch changes the graph: some MXFP4 linear takes gfx950's MX GEMM form (builder/quant/mx_gemm.py)."""
    from .quant.mx_gemm import mx_gemm_applies
    return plan.ep.amd_arch == "any" or any(
        lp.scheme.__name__ == "Mxfp4Linear" and mx_gemm_applies(plan.ep, lp, plan.options.mx_activations) is None
        for lp in plan.linears.values())  # dense linears and routed experts alike (quant/mx_gemm.py routed_mx_applies)


def _has_moe(plan) -> bool:
    return hasattr(plan.hp, "num_experts")


def _has_mla(plan) -> bool:
    return hasattr(plan.hp, "kv_lora_rank")


def _has_float_lm_head(plan) -> bool:
    lm_head = plan.linears.get("lm_head")
    return lm_head is not None and lm_head.spec is None


def _has_fusable(plan) -> bool:
    return any(n.endswith(("q_proj", "gate_proj")) for n in plan.linears)


OPTIONS: dict[str, Option] = {
    "accuracy_level": Option(choice("0", "1", "2", "3", "4", convert=int), _has_matmul_nbits,
                             "MatMulNBits accuracy_level (cpu default 4; 1 for fp32-exact results). With the custom-op "
                             "library cpu 4-bit weights default to the exact MatMulUint4/Int4 and experts at level 1; "
                             "an explicit level other than 1 gives MatMulNBits and int8-activation experts"),
    "kv_cache": Option(choice("auto", "emulate", "off", "native"), _has_kv,
                       "FP8 KV cache (k_proj/v_proj.output_scale): auto|emulate|off|native"),
    "fp8_attention": Option(choice("auto", "off"), _has_fp8_attention, "FP8 attention subgraph: auto|off"),
    "attention": Option(_choices_of(("builder.attention_variants", "ATTENTION_FORMS")), _has_standard_attention,
                        "attention form: auto (CPU with the custom-op library: fixed; without it, quantized "
                        "activations: explicit, else fused) | fixed (com.quark_onnx GroupQueryAttentionFixedOrder: "
                        "GroupQueryAttention's in-place cache, one summation order on every CPU) | fused "
                        "(GroupQueryAttention) | explicit (MatMul subgraph with a fixed-order softmax: the same "
                        "logits on AVX2 and AVX-512 CPUs)"),
    "mx_activations": Option(_choices_of(("builder.quant.mxfp4", "MX_ACTIVATION_OPTIONS")), _has_fp4,
                             "MXFP4/NVFP4 dynamic activation quantization: emulate|skip"),
    "fp8_linear": Option(_choices_of(("builder.quant.fp8_w8a8", "FP8_LINEAR_FORMS")),
                         lambda plan: _has_dtype(plan, "fp8"), "FP8 W8A8 linear form (overrides the EP profile)"),
    "int8_linear": Option(_choices_of(("builder.quant.int8_w8a8", "INT8_LINEAR_FORMS")),
                          lambda plan: _has_dtype(plan, "int8", "uint8", slot="input_tensors"),
                          "INT8 W8A8 linear form: dequantized_weight (CPU default: fp32 GEMM, the same logits on "
                          "every CPU) | qdq (ORT CPU fuses an integer GEMM: faster, but on x86 CPUs without VNNI its "
                          "u8s8 kernel saturates and the logits drift)"),
    "int4_linear": Option(_choices_of(("builder.quant.int_weight_only", "INT4_LINEAR_FORMS")), _has_int4,
                          "4-bit weight-only linear form: compact (cpu default with the custom-op library: "
                          "com.quark_onnx MatMulUint4/MatMulInt4, fp32 activations, exact, the same bits on every "
                          "CPU) | matmul_nbits (MatMulNBits at accuracy_level; the default elsewhere)"),
    "fp4_linear": Option(_choices_of(("builder.quant.mxfp4", "FP4_LINEAR_METHODS")), _has_fp4_weight,
                         "FP4 weight form (overrides the EP profile)"),
    "amd_arch": Option(_choices_of(("builder.quant.mx_gemm", "AMD_ARCHES")), _has_mx_gemm,
                       "-e rocm / -e migraphx target chip: any (forms every gfx parses; default) | gfx950 (MXFP4 "
                       "linears as float4e2m1 Q/DQ on both MatMul operands, which MIGraphX lowers to gfx950's MX FP4 "
                       "GEMM; opset 23; ORT CPU cannot run it)"),
    "fuse_projections": Option(choice("0", "1", "true", "false", convert=lambda t: t in ("1", "true")),
                               _has_fusable, "one matmul for q/k/v and for gate/up where the schemes agree: 1|0"),
    "moe": Option(_choices_of(("builder.ops.moe", "MOE_FORMS")), _has_moe,
                  "MoE form: routed (cpu: our MatMulExperts ops with the custom-op library, QMoE for 4-bit "
                  "experts without it; else the standard-op routed form) | gather (the standard-op routed form) | "
                  "dense"),
    "int4_experts": Option(_choices_of(("builder.ops.moe", "INT4_EXPERTS_FORMS")), _has_moe,
                           "cpu routed 4-bit integer experts: compact (default with the custom-op library: "
                           "com.quark_onnx MatMulExpertsUint4/Int4, the stacked bytes read in place; exact, or int8 "
                           "activations as QMoE's at an explicit accuracy_level=4) | qmoe (com.microsoft QMoE, "
                           "pre-packed at session creation; default without the library)"),
    "mla_cache": Option(_choices_of(("builder.ops.mla_attention", "MLA_CACHE_FORMS")), _has_mla,
                        "DeepSeek MLA cache: materialized (per-head K/V in GroupQueryAttention) | latent (MLA's "
                        "compressed latent, kv_b_proj absorbed; cpu/cuda)"),
    "moe_routed_tokens": Option(_positive_int, _has_moe,
                                "standard-op routed MoE: most tokens per call that take the routed branch (default "
                                "E/k; more tokens run every expert)"),
    "lm_head": Option(_choices_of(("builder.quant.float_int8", "LM_HEAD_FORMS")), _has_float_lm_head,
                      "float lm_head storage: float (exact) | int8 (8-bit MatMulNBits, not exact) | bf16 (checkpoint's "
                      "bf16 bits, custom-op kernel on CPU, exact)"),
    "embedding": Option(choice("float", "bf16"), None,
                        "token embedding storage: float (io dtype) | bf16 (checkpoint's bf16 bits, Gather + Cast, exact; "
                        "cpu)"),
    "prefill_logits": Option(choice("all", "last"), None,
                             "logits a prompt run returns: all (every position; cuda default) | last (each sequence's "
                             "last token only: the lm_head runs once per sequence; onnxruntime-genai reads it; default "
                             "on cpu, rocm, migraphx)"),
    "custom_ops_library": Option(_path, None, "custom-op shared library, copied into the output folder (cpu default: found or built by the "
                                 "converter; none: no library and the dense fp32 forms)"),
}


def parse_extra_options(pairs: list[str]) -> BuildOptions:
    """`KEY=VALUE` strings -> BuildOptions; unknown keys, repeated keys and bad values are refused."""
    options = BuildOptions()
    seen: set[str] = set()
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep:
            raise ConversionError("expected KEY=VALUE", field="--extra_options", value=pair)
        if key not in OPTIONS:
            raise ConversionError("unknown option", field="--extra_options", value=key,
                                  accepted=", ".join(OPTIONS))
        if key in seen:
            raise ConversionError("option given twice", field=f"--extra_options {key}", value=text)
        seen.add(key)
        value = OPTIONS[key].parse(key, text)
        if hasattr(options, key) and key != "extra":
            setattr(options, key, value)
        else:
            options.extra[key] = value
    options.given = tuple(sorted(seen))
    return options


def options_not_applying(plan) -> list[str]:
    """Warnings for the keys the user gave that change nothing for this model."""
    out = []
    for key in getattr(plan.options, "given", ()):
        applies = OPTIONS[key].applies
        if applies is not None and not applies(plan):
            out.append(f"--extra_options {key} does not apply to this model ({plan.hp.architecture}, "
                       f"{_scheme_summary(plan)}): ignored")
    return out


def _scheme_summary(plan) -> str:
    names = sorted({lp.scheme.__name__ for lp in plan.linears.values()})
    return "/".join(names)
