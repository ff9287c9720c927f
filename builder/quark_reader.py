"""Strict reader of a Quark hf_format `quantization_config` and per-layer spec resolution.

Everything is parsed into frozen dataclasses; a key, dtype or scheme we do not understand raises ConversionError
naming the config field and the value (`../shared/docs/quark_format.md` section 1 is the spec).

Resolution follows Quark's own order at quantization time:
exclude (exact, then fnmatch) -> layer_quant_config (exact key, then first fnmatch match in dict order)
-> layer_type_quant_config -> global_quant_config; kv_cache_quant_config then overrides the output spec.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConversionError

DTYPES = ("int8", "uint8", "int16", "uint16", "int32", "int4", "uint4", "int3", "int2", "uint2", "bfloat16",
          "float16", "fp8_e4m3", "fp8_e5m2", "fp8_e5m3", "fp6_e3m2", "fp6_e2m3", "fp4", "mx", "mx6", "mx9", "bfp16")
QSCHEMES = ("per_tensor", "per_channel", "per_group", "per_block")
ROUND_METHODS = ("round", "floor", "half_even")
SCALE_TYPES = ("float", "pof2", "float32", "float16", "bfloat16", "float8_e5m3", "float8_e8m0fnu")
SCALE_FORMATS = (None, "e8m0", "float32", "e5m3")
TENSOR_KEYS = {"dtype", "qscheme", "ch_axis", "group_size", "block_size", "symmetric", "is_dynamic", "round_method",
               "scale_type", "zero_point_type", "scale_format", "scale_calculation_mode", "mx_element_dtype",
               "observer_cls", "is_scale_quant", "enable_buffer_reuse", "max_input_numel"}
LEGACY_TENSOR_KEYS = {"dynamic": "is_dynamic", "axis": "ch_axis"}
LAYER_KEYS = {"input_tensors", "output_tensors", "weight", "bias", "target_device"}
TOP_KEYS = {"quant_method", "global_quant_config", "layer_quant_config", "layer_type_quant_config",
            "kv_cache_quant_config", "kv_cache_post_rope", "exclude", "algo_config", "softmax_quant_spec",
            "quant_mode", "version", "export", "attention_quant_config"}
EXPORT_KEYS = {"kv_cache_group", "min_kv_scale", "pack_method", "weight_format", "weight_merge_groups"}
# Algorithms whose export needs nothing beyond the plain per-layer tensors.
PLAIN_ALGOS = {"awq", "gptq", "gptaq", "smooth", "smoothquant", "autosmoothquant", "qronos"}


@dataclass(frozen=True)
class QTensorSpec:
    dtype: str
    qscheme: str | None
    ch_axis: int | None = None
    group_size: int | None = None
    block_size: tuple[int, ...] | None = None
    symmetric: bool | None = None
    is_dynamic: bool = False
    round_method: str = "half_even"
    scale_type: str | None = None
    scale_format: str | None = None
    scale_calculation_mode: str | None = None
    is_scale_quant: bool = False

    def short(self) -> str:
        parts = [self.dtype, self.qscheme or "?"]
        if self.group_size:
            parts.append(f"g{self.group_size}")
        if self.symmetric is not None:
            parts.append("sym" if self.symmetric else "asym")
        if self.is_dynamic:
            parts.append("dynamic")
        if self.scale_format:
            parts.append(f"scale:{self.scale_format}")
        return " ".join(parts)


# A tensor slot holds no spec, one spec, or a two-stage list (NVFP4: [fp4 g16, fp8 per_tensor scale quant]).
TensorSlot = tuple[QTensorSpec, ...]


@dataclass(frozen=True)
class QLayerSpec:
    weight: TensorSlot = ()
    input_tensors: TensorSlot = ()
    output_tensors: TensorSlot = ()
    bias: TensorSlot = ()
    source: str = "global"  # where it came from: global, layer:<key>, type:<key>, kv:<key>

    @property
    def is_quantized(self) -> bool:
        return bool(self.weight or self.input_tensors or self.output_tensors)

    def short(self) -> str:
        def slot(s: TensorSlot) -> str:
            return " + ".join(t.short() for t in s) if s else "-"
        return f"W[{slot(self.weight)}] A[{slot(self.input_tensors)}] O[{slot(self.output_tensors)}] ({self.source})"


@dataclass(frozen=True)
class ExportSpec:
    kv_cache_group: tuple[str, ...] = ()
    min_kv_scale: float = 0.0
    pack_method: str = "reorder"
    weight_format: str = "real_quantized"


@dataclass(frozen=True)
class QuarkConfig:
    config_file: str
    global_spec: QLayerSpec
    layer_specs: tuple[tuple[str, QLayerSpec], ...]  # dict order kept: first fnmatch match wins
    layer_type_specs: tuple[tuple[str, QLayerSpec], ...]
    kv_cache_specs: tuple[tuple[str, QLayerSpec], ...]
    kv_cache_post_rope: bool
    exclude: tuple[str, ...]
    algos: tuple[str, ...]
    softmax_spec: QTensorSpec | None
    export: ExportSpec
    version: str | None
    raw: dict = field(repr=False, compare=False, default_factory=dict)

    # ---- resolution -------------------------------------------------------------------------------------------
    def is_excluded(self, layer: str) -> bool:
        if layer in self.exclude:
            return True
        return any(_is_pattern(p) and fnmatch.fnmatch(layer, p) for p in self.exclude)

    def resolve(self, layer: str, layer_type: str = "Linear") -> QLayerSpec | None:
        """The spec Quark applied to `layer`, or None when it stayed float."""
        kv = self._match(self.kv_cache_specs, layer)
        if self.is_excluded(layer):
            spec = None
        else:
            spec = (self._exact_or_match(self.layer_specs, layer, "layer")
                    or self._exact(self.layer_type_specs, layer_type, "type")
                    or (self.global_spec if layer_type == "Linear" else None))
        if kv is not None:
            key, kv_spec = kv
            base = spec or QLayerSpec(source="excluded")
            spec = QLayerSpec(weight=base.weight, input_tensors=base.input_tensors, bias=base.bias,
                              output_tensors=kv_spec.output_tensors, source=f"{base.source}+kv:{key}")
        if spec is not None and not spec.is_quantized:
            return None
        return spec

    def kv_output_spec(self, layer: str) -> QTensorSpec | None:
        spec = self.resolve(layer)
        return spec.output_tensors[0] if spec and spec.output_tensors else None

    @staticmethod
    def _exact(table, key: str, tag: str) -> QLayerSpec | None:
        for k, v in table:
            if k == key:
                return _with_source(v, f"{tag}:{k}")
        return None

    @classmethod
    def _exact_or_match(cls, table, layer: str, tag: str) -> QLayerSpec | None:
        hit = cls._exact(table, layer, tag)
        if hit is not None:
            return hit
        for k, v in table:
            if _is_pattern(k) and fnmatch.fnmatch(layer, k):
                return _with_source(v, f"{tag}:{k}")
        return None

    @staticmethod
    def _match(table, layer: str):
        for k, v in table:
            if k == layer or fnmatch.fnmatch(layer, k):
                return k, v
        return None


def _with_source(spec: QLayerSpec, source: str) -> QLayerSpec:
    return QLayerSpec(spec.weight, spec.input_tensors, spec.output_tensors, spec.bias, source)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_pattern(text: str) -> bool:
    return any(c in text for c in "*?[")


# ---- parsing ---------------------------------------------------------------------------------------------------
class _Parser:
    def __init__(self, config_file: str):
        self.file = config_file

    def fail(self, message: str, field_path: str, value: Any, accepted: str | None = None):
        raise ConversionError(message, file=self.file, field=f"quantization_config.{field_path}", value=value,
                              accepted=accepted)

    def tensor(self, d: Any, path: str) -> QTensorSpec:
        if not isinstance(d, dict):
            self.fail("tensor spec must be an object", path, d)
        d = {LEGACY_TENSOR_KEYS.get(k, k): v for k, v in d.items()}
        unknown = set(d) - TENSOR_KEYS
        if unknown:
            self.fail("unknown key in tensor spec", f"{path}.{sorted(unknown)[0]}", d[sorted(unknown)[0]],
                      ", ".join(sorted(TENSOR_KEYS)))
        dtype = d.get("dtype")
        if dtype not in DTYPES:
            self.fail("unknown dtype", f"{path}.dtype", dtype, ", ".join(DTYPES))
        qscheme = d.get("qscheme")
        if qscheme is not None and qscheme not in QSCHEMES:
            self.fail("unknown qscheme", f"{path}.qscheme", qscheme, ", ".join(QSCHEMES))
        rm = d.get("round_method") or "half_even"
        if rm not in ROUND_METHODS:
            self.fail("unknown round_method", f"{path}.round_method", rm, ", ".join(ROUND_METHODS))
        st = d.get("scale_type")
        if st is not None and st not in SCALE_TYPES:
            self.fail("unknown scale_type", f"{path}.scale_type", st, ", ".join(SCALE_TYPES))
        sf = d.get("scale_format")
        if sf not in SCALE_FORMATS:
            self.fail("unknown scale_format", f"{path}.scale_format", sf, "null, e8m0, float32, e5m3")
        gs = d.get("group_size")
        if gs is not None and (not _is_int(gs) or gs <= 0):
            self.fail("group_size must be a positive integer", f"{path}.group_size", gs)
        if qscheme == "per_group" and gs is None:
            self.fail("per_group needs a group_size", f"{path}.group_size", gs)
        bs = d.get("block_size")
        if bs is not None and not (_is_int(bs) or isinstance(bs, list) and all(_is_int(x) for x in bs)):
            self.fail("block_size must be an integer or a list of integers", f"{path}.block_size", bs)
        for key in ("symmetric", "is_dynamic", "is_scale_quant"):
            if d.get(key) is not None and not isinstance(d[key], bool):
                self.fail("must be true, false or null", f"{path}.{key}", d[key])
        if d.get("ch_axis") is not None and not _is_int(d["ch_axis"]):
            self.fail("must be an integer or null", f"{path}.ch_axis", d["ch_axis"])
        for key in ("scale_calculation_mode", "mx_element_dtype"):
            if d.get(key) is not None and not isinstance(d[key], str):
                self.fail("must be a string or null", f"{path}.{key}", d[key])
        return QTensorSpec(dtype=dtype, qscheme=qscheme, ch_axis=d.get("ch_axis"), group_size=gs,
                           block_size=tuple(bs) if isinstance(bs, list) else (bs,) if bs else None,
                           symmetric=d.get("symmetric"), is_dynamic=bool(d.get("is_dynamic")), round_method=rm,
                           scale_type=st, scale_format=sf, scale_calculation_mode=d.get("scale_calculation_mode"),
                           is_scale_quant=bool(d.get("is_scale_quant")))

    def slot(self, d: Any, path: str) -> TensorSlot:
        if d is None:
            return ()
        if isinstance(d, list):
            return tuple(self.tensor(x, f"{path}[{i}]") for i, x in enumerate(d))
        return (self.tensor(d, path),)

    def layer(self, d: Any, path: str) -> QLayerSpec:
        if not isinstance(d, dict):
            self.fail("layer spec must be an object", path, d)
        unknown = set(d) - LAYER_KEYS
        if unknown:
            k = sorted(unknown)[0]
            self.fail("unknown key in layer spec", f"{path}.{k}", d[k], ", ".join(sorted(LAYER_KEYS)))
        return QLayerSpec(weight=self.slot(d.get("weight"), f"{path}.weight"),
                          input_tensors=self.slot(d.get("input_tensors"), f"{path}.input_tensors"),
                          output_tensors=self.slot(d.get("output_tensors"), f"{path}.output_tensors"),
                          bias=self.slot(d.get("bias"), f"{path}.bias"))

    def table(self, d: Any, path: str) -> tuple[tuple[str, QLayerSpec], ...]:
        if d is None:
            return ()
        if not isinstance(d, dict):
            self.fail("must be an object of name -> layer spec", path, d)
        return tuple((k, self.layer(v, f"{path}.{k}")) for k, v in d.items())

    def algos(self, d: Any) -> tuple[str, ...]:
        if d is None:
            return ()
        items = d if isinstance(d, list) else [d]
        names = []
        for i, item in enumerate(items):
            name = item.get("name") if isinstance(item, dict) else None
            if name == "rotation" and item.get("online_r1_rotation"):
                self.fail("online rotation needs an input_rotation at run time; not supported yet",
                          f"algo_config[{i}].online_r1_rotation", True)
            if name not in PLAIN_ALGOS and name != "rotation":
                self.fail("algorithm not supported", f"algo_config[{i}].name", name, ", ".join(sorted(PLAIN_ALGOS)))
            names.append(name)
        return tuple(names)

    def export(self, d: Any) -> ExportSpec:
        if d is None:
            return ExportSpec()
        if not isinstance(d, dict):
            self.fail("must be an object", "export", d)
        group = d.get("kv_cache_group")
        if group is not None and not (isinstance(group, list) and all(isinstance(x, str) for x in group)):
            self.fail("must be a list of layer names", "export.kv_cache_group", group)
        mks = d.get("min_kv_scale")
        if mks is not None and (isinstance(mks, bool) or not isinstance(mks, (int, float)) or not mks >= 0):
            self.fail("must be a non-negative number", "export.min_kv_scale", mks)
        unknown = set(d) - EXPORT_KEYS
        if unknown:
            k = sorted(unknown)[0]
            self.fail("unknown key", f"export.{k}", d[k], ", ".join(sorted(EXPORT_KEYS)))
        pm = d.get("pack_method") or "reorder"
        if pm not in ("reorder", "order"):
            self.fail("unknown pack_method", "export.pack_method", pm, "reorder, order")
        wf = d.get("weight_format") or "real_quantized"
        if wf not in ("real_quantized", "fake_quantized"):
            self.fail("unknown weight_format", "export.weight_format", wf, "real_quantized, fake_quantized")
        return ExportSpec(kv_cache_group=tuple(d.get("kv_cache_group") or ()),
                          min_kv_scale=float(d.get("min_kv_scale") or 0.0), pack_method=pm, weight_format=wf)


def parse_quant_config(q: dict, config_file: str) -> QuarkConfig:
    p = _Parser(config_file)
    if not isinstance(q, dict):
        p.fail("must be an object", "", q)
    method = q.get("quant_method")
    if method != "quark":
        p.fail("not a Quark export", "quant_method", method, "quark")
    unknown = set(q) - TOP_KEYS
    if unknown:
        k = sorted(unknown)[0]
        p.fail("unknown key", k, q[k], ", ".join(sorted(TOP_KEYS)))
    if "global_quant_config" not in q:
        p.fail("missing", "global_quant_config", None)
    for key, kind, what in (("kv_cache_post_rope", bool, "true or false"), ("version", str, "a string")):
        if q.get(key) is not None and not isinstance(q[key], kind):
            p.fail(f"must be {what}", key, q[key])
    if q.get("quant_mode") not in (None, "eager_mode", "fx_graph_mode"):
        p.fail("unknown quant_mode", "quant_mode", q.get("quant_mode"), "eager_mode, fx_graph_mode")
    exclude = q.get("exclude") or []
    if not isinstance(exclude, list) or not all(isinstance(x, str) for x in exclude):
        p.fail("must be a list of layer names or patterns", "exclude", exclude)
    softmax = q.get("softmax_quant_spec")
    if isinstance(softmax, list):
        softmax = softmax[0] if softmax else None
    return QuarkConfig(
        config_file=config_file,
        global_spec=p.layer(q["global_quant_config"], "global_quant_config"),
        layer_specs=p.table(q.get("layer_quant_config"), "layer_quant_config"),
        layer_type_specs=p.table(q.get("layer_type_quant_config"), "layer_type_quant_config"),
        kv_cache_specs=p.table(q.get("kv_cache_quant_config"), "kv_cache_quant_config"),
        kv_cache_post_rope=bool(q.get("kv_cache_post_rope", False)),
        exclude=tuple(exclude),
        algos=p.algos(q.get("algo_config")),
        softmax_spec=p.tensor(softmax, "softmax_quant_spec") if softmax else None,
        export=p.export(q.get("export")),
        version=q.get("version"),
        raw=q,
    )


def read_model_config(model_dir: str | Path) -> tuple[dict, QuarkConfig | None]:
    """config.json as a dict (every field we read type-checked), and its parsed quantization_config (None for a
    float model)."""
    from .config_schema import check_config_fields
    from .input_files import exists, read_json
    path = Path(model_dir) / "config.json"
    if not exists(path):
        raise ConversionError("config.json not found", file=path)
    cfg = read_json(path, Path(model_dir))
    check_config_fields(cfg, str(path))
    q = cfg.get("quantization_config")
    return cfg, (parse_quant_config(q, str(path)) if q is not None else None)
