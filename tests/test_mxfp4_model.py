"""MXFP4 end to end: real amd-quark exports of a tiny Llama -> ONNX -> ORT / og.Generator vs Quark's own model.

References (tests/quark_factory.py, made by Quark itself, not by the converter):
  reference.npz logits / greedy : Quark's frozen fake-quantized model (weights AND dynamic MXFP4 activations)
  reference.npz dequant_logits  : fp32 PyTorch model on Quark's dequantized weights (no activation quantization)
  quark_dequant.npz             : Quark's dequantized weight per Linear
and tests/independent_decode.py (a decoder written from docs, sharing no code with builder/).
The helpers here are reused by test_nvfp4_model.py.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from builder.convert import convert
from builder.emit_context import BuildOptions

sys.path.insert(0, str(Path(__file__).resolve().parent))
from independent_decode import dequantize_export  # noqa: E402

LOGIT_TOL = 1e-4   # fp32 ORT vs fp32 PyTorch: only summation order differs
NEW_TOKENS = 16


def build(export: Path, out: Path, ep: str = "cpu", precision: str = "fp32", fp4_linear: str | None = None,
          **options) -> Path:
    extra = {"fp4_linear": fp4_linear} if fp4_linear else {}
    convert(export / "quark", out, ep, precision, BuildOptions(extra=extra, **options), log=lambda _msg: None)
    return out


def prompt_logits(model_dir: Path, input_ids: np.ndarray) -> np.ndarray:
    """Logits of the whole prompt in one run with an empty KV cache (CPU EP)."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(model_dir / "model.onnx"), so, providers=["CPUExecutionProvider"])
    feeds = {"input_ids": input_ids, "attention_mask": np.ones_like(input_ids)}
    for inp in sess.get_inputs():
        if inp.name.startswith("past_key_values"):
            dtype = np.float16 if "float16" in inp.type else np.float32
            feeds[inp.name] = np.zeros((input_ids.shape[0], inp.shape[1], 0, inp.shape[3]), dtype=dtype)
    return sess.run(["logits"], feeds)[0].astype(np.float32)


def genai_greedy(model_dir: Path, input_ids: np.ndarray, new_tokens: int = NEW_TOKENS) -> list[int]:
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


def matmul_nbits_weights(model_dir: Path) -> dict[str, np.ndarray]:
    """Every FP4 weight as float32 [N, K]: 8-bit MatMulNBits decoded as (u - 128) * scale, or the dense W.T."""
    model = onnx.load(str(model_dir / "model.onnx"))
    inits = {t.name: t for t in model.graph.initializer}
    out = {}
    for node in model.graph.node:
        if node.op_type != "MatMulNBits":
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["bits"] == 8 and len(node.input) == 3, "FP4 re-encoding must be 8-bit with the default zero point"
        n, k, bs = attrs["N"], attrs["K"], attrs["block_size"]
        b = numpy_helper.to_array(inits[node.input[1]], base_dir=str(model_dir)).reshape(n, k // bs, bs)
        s = numpy_helper.to_array(inits[node.input[2]], base_dir=str(model_dir)).astype(np.float32).reshape(n, -1, 1)
        layer = node.name.rsplit("/", 1)[0]
        out[layer] = ((b.astype(np.float32) - 128.0) * s).reshape(n, k)
    for init in model.graph.initializer:   # fp4_linear=dense: W.T stored as is
        if init.name.endswith(".weight_dequantized.T"):
            module = init.name[: -len(".weight_dequantized.T")]
            out[onnx_layer_name(module)] = numpy_helper.to_array(init, base_dir=str(model_dir)).T
    return out


def onnx_layer_name(module: str) -> str:
    """model.layers.0.self_attn.q_proj -> /model/layers.0/attn/q_proj (builder/arch/llama.py node prefixes)."""
    parts = module.split(".")
    if module == "lm_head":
        return "/lm_head"
    return f"/model/layers.{parts[2]}/{'attn' if parts[3] == 'self_attn' else 'mlp'}/{parts[4]}"


def check_weights_bit_exact(export: Path, model_dir: Path) -> int:
    decoded = matmul_nbits_weights(model_dir)
    independent = dequantize_export(export / "quark")
    quark = dict(np.load(export / "quark_dequant.npz"))
    assert set(independent) == set(quark) and independent, "nothing quantized?"
    for module, w in independent.items():
        got = decoded[onnx_layer_name(module)]
        np.testing.assert_array_equal(got, w, err_msg=f"{module}: ONNX weight != independent decoder")
        np.testing.assert_array_equal(got, quark[module], err_msg=f"{module}: ONNX weight != Quark's dequantized")
    return len(independent)


def op_types(model_dir: Path) -> dict[str, int]:
    model = onnx.load(str(model_dir / "model.onnx"), load_external_data=False)
    counts: dict[str, int] = {}
    for node in model.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


@pytest.fixture(scope="module")
def mxfp4_export(quark_exports):
    return quark_exports("llama_h64", "mxfp4")


def test_mxfp4_cpu_matches_quark(mxfp4_export, tmp_path):
    ref = np.load(mxfp4_export / "reference.npz")
    out = build(mxfp4_export, tmp_path / "m")
    cfg = json.loads((out / "genai_config.json").read_text())
    assert cfg["model"]["decoder"]["filename"] == "model.onnx"
    logits = prompt_logits(out, ref["input_ids"])
    assert np.abs(logits - ref["logits"]).max() < LOGIT_TOL
    assert genai_greedy(out, ref["input_ids"]) == ref["greedy"].tolist()
    assert check_weights_bit_exact(mxfp4_export, out) == 14          # CPU default: dense fp32 weights


def test_mxfp4_matmul_nbits8_lossless(mxfp4_export, tmp_path):
    """8-bit MatMulNBits re-encoding: bit-exact weights; Quark-exact at accuracy_level 1, not at 4 (docs/fp4.md)."""
    ref = np.load(mxfp4_export / "reference.npz")
    out = build(mxfp4_export, tmp_path / "m", fp4_linear="matmul_nbits8", accuracy_level=1)
    assert op_types(out).get("MatMulNBits") == 14
    assert check_weights_bit_exact(mxfp4_export, out) == 14
    assert np.abs(prompt_logits(out, ref["input_ids"]) - ref["logits"]).max() < LOGIT_TOL
    assert genai_greedy(out, ref["input_ids"]) == ref["greedy"].tolist()


def test_mxfp4_skip_activations_is_weight_only(mxfp4_export, tmp_path):
    """mx_activations=skip: the ONNX model equals PyTorch on Quark's dequantized weights, and differs from Quark."""
    ref = np.load(mxfp4_export / "reference.npz")
    out = build(mxfp4_export, tmp_path / "m", mx_activations="skip")
    logits = prompt_logits(out, ref["input_ids"])
    assert np.abs(logits - ref["dequant_logits"]).max() < LOGIT_TOL
    assert np.abs(logits - ref["logits"]).max() > 100 * LOGIT_TOL, "activation emulation should matter"
    assert "Round" not in op_types(out)


def test_mxfp4_migraphx_dq_path_runs_on_cpu(mxfp4_export, tmp_path):
    """The MIGraphX weight path (DequantizeLinear of e2m1 coded as float8e4m3fn, blocked scales) is exact too."""
    ref = np.load(mxfp4_export / "reference.npz")
    out = build(mxfp4_export, tmp_path / "m", ep="migraphx")
    counts = op_types(out)
    assert counts.get("DequantizeLinear", 0) >= 14 and "MatMulNBits" not in counts
    logits = prompt_logits(out, ref["input_ids"])
    assert np.abs(logits - ref["logits"]).max() < LOGIT_TOL


def test_mxfp4_cuda_graph(mxfp4_export, tmp_path):
    out = build(mxfp4_export, tmp_path / "m", ep="cuda", precision="fp16")
    counts = op_types(out)
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    try:
        import custom_ops.functions  # noqa: F401
    except ImportError:
        assert counts.get("MatMulNBits") == 14
        return
    assert counts.get("MatMulMxfp4") == 14
    assert any(f.name == "MatMulMxfp4" and f.domain == "com.quark_onnx" for f in model.functions)
    node = next(n for n in model.graph.node if n.op_type == "MatMulMxfp4")
    inits = {t.name: t for t in model.graph.initializer}
    assert list(inits[node.input[1]].dims) == [64, 32] and list(inits[node.input[2]].dims) == [64, 2]
    # without the custom-op library ORT runs the model-local function: check its numerics on CPU (fp32 io)
    ref = np.load(mxfp4_export / "reference.npz")
    out32 = build(mxfp4_export, tmp_path / "m32", ep="cuda", precision="fp32")
    assert op_types(out32).get("MatMulMxfp4") == 14
    assert np.abs(prompt_logits(out32, ref["input_ids"]) - ref["logits"]).max() < LOGIT_TOL
