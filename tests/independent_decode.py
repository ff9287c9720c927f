"""Independent decoder of Quark hf_format exports, written from docs/quark_format.md (not from the converter).

dequantize_export(export_dir) -> {module_name: float32 numpy [out, in]} for every quantized Linear
(a Linear is quantized when its `<name>.weight_scale` tensor exists).
load_reference_model(export_dir) -> fp32 transformers model whose Linears hold those dequantized weights
("PyTorch on dequantized weights"); activation/KV/softmax quantization is NOT emulated by it.
"""
from __future__ import annotations

import fnmatch
import json
import struct
from pathlib import Path

import numpy as np

# Pack_4_bits: word c, nibble slot i holds logical element 8c + ORDER_MAP[i] ("reorder"); identity for "order"
PACK_ORDER_MAP = {"reorder": (0, 2, 4, 6, 1, 3, 5, 7), "order": (0, 1, 2, 3, 4, 5, 6, 7)}
FP4_E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)
PER_GROUP_TRANSPOSED_DTYPES = {"int4", "uint4", "int8", "uint8", "int2", "int3", "uint2"}
# older Quark releases spell the scales like the quantizer modules
SUFFIX_ALIASES = {
    "weight_scale": ("weight_scale", "weight_quantizer.scale"),
    "weight_zero_point": ("weight_zero_point", "weight_quantizer.zero_point"),
}


def read_config(export_dir: str | Path) -> dict:
    return json.loads((Path(export_dir) / "config.json").read_text())


def safetensors_index(export_dir: str | Path) -> dict[str, tuple[str, list[int], Path]]:
    """{tensor_name: (safetensors dtype string, shape, file)} from the headers only."""
    index = {}
    for f in sorted(Path(export_dir).glob("*.safetensors")):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, meta in header.items():
            if name != "__metadata__":
                index[name] = (meta["dtype"], meta["shape"], f)
    return index


def load_tensors(export_dir: str | Path) -> dict:
    """All tensors as torch tensors (torch keeps fp8 / bf16 dtypes that numpy lacks)."""
    from safetensors.torch import load_file

    tensors = {}
    for f in sorted(Path(export_dir).glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    return tensors


def resolve_weight_spec(qcfg: dict, module: str):
    """Weight QTensorConfig (dict, or list for two-stage schemes) as Quark's reloader resolves it:
    layer_quant_config (exact key, then first fnmatch in order), layer_type_quant_config["Linear"], global."""
    layers = qcfg.get("layer_quant_config") or {}
    if module in layers:
        return layers[module]["weight"]
    for pattern, cfg in layers.items():
        if fnmatch.fnmatch(module, pattern):
            return cfg["weight"]
    by_type = (qcfg.get("layer_type_quant_config") or {}).get("Linear")
    if by_type is not None:
        return by_type["weight"]
    return qcfg["global_quant_config"]["weight"]


def unpack_int4(packed, pack_method: str, signed: bool, n: int):
    """int32 [..., W] -> int32 [..., n]: 8 nibbles per word along the last axis, trimmed to n."""
    import torch

    order_map = PACK_ORDER_MAP[pack_method]
    words = packed.to(torch.int64) & 0xFFFFFFFF
    nibbles = torch.stack([(words >> (4 * slot)) & 0xF for slot in range(8)], dim=-1)  # [..., W, slot]
    logical = torch.empty_like(nibbles)
    logical[..., list(order_map)] = nibbles  # slot i holds element order_map[i]
    values = logical.reshape(*packed.shape[:-1], packed.shape[-1] * 8)[..., :n]
    if signed:
        values = torch.where(values >= 8, values - 16, values)
    return values.to(torch.int32)


def _get(tensors: dict, module: str, suffix: str, required: bool = True):
    for spelling in SUFFIX_ALIASES.get(suffix, (suffix,)):
        if f"{module}.{spelling}" in tensors:
            return tensors[f"{module}.{spelling}"]
    if required:
        raise KeyError(f"{module}: tensor '{suffix}' missing (looked for {SUFFIX_ALIASES.get(suffix, (suffix,))})")
    return None


def _expand_groups(t, group: int, axis: int):
    return t.repeat_interleave(group, dim=axis)


def _decode_int(tensors, module, spec, pack_method):
    import torch

    dtype, qscheme = spec["dtype"], spec["qscheme"]
    weight = _get(tensors, module, "weight")
    scale = _get(tensors, module, "weight_scale").float()
    zp = _get(tensors, module, "weight_zero_point", required=False)
    signed = dtype.startswith("int")
    four_bit = dtype in ("int4", "uint4")
    if qscheme == "per_group":
        # stored transposed: weight [in, out(/8)], scale [in/g, out], zp [in/g, out(/8)]
        out_features = scale.shape[-1]
        q = unpack_int4(weight, pack_method, signed, out_features) if four_bit else weight.to(torch.int32)
        if zp is None:
            z = torch.zeros_like(scale, dtype=torch.int32)
        else:
            z = unpack_int4(zp, pack_method, signed, out_features) if four_bit else zp.to(torch.int32)
        group = spec["group_size"]
        w_in_out = (q - _expand_groups(z, group, 0)).float() * _expand_groups(scale, group, 0)
        return w_in_out.T.contiguous()
    if qscheme == "per_channel":
        # weight [out, in(/8)], scale [out], zp [out(/8)] (packed like the weight for 4 bits)
        out_features = scale.reshape(-1).shape[0]
        q = unpack_int4(weight, pack_method, signed, weight.shape[-1] * 8) if four_bit else weight.to(torch.int32)
        if zp is None:
            z = torch.zeros(out_features, dtype=torch.int32)
        else:
            z = unpack_int4(zp.reshape(-1), pack_method, signed, out_features) if four_bit else zp.to(torch.int32)
        return (q - z.reshape(-1, 1)).float() * scale.reshape(-1, 1)
    if qscheme == "per_tensor":
        if four_bit:
            raise NotImplementedError(f"{module}: per_tensor {dtype} is not decoded")
        z = 0 if zp is None else int(zp.reshape(()).item())
        return (weight.to(torch.int32) - z).float() * scale.reshape(())
    raise NotImplementedError(f"{module}: qscheme {qscheme!r} for {dtype}")


def _decode_fp8(tensors, module, spec):
    weight = _get(tensors, module, "weight").float()
    scale = _get(tensors, module, "weight_scale").float()
    qscheme = spec["qscheme"]
    if qscheme == "per_tensor":
        return weight * scale.reshape(())
    if qscheme == "per_channel":
        return weight * scale.reshape(-1, 1)
    if qscheme == "per_block":
        br, bc = spec["block_size"]
        full = scale.repeat_interleave(br, 0).repeat_interleave(bc, 1)
        return weight * full[: weight.shape[0], : weight.shape[1]]
    if qscheme == "per_group":
        return weight * _expand_groups(scale, spec["group_size"], 1)
    raise NotImplementedError(f"{module}: fp8 qscheme {qscheme!r}")


def unpack_fp4(packed):
    """uint8 [out, in/2] -> float32 [out, in]; low nibble = even element, bit 3 = sign."""
    import torch

    b = packed.to(torch.int64)
    nibbles = torch.stack([b & 0xF, b >> 4], dim=-1).reshape(packed.shape[0], -1)
    magnitude = torch.from_numpy(FP4_E2M1_VALUES)[nibbles & 0x7]
    return torch.where(nibbles >= 8, -magnitude, magnitude)


def _decode_fp4(tensors, module, spec):
    import torch

    stages = spec if isinstance(spec, list) else [spec]
    first = stages[0]
    values = unpack_fp4(_get(tensors, module, "weight"))
    scale = _get(tensors, module, "weight_scale")
    if first.get("scale_format") == "e8m0":
        block_scale = torch.pow(2.0, scale.to(torch.float32) - 127.0)
    else:  # nvfp4: fp8 block scales times an fp32 global scale
        block_scale = scale.float()
        if len(stages) > 1:
            block_scale = block_scale * _get(tensors, module, "weight_scale_2").float().reshape(())
    return values * _expand_groups(block_scale, first["group_size"], 1)[:, : values.shape[1]]


def dequantize_module(tensors: dict, module: str, qcfg: dict):
    """float32 torch [out, in] for one quantized Linear."""
    spec = resolve_weight_spec(qcfg, module)
    export = qcfg.get("export") or {}
    if export.get("weight_format") == "fake_quantized":
        return _get(tensors, module, "weight").float()
    first = spec[0] if isinstance(spec, list) else spec
    if first["dtype"] in PER_GROUP_TRANSPOSED_DTYPES:
        return _decode_int(tensors, module, first, export.get("pack_method", "reorder"))
    if first["dtype"] == "fp8_e4m3":
        return _decode_fp8(tensors, module, first)
    if first["dtype"] == "fp4":
        return _decode_fp4(tensors, module, spec)
    raise NotImplementedError(f"{module}: weight dtype {first['dtype']!r}")


def quantized_modules(tensors: dict) -> list[str]:
    names = set()
    for key in tensors:
        for spelling in SUFFIX_ALIASES["weight_scale"]:
            if key.endswith("." + spelling):
                names.add(key[: -len(spelling) - 1])
    return sorted(names)


def dequantize_export(export_dir: str | Path) -> dict[str, np.ndarray]:
    qcfg = read_config(export_dir)["quantization_config"]
    tensors = load_tensors(export_dir)
    return {m: dequantize_module(tensors, m, qcfg).numpy() for m in quantized_modules(tensors)}


def load_reference_model(export_dir: str | Path):
    """fp32 transformers model: unquantized tensors from the export, Linears replaced by dequantized weights."""
    import transformers

    cfg_dict = read_config(export_dir)
    qcfg = cfg_dict.pop("quantization_config")
    tensors = load_tensors(export_dir)
    qmods = quantized_modules(tensors)
    params = {m + ".weight": dequantize_module(tensors, m, qcfg) for m in qmods}
    skip_suffixes = ("_scale", "_zero_point", "_scale_2", "_zero_point_2", "quantizer.scale", "quantizer.zero_point")
    for name, t in tensors.items():
        if name not in params and not name.endswith(skip_suffixes) and not name.endswith("_rotation"):
            params[name] = t.float()
    model_cls = getattr(transformers, cfg_dict["architectures"][0])
    config = model_cls.config_class.from_dict(cfg_dict)
    config.tie_word_embeddings = "lm_head.weight" not in params
    model = model_cls._from_config(config, attn_implementation="eager").float().eval().requires_grad_(False)
    missing, unexpected = model.load_state_dict(params, strict=False)
    missing = [m for m in missing if not (config.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"{export_dir}: reference model missing={missing} unexpected={unexpected}")
    if config.tie_word_embeddings:
        model.tie_weights()
    return model
