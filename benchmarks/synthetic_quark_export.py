"""Write a large Quark-style uint4 per-group export (random packed weights) shard by shard, for benchmarks.

    python benchmarks/synthetic_quark_export.py OUT_DIR --preset 1b

Random int32 words are valid packed uint4 data, so nothing is quantized: this measures conversion speed and memory,
not accuracy. Shards are written one at a time, so the generator itself stays small.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from synthetic_export import QUANT_CONFIG  # noqa: E402

PRESETS = {  # hidden, intermediate, layers, heads, kv_heads, vocab
    "tiny": (256, 688, 4, 8, 2, 4096),
    "signals": (1024, 2816, 6, 16, 4, 16000),  # tests/test_signals.py: ~100 MB out, emitted in about a second
    "1b": (2048, 5632, 22, 32, 4, 32000),      # TinyLlama-1.1B shape
    "8b": (4096, 14336, 32, 32, 8, 128256),    # Llama-3.1-8B shape
    "over-2gb": (2048, 5632, 4, 32, 4, 128256),  # small layers, 128k vocab: a 2.2 GB ONNX data file
    "70b-4layers": (8192, 28672, 4, 64, 8, 128256),  # Llama-3.1-70B tensor shapes, 4 of its 80 layers
}


def linear_tensors(rng, name, n_out, n_in, group):
    words_out = -(-n_out // 8)
    bf16 = ml_dtypes.bfloat16
    return {
        f"{name}.weight": np.frombuffer(rng.bytes(n_in * words_out * 4), np.int32).reshape(n_in, words_out),
        f"{name}.weight_scale": rng.uniform(0.002, 0.02, (n_in // group, n_out)).astype(bf16),
        f"{name}.weight_zero_point": np.full((n_in // group, words_out), 0x88888888 - 2**32, np.int32),
    }


def write(out: Path, preset: str, group: int = 128) -> None:
    hidden, inter, layers, heads, kv_heads, vocab = PRESETS[preset]
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    bf16 = ml_dtypes.bfloat16
    q = copy.deepcopy(QUANT_CONFIG)
    q["global_quant_config"]["weight"]["group_size"] = group
    head_dim = hidden // heads
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
           "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
           "num_key_value_heads": kv_heads, "vocab_size": vocab, "max_position_embeddings": 2048,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False, "bos_token_id": 1,
           "eos_token_id": 2, "torch_dtype": "bfloat16", "quantization_config": q}
    weight_map = {}

    def save(shard_name, tensors):
        save_file(tensors, str(out / shard_name))
        weight_map.update({k: shard_name for k in tensors})

    n_shards = layers + 1
    save(f"model-00001-of-{n_shards:05d}.safetensors", {
        "model.embed_tokens.weight": (0.02 * rng.standard_normal((vocab, hidden), np.float32)).astype(bf16),
        "model.norm.weight": np.ones(hidden, bf16),
        "lm_head.weight": (0.02 * rng.standard_normal((vocab, hidden), np.float32)).astype(bf16)})
    kv = head_dim * kv_heads
    for i in range(layers):
        p = f"model.layers.{i}"
        tensors = {f"{p}.input_layernorm.weight": np.ones(hidden, bf16),
                   f"{p}.post_attention_layernorm.weight": np.ones(hidden, bf16)}
        for proj, (n_out, n_in) in {"self_attn.q_proj": (hidden, hidden), "self_attn.k_proj": (kv, hidden),
                                    "self_attn.v_proj": (kv, hidden), "self_attn.o_proj": (hidden, hidden),
                                    "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden),
                                    "mlp.down_proj": (hidden, inter)}.items():
            tensors.update(linear_tensors(rng, f"{p}.{proj}", n_out, n_in, group))
        save(f"model-{i + 2:05d}-of-{n_shards:05d}.safetensors", tensors)
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--preset", default="1b", choices=sorted(PRESETS))
    ap.add_argument("--group_size", type=int, default=128)
    a = ap.parse_args()
    write(Path(a.out), a.preset, a.group_size)
