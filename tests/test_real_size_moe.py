"""benchmarks/real_size.py's synthetic MoE exports (write_moe_export) against the tiny exports amd-quark 0.13 itself
made (tests/quark_factory.py: qwen3_moe with uint4 g32, MXFP4 and MXFP4 + FP8 activations, gpt_oss with MXFP4 and
MXFP4 + FP8 activations).

The writer is run at each fixture's own shape (read from the fixture's config.json) and float32, the fixture's
dtype; then, for the layers both have as sparse MoE layers: the same tensor names, dtypes and shapes; the same
config.json keys and quantization_config (the routers excluded layer by layer, then lm_head); and converted for -e cpu
(the default: MatMulExpertsMxfp4, MatMulExpertsMxfp4R16 for float A, MatMulExpertsUint4), the same nodes (op type and domain) and initializers (name, dtype,
shape) in those layers. The real-size rows (bfloat16 at the release shapes) differ from these only in the shape
values and the float dtype.
"""
from __future__ import annotations

import json
import re
import struct
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnx_helpers import build

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from real_size import CONFIGS, session_weight_bytes, write_moe_export  # noqa: E402

CASES = [("qwen3_moe", "uint4_g32", "uint4"), ("qwen3_moe", "mxfp4", "mxfp4"), ("gpt_oss", "mxfp4", "mxfp4"),
         ("qwen3_moe", "mxfp4_fp8", "mxfp4_fp8"), ("gpt_oss", "mxfp4_fp8", "mxfp4_fp8"),
         ("qwen3_moe", "fp8_w8a8_kv", "fp8_kv"), ("qwen3_moe", "nvfp4", "nvfp4")]
QUARK_EXPORTS = [(shape, recipe) for shape, recipe, _ in CASES]
CONFIG_KEY = {"uint4_g32": "uint4_g32", "mxfp4": "mxfp4", "mxfp4_fp8": "mxfp4_fp8", "fp8_w8a8_kv": "fp8_w8a8_kv",
              "nvfp4": "nvfp4"}  # benchmarks/real_size_quant_configs.json
ROTARY_CACHES = ("cos_cache", "sin_cache")  # [max_position_embeddings, ...]: the writer's is the release's
EXPECTED_OP = {"uint4": ("com.quark_onnx", "MatMulExpertsUint4"), "mxfp4": ("com.quark_onnx", "MatMulExpertsMxfp4"),
               "mxfp4_fp8": ("com.quark_onnx", "MatMulExpertsMxfp4R16"),  # float A: the 16-row tiles
               "fp8_kv": ("com.quark_onnx", "MatMulExpertsFp8"), "nvfp4": ("com.quark_onnx", "MatMulExpertsNvfp4R16")}


def tensors(folder: Path) -> dict[str, tuple[str, tuple]]:
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with open(f, "rb") as fh:
            header = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
        out.update({k: (v["dtype"], tuple(v["shape"])) for k, v in header.items() if k != "__metadata__"})
    return out


def shape_of(cfg: dict) -> dict:
    moe = cfg["model_type"] == "qwen3_moe"
    return dict(arch=cfg["model_type"], hidden=cfg["hidden_size"], inter=cfg["intermediate_size"],
                moe_inter=cfg["moe_intermediate_size"] if moe else cfg["intermediate_size"],
                layers=cfg["num_hidden_layers"], heads=cfg["num_attention_heads"],
                kv_heads=cfg["num_key_value_heads"], head_dim=cfg["head_dim"], vocab=cfg["vocab_size"],
                experts=cfg["num_local_experts"], top_k=cfg["num_experts_per_tok"])


def sparse_layers(cfg: dict) -> list[int]:
    dense = set(cfg.get("mlp_only_layers") or ())
    return [i for i in range(cfg["num_hidden_layers"]) if i not in dense]


def in_layers(name: str, layers: list[int]) -> bool:
    m = re.search(r"layers[./](\d+)[./]", name)
    return m is None or int(m.group(1)) in layers


def graph_parts(model_dir: Path, layers: list[int]):
    model = onnx.load(str(model_dir / "model.onnx"), load_external_data=False)
    nodes = Counter((n.domain, n.op_type) for n in model.graph.node if in_layers(n.name, layers))
    inits = {t.name: (t.data_type, tuple(t.dims)) for t in model.graph.initializer if in_layers(t.name, layers)
             and t.name not in ROTARY_CACHES}
    return nodes, inits


def normalized_exclude(exclude: list[str]) -> list[str]:
    return list(dict.fromkeys(re.sub(r"layers\.\d+\.", "layers.N.", e) for e in exclude))


@pytest.mark.parametrize("shape,recipe,kind", CASES, ids=[f"{s}-{r}" for s, r, _ in CASES])
def test_synthetic_moe_export_matches_quark(quark_exports, tmp_path, shape, recipe, kind):
    fixture = quark_exports(shape, recipe) / "quark"
    cfg = json.loads((fixture / "config.json").read_text())
    syn = write_moe_export(tmp_path / "syn", kind, CONFIGS[CONFIG_KEY[recipe]], shape_of(cfg), np.float32)
    syn_cfg = json.loads((syn / "config.json").read_text())
    layers = sparse_layers(cfg)
    assert layers and sparse_layers(syn_cfg) == list(range(cfg["num_hidden_layers"]))

    want = {k: v for k, v in tensors(fixture).items() if in_layers(k, layers)}
    got = {k: v for k, v in tensors(syn).items() if in_layers(k, layers)}
    assert sorted(set(want) ^ set(got)) == []
    assert {k: v for k, v in got.items() if want[k] != v} == {}

    assert sorted(syn_cfg) == sorted(cfg)
    q, syn_q = dict(cfg["quantization_config"]), dict(syn_cfg["quantization_config"])
    assert normalized_exclude(q.pop("exclude")) == normalized_exclude(syn_q.pop("exclude"))
    assert syn_q == q

    theirs = graph_parts(build(fixture, tmp_path / "fixture_onnx", "cpu", "fp32"), layers)
    ours = graph_parts(build(syn, tmp_path / "syn_onnx", "cpu", "fp32"), layers)
    assert ours[0] == theirs[0]
    # MatMulExperts*: gate_up (gpt-oss's own, or fused), down; NVFP4 gate and up apart (a weight_scale_2 each)
    per_layer = 3 if kind == "nvfp4" and shape != "gpt_oss" else 2
    assert ours[0][EXPECTED_OP[kind]] == per_layer * len(layers)
    assert sorted(set(ours[1]) ^ set(theirs[1])) == []
    assert {k: v for k, v in ours[1].items() if theirs[1][k] != v} == {}


DTYPE_BYTES = {"F32": 4, "BF16": 2, "U8": 1, "I32": 4, "F8_E4M3": 1}


@pytest.mark.parametrize("shape,recipe,kind", CASES, ids=[f"{s}-{r}" for s, r, _ in CASES])
def test_streamed_bytes_count_top_k_of_the_experts(quark_exports, tmp_path, shape, recipe, kind):
    """real_size's GB/s column: a decoded token reads the quantized and 2-D float weights once and k/E of every
    expert stack. Expected from the export's own tensors (the compact forms keep their bytes: MatMulExpertsMxfp4 /
    MatMulMxfp4 the e2m1 + e8m0 bytes, QMoE and MatMulNBits the 4-bit codes, fp32 scales and packed zero points of
    this float32 export; lm_head and routers fp32; FP8 experts' fused gate and up stack its per-tensor scales as an
    fp32 column scale per row, builder/ops/routed_experts.py _pair_arrays; a dense FP8 / NVFP4 linear reads its 0-d
    scale)."""
    cfg = json.loads((quark_exports(shape, recipe) / "quark" / "config.json").read_text())
    s = shape_of(cfg)
    syn = write_moe_export(tmp_path / "syn", kind, CONFIGS[CONFIG_KEY[recipe]], s, np.float32)
    expected = 0.0
    for name, (dtype, dims) in tensors(syn).items():
        if name.endswith(("weight", "weight_scale", "weight_zero_point")) and len(dims) == 2 \
                and name != "model.embed_tokens.weight":
            share = s["top_k"] / s["experts"] if ".experts." in name else 1
            expected += DTYPE_BYTES[dtype] * int(np.prod(dims)) * share
            if dtype == "F8_E4M3" and name.endswith(("gate_proj.weight", "up_proj.weight")) and ".experts." in name:
                expected += 4 * dims[0] * share
        elif name.endswith(("weight_scale", "weight_scale_2")) and not dims and ".experts." not in name:
            # the dense linears' 0-d scale: MatMulFp8's weight scale, MatMulNvfp4R16's weight_scale_2
            expected += DTYPE_BYTES[dtype]
    got = session_weight_bytes(build(syn, tmp_path / "onnx", "cpu", "fp32"), s["top_k"])["streamed_bytes_per_token"]
    assert got == pytest.approx(expected, rel=1e-6)
