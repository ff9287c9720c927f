"""A hand-written Quark-style uint4 per-group export (no amd-quark needed), used to test input validation.

Numerical tests use real amd-quark exports (tests/quark_factory.py); this one only has to be well-formed so that
tests can break it in one specific way at a time.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, VOCAB, GROUP = 64, 128, 1, 4, 2, 256, 32
REORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # nibble slot -> logical element (Quark Pack_4_bits reorder)

WEIGHT_SPEC = {"dtype": "uint4", "qscheme": "per_group", "ch_axis": -1, "group_size": GROUP, "symmetric": False,
               "is_dynamic": False, "round_method": "half_even", "scale_type": "float", "zero_point_type": "int32",
               "scale_format": None, "block_size": None, "observer_cls": "PerGroupMinMaxObserver",
               "is_scale_quant": False, "mx_element_dtype": None, "enable_buffer_reuse": False,
               "max_input_numel": 4194304, "scale_calculation_mode": None}
QUANT_CONFIG = {
    "quant_method": "quark", "version": "0.13", "quant_mode": "eager_mode", "algo_config": None,
    "exclude": ["lm_head"], "softmax_quant_spec": None, "kv_cache_post_rope": False, "kv_cache_quant_config": {},
    "layer_quant_config": {}, "layer_type_quant_config": {},
    "global_quant_config": {"weight": WEIGHT_SPEC, "input_tensors": None, "output_tensors": None, "bias": None,
                            "target_device": None},
    "export": {"kv_cache_group": [], "min_kv_scale": 0.0, "pack_method": "reorder",
               "weight_format": "real_quantized", "weight_merge_groups": None},
}


def pack_rows_reorder(values: np.ndarray) -> np.ndarray:
    """uint4 values [..., n] -> int32 words [..., ceil(n/8)] with Quark's reorder."""
    n = values.shape[-1]
    padded = np.zeros((*values.shape[:-1], -(-n // 8) * 8), np.uint32)
    padded[..., :n] = values
    groups = padded.reshape(*values.shape[:-1], -1, 8)
    words = np.zeros(groups.shape[:-1], np.uint32)
    for slot, element in enumerate(REORDER):
        words |= groups[..., element] << np.uint32(4 * slot)
    return words.view(np.int32)


def quantized_linear(rng, name: str, n_out: int, n_in: int, group: int = GROUP) -> dict[str, np.ndarray]:
    q = rng.integers(0, 16, size=(n_out, n_in))
    zp = rng.integers(6, 10, size=(n_out, n_in // group))
    scale = rng.uniform(0.005, 0.02, size=(n_out, n_in // group)).astype(np.float32)
    return {f"{name}.weight": pack_rows_reorder(q.T), f"{name}.weight_scale": np.ascontiguousarray(scale.T),
            f"{name}.weight_zero_point": pack_rows_reorder(zp.T)}


def write_synthetic_export(out: Path, *, quant_config: dict | None = None, config_overrides: dict | None = None,
                           drop: tuple[str, ...] = (), groups: dict[str, int] | None = None) -> Path:
    """`groups` maps a projection suffix (e.g. "mlp.down_proj") to the group size its tensors are written with."""
    rng = np.random.default_rng(0)
    out.mkdir(parents=True, exist_ok=True)
    qcfg = copy.deepcopy(QUANT_CONFIG if quant_config is None else quant_config)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
           "intermediate_size": INTER, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
           "num_key_value_heads": KV_HEADS, "vocab_size": VOCAB, "max_position_embeddings": 128, "rms_norm_eps": 1e-5,
           "rope_theta": 10000.0, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
           "torch_dtype": "float32", "quantization_config": qcfg}
    cfg.update(config_overrides or {})
    tensors = {"model.embed_tokens.weight": rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32),
               "model.norm.weight": np.ones(HIDDEN, np.float32),
               "lm_head.weight": (0.05 * rng.standard_normal((VOCAB, HIDDEN))).astype(np.float32)}
    kv = HIDDEN // HEADS * KV_HEADS
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        tensors[f"{p}.input_layernorm.weight"] = np.ones(HIDDEN, np.float32)
        tensors[f"{p}.post_attention_layernorm.weight"] = np.ones(HIDDEN, np.float32)
        for proj, (n_out, n_in) in {"self_attn.q_proj": (HIDDEN, HIDDEN), "self_attn.k_proj": (kv, HIDDEN),
                                    "self_attn.v_proj": (kv, HIDDEN), "self_attn.o_proj": (HIDDEN, HIDDEN),
                                    "mlp.gate_proj": (INTER, HIDDEN), "mlp.up_proj": (INTER, HIDDEN),
                                    "mlp.down_proj": (HIDDEN, INTER)}.items():
            group = (groups or {}).get(proj, GROUP)
            tensors.update(quantized_linear(rng, f"{p}.{proj}", n_out, n_in, group))
    for name in drop:
        tensors.pop(name)
    save_file(tensors, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    return out
