"""genai_config.json, written in one place."""
from __future__ import annotations

import json
from pathlib import Path

from .arch.base import DecoderHyper
from .ep_configs.base import EPConfig
from .input_files import exists, read_input, read_json

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json")
# onnxruntime-genai's tokenizer needs one of these (tokenizer.json, or a sentencepiece model, or BPE vocab files)
TOKENIZER_REQUIRED = ("tokenizer.json", "tokenizer.model", "vocab.json")
SEARCH_DEFAULTS = {"diversity_penalty": 0.0, "do_sample": False, "early_stopping": True, "length_penalty": 1.0,
                   "min_length": 0, "no_repeat_ngram_size": 0, "num_beams": 1, "num_return_sequences": 1,
                   "past_present_share_buffer": True, "repetition_penalty": 1.0, "temperature": 1.0, "top_k": 50,
                   "top_p": 1.0}
FROM_GENERATION_CONFIG = ("do_sample", "temperature", "top_k", "top_p", "repetition_penalty", "num_beams",
                          "length_penalty", "no_repeat_ngram_size", "early_stopping", "diversity_penalty")


def build_genai_config(hp: DecoderHyper, ep: EPConfig, source_dir: Path, *, filename: str = "model.onnx",
                       decoder_extras: dict | None = None, custom_ops_library: str | None = None,
                       search_extras: dict | None = None, generation: dict | None = None) -> dict:
    """`generation`: generation_config.json as read and validated by the plan (read here when not given)."""
    if generation is None:
        gen_path = source_dir / "generation_config.json"
        generation = read_json(gen_path, source_dir) if exists(gen_path) else {}
    gen = generation
    eos = gen.get("eos_token_id", hp.eos_token_id)
    bos = gen.get("bos_token_id", hp.bos_token_id)
    pad = gen.get("pad_token_id", hp.pad_token_id)
    if pad is None:
        pad = eos[0] if isinstance(eos, list) else eos
    session_options = {"log_id": "onnxruntime-genai", "provider_options": [dict(p) for p in ep.genai_provider_options],
                       **dict(ep.genai_session_options)}
    if custom_ops_library:
        session_options["custom_ops_library"] = custom_ops_library
    decoder = {
        "session_options": session_options, "filename": filename, "head_size": hp.head_dim,
        "hidden_size": hp.hidden_size,
        "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                   "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"},
        "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value"},
        "num_attention_heads": hp.num_heads, "num_hidden_layers": hp.num_layers,
        "num_key_value_heads": hp.num_kv_heads,
    }
    for key, value in (decoder_extras or {}).items():
        if isinstance(value, dict) and isinstance(decoder.get(key), dict):
            decoder[key].update(value)
        else:
            decoder[key] = value
    search = dict(SEARCH_DEFAULTS)
    search.update({k: gen[k] for k in FROM_GENERATION_CONFIG if k in gen})
    search["max_length"] = hp.max_positions
    search.update(search_extras or {})
    model = {"bos_token_id": bos, "context_length": hp.max_positions, "decoder": decoder, "eos_token_id": eos,
             "pad_token_id": pad, "type": hp.model_type, "vocab_size": hp.vocab_size}
    return {"model": model, "search": search}


def write_genai_config(config: dict, out_dir: Path) -> None:
    (out_dir / "genai_config.json").write_text(json.dumps(config, indent=4, sort_keys=True) + "\n")


def copy_tokenizer_files(source_dir: Path, out_dir: Path) -> list[str]:
    copied = []
    for name in TOKENIZER_FILES:
        src = source_dir / name
        if exists(src):
            (out_dir / name).write_bytes(read_input(src, source_dir, limit=1 << 30))
            copied.append(name)
    return copied
