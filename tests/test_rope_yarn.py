"""yarn rope (builder/ops/rotary.py) against transformers' own ROPE_INIT_FUNCTIONS["yarn"]: inverse frequencies and
the attention factor that scales cos/sin. End to end: tests/test_gpt_oss.py "gpt_oss_yarn"."""
from __future__ import annotations

import numpy as np
import pytest

from builder.errors import ConversionError
from builder.ops.rotary import cos_sin_caches, inv_frequencies, rope_attention_factor

YARN = [
    # gpt-oss: truncate false
    dict(rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0, original_max_position_embeddings=4096,
         truncate=False, rope_theta=150000.0),
    # defaults (beta 32/1, truncate true)
    dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=64, rope_theta=10000.0),
    # DeepSeek style: mscale / mscale_all_dim
    dict(rope_type="yarn", factor=40.0, mscale=1.0, mscale_all_dim=1.0, beta_fast=32, beta_slow=1,
         original_max_position_embeddings=4096, rope_theta=10000.0),
    dict(rope_type="yarn", factor=8.0, attention_factor=0.5, original_max_position_embeddings=512, rope_theta=5e5),
]


@pytest.mark.parametrize("rope", YARN, ids=range(len(YARN)))
def test_yarn_matches_transformers(rope):
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    cfg = transformers.GptOssConfig(head_dim=64, hidden_size=256, num_attention_heads=4,
                                    max_position_embeddings=131072, rope_parameters=dict(rope))
    inv_ref, factor_ref = ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
    inv = inv_frequencies(64, rope["rope_theta"], rope, "config.json")
    assert np.abs(inv - inv_ref.numpy()).max() <= 1e-6 * inv_ref.numpy().max()  # measured 1e-8 (fp32 vs fp64)
    assert rope_attention_factor(rope) == pytest.approx(factor_ref, rel=1e-12)
    cos, _sin = cos_sin_caches(64, 16, rope["rope_theta"], rope, "config.json")
    assert cos[0, 0] == pytest.approx(factor_ref, rel=1e-6)


def test_yarn_without_factor_is_refused():
    with pytest.raises(ConversionError, match="rope_parameters.factor=None"):
        inv_frequencies(64, 1e4, {"rope_type": "yarn", "original_max_position_embeddings": 64}, "config.json")
