"""Attention variants chosen from the checkpoint's output scales (registered with builder/attention_plan.py).

- FP8 KV cache (k_proj/v_proj.output_scale, kv_cache_post_rope=false): Quark fake-quantizes the k/v projection
  outputs before RoPE (and before a family's per-head q/k norm: Qwen3's default_attention applies it after these).
  Emulated on every EP as QDQ(k), QDQ(v) in front of GroupQueryAttention, so the cache holds exactly the values an
  FP8 cache would give (in the io dtype). A native FP8 GQA cache (CUDA k_scale/v_scale) would
  quantize after RoPE and needs genai_config keys not verified here: `kv_cache=native` is refused.
- FP8 attention (q_proj.output_scale and/or self_attn.prob_output_scale): explicit MatMul/Softmax subgraph with QDQ
  (builder/ops/fp8_attention.py), chosen automatically; `fp8_attention=off` keeps fused GQA and ignores those scales
  (with a note), still emulating the FP8 KV cache.
Options (BuildOptions): kv_cache auto|emulate|off|native, fp8_attention auto|off.
"""
from __future__ import annotations

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
            spec = model_plan.linears[name].spec
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


def _explicit_fp8(scales: list[LayerScales], head_norms=None):
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
        return fp8_attention(ctx, i, q, k, v, past_k, past_v, present_k, present_v, cache[key], hp, s)
    return attention


@register_chooser
def choose_quantized_attention(model_plan, ckpt):
    if model_plan.quant is None:
        return None
    scales = read_layer_scales(model_plan, ckpt)
    has_kv = any(s.k is not None or s.v is not None for s in scales)
    has_attn = any(s.q is not None or s.prob is not None for s in scales)
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
    if has_kv and opts.kv_cache == "native":
        raise ConversionError("a native FP8 GroupQueryAttention cache is not implemented (it quantizes after RoPE, "
                              "Quark before; genai keys unverified); use kv_cache=emulate", field="kv_cache",
                              value="native", accepted="auto, emulate, off")
    if has_kv and opts.kv_cache == "off":
        notes.append("kv_cache=off: the checkpoint's k_proj/v_proj.output_scale (FP8 KV cache) are ignored")
        scales = [LayerScales(q=s.q, prob=s.prob) for s in scales]
        has_kv = False
    if has_attn and opts.fp8_attention == "off":
        notes.append("WARNING fp8_attention=off: fused GroupQueryAttention; the checkpoint's q_proj.output_scale / "
                     "self_attn.prob_output_scale are ignored (logits differ from Quark's FP8 attention)")
        scales = [LayerScales(k=s.k, v=s.v) for s in scales]
        has_attn = False
    if has_attn:
        notes.append(f"FP8 attention: explicit MatMul/Softmax subgraph with Q/DQ of Q, K, V (before RoPE) and the "
                     f"softmax probabilities (checkpoint scales) on {ep}; KV cache holds the fake-quantized values "
                     "in the io dtype; genai past_present_share_buffer=false")
        model_plan.search_extras["past_present_share_buffer"] = False
        return _explicit_fp8(scales, getattr(model_plan.family, "head_norms", None))
    if has_kv:
        notes.append(f"FP8 KV cache emulated on {ep}: K and V are quantize-dequantized with k_proj/v_proj."
                     "output_scale before GroupQueryAttention (numerics of an FP8 cache; cache stored in the io "
                     "dtype)")
        return _emulated_kv_gqa(model_plan.family.default_attention, scales)
    return None
