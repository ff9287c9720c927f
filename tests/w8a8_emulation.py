"""PyTorch emulation of Quark's fake quantization for W8A8 exports (FP8 static/dynamic, INT8 static), written from
Quark's source, independent of builder/: fp8: clamp(x / s, +-448) -> float8_e4m3fn -> * s; dynamic per-token
s = amax / 448; the k/v/q_proj output quantizers; softmax output quantized in eager attention. Applied to an eager
transformers model holding Quark's own dequantized weights, using the scales *in the export*.
Used by test_fp8_w8a8.py and test_int8_w8a8.py.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from onnx_helpers import NEW_TOKENS, build, genai_greedy, prompt_logits
from quark_factory import forward_logits, torch_greedy

# measured (ORT CPU vs this emulation, llama_h64 fp32): fp8_w8a8 ~1e-6, fp8_w8a8_kv 1e-6, fp8_w8a8_kv_attn 2e-6,
# ptpc_fp8 2e-6, int8_w8a8 7e-7 (the README claims ~1e-6); 5x headroom
TOL_VS_EMULATION = 1e-5


def _fq_fp8(x, s):
    import torch
    return torch.clamp(x / s, -448.0, 448.0).to(torch.float8_e4m3fn).to(x.dtype) * s


def _fq_int(x, s, zp, qmin, qmax):
    import torch
    return (torch.clamp(torch.round(x * (1.0 / s)) + zp, qmin, qmax) - zp) * s


def emulated_model(export_dir: Path):
    """Eager fp32 transformers model with Quark's fake quantization (scales read from the export)."""
    import torch
    import transformers
    from safetensors.torch import load_file

    cfg = json.loads((export_dir / "quark" / "config.json").read_text())
    q = cfg["quantization_config"]
    tensors = load_file(str(export_dir / "quark" / "model.safetensors"))
    deq = np.load(export_dir / "quark_dequant.npz")
    model = transformers.AutoModelForCausalLM.from_pretrained(export_dir / "float", attn_implementation="eager",
                                                              dtype=torch.float32).eval()
    act = q["global_quant_config"]["input_tensors"]
    for name, mod in model.named_modules():
        if name not in deq.files:
            continue
        mod.weight.data = torch.from_numpy(deq[name])
        if act and act["is_dynamic"]:
            per_token = act["qscheme"] == "per_channel"

            def dyn(m, a):
                x = a[0]
                amax = x.abs().amax(dim=-1, keepdim=True) if per_token else x.abs().amax()
                s = amax / 448.0
                s = s.masked_fill(s == 0, torch.finfo(torch.float32).eps)
                return (_fq_fp8(x, s),)
            mod.register_forward_pre_hook(dyn)
        elif act and act["dtype"] == "fp8_e4m3":
            s = tensors[f"{name}.input_scale"].float()
            mod.register_forward_pre_hook(lambda m, a, s=s: (_fq_fp8(a[0], s),))
        elif act:
            s = tensors[f"{name}.input_scale"].float()
            zp = tensors[f"{name}.input_zero_point"].float()
            lo, hi = (-128, 127) if act["dtype"] == "int8" else (0, 255)
            mod.register_forward_pre_hook(lambda m, a, s=s, zp=zp, lo=lo, hi=hi: (_fq_int(a[0], s, zp, lo, hi),))
        if f"{name}.output_scale" in tensors:
            s = tensors[f"{name}.output_scale"].float()
            mod.register_forward_hook(lambda m, a, o, s=s: _fq_fp8(o, s))
    for i, layer in enumerate(model.model.layers):
        key = f"model.layers.{i}.self_attn.prob_output_scale"
        if key in tensors:
            _quantize_softmax(layer.self_attn, tensors[key].float())
    return model


def _quantize_softmax(attn, scale):
    """Like Quark's prepare_for_attention_quant: softmax output fake-quantized inside this module's forward."""
    import torch
    original_forward, original_softmax = attn.forward, torch.nn.functional.softmax

    def q_softmax(x, dim=None, _stacklevel=3, dtype=None):
        return _fq_fp8(original_softmax(x, dim=dim, dtype=dtype).to(x.dtype), scale)

    def forward(*args, **kwargs):
        torch.nn.functional.softmax = q_softmax
        try:
            return original_forward(*args, **kwargs)
        finally:
            torch.nn.functional.softmax = original_softmax
    attn.forward = forward


def emulate(export_dir: Path, input_ids: np.ndarray, new_tokens: int = NEW_TOKENS):
    """(prompt logits [1, S, V], greedy continuation without KV cache)."""
    import torch
    model = emulated_model(export_dir)
    seq = torch.from_numpy(input_ids)
    greedy, _margins = torch_greedy(model, seq, new_tokens)
    return forward_logits(model, seq).numpy(), greedy


def cpu_vs_references(export_dir: Path, out: Path) -> dict:
    """Convert `export_dir` for the CPU EP into `out`, run it (prompt logits through ORT, og.Generator greedy) and
    compare with the emulation and with Quark's in-memory reference.npz; the figures, for the caller to assert on."""
    build(export_dir, out, "cpu", None)
    ref = np.load(export_dir / "reference.npz")
    ids = ref["input_ids"]
    emu_logits, emu_greedy = emulate(export_dir, ids)
    logits = prompt_logits(out, ids)
    r = dict(vs_emulation=float(np.abs(logits - emu_logits).max()),
             vs_quark_in_memory=float(np.abs(logits - ref["logits"]).max()),
             greedy=genai_greedy(out, ids), emu_greedy=emu_greedy, quark_greedy=[int(t) for t in ref["greedy"]])
    print(f"{export_dir.name}: max|logit diff| vs emulation {r['vs_emulation']:.2e}, vs Quark in-memory "
          f"{r['vs_quark_in_memory']:.2e}")
    return r
