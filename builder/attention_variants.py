"""Attention variants chosen from the checkpoint's output scales (registered with builder/attention_plan.py).

- FP8 KV cache (k_proj/v_proj.output_scale, kv_cache_post_rope=false): Quark fake-quantizes the k/v projection
  outputs before RoPE (and before a family's per-head q/k norm: Qwen3's default_attention applies it after
  these). Default (auto/emulate), every EP: QDQ(k), QDQ(v) in front of GroupQueryAttention, so the cache
  holds exactly the values an FP8 cache would give (in the io dtype).
  `kv_cache=native` (CUDA only, opt-in): GroupQueryAttention keeps past/present as float8e4m3fn
  (k_quant_type=v_quant_type=PER_TENSOR, kv_cache_bit_width=8, inputs 12/13 = float32 [1] scale initializers); the
  kernel quantizes K after RoPE (vLLM's reading of the same scales) and attends to unquantized K/V on the first
  prompt, so it is not Quark's emulation. onnxruntime-genai takes the cache dtype from the model's past inputs: no
  genai_config key is involved (docs/kv_cache.md has the evidence).
- FP8 attention (q_proj.output_scale and/or self_attn.prob_output_scale): explicit MatMul/Softmax subgraph with QDQ
  (builder/ops/fp8_attention.py), chosen automatically; `fp8_attention=off` keeps fused GQA and ignores those scales
  (with a note), still emulating the FP8 KV cache.
- ISA-fixed attention (`attention=explicit`; the CPU default for every scheme with quantized activations: INT8,
  FP8 static or per-token, MXFP4, NVFP4): the same explicit subgraph, its softmax as ReduceMax/Sub/Exp/ReduceSum/Div
  (ops/fp8_attention.py, softmax_fixed_order); with an FP8 KV cache it keeps QDQ(k), QDQ(v) before RoPE, with FP8
  attention it keeps every Q/DQ (the probabilities' after the fixed-order softmax; FP8 attention takes the fixed
  order on cpu whatever the linears' activations, its probability quantizer reading the softmax directly).
  GroupQueryAttention's softmax (and ORT's Softmax) sums in MLAS's ISA-dependent order (16 lanes on AVX-512, 8 on
  AVX2), and an activation quantizer after it turns those ulps into other codes: on
  SmolLM2-135M the logits differed by 9.25 (INT8) and 2.72 (PTPC) between AVX-512 and AVX2 (issue 21,
  docs/real_model_numerics.md). `attention=fused` keeps GroupQueryAttention (and ORT's Softmax in FP8 attention).
  Weight-only and float schemes keep GroupQueryAttention under auto: no activation quantizer amplifies its ulps.
  Families the explicit subgraph does not cover (explicit_attention_supported) keep GroupQueryAttention under auto.
- Fixed-order fused attention (`attention=fixed`; the cpu default under auto wherever the custom-op library is in use
  and the family's attention is plain GroupQueryAttention, with or without Qwen3's head norms or gpt-oss's sinks):
  com.quark_onnx GroupQueryAttentionFixedOrder[Sinks] (builder/ops/attention_fixed_order.py), GroupQueryAttention's inputs and in-place
  cache (genai past_present_share_buffer=true) with one summation order on every CPU. It replaces both
  GroupQueryAttention (weight-only schemes: their logits no longer depend on the CPU) and the explicit subgraph
  (activation-quantized schemes: no cache concatenation per step); with an FP8 KV cache it takes QDQ(k), QDQ(v)
  in front. FP8 attention (probabilities quantized) keeps the explicit subgraph.
Options (BuildOptions): kv_cache auto|emulate|off|native, fp8_attention auto|off, attention auto|fused|explicit|fixed.
"""
from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto

from .attention_plan import register_chooser
from .errors import ConversionError
from .ops.fp8_attention import LayerScales, fp8_attention, shared_values
from .ops.qdq import qdq_static
from .quant.fp8_w8a8 import scalar_scale


def _check_output_spec(spec_slot, layer: str, config_file: str, field: str) -> None:
    t = spec_slot[0]
    if len(spec_slot) != 1 or t.dtype != "fp8_e4m3" or t.qscheme != "per_tensor" or t.is_dynamic \
            or t.symmetric is False:
        raise ConversionError("only static symmetric per_tensor fp8_e4m3 KV-cache/attention quantization is "
                              "supported", file=config_file, layer=layer, field=field, value=t.short(),
                              accepted="fp8_e4m3 per_tensor sym")


def read_layer_scales(model_plan, ckpt) -> list[LayerScales]:
    quant, hp = model_plan.quant, model_plan.hp
    cfg_file = quant.config_file
    out = []
    for i in range(hp.num_layers):
        attn = f"model.layers.{i}.self_attn"
        found = {}
        for proj in ("q", "k", "v"):
            name = f"{attn}.{proj}_proj"
            plan = model_plan.linears.get(name)  # absent for fused-module families (Phi-3's qkv_proj)
            spec = plan.spec if plan is not None else None
            if spec is None or not spec.output_tensors:
                continue
            _check_output_spec(spec.output_tensors, name, cfg_file, f"{spec.source}.output_tensors")
            if f"{name}.output_scale" not in ckpt:
                raise ConversionError("output quantization configured but output_scale missing",
                                      file=ckpt.model_dir, layer=f"{name}.output_scale",
                                      field="output_tensors.dtype", value="fp8_e4m3")
            found[proj] = scalar_scale(ckpt, f"{name}.output_scale")
        if quant.softmax_spec is not None:
            _check_output_spec((quant.softmax_spec,), attn, cfg_file, "softmax_quant_spec")
            if f"{attn}.prob_output_scale" in ckpt:
                found["prob"] = scalar_scale(ckpt, f"{attn}.prob_output_scale")
        out.append(LayerScales(**found))
    if quant.softmax_spec is not None:
        missing = [i for i, s in enumerate(out) if s.prob is None]
        if missing and len(missing) < len(out):
            raise ConversionError("prob_output_scale present for some layers only", file=ckpt.model_dir,
                                  layer=f"model.layers.{missing[0]}.self_attn.prob_output_scale",
                                  field="softmax_quant_spec", value=quant.softmax_spec.short())
        if missing:  # Quark writes it only when attention ran eagerly at quantization time (else it warns)
            model_plan.notes.append("softmax_quant_spec is set but the checkpoint has no prob_output_scale: Quark "
                                    "did not quantize the probabilities (non-eager attention at quantization "
                                    "time), so neither does this model")
    return out


def _emulated_kv_gqa(default_attention, scales: list[LayerScales]):
    def attention(ctx, i, q, k, v, past_k, past_v, present_k, present_v, shared, hp):
        s = scales[i]
        p = f"/model/layers.{i}/attn"
        if s.k is not None:
            k = qdq_static(ctx, k, s.k, "fp8_e4m3", f"{p}/k_quant")
        if s.v is not None:
            v = qdq_static(ctx, v, s.v, "fp8_e4m3", f"{p}/v_quant")
        return default_attention(ctx, i, q, k, v, past_k, past_v, present_k, present_v, shared, hp)
    return attention


# why an EP has no native FP8 GroupQueryAttention cache (docs/kv_cache.md)
NO_NATIVE_FP8_CACHE = {
    "cpu": "onnxruntime's CPU GroupQueryAttention has int8/4-bit caches but no float8 cache",
    "migraphx": "MIGraphX's GroupQueryAttention parser takes no k_scale/v_scale (no quantized cache)",
    "rocm": "MIGraphX's GroupQueryAttention parser takes no k_scale/v_scale (no quantized cache)",
}
NATIVE_ACCEPTED = "auto, emulate, off"


def _refuse_native(reason: str, **where) -> None:
    field = where.pop("field", "--extra_options kv_cache")
    prefix = "" if field == "--extra_options kv_cache" else "kv_cache=native: "
    raise ConversionError(prefix + reason, field=field, value=where.pop("value", "native"),
                          accepted=where.pop("accepted", NATIVE_ACCEPTED), **where)


def check_native_kv(model_plan, scales: list[LayerScales], has_attn: bool) -> None:
    """Everything `kv_cache=native` needs, checked before anything is written."""
    ep, opts = model_plan.ep, model_plan.options
    if "fp8" not in ep.gqa_kv_quant:
        _refuse_native(f"no float8 GroupQueryAttention cache on {ep.name} "
                       f"({NO_NATIVE_FP8_CACHE.get(ep.name, 'not in this EP profile')})")
    if model_plan.io not in ("fp16", "bf16"):
        _refuse_native(f"{ep.name} registers GroupQueryAttention with a float8 cache for fp16/bf16 only "
                       f"(io {model_plan.io} would run it on CPU, which has none)", field="--precision",
                       value=model_plan.io, accepted="fp16, bf16")
    if has_attn and opts.fp8_attention != "off":
        _refuse_native("the checkpoint's q_proj.output_scale / prob_output_scale select the explicit FP8 attention "
                       "subgraph, not GroupQueryAttention; add fp8_attention=off", field="--extra_options "
                       "fp8_attention", value=opts.fp8_attention, accepted="off (with kv_cache=native)")
    for i, s in enumerate(scales):
        for proj, value in (("k", s.k), ("v", s.v)):
            if value is None or not math.isfinite(value) or value <= 0:
                _refuse_native("every layer needs finite positive k_proj and v_proj output scales",
                               file=model_plan.source, layer=f"model.layers.{i}.self_attn.{proj}_proj.output_scale",
                               field="output_scale", value=value, accepted="> 0")


def _native_kv_gqa(default_attention, scales: list[LayerScales]):
    def attention(ctx, i, q, k, v, past_k, past_v, present_k, present_v, shared, hp):
        s, g, p = scales[i], ctx.graph, f"model.layers.{i}.attn"
        if s.k == s.v:  # Quark writes max(k, v) to both: one tensor lets CUDA use its XQA decode kernel
            k_scale = v_scale = g.initializer(f"{p}.kv_scale", np.array([s.k], np.float32))
        else:
            k_scale = g.initializer(f"{p}.k_scale", np.array([s.k], np.float32))
            v_scale = g.initializer(f"{p}.v_scale", np.array([s.v], np.float32))
        return default_attention(ctx, i, q, k, v, past_k, past_v, present_k, present_v, shared, hp,
                                 extra_inputs=["", "", "", k_scale, v_scale],  # position_ids, bias, head_sink
                                 extra_attrs=dict(k_quant_type="PER_TENSOR", v_quant_type="PER_TENSOR",
                                                  kv_cache_bit_width=8))
    attention.cache_elem_type = TensorProto.FLOAT8E4M3FN
    return attention


def _explicit_fp8(scales: list[LayerScales], head_norms=None, fixed_softmax: bool = False):
    """head_norms(ctx, i, q, k, hp) -> (q, k): a family's per-head q/k norm (Qwen3), applied like Quark between the
    q/k_proj output quantizers and RoPE: QDQ(q), QDQ(k) here, then the norms, then fp8_attention without q/k scales."""
    cache: dict[int, object] = {}

    def attention(ctx, i, q, k, v, past_k, past_v, present_k, present_v, shared, hp):
        key = id(ctx.graph)
        if key not in cache:
            cache.clear()
            cache[key] = shared_values(ctx, shared, hp)
        s = scales[i]
        if head_norms is not None:
            p = f"/model/layers.{i}/attn"
            if s.q is not None:
                q = qdq_static(ctx, q, s.q, "fp8_e4m3", f"{p}/q_quant")
            if s.k is not None:
                k = qdq_static(ctx, k, s.k, "fp8_e4m3", f"{p}/k_quant")
            q, k = head_norms(ctx, i, q, k, hp)
            s = LayerScales(v=s.v, prob=s.prob)
        return fp8_attention(ctx, i, q, k, v, past_k, past_v, present_k, present_v, cache[key], hp, s,
                             fixed_softmax=fixed_softmax)
    attention.explicit_fp8 = True  # families without the explicit subgraph's features refuse it
    return attention


@register_chooser
def choose_quantized_attention(model_plan, ckpt):
    scales = read_layer_scales(model_plan, ckpt) if model_plan.quant is not None else []
    has_kv = any(s.k is not None or s.v is not None for s in scales)
    has_attn = any(s.q is not None or s.prob is not None for s in scales)
    if model_plan.options.kv_cache == "native" and not has_kv:
        _refuse_native("the checkpoint has no k_proj/v_proj.output_scale (no FP8 KV cache to store)",
                       file=model_plan.source)
    if not has_kv and not has_attn:
        return None
    opts, notes, ep = model_plan.options, model_plan.notes, model_plan.ep.name
    cfg_file = model_plan.quant.config_file
    if has_kv and model_plan.quant.kv_cache_post_rope:
        raise ConversionError("post-RoPE KV-cache scales are not supported", file=cfg_file,
                              field="quantization_config.kv_cache_post_rope", value=True, accepted="false")
    if opts.kv_cache not in ("auto", "emulate", "off", "native"):
        raise ConversionError("unknown kv_cache option", field="--extra_options kv_cache", value=opts.kv_cache,
                              accepted="auto, emulate, off, native")
    if opts.fp8_attention not in ("auto", "off"):
        raise ConversionError("unknown fp8_attention option", field="--extra_options fp8_attention",
                              value=opts.fp8_attention, accepted="auto, off")
    if has_kv and opts.kv_cache == "off":
        notes.append("kv_cache=off: the checkpoint's k_proj/v_proj.output_scale (FP8 KV cache) are ignored")
        scales = [LayerScales(q=s.q, prob=s.prob) for s in scales]
        has_kv = False
    if has_attn and opts.fp8_attention == "off":
        notes.append("WARNING fp8_attention=off: fused GroupQueryAttention; the checkpoint's q_proj.output_scale / "
                     "self_attn.prob_output_scale are ignored (logits differ from Quark's FP8 attention)")
        scales = [LayerScales(k=s.k, v=s.v) for s in scales]
        has_attn = False
    # on cpu, auto: FP8 attention's probability quantizer reads the softmax directly, so it takes the fixed order
    # whatever the linears' activations
    fixed = fixed_softmax_wanted(model_plan) or (has_attn and attention_form(model_plan) == "auto"
                                                 and ep == "cpu")
    if opts.kv_cache == "native":
        if attention_form(model_plan) == "explicit":
            raise ConversionError("attention=explicit replaces GroupQueryAttention, which kv_cache=native needs",
                                  field="--extra_options attention", value="explicit", accepted="auto, fused")
        check_native_kv(model_plan, scales, has_attn)
        notes.append(f"FP8 KV cache native on {ep} (kv_cache=native): GroupQueryAttention stores past/present as "
                     "float8e4m3fn with k_proj/v_proj.output_scale as k_scale/v_scale; it quantizes K AFTER RoPE "
                     "(vLLM's semantics; Quark's emulation quantizes before RoPE) and the first prompt attends to "
                     "unquantized K/V, so logits differ from Quark's; needs onnxruntime CUDA with USE_FP8_KV_CACHE "
                     "and an SM89+ GPU; genai past_present_share_buffer=true")
        model_plan.search_extras["past_present_share_buffer"] = True
        return _native_kv_gqa(model_plan.family.default_attention, scales)
    if has_attn and attention_form(model_plan) == "fixed":
        raise ConversionError("attention=fixed cannot quantize the attention probabilities (the checkpoint's "
                              "q_proj.output_scale / prob_output_scale: FP8 attention runs the explicit subgraph)",
                              field="--extra_options attention", value="fixed", accepted="auto, explicit")
    if has_attn:
        notes.append(f"FP8 attention: explicit MatMul/Softmax subgraph with Q/DQ of Q, K, V (before RoPE) and the "
                     f"softmax probabilities (checkpoint scales) on {ep}; KV cache holds the fake-quantized values "
                     "in the io dtype; genai past_present_share_buffer=false"
                     + ("; fixed-order softmax (ReduceMax, Exp, ReduceSum, Div) instead of ORT's Softmax, the same "
                        "on AVX2 and AVX-512 CPUs (attention=fused for ORT's Softmax)" if fixed else ""))
        model_plan.search_extras["past_present_share_buffer"] = False
        return _explicit_fp8(scales, getattr(model_plan.family, "head_norms", None), fixed_softmax=fixed)
    native = ("kv_cache=native stores a real float8 cache instead (quantized after RoPE, opt-in)"
              if "fp8" in model_plan.ep.gqa_kv_quant else f"{ep} has no native FP8 GroupQueryAttention cache")
    if has_kv and fixed_order_chosen(model_plan):
        notes.append(f"FP8 KV cache emulated on {ep}: K and V are quantize-dequantized with k_proj/v_proj.output_scale "
                     f"before RoPE, in front of {FIXED_ORDER_NOTE}; {native}")
        return _fixed_order(model_plan, scales)
    if has_kv and fixed:
        why_not = explicit_attention_supported(model_plan)
        if why_not is None:
            notes.append(f"FP8 KV cache emulated on {ep} in the explicit attention subgraph: K and V are "
                         "quantize-dequantized with k_proj/v_proj.output_scale before RoPE, fixed-order softmax "
                         "(ReduceMax, Exp, ReduceSum, Div) instead of GroupQueryAttention's ISA-dependent one; the "
                         "logits are the same on AVX2 and AVX-512 CPUs (attention=fused for GroupQueryAttention); "
                         f"genai past_present_share_buffer=false; {native}")
            model_plan.search_extras["past_present_share_buffer"] = False
            return _explicit_fp8(scales, fixed_softmax=True)
        if attention_form(model_plan) == "explicit":
            raise ConversionError(f"attention=explicit is not supported here ({why_not})",
                                  field="--extra_options attention", value="explicit", accepted="auto, fused")
    if has_kv:
        notes.append(f"FP8 KV cache emulated on {ep}: K and V are quantize-dequantized with k_proj/v_proj."
                     "output_scale before GroupQueryAttention (numerics of an FP8 cache; cache stored in the io "
                     f"dtype); {native}")
        return _emulated_kv_gqa(model_plan.family.default_attention, scales)
    return None


ATTENTION_FORMS = ("auto", "fused", "explicit", "fixed")  # --extra_options attention


FLOAT_ACTIVATIONS = ("bfloat16", "float16")  # a float "quantizer" on the input rounds, it picks no codes


def isa_sensitive_activations(model_plan) -> bool:
    """Some linear quantizes its input (INT8, FP8 static or dynamic, MXFP4, NVFP4, ...): an activation quantizer
    turns GroupQueryAttention's ISA-dependent ulps into other codes, and those into other logits (issue 21: 9.25
    for INT8 and 2.72 for per-token FP8 between AVX-512 and AVX2 on SmolLM2-135M). Weight-only and float schemes
    carry those ulps through unamplified and keep GroupQueryAttention."""
    for lp in model_plan.linears.values():
        spec = lp.spec
        if spec is None or not spec.input_tensors:
            continue
        if any(a.dtype not in FLOAT_ACTIVATIONS for a in spec.input_tensors):
            return True
    return False


def attention_form(model_plan) -> str:
    form = model_plan.options.extra.get("attention", "auto")
    if form not in ATTENTION_FORMS:
        raise ConversionError("unknown attention value", field="--extra_options attention", value=form,
                              accepted=", ".join(ATTENTION_FORMS))
    return form


def fixed_softmax_wanted(model_plan) -> bool:
    """attention=explicit, or auto on cpu with quantized activations: the fixed-order softmax."""
    form = attention_form(model_plan)
    return form == "explicit" or (form == "auto" and model_plan.ep.name == "cpu"
                                  and isa_sensitive_activations(model_plan))


def explicit_attention_supported(model_plan) -> str | None:
    """None when the explicit subgraph can replace the family's fused attention, else why not."""
    from .arch import llama
    hp = model_plan.hp
    if model_plan.family.default_attention is not llama.default_attention:
        return f"{getattr(model_plan.family, '__name__', 'this family').rsplit('.', 1)[-1]} has its own attention"
    if not hp.uniform_window:
        return "a mix of sliding-window and full-attention layers"
    if hp.partial_rotary_factor != 1.0:
        return "partial rotary"
    return None


FIXED_ORDER_NOTE = ("com.quark_onnx GroupQueryAttentionFixedOrder (GroupQueryAttention's inputs and in-place cache, "
                    "one summation order on every CPU: the same logits on AVX2 and AVX-512 machines; attention=fused "
                    "for GroupQueryAttention); genai past_present_share_buffer=true")


def _fixed_order_parts(family):
    """(head_norms, layer_sinks) a family puts around plain GroupQueryAttention (Qwen3's per-head norms in front,
    gpt-oss's sinks as an input; None where it has neither), or None for a family with an attention of its own."""
    from .arch import gpt_oss, llama, qwen3
    return {llama.default_attention: (None, None), qwen3.default_attention: (qwen3.head_norms, None),
            gpt_oss.default_attention: (None, gpt_oss.layer_sinks)}.get(family.default_attention)


def fixed_order_unsupported(model_plan, need_kernel: bool = True) -> str | None:
    """None when GroupQueryAttentionFixedOrder can run this model's attention (need_kernel: through the custom-op
    library's kernel, not only its ONNX function), else why not."""
    from .custom_ops_library import OP_SYMBOLS, exported_kernels
    from .ops.attention_fixed_order import OP
    if model_plan.ep.name != "cpu":
        return f"its kernel is a CPU kernel, the EP is {model_plan.ep.name}"
    if model_plan.io != "fp32":
        return f"its kernel takes float32, the io is {model_plan.io}"
    if _fixed_order_parts(model_plan.family) is None:
        return f"{getattr(model_plan.family, '__name__', 'this family').rsplit('.', 1)[-1]} has its own attention"
    if not need_kernel:
        return None
    library = model_plan.options.custom_ops_library
    if not library:
        return "no custom-op library in use (a float model, custom_ops_library=none, or none could be built)"
    if OP_SYMBOLS[OP] not in exported_kernels(str(library)):
        return f"{library} has no {OP} kernel (built before it existed: python -m custom_ops.ort_library --force)"
    return None


def fixed_order_chosen(model_plan) -> bool:
    """attention=fixed (where the op can run, through the library's kernel or, without it, its ONNX function), or
    auto where the custom-op library in use has its kernel (fixed_order_unsupported)."""
    form = attention_form(model_plan)
    if form == "fixed":
        why_not = fixed_order_unsupported(model_plan, need_kernel=False)
        if why_not is not None:
            raise ConversionError(f"attention=fixed is not available here ({why_not})",
                                  field="--extra_options attention", value="fixed", accepted="auto, fused, explicit")
        return True
    return form == "auto" and fixed_order_unsupported(model_plan) is None


def _fixed_order(model_plan, scales: list[LayerScales] | None = None):
    """GroupQueryAttentionFixedOrder, after QDQ(k), QDQ(v) (FP8 KV cache scales) and the family's head norms (Qwen3);
    with the layer's sinks (gpt-oss) GroupQueryAttentionFixedOrderSinks."""
    from .ops.attention_fixed_order import fixed_order_attention
    head_norms, layer_sinks = _fixed_order_parts(model_plan.family)
    model_plan.search_extras["past_present_share_buffer"] = True

    def attention(ctx, i, q, k, v, past_k, past_v, present_k, present_v, shared, hp):
        s = scales[i] if scales else LayerScales()
        p = f"/model/layers.{i}/attn"
        if s.k is not None:
            k = qdq_static(ctx, k, s.k, "fp8_e4m3", f"{p}/k_quant")
        if s.v is not None:
            v = qdq_static(ctx, v, s.v, "fp8_e4m3", f"{p}/v_quant")
        if head_norms is not None:
            q, k = head_norms(ctx, i, q, k, hp)
        return fixed_order_attention(ctx, i, q, k, v, past_k, past_v, present_k, present_v, shared, hp,
                                     sinks=layer_sinks(ctx, i) if layer_sinks else None)
    return attention


@register_chooser
def choose_fixed_order_attention(model_plan, ckpt):
    """attention=fixed, or the cpu default (auto) where the custom-op library is in use: registered after
    choose_quantized_attention, which builds the FP8 KV / attention checkpoints' forms (this op with QDQ(k), QDQ(v)
    for an FP8 KV cache) itself."""
    if not fixed_order_chosen(model_plan):
        return None
    model_plan.notes.append(f"attention on {model_plan.ep.name}: {FIXED_ORDER_NOTE}")
    return _fixed_order(model_plan)


@register_chooser
def choose_isa_fixed_attention(model_plan, ckpt):
    """attention=explicit (CPU default where isa_sensitive_activations): the explicit subgraph with the fixed-order
    softmax; registered after choose_quantized_attention, which builds FP8 KV / attention checkpoints' forms (with
    the fixed-order softmax where fixed_softmax_wanted) itself."""
    form = attention_form(model_plan)
    if not fixed_softmax_wanted(model_plan):
        return None
    why_not = explicit_attention_supported(model_plan)
    if why_not is not None:
        if form == "explicit":
            raise ConversionError(f"attention=explicit is not supported here ({why_not})",
                                  field="--extra_options attention", value=form, accepted="auto, fused")
        return None
    model_plan.notes.append(
        f"attention on {model_plan.ep.name}: explicit MatMul subgraph with a fixed-order softmax (ReduceMax, Exp, "
        "ReduceSum, Div) instead of GroupQueryAttention, whose softmax sums in an ISA-dependent order; the logits "
        "are the same on AVX2 and AVX-512 CPUs (attention=fused for GroupQueryAttention); genai past_present_share_buffer="
        "false")
    model_plan.search_extras["past_present_share_buffer"] = False
    return _explicit_fp8([LayerScales()] * model_plan.hp.num_layers, fixed_softmax=True)
