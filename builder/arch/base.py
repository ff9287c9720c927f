"""Decoder-only architecture description: hyper-parameters (aliases as data) and the linear layers it has."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConversionError

# Hyper-parameter name -> the config.json spellings seen across families, first found wins.
ALIASES = {
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "intermediate_size": ("intermediate_size", "ffn_dim", "n_inner"),
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "num_heads": ("num_attention_heads", "n_head"),
    "num_kv_heads": ("num_key_value_heads", "num_attention_heads", "n_head"),
    "vocab_size": ("vocab_size",),
    "rms_norm_eps": ("rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps"),
    "max_positions": ("max_position_embeddings", "n_positions"),
}


# model types whose sliding window applies only to the layers that `layer_types` / `max_window_layers` mark
PER_LAYER_WINDOW_TYPES = ("qwen2", "qwen3")
# model types that always window by `layer_types` (no use_sliding_window switch); without layer_types, every
# `sliding_window_pattern`-th layer is global (transformers' Gemma2Config / Gemma3TextConfig defaults)
LAYER_TYPE_PATTERN_DEFAULTS = {"gemma2": 2, "gemma3_text": 6}


@dataclass(frozen=True)
class DecoderHyper:
    architecture: str
    model_type: str            # genai_config model.type
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    max_positions: int
    rope_theta: float
    rope_scaling: dict | None
    tie_word_embeddings: bool
    sliding_window: int        # -1: none; the window of every windowed layer (see windowed_layers)
    bos_token_id: int | None
    eos_token_id: int | list | None
    pad_token_id: int | None
    partial_rotary_factor: float = 1.0  # rotary_dim = int(head_dim * factor); read by families that support it
    windowed_layers: tuple[bool, ...] | None = None  # None: every layer follows sliding_window
    # rope of the windowed layers when it differs from the global one (Gemma3 rope_local_base_freq /
    # rope_parameters.sliding_attention): (theta, scaling or None); None: all layers share rope_theta/rope_scaling
    sliding_rope: tuple[float, dict | None] | None = None
    # set by a family's refine_hyper (Gemma): attention scale query_pre_attn_scalar**-0.5 (None: head_dim**-0.5),
    # tanh softcaps of the attention and final logits (0: none), MLP activation
    query_pre_attn_scalar: float | None = None
    attn_logit_softcap: float = 0.0
    final_logit_softcap: float = 0.0
    hidden_act: str = "silu"

    def layer_window(self, i: int) -> int:
        """GroupQueryAttention local_window_size of layer i (-1: full attention)."""
        if self.windowed_layers is None or self.windowed_layers[i]:
            return self.sliding_window
        return -1

    @property
    def uniform_window(self) -> bool:
        return self.windowed_layers is None or len(set(self.windowed_layers)) <= 1


def read_hyper(cfg: dict, architecture: str, model_type: str, config_file: str) -> DecoderHyper:
    def get(key, required=True):
        for alias in ALIASES[key]:
            if cfg.get(alias) is not None:
                return cfg[alias]
        if required:
            raise ConversionError("required hyper-parameter missing", file=config_file, field=ALIASES[key][0],
                                  value=None)
        return None

    def positive(key):
        v = get(key)
        if not isinstance(v, int) or v <= 0:
            raise ConversionError("must be a positive integer", file=config_file, field=ALIASES[key][0], value=v)
        return v

    hidden, heads = positive("hidden_size"), positive("num_heads")
    kv = positive("num_kv_heads")
    if heads % kv:
        raise ConversionError("num_attention_heads must be a multiple of num_key_value_heads", file=config_file,
                              field="num_key_value_heads", value=kv)
    head_dim = cfg.get("head_dim") or hidden // heads
    rope = cfg.get("rope_parameters") or {}
    sliding_rope = None
    if "full_attention" in rope or "sliding_attention" in rope:  # per-layer-type rope (Gemma3 in transformers 5)
        local = rope.get("sliding_attention") or {}
        sliding_rope = (float(_first_set(local.get("rope_theta"), 10000.0)),
                        local if local.get("rope_type", "default") != "default" else None)
        rope = rope.get("full_attention") or {}
    elif cfg.get("rope_local_base_freq") is not None:  # older Gemma3 config.json spelling
        sliding_rope = (float(cfg["rope_local_base_freq"]), None)
    theta = _first_set(rope.get("rope_theta"), cfg.get("rope_theta"), 10000.0)
    scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
    sliding = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
    windowed = None
    if model_type in PER_LAYER_WINDOW_TYPES:  # transformers: use_sliding_window defaults to false there
        sliding = cfg.get("sliding_window") if cfg.get("use_sliding_window", False) else None
        windowed = _windowed_layers(cfg, sliding, positive("num_layers"), config_file)
        if windowed is not None and not any(windowed):  # no layer windowed: no window at all
            sliding, windowed = None, None
    elif model_type in LAYER_TYPE_PATTERN_DEFAULTS:
        num_layers = positive("num_layers")
        if sliding and cfg.get("layer_types") is None:
            every = int(cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern")
                        or LAYER_TYPE_PATTERN_DEFAULTS[model_type])
            cfg = {**cfg, "layer_types": ["sliding_attention" if (i + 1) % every else "full_attention"
                                          for i in range(num_layers)]}
        windowed = _windowed_layers(cfg, sliding, num_layers, config_file)
        if windowed is not None and not any(windowed):
            sliding, windowed = None, None
    return DecoderHyper(
        architecture=architecture, model_type=model_type, hidden_size=hidden,
        intermediate_size=positive("intermediate_size"), num_layers=positive("num_layers"), num_heads=heads,
        num_kv_heads=kv, head_dim=int(head_dim), vocab_size=positive("vocab_size"),
        rms_norm_eps=float(get("rms_norm_eps", required=False) or 1e-6), max_positions=positive("max_positions"),
        rope_theta=float(theta), rope_scaling=scaling,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        sliding_window=int(sliding) if sliding else -1,
        bos_token_id=cfg.get("bos_token_id"), eos_token_id=cfg.get("eos_token_id"),
        pad_token_id=cfg.get("pad_token_id"),
        partial_rotary_factor=float(_first_set(rope.get("partial_rotary_factor"), cfg.get("partial_rotary_factor"), 1.0)),
        windowed_layers=windowed, sliding_rope=sliding_rope)


def _first_set(*values):
    return next(v for v in values if v is not None)


def _windowed_layers(cfg: dict, window: int | None, num_layers: int, config_file: str) -> tuple[bool, ...] | None:
    """Which layers use the sliding window, as transformers decides: the layers whose `layer_types` entry is
    "sliding_attention" (without layer_types: layers >= max_window_layers). None: all of them (or no window)."""
    if not window:
        return None
    types = cfg.get("layer_types")
    if types is None and cfg.get("max_window_layers") is not None:
        types = ["sliding_attention" if i >= cfg["max_window_layers"] else "full_attention"
                 for i in range(num_layers)]
    if types is None:
        return None
    if len(types) != num_layers or not set(types) <= {"sliding_attention", "full_attention"}:
        raise ConversionError("layer_types must name every layer sliding_attention or full_attention",
                              file=config_file, field="layer_types", value=types)
    windowed = tuple(t == "sliding_attention" for t in types)
    return None if all(windowed) else windowed
