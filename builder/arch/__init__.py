"""Architecture registry: config.json `architectures[0]` -> family module."""
from __future__ import annotations

from types import ModuleType

from ..errors import ConversionError
from . import deepseek_v3, gemma, gpt_oss, llama, mixtral, phi3, qwen2_moe, qwen3, qwen3_moe
from .base import DecoderHyper, read_hyper

FAMILIES: dict[str, ModuleType] = {name: module for module in (llama, qwen3, phi3, gemma, mixtral, qwen3_moe,
                                                                 qwen2_moe, gpt_oss, deepseek_v3)
                                   for name in module.MODEL_TYPES}


def family_for(cfg: dict, config_file: str) -> tuple[ModuleType, DecoderHyper]:
    archs = cfg.get("architectures") or []
    arch = archs[0] if archs else None
    if arch not in FAMILIES:
        raise ConversionError("architecture not supported", file=config_file, field="architectures[0]", value=arch,
                              accepted=", ".join(sorted(FAMILIES)))
    module = FAMILIES[arch]
    hp = read_hyper(cfg, arch, module.MODEL_TYPES[arch], config_file)
    if hasattr(module, "refine_hyper"):  # family-specific hyper-parameters, validated, as a new DecoderHyper
        hp = module.refine_hyper(cfg, hp, config_file)  # (gemma: softcaps, local rope; MoE: experts)
    if hasattr(module, "check_config"):  # what a family cannot express, refused before any tensor is read
        module.check_config(cfg, hp, config_file)
    return module, hp
