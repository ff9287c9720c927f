"""`kv_cache=native`: a float8e4m3fn GroupQueryAttention cache on CUDA (docs/kv_cache.md), refused elsewhere.

No GPU here: the CUDA graph is checked node by node (attributes, scale inputs 12/13, cache dtypes, genai_config).
Two CPU checks back the claims the builder relies on, each against a numpy reference:
- onnxruntime's GroupQueryAttention with a quantized (int8: the CPU has no fp8 cache) cache quantizes K after RoPE,
  with k_scale/v_scale as the dequantization multiplier (present = round(rope(k) / s));
- onnxruntime-genai 0.18 allocates and carries a float8e4m3fn cache from the model's declared past/present dtype,
  with no genai_config key.
"""
from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from bad_input_kit import run_cli
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from safetensors import safe_open

from builder.convert import convert
from builder.ep_check import check_findings
from builder.ep_configs import get_ep
from builder.emit_context import BuildOptions
from builder.errors import ConversionError

RECIPES = ("fp8_w8a8_kv", "fp8_w8a8_kv_attn")
QUARK_EXPORTS = [("llama_h64", r) for r in RECIPES]
NATIVE = BuildOptions(kv_cache="native")
MS = "com.microsoft"


@pytest.fixture(scope="module")
def exports(quark_exports):
    return dict(zip(RECIPES, quark_exports.many(QUARK_EXPORTS)))


def load(model_dir):
    return onnx.load(str(model_dir / "model.onnx"), load_external_data=False)


def gqa_nodes(model):
    return [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]


def attrs(node):
    return {a.name: h.get_attribute_value(a) for a in node.attribute}


def checkpoint_scale(src, name: str) -> float:
    for f in sorted(src.glob("*.safetensors")):
        with safe_open(str(f), "np") as st:
            if name in st.keys():
                return float(np.asarray(st.get_tensor(name), np.float32))
    raise KeyError(name)


# ---------------------------------------------------------------------------------------------- the CUDA graph
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_cuda_native_gqa_has_fp8_cache_and_checkpoint_scales(exports, precision, tmp_path):
    src = exports["fp8_w8a8_kv"] / "quark"
    out = tmp_path / "cuda"
    plan = convert(src, out, "cuda", precision, options=NATIVE, log=lambda m: None)
    model = load(out)
    inits = {t.name: t for t in model.graph.initializer}
    nodes = gqa_nodes(model)
    assert len(nodes) == 2
    for i, node in enumerate(nodes):
        a = attrs(node)
        assert a["k_quant_type"] == b"PER_TENSOR" and a["v_quant_type"] == b"PER_TENSOR"
        assert a["kv_cache_bit_width"] == 8 and a["do_rotary"] == 1
        assert node.input[3] == f"past_key_values.{i}.key" and node.input[4] == f"past_key_values.{i}.value"
        assert list(node.input[9:12]) == ["", "", ""] and len(node.input) == 14
        for slot, proj in ((12, "k"), (13, "v")):
            t = inits[node.input[slot]]
            assert t.data_type == T.FLOAT and list(t.dims) == [1]
            want = checkpoint_scale(src, f"model.layers.{i}.self_attn.{proj}_proj.output_scale")
            assert float(nh.to_array(t)[0]) == want
        if node.input[12] == node.input[13]:  # equal scales share one tensor (XQA needs k_scale is v_scale)
            assert checkpoint_scale(src, f"model.layers.{i}.self_attn.k_proj.output_scale") == \
                checkpoint_scale(src, f"model.layers.{i}.self_attn.v_proj.output_scale")
        producers = {o: n.op_type for n in model.graph.node for o in n.output}
        assert producers[node.input[1]] != "DequantizeLinear" and producers[node.input[2]] != "DequantizeLinear"
    kv = [v for v in list(model.graph.input) + list(model.graph.output) if "key" in v.name or "value" in v.name]
    assert len(kv) == 8 and all(v.type.tensor_type.elem_type == T.FLOAT8E4M3FN for v in kv)
    io_t = {"fp16": T.FLOAT16, "bf16": T.BFLOAT16}[precision]
    assert [o.type.tensor_type.elem_type for o in model.graph.output if o.name == "logits"] == [io_t]
    cfg = json.loads((out / "genai_config.json").read_text())
    assert cfg["search"]["past_present_share_buffer"] is True
    assert set(cfg["model"]["decoder"]["inputs"]) == {"input_ids", "attention_mask", "past_key_names",
                                                      "past_value_names"}
    assert set(cfg["model"]["decoder"]["outputs"]) == {"logits", "present_key_names", "present_value_names"}
    assert any("native on cuda" in n and "AFTER RoPE" in n for n in plan.notes)


def test_native_graph_breaks_cpu_and_migraphx_rules(exports, tmp_path):
    out = tmp_path / "cuda"
    convert(exports["fp8_w8a8_kv"] / "quark", out, "cuda", options=NATIVE, log=lambda m: None)
    hit = {ep: {f.rule for f in check_findings(out / "model.onnx", get_ep(ep))} for ep in ("cuda", "cpu", "migraphx")}
    assert "cuda-gqa-fp8-cache" in hit["cuda"]
    assert "cpu-gqa-no-fp8-cache" in hit["cpu"]
    assert {"migraphx-gqa-inputs", "migraphx-gqa-kv-quant"} <= hit["migraphx"]


def test_default_stays_emulated_on_cuda(exports, tmp_path):
    out = tmp_path / "cuda"
    plan = convert(exports["fp8_w8a8_kv"] / "quark", out, "cuda", log=lambda m: None)
    model = load(out)
    assert all("k_quant_type" not in attrs(n) for n in gqa_nodes(model))
    assert all(v.type.tensor_type.elem_type == T.FLOAT16 for v in model.graph.input if "past" in v.name)
    assert any("emulated on cuda" in n and "kv_cache=native" in n for n in plan.notes)


def test_native_with_fp8_attention_off(exports, tmp_path):
    src = exports["fp8_w8a8_kv_attn"] / "quark"
    with pytest.raises(ConversionError) as err:
        convert(src, tmp_path / "refused", "cuda", options=NATIVE, log=lambda m: None)
    assert "fp8_attention=off" in str(err.value) and "\n" not in str(err.value)
    plan = convert(src, tmp_path / "o", "cuda", options=BuildOptions(kv_cache="native", fp8_attention="off"),
                   log=lambda m: None)
    assert all(attrs(n)["k_quant_type"] == b"PER_TENSOR" for n in gqa_nodes(load(tmp_path / "o")))
    assert any(n.startswith("WARNING fp8_attention=off") for n in plan.notes)


# ---------------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("ep,precision,needle", [
    ("cpu", None, "no float8 GroupQueryAttention cache on cpu"),
    ("migraphx", None, "no float8 GroupQueryAttention cache on migraphx"),
    ("rocm", None, "no float8 GroupQueryAttention cache on rocm"),
    ("cuda", "fp32", "fp16/bf16 only"),
])
def test_native_refused_in_one_line(exports, ep, precision, needle, tmp_path):
    with pytest.raises(ConversionError) as err:
        convert(exports["fp8_w8a8_kv"] / "quark", tmp_path / "o", ep, precision, options=NATIVE,
                log=lambda m: None)
    msg = str(err.value)
    assert needle in msg and "\n" not in msg and "native" in msg
    assert not (tmp_path / "o").exists()


def test_native_without_kv_scales_refused(tmp_path):
    from synthetic_export import write_synthetic_export
    src = write_synthetic_export(tmp_path / "src")
    with pytest.raises(ConversionError) as err:
        convert(src, tmp_path / "o", "cuda", options=NATIVE, log=lambda m: None)
    assert "no k_proj/v_proj.output_scale" in str(err.value)


def test_inspect_says_which_cache(exports):
    src = str(exports["fp8_w8a8_kv"] / "quark")

    def inspect(*args):
        r = run_cli(["inspect", "-i", src, *args])  # forked like `python -m builder` (tests/bad_input_kit.py)
        return r.returncode, r.stdout + r.stderr

    rc, text = inspect("-e", "cuda", "--extra_options", "kv_cache=native")
    assert rc == 0 and "note: FP8 KV cache native on cuda" in text and "quantizes K AFTER RoPE" in text
    rc, text = inspect("-e", "cpu")
    assert rc == 0 and "FP8 KV cache emulated on cpu" in text and "cpu has no native FP8" in text
    rc, text = inspect("-e", "migraphx", "--extra_options", "kv_cache=native")
    assert rc == 2 and "no float8 GroupQueryAttention cache on migraphx" in text


# ---------------------------------------------------------------------------------------------- CPU semantics
B, S, H, HK, D, K_SCALE, V_SCALE = 1, 3, 4, 2, 16, 0.05, 0.03


def _rope_tables(n=32):
    freq = np.outer(np.arange(n), 1.0 / 10000 ** (np.arange(0, D, 2) / D))
    return np.cos(freq).astype(np.float32), np.sin(freq).astype(np.float32)


def _rope(x, pos, cos, sin):  # x [S, n, D], non-interleaved
    c, s = cos[pos][:, None, :], sin[pos][:, None, :]
    x1, x2 = x[..., :D // 2], x[..., D // 2:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1)


def _attention(q, k, v):  # q [S, H, D]; k, v [HK, T, D]; causal, new tokens at the end
    t, out = k.shape[1], []
    for head in range(H):
        kk, vv = k[head // (H // HK)], v[head // (H // HK)]
        scores = q[:, head] @ kk.T / np.sqrt(D)
        allowed = np.arange(t)[None, :] <= (t - q.shape[0] + np.arange(q.shape[0]))[:, None]
        scores = np.where(allowed, scores, -np.inf)
        p = np.exp(scores - scores.max(-1, keepdims=True))
        out.append((p / p.sum(-1, keepdims=True)) @ vv)
    return np.stack(out, 1).reshape(q.shape[0], H * D)


def _int8(x, s):
    return np.clip(np.round(x / s), -128, 127).astype(np.int8)


def test_cpu_gqa_quantized_cache_is_post_rope_with_dequant_scale():
    cos, sin = _rope_tables()
    io, c8 = T.FLOAT, T.INT8
    inputs = [h.make_tensor_value_info(n, t, s) for n, t, s in [
        ("q", io, [B, None, H * D]), ("k", io, [B, None, HK * D]), ("v", io, [B, None, HK * D]),
        ("past_k", c8, [B, HK, None, D]), ("past_v", c8, [B, HK, None, D]), ("seqlens_k", T.INT32, [B]),
        ("total", T.INT32, [])]]
    inits = [nh.from_array(cos, "cos"), nh.from_array(sin, "sin"),
             nh.from_array(np.array([K_SCALE], np.float32), "k_scale"),
             nh.from_array(np.array([V_SCALE], np.float32), "v_scale")]
    node = h.make_node("GroupQueryAttention", ["q", "k", "v", "past_k", "past_v", "seqlens_k", "total", "cos", "sin",
                                               "", "", "", "k_scale", "v_scale"], ["o", "pk", "pv"], domain=MS,
                       num_heads=H, kv_num_heads=HK, do_rotary=1, k_quant_type="PER_TENSOR",
                       v_quant_type="PER_TENSOR", kv_cache_bit_width=8)
    outputs = [h.make_tensor_value_info("o", io, None), h.make_tensor_value_info("pk", c8, None),
               h.make_tensor_value_info("pv", c8, None)]
    model = h.make_model(h.make_graph([node], "g", inputs, outputs, inits), ir_version=10,
                         opset_imports=[h.make_opsetid("", 21), h.make_opsetid(MS, 1)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    q, k, v = (rng.normal(size=(B, S, n * D)).astype(np.float32) for n in (H, HK, HK))
    empty = np.zeros((B, HK, 0, D), np.int8)
    o, pk, pv = sess.run(None, dict(q=q, k=k, v=v, past_k=empty, past_v=empty, seqlens_k=np.array([S - 1], np.int32),
                                    total=np.array(S, np.int32)))
    k_rope = _rope(k[0].reshape(S, HK, D), np.arange(S), cos, sin).transpose(1, 0, 2)
    v_heads = v[0].reshape(S, HK, D).transpose(1, 0, 2)
    assert np.array_equal(pk[0], _int8(k_rope, K_SCALE))            # quantized AFTER RoPE, scale divides
    assert not np.array_equal(pk[0], _int8(k[0].reshape(S, HK, D).transpose(1, 0, 2), K_SCALE))
    assert np.array_equal(pv[0], _int8(v_heads, V_SCALE))
    q_rope = _rope(q[0].reshape(S, H, D), np.arange(S), cos, sin)
    dequant = _attention(q_rope, pk[0] * K_SCALE, pv[0] * V_SCALE)
    # the CPU kernel's prompt reads the dequantized cache (CUDA's reads float K/V: docs/kv_cache.md)
    assert np.abs(o[0] - dequant).max() < 1e-5
    assert np.abs(o[0] - _attention(q_rope, k_rope, v_heads)).max() > 1e-3
    q1, k1, v1 = (rng.normal(size=(B, 1, n * D)).astype(np.float32) for n in (H, HK, HK))
    o1, pk1, _ = sess.run(None, dict(q=q1, k=k1, v=v1, past_k=pk, past_v=pv, seqlens_k=np.array([S], np.int32),
                                     total=np.array(S + 1, np.int32)))
    k1_rope = _rope(k1[0].reshape(1, HK, D), np.array([S]), cos, sin).transpose(1, 0, 2)
    assert np.array_equal(pk1[0][:, :S], pk[0]) and np.array_equal(pk1[0][:, S:], _int8(k1_rope, K_SCALE))
    keys = np.concatenate([pk[0], _int8(k1_rope, K_SCALE)], 1) * K_SCALE
    values = np.concatenate([pv[0], _int8(v1[0].reshape(1, HK, D).transpose(1, 0, 2), V_SCALE)], 1) * V_SCALE
    assert np.abs(o1[0] - _attention(_rope(q1[0].reshape(1, H, D), np.array([S]), cos, sin), keys, values)).max() \
        < 1e-5


def _fp8_cache_model(out, emb, w, scale):
    """input_ids -> x = emb[ids]; cache = fp8(x / scale) appended to past; logits = (x + sum(dequant cache)) @ w."""
    vocab, d = emb.shape
    f8 = T.FLOAT8E4M3FN
    inputs = [h.make_tensor_value_info("input_ids", T.INT64, ["b", "s"]),
              h.make_tensor_value_info("attention_mask", T.INT64, ["b", "t"])]
    inputs += [h.make_tensor_value_info(f"past_key_values.0.{n}", f8, ["b", 1, "p", d]) for n in ("key", "value")]
    outputs = [h.make_tensor_value_info("logits", T.FLOAT, ["b", "s", vocab])]
    outputs += [h.make_tensor_value_info(f"present.0.{n}", f8, ["b", 1, "t", d]) for n in ("key", "value")]
    inits = [nh.from_array(emb, "emb"), nh.from_array(w, "w"), nh.from_array(np.array(scale, np.float32), "s"),
             h.make_tensor("zp", f8, [], [0.0]), nh.from_array(np.array([1], np.int64), "ax1"),
             nh.from_array(np.array([2], np.int64), "ax2")]
    nodes = [h.make_node("Gather", ["emb", "input_ids"], ["x"]), h.make_node("Unsqueeze", ["x", "ax1"], ["x4"])]
    for n in ("key", "value"):  # ONNX Concat takes no float8: concatenate dequantized, re-quantize (exact)
        nodes += [h.make_node("DequantizeLinear", [f"past_key_values.0.{n}", "s", "zp"], [f"past_{n}"]),
                  h.make_node("Concat", [f"past_{n}", "x4"], [f"all_{n}"], axis=2),
                  h.make_node("QuantizeLinear", [f"all_{n}", "s", "zp"], [f"present.0.{n}"])]
    nodes += [h.make_node("DequantizeLinear", ["present.0.key", "s", "zp"], ["cache"]),
              h.make_node("ReduceSum", ["cache", "ax2"], ["cache_sum"], keepdims=0),
              h.make_node("Add", ["x", "cache_sum"], ["y"]), h.make_node("MatMul", ["y", "w"], ["logits"])]
    model = h.make_model(h.make_graph(nodes, "g", inputs, outputs, inits), ir_version=10,
                         opset_imports=[h.make_opsetid("", 21)])
    onnx.save(model, out / "model.onnx")
    decoder = {"session_options": {"log_id": "onnxruntime-genai", "provider_options": []}, "filename": "model.onnx",
               "head_size": d, "hidden_size": d, "num_attention_heads": 1, "num_hidden_layers": 1,
               "num_key_value_heads": 1,
               "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                          "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"},
               "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                           "present_value_names": "present.%d.value"}}
    cfg = {"model": {"bos_token_id": 1, "context_length": 32, "eos_token_id": vocab - 1, "pad_token_id": 0,
                     "type": "llama", "vocab_size": vocab, "decoder": decoder},
           "search": {"max_length": 16, "past_present_share_buffer": False, "do_sample": False, "num_beams": 1}}
    (out / "genai_config.json").write_text(json.dumps(cfg))


def test_genai_allocates_and_carries_an_fp8_cache(tmp_path):
    from onnx_helpers import genai_greedy
    rng = np.random.default_rng(0)
    vocab, d, scale = 12, 8, 0.25
    emb = rng.normal(size=(vocab, d)).astype(np.float32)
    w = rng.normal(size=(d, vocab)).astype(np.float32)
    w[:, vocab - 1] = -100.0  # eos never wins
    _fp8_cache_model(tmp_path, emb, w, scale)
    prompt = np.array([[3, 5, 7]], np.int64)
    got = genai_greedy(tmp_path, prompt, new_tokens=6)

    def fp8(x):
        return np.clip(x / scale, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) * scale

    def reference(carry_cache: bool) -> list[int]:
        seq, out = list(prompt[0]), []
        for _ in range(6):
            cached = seq if carry_cache or not out else seq[-1:]
            nxt = int(np.argmax((emb[seq[-1]] + sum(fp8(emb[t]) for t in cached)) @ w))
            out.append(nxt)
            seq.append(nxt)
        return out
    assert reference(True) != reference(False)  # the check can tell a carried cache from a dropped one
    assert got == reference(True)
