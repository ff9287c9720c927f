"""Write a large Quark-style uint4 per-group export (random packed weights) shard by shard, for benchmarks.

    python benchmarks/synthetic_quark_export.py OUT_DIR --preset llama3-8b [--layers N] [--tokenizer_from DIR]

Random int32 words are valid packed uint4 data, so nothing is quantized: this measures conversion speed and memory,
not accuracy. Tensors are written to each shard block by block (our own safetensors writer), so the generator stays
small even for a 70B-shaped 128k-vocabulary embedding (2 GiB in bf16). Presets follow the public configs of the models
they are named after (hidden, intermediate, layers, heads, kv heads, vocab, tied embeddings, rope theta).
"""
from __future__ import annotations

import argparse
import copy
import json
import shutil
import struct
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from synthetic_export import QUANT_CONFIG  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
PRESETS = {  # hidden, intermediate, layers, heads, kv_heads, vocab, tied, rope_theta
    "tiny": (256, 688, 4, 8, 2, 4096, False, 10000.0),
    "signals": (1024, 2816, 6, 16, 4, 16000, False, 10000.0),  # tests/test_signals.py: ~100 MB out
    "1b": (2048, 5632, 22, 32, 4, 32000, False, 10000.0),      # TinyLlama-1.1B shape
    "8b": (4096, 14336, 32, 32, 8, 128256, False, 500000.0),   # Llama-3.1-8B shape (alias of llama3-8b)
    "over-2gb": (2048, 5632, 4, 32, 4, 128256, False, 10000.0),  # small layers, 128k vocab: a 2.2 GB ONNX data file
    "70b-4layers": (8192, 28672, 4, 64, 8, 128256, False, 500000.0),  # Llama-3.1-70B tensor shapes, 4 of 80 layers
    "llama3-1b": (2048, 8192, 16, 32, 8, 128256, True, 500000.0),     # Llama-3.2-1B: tied embeddings
    "llama3-8b": (4096, 14336, 32, 32, 8, 128256, False, 500000.0),   # Llama-3.1-8B: untied
    "llama3-70b-sliced": (8192, 28672, 4, 64, 8, 128256, False, 500000.0),  # Llama-3.1-70B, layer-sliced to 4
    "ci-vocab128k": (512, 1024, 2, 8, 2, 128256, False, 500000.0),     # tests/test_memory_budget.py
}
SAFETENSORS_NAMES = {np.dtype(np.int32): "I32", BF16: "BF16", np.dtype(np.float32): "F32"}


class Lazy:
    """A tensor described by dtype and shape, produced row block by row block when its shard is written."""

    def __init__(self, dtype, shape, blocks):
        self.dtype, self.shape, self.blocks = np.dtype(dtype), tuple(shape), blocks

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def eager(array: np.ndarray) -> Lazy:
    return Lazy(array.dtype, array.shape, lambda: iter([array]))


def normal_bf16(rng, rows: int, cols: int, std: float = 0.02, block_rows: int = 4096) -> Lazy:
    def blocks():
        for i in range(0, rows, block_rows):
            r = min(block_rows, rows - i)
            yield (std * rng.standard_normal((r, cols), np.float32)).astype(BF16)
    return Lazy(BF16, (rows, cols), blocks)


def save_shard(path: Path, tensors: dict[str, Lazy]) -> None:
    """A safetensors file (8-byte header length, JSON header, then the tensors' bytes), streamed."""
    header, offset = {}, 0
    for name, t in tensors.items():
        header[name] = {"dtype": SAFETENSORS_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * ((-len(raw)) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        for name, t in tensors.items():
            written = 0
            for block in t.blocks():
                block = np.ascontiguousarray(block, dtype=t.dtype)
                fh.write(block.tobytes())
                written += block.nbytes
            assert written == t.nbytes, name


def linear_tensors(rng, name, n_out, n_in, group):
    words_out = -(-n_out // 8)
    return {
        f"{name}.weight": np.frombuffer(rng.bytes(n_in * words_out * 4), np.int32).reshape(n_in, words_out),
        f"{name}.weight_scale": rng.uniform(0.002, 0.02, (n_in // group, n_out)).astype(BF16),
        f"{name}.weight_zero_point": np.full((n_in // group, words_out), 0x88888888 - 2**32, np.int32),
    }


def write(out: Path, preset: str, group: int = 128, layers: int | None = None,
          tokenizer_from: str | None = None, tied: bool | None = None) -> Path:
    hidden, inter, n_layers, heads, kv_heads, vocab, preset_tied, theta = PRESETS[preset]
    n_layers = layers or n_layers
    tied = preset_tied if tied is None else tied
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    q = copy.deepcopy(QUANT_CONFIG)
    q["global_quant_config"]["weight"]["group_size"] = group
    head_dim = hidden // heads
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
           "intermediate_size": inter, "num_hidden_layers": n_layers, "num_attention_heads": heads,
           "num_key_value_heads": kv_heads, "head_dim": head_dim, "vocab_size": vocab,
           "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": theta,
           "tie_word_embeddings": tied, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16",
           "quantization_config": q}
    weight_map = {}

    def save(shard_name, tensors):
        save_shard(out / shard_name, tensors)
        weight_map.update({k: shard_name for k in tensors})

    n_shards = n_layers + 1
    first = {"model.embed_tokens.weight": normal_bf16(rng, vocab, hidden),
             "model.norm.weight": eager(np.ones(hidden, BF16))}
    if not tied:
        first["lm_head.weight"] = normal_bf16(rng, vocab, hidden)
    save(f"model-00001-of-{n_shards:05d}.safetensors", first)
    kv = head_dim * kv_heads
    for i in range(n_layers):
        p = f"model.layers.{i}"
        tensors = {f"{p}.input_layernorm.weight": np.ones(hidden, BF16),
                   f"{p}.post_attention_layernorm.weight": np.ones(hidden, BF16)}
        for proj, (n_out, n_in) in {"self_attn.q_proj": (hidden, hidden), "self_attn.k_proj": (kv, hidden),
                                    "self_attn.v_proj": (kv, hidden), "self_attn.o_proj": (hidden, hidden),
                                    "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden),
                                    "mlp.down_proj": (hidden, inter)}.items():
            tensors.update(linear_tensors(rng, f"{p}.{proj}", n_out, n_in, group))
        save(f"model-{i + 2:05d}-of-{n_shards:05d}.safetensors", {k: eager(v) for k, v in tensors.items()})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    if tokenizer_from:  # the onnxruntime-genai builder needs tokenizer files
        for f in Path(tokenizer_from).glob("tokenizer*"):
            shutil.copy(f, out / f.name)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--preset", default="1b", choices=sorted(PRESETS))
    ap.add_argument("--group_size", type=int, default=128)
    ap.add_argument("--layers", type=int, default=None, help="override the preset's layer count (a layer slice)")
    ap.add_argument("--tokenizer_from", default=None, help="copy tokenizer* files from this folder")
    ap.add_argument("--tied", choices=("yes", "no"), default=None, help="override the preset's tie_word_embeddings")
    a = ap.parse_args()
    write(Path(a.out), a.preset, a.group_size, a.layers, a.tokenizer_from,
          None if a.tied is None else a.tied == "yes")
