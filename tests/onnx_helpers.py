"""Running converted models in tests: build, prompt logits through ORT, greedy tokens through og.Generator,
MatMulNBits weights decoded back to float, op counts. Shared by every end-to-end test module."""
from __future__ import annotations

import json

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from builder.convert import convert
from builder.emit_context import BuildOptions

NEW_TOKENS = 16


def build(export: Path, out: Path, ep: str = "cpu", precision: str | None = "fp32", **options) -> Path:
    """Convert `export/quark` (a factory export dir) or `export` itself (a Quark folder) into `out`."""
    src = export / "quark" if (export / "quark").is_dir() else export
    # every prompt position's logits, which the numerics tests compare with Quark's (the cpu default is the last
    # position only: tests/test_prefill_logits.py checks that form against this one)
    options.setdefault("prefill_logits", "all")
    known = set(BuildOptions.__dataclass_fields__) - {"extra"}
    extra = {k: v for k, v in options.items() if k not in known}
    kwargs = {k: v for k, v in options.items() if k in known}
    convert(src, out, ep, precision, BuildOptions(extra=extra, **kwargs), log=lambda _msg: None)
    return out


def shipped_library(model_dir: Path) -> str | None:
    """The custom-op library genai_config names (copied into the model folder by the converter), or None."""
    cfg_file = model_dir / "genai_config.json"
    if not cfg_file.exists():
        return None
    name = json.loads(cfg_file.read_text())["model"]["decoder"].get("session_options", {}).get("custom_ops_library")
    return str(model_dir / name) if name else None


def cpu_library_has_kernel(op: str) -> bool:
    """Whether the custom-op library the converter finds (custom_ops/build/ort) has op's CPU kernel: the cpu EP's
    default is then the compact form of op (builder/compact_forms.py missing_kernels), else the dense fp32 form."""
    import ctypes

    from builder.custom_ops_library import OP_SYMBOLS
    from custom_ops import ort_library
    path, _ = ort_library.available()
    return path is not None and hasattr(ctypes.CDLL(str(path)), OP_SYMBOLS[op])


def prompt_logits(model_dir: Path, input_ids: np.ndarray, session_config: dict | None = None,
                  custom_ops_library: str | None = None, profile_nodes: list | None = None) -> np.ndarray:
    """Logits of the whole prompt in one run with an empty KV cache (CPU EP), with the custom-op library the output
    ships registered (custom_ops_library="" for none; a path for another); `profile_nodes` (a list) receives the profiled (op, provider) pairs."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    for key, value in (session_config or {}).items():
        so.add_session_config_entry(key, value)
    if custom_ops_library is None:  # the library the output ships (the cpu EP's compact default), as og loads it
        custom_ops_library = shipped_library(model_dir)
    if custom_ops_library:
        so.register_custom_ops_library(custom_ops_library)
    if profile_nodes is not None:
        so.enable_profiling = True
    sess = ort.InferenceSession(str(model_dir / "model.onnx"), so, providers=["CPUExecutionProvider"])
    feeds = {"input_ids": input_ids, "attention_mask": np.ones_like(input_ids)}
    for inp in sess.get_inputs():
        if inp.name.startswith("past_key_values"):
            dtype = np.float16 if "float16" in inp.type else np.float32
            feeds[inp.name] = np.zeros((input_ids.shape[0], inp.shape[1], 0, inp.shape[3]), dtype=dtype)
    logits = sess.run(["logits"], feeds)[0].astype(np.float32)
    if profile_nodes is not None:
        from custom_ops.single_op import profiled_nodes
        profile_nodes.extend(profiled_nodes(sess))
    return logits


def genai_greedy(model_dir: Path, input_ids: np.ndarray, new_tokens: int = NEW_TOKENS) -> list[int]:
    """Greedy continuation through onnxruntime-genai (KV cache, one token per step)."""
    import onnxruntime_genai as og

    model = og.Model(str(model_dir))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=input_ids.shape[1] + new_tokens, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(input_ids)
    out = []
    while not gen.is_done() and len(out) < new_tokens:
        gen.generate_next_token()
        out.append(int(gen.get_next_tokens()[0]))
    return out


def decisive_prefix(margins: np.ndarray, tolerance: float) -> int:
    """How many greedy steps have a top-1/top-2 logit margin above `tolerance` before the first near-tie.
    Past a near-tie the reference's own choice is arbitrary at that numeric precision."""
    small = np.flatnonzero(np.asarray(margins) <= tolerance)
    return int(small[0]) if small.size else len(margins)


# the cpu default form of routed 4-bit integer experts (with the custom-op library; QMoE without it)
INT4_EXPERTS_OPS = ("MatMulExpertsUint4", "MatMulExpertsInt4")


def int4_experts_nodes(ops: dict[str, int]) -> int:
    return sum(ops.get(op, 0) for op in INT4_EXPERTS_OPS)


def session_logits(model_path: Path, ids: np.ndarray, library: str | None) -> np.ndarray:
    """A prompt's logits through ORT's CPU session of model_path (empty KV cache), the custom-op library registered
    when given."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if library:
        so.register_custom_ops_library(library)
    sess = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    for inp in sess.get_inputs():
        if inp.name.startswith("past_key_values"):
            feeds[inp.name] = np.zeros((ids.shape[0], inp.shape[1], 0, inp.shape[3]), np.float32)
    return sess.run(["logits"], feeds)[0]


def run_single_op(op_type: str, x: np.ndarray, weights: dict, library: str | None, threads: int) -> np.ndarray:
    """One com.quark_onnx node (custom_ops/single_op.py, its function attached) on x [..., K] in ORT's CPU session:
    the library's kernel when `library` is given, else the ONNX-function fallback."""
    from custom_ops import functions, single_op
    model = single_op.single_op_model(op_type, x.dtype, x.shape[-1], weights)
    sess = single_op.session(model, library=library, threads=threads)
    return sess.run(None, {functions.OP_INPUTS[op_type][0]: x})[0]


def fp8_quantize_count(ops: dict[str, int]) -> int:
    """Static / dynamic activation quantizers of an op_types count: QuantizeLinear nodes, plus the com.quark_onnx
    QuantizeDequantizeFp8 nodes that take a static FP8 pair's place on cpu with the library."""
    return ops.get("QuantizeLinear", 0) + ops.get("QuantizeDequantizeFp8", 0)


def op_types(model_dir: Path) -> dict[str, int]:
    model = onnx.load(str(model_dir / "model.onnx"), load_external_data=False)
    counts: dict[str, int] = {}
    for node in model.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def onnx_layer_name(module: str) -> str:
    """model.layers.0.self_attn.q_proj -> /model/layers.0/attn/q_proj (builder/arch/llama.py node prefixes)."""
    if module == "lm_head":
        return "/lm_head"
    parts = module.split(".")
    return f"/model/layers.{parts[2]}/{'attn' if parts[3] == 'self_attn' else 'mlp'}/{parts[4]}"


# com.quark_onnx ops on MatMulNBits' own 4-bit inputs (custom_ops/src/qo_cpu_int4.c: B, scales, zero points)
INT4_COMPACT_OPS = ("MatMulUint4", "MatMulInt4")


def matmul_nbits_nodes(model_dir: Path, model: onnx.ModelProto | None = None):
    """Each MatMulNBits of the model, and each MatMulUint4 / MatMulInt4 (the cpu default's 4-bit form, the same
    inputs; bits = 4), as (node, attributes, {input name: numpy array of that initializer})."""
    model = model if model is not None else onnx.load(str(model_dir / "model.onnx"))
    inits = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "MatMulNBits" or node.op_type in INT4_COMPACT_OPS:
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            attrs.setdefault("bits", 4)
            arrays = {name: numpy_helper.to_array(inits[name], base_dir=str(model_dir))
                      for name in node.input[1:] if name in inits}
            yield node, attrs, arrays


def int4_linear_count(ops: dict) -> int:
    """The 4-bit (and 8-bit) weight-only linears among op_types' counts: MatMulNBits or the compact 4-bit ops."""
    return ops.get("MatMulNBits", 0) + sum(ops.get(op, 0) for op in INT4_COMPACT_OPS)


def matmul_nbits_dequantized(model_dir: Path) -> dict[str, np.ndarray]:
    """Decode every MatMulNBits (and MatMulUint4 / MatMulInt4) back to float32 [N, K] from the ONNX tensors alone (ort_facts.md layout):
    B uint8 [N, k_blocks, bs*bits/8] LSB first, scales [N*k_blocks], zero_points packed or default 2^(bits-1)."""
    model = onnx.load(str(model_dir / "model.onnx"))
    out = {}
    for node, attrs, arrays in matmul_nbits_nodes(model_dir, model):
        n, k, bs, bits = attrs["N"], attrs["K"], attrs["block_size"], attrs["bits"]
        blocks = -(-k // bs)
        raw = arrays[node.input[1]].reshape(n, blocks, -1)
        if bits == 4:
            vals = np.stack([raw & 0xF, raw >> 4], axis=-1).reshape(n, blocks * bs)
        else:
            vals = raw.reshape(n, blocks * bs)
        scales = arrays[node.input[2]].astype(np.float32).reshape(n, blocks)
        if len(node.input) > 3 and node.input[3]:
            zraw = arrays[node.input[3]].reshape(n, -1)
            zps = np.stack([zraw & 0xF, zraw >> 4], -1).reshape(n, -1)[:, :blocks] if bits == 4 else zraw
        else:
            zps = np.full((n, blocks), 1 << (bits - 1))
        w = (vals.astype(np.float32) - np.repeat(zps, bs, 1)) * np.repeat(scales, bs, 1)
        out[node.name.rsplit("/", 1)[0]] = w[:, :k]
    return _unfuse(model, model_dir, out)


FUSED_PARTS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def _unfuse(model, model_dir: Path, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Fused projections (`.../qkv_proj`, `.../gate_up_proj`) back to one entry per projection, using the sizes
    of the Split node that follows them."""
    inits = {t.name: t for t in model.graph.initializer}
    splits = {n.name.rsplit("/", 1)[0]: n for n in model.graph.node if n.op_type == "Split"}
    for prefix in [p for p in weights if p.rsplit("/", 1)[-1] in FUSED_PARTS]:
        sizes = numpy_helper.to_array(inits[splits[prefix].input[1]], base_dir=str(model_dir))
        parent, fused = prefix.rsplit("/", 1)
        rows = np.split(weights.pop(prefix), np.cumsum(sizes)[:-1])
        for part, w in zip(FUSED_PARTS[fused], rows):
            weights[f"{parent}/{part}"] = w
    return weights
