"""The JSON type and range of every config.json / generation_config.json field the converter reads.

Checked before anything else is read, so a wrong type is one ConversionError naming the field and its value, never
a TypeError deep in the plan. `quantization_config` is checked by builder/quark_reader.py, family-specific
fields with a meaning (Gemma's softcaps, Mixtral's expert counts) by their family's refine_hyper; here only their
types.
"""
from __future__ import annotations

import math

from .errors import ConversionError

# The rotary cos/sin caches are [max_position_embeddings, rotary_dim/2] float32 each; above this many bytes for the
# pair (head_dim 128: 1,048,576 positions) the conversion is refused rather than allocating gigabytes.
MAX_ROTARY_CACHE_BYTES = 512 << 20


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def positive_int(v) -> str | None:
    return None if _is_int(v) and v > 0 else "must be a positive integer"


def non_negative_int(v) -> str | None:
    return None if _is_int(v) and v >= 0 else "must be a non-negative integer"


def positive_number(v) -> str | None:
    return None if _is_num(v) and math.isfinite(v) and v > 0 else "must be a finite positive number"


def small_positive_number(v) -> str | None:  # epsilons
    return None if _is_num(v) and math.isfinite(v) and 0 < v < 1 else "must be a finite number in (0, 1)"


def unit_fraction(v) -> str | None:
    return None if _is_num(v) and math.isfinite(v) and 0 < v <= 1 else "must be a number in (0, 1]"


def boolean(v) -> str | None:
    return None if isinstance(v, bool) else "must be true or false"


def string(v) -> str | None:
    return None if isinstance(v, str) else "must be a string"


def number(v) -> str | None:
    return None if _is_num(v) and math.isfinite(v) else "must be a finite number"


def string_list(v) -> str | None:
    return None if isinstance(v, list) and all(isinstance(x, str) for x in v) else "must be a list of strings"


def token_id(v) -> str | None:
    return None if _is_int(v) and v >= 0 else "must be a non-negative integer token id"


def integer(v) -> str | None:  # pad_token_id: some configs say -1
    return None if _is_int(v) else "must be an integer"


def token_ids(v) -> str | None:
    if _is_int(v) and v >= 0:
        return None
    if isinstance(v, list) and v and all(_is_int(x) and x >= 0 for x in v):
        return None
    return "must be a token id or a non-empty list of token ids"


def obj(v) -> str | None:
    return None if isinstance(v, dict) else "must be an object"


# field -> validator; a field that is absent or null is not checked here (read_hyper says which are required)
CONFIG_FIELDS = {
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "intermediate_size", "ffn_dim", "n_inner",
                     "num_hidden_layers", "n_layer", "num_layers", "num_attention_heads", "n_head",
                     "num_key_value_heads", "vocab_size", "max_position_embeddings", "n_positions", "head_dim",
                     "sliding_window_pattern", "_sliding_window_pattern", "num_local_experts",
                     "num_experts_per_tok"), positive_int),
    "sliding_window": non_negative_int, "max_window_layers": non_negative_int,
    **dict.fromkeys(("rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps"), small_positive_number),
    **dict.fromkeys(("rope_theta", "rope_local_base_freq", "query_pre_attn_scalar"), positive_number),
    **dict.fromkeys(("attn_logit_softcapping", "final_logit_softcapping"), positive_number),
    "partial_rotary_factor": unit_fraction,
    **dict.fromkeys(("tie_word_embeddings", "use_sliding_window", "use_bidirectional_attention",
                     "attention_bias"), boolean),
    **dict.fromkeys(("hidden_act", "hidden_activation", "model_type"), string),
    "architectures": string_list, "layer_types": string_list,
    "bos_token_id": token_id, "pad_token_id": integer, "eos_token_id": token_ids,
    "rope_scaling": obj, "rope_parameters": obj, "quantization_config": obj,
}
ROPE_FIELDS = {"rope_type": string, "type": string, "factor": positive_number, "low_freq_factor": positive_number,
               "high_freq_factor": positive_number, "original_max_position_embeddings": positive_int,
               "rope_theta": positive_number, "partial_rotary_factor": unit_fraction}
ROPE_REQUIRED = {"linear": ("factor",),
                 "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}
GENERATION_FIELDS = {"bos_token_id": token_id, "pad_token_id": integer, "eos_token_id": token_ids,
                     "do_sample": boolean, "temperature": number, "top_k": non_negative_int, "top_p": number,
                     "repetition_penalty": number, "num_beams": positive_int, "length_penalty": number,
                     "no_repeat_ngram_size": non_negative_int, "diversity_penalty": number}


def _check(table: dict, d: dict, file: str, prefix: str = "") -> None:
    for key, check in table.items():
        value = d.get(key)
        if value is None:
            continue
        problem = check(value)
        if problem:
            raise ConversionError(problem, file=file, field=f"{prefix}{key}", value=value)


def check_rope(d: dict, file: str, path: str) -> None:
    _check(ROPE_FIELDS, d, file, f"{path}.")
    rope_type = d.get("rope_type", d.get("type"))
    for key in ROPE_REQUIRED.get(rope_type, ()):
        if d.get(key) is None:
            raise ConversionError(f"rope type {rope_type} needs {key}", file=file, field=f"{path}.{key}", value=None)
    if rope_type == "llama3" and d["high_freq_factor"] <= d["low_freq_factor"]:
        raise ConversionError("high_freq_factor must be larger than low_freq_factor", file=file,
                              field=f"{path}.high_freq_factor", value=d["high_freq_factor"])


def check_config_fields(cfg: dict, file: str) -> None:
    _check(CONFIG_FIELDS, cfg, file)
    if not cfg.get("architectures"):
        raise ConversionError("architectures missing or empty", file=file, field="architectures",
                              value=cfg.get("architectures"))
    for key in ("rope_scaling", "rope_parameters"):
        d = cfg.get(key)
        if d is None:
            continue
        check_rope(d, file, key)
        for sub in ("full_attention", "sliding_attention"):
            if d.get(sub) is not None:
                if not isinstance(d[sub], dict):
                    raise ConversionError("must be an object", file=file, field=f"{key}.{sub}", value=d[sub])
                check_rope(d[sub], file, f"{key}.{sub}")
    types = cfg.get("layer_types")
    if types is not None and not set(types) <= {"sliding_attention", "full_attention"}:
        raise ConversionError("layer_types entries must be sliding_attention or full_attention", file=file,
                              field="layer_types", value=sorted(set(types) - {"sliding_attention",
                                                                              "full_attention"})[0])


def check_rotary_size(max_positions: int, head_dim: int, file: str, field: str) -> None:
    nbytes = max_positions * head_dim * 4  # cos + sin, float32, head_dim/2 wide each
    if nbytes > MAX_ROTARY_CACHE_BYTES:
        limit = MAX_ROTARY_CACHE_BYTES // (head_dim * 4)
        raise ConversionError(f"rotary cos/sin caches would take {nbytes / 2**30:.1f} GiB "
                              f"({max_positions} positions x head_dim {head_dim}); lower it to the context the "
                              "model is used with", file=file, field=field, value=max_positions,
                              accepted=f"at most {limit} for head_dim {head_dim}")


def check_generation_config(gen: dict, file: str) -> None:
    _check(GENERATION_FIELDS, gen, file)
    early = gen.get("early_stopping")
    if early is not None and not isinstance(early, bool) and early != "never":
        raise ConversionError("must be true, false or \"never\"", file=file, field="early_stopping", value=early)
