"""A tiny byte-level BPE tokenizer for the random test models (no hub download).

ids: <unk>=0, <s>=1, </s>=2, then byte symbols (GPT-2 byte-to-unicode alphabet), then merge tokens
built from pairs of common lowercase letters when the vocabulary is larger than 259.
With vocab_size=256 only 253 of the 256 byte symbols fit; the 3 dropped ones are rare control bytes
(they map to <unk>). Files written: tokenizer.json, tokenizer_config.json (with a small chat_template).
Loaded by transformers' PreTrainedTokenizerFast and by onnxruntime-genai's og.Tokenizer.
"""
from __future__ import annotations

import json
from pathlib import Path

UNK, BOS, EOS = "<unk>", "<s>", "</s>"
SPECIAL_TOKENS = (UNK, BOS, EOS)
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
_MERGE_LETTERS = "etaoinshrdlucmfwypvbgkjqxz"


def _byte_alphabet() -> list[str]:
    """GPT-2's byte-to-unicode map, in byte order (printable bytes map to themselves)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    symbols: dict[int, str] = {b: chr(b) for b in printable}
    shift = 0
    for b in range(256):
        if b not in symbols:
            symbols[b] = chr(256 + shift)
            shift += 1
    return [symbols[b] for b in range(256)]


def _vocab_and_merges(vocab_size: int) -> tuple[dict[str, int], list[list[str]]]:
    if vocab_size < 64:
        raise ValueError(f"vocab_size={vocab_size}: need at least 64 ids for a usable byte-level tokenizer")
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    # printable symbols first, so that a small vocab keeps ASCII text and drops control bytes
    alphabet = _byte_alphabet()
    ordered = [alphabet[b] for b in range(256) if 0x21 <= b <= 0x7E] + [
        alphabet[b] for b in range(256) if not 0x21 <= b <= 0x7E
    ]
    # 'Ġ' (space) must survive truncation
    ordered.remove(alphabet[0x20])
    ordered.insert(0, alphabet[0x20])
    for sym in ordered[: vocab_size - len(vocab)]:
        vocab[sym] = len(vocab)
    merges: list[list[str]] = []
    for a in _MERGE_LETTERS:
        for b in _MERGE_LETTERS:
            if len(vocab) >= vocab_size:
                return vocab, merges
            vocab[a + b] = len(vocab)
            merges.append([a, b])
    while len(vocab) < vocab_size:  # very large vocab: unreachable filler tokens
        vocab[f"<extra_{len(vocab)}>"] = len(vocab)
    return vocab, merges


def tokenizer_json(vocab_size: int) -> dict:
    vocab, merges = _vocab_and_merges(vocab_size)
    added = [
        dict(id=i, content=tok, single_word=False, lstrip=False, rstrip=False, normalized=False, special=True)
        for i, tok in enumerate(SPECIAL_TOKENS)
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        # no BOS post-processor: og.Tokenizer ignores it, so both add nothing and agree
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": UNK,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },
    }


def tokenizer_config_json(max_length: int = 256) -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": UNK,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {
            str(i): dict(content=tok, lstrip=False, normalized=False, rstrip=False, single_word=False, special=True)
            for i, tok in enumerate(SPECIAL_TOKENS)
        },
    }


def write_tokenizer(out_dir: str | Path, vocab_size: int = 256, max_length: int = 256) -> Path:
    """Write tokenizer.json + tokenizer_config.json into out_dir and return out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(json.dumps(tokenizer_json(vocab_size), ensure_ascii=False, indent=1))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config_json(max_length), indent=1))
    return out
