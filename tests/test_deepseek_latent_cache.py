"""DeepSeek MLA with --extra_options mla_cache=latent (builder/ops/mla_attention.py mla_latent_attention): the
cache is MLA's compressed latent (kv_a_layernorm(c), Quark's kv_b_proj input quantization applied, and the roped
k_rot) split over genai's key and value caches [B, 1, T, (kv_lora_rank + qk_rope)/2]; kv_b_proj is absorbed into the
query and output sides.

Against Quark's own model (tests/quark_factory.py reference.npz): prompt logits, and the greedy tokens through
og.Generator with the latent cache (one token a step); the decode-step logits og returns for the latent form against
those of the materialised form (which the prompt check ties to Quark). Schemes: kv_b_proj float (Quark's deepseek_v3
template excludes self_attn: uint4 / MXFP4 experts), and, with attention quantized (local recipes below), uint4 g32
weight-only and MXFP4 weights + dynamic MXFP4 activations on kv_b_proj. Quark's FP8 KV cache (kv_b_proj's output
quantizer) is refused.
"""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from builder.errors import ConversionError
from builder.options import parse_extra_options
from onnx_helpers import build, genai_greedy, op_types, prompt_logits
from quark_factory import QuantRecipe
from test_deepseek_v3 import LAYERS, MOE_LAYERS, expected_greedy

ATTN_EXCLUDE = ("lm_head", "*mlp.gate")  # attention quantized too (Quark's template excludes *self_attn*)
MXFP4_ATTN = QuantRecipe(name="mxfp4_attn", scheme="mxfp4", exclude=ATTN_EXCLUDE)
UINT4_ATTN = QuantRecipe(name="uint4_g32_attn", scheme="uint4_wo_32", exclude=ATTN_EXCLUDE)
CASES = [("deepseek_v3", "uint4_g32"), ("deepseek_v3", "mxfp4"), ("deepseek_v3", MXFP4_ATTN),
         ("deepseek_v3", UINT4_ATTN), ("deepseek_v3_qproj_yarn", "uint4_g32"), ("deepseek_v3_qproj_yarn", MXFP4_ATTN)]
QUARK_EXPORTS = CASES + [("deepseek_v3", "fp8_w8a8_kv"), ("deepseek_v3", "mxfp4_attn_kv")]
# measured (CASES order): prompt vs Quark 1.9e-6, 9.5e-7, 4.8e-7, 1.7e-6, 1.8e-6, 6.0e-7; decode steps latent vs
# materialised 2.3e-6, 7.2e-7, 0, 1.6e-6, 1.6e-6, 0; without kv_b_proj's MXFP4 input quantization before caching
# (mxfp4_attn) the prompt diff is 1.9
BOUND = 2e-5          # max |logit diff| against Quark, the materialised form's bound (test_deepseek_v3.py)
DECODE_BOUND = 2e-5   # og decode-step logits, latent vs materialised
DECODE_STEPS = 8


def _name(recipe) -> str:
    return recipe if isinstance(recipe, str) else recipe.name


def og_step_logits(model_dir, input_ids, steps: int) -> tuple[list[int], np.ndarray]:
    """Greedy through og.Generator (its own cache): the tokens and the logits of each step [steps, vocab]."""
    import onnxruntime_genai as og

    model = og.Model(str(model_dir))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=input_ids.shape[1] + steps, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(input_ids)
    tokens, logits = [], []
    while not gen.is_done() and len(tokens) < steps:
        logits.append(np.asarray(gen.get_logits(), dtype=np.float32).reshape(-1))
        gen.generate_next_token()
        tokens.append(int(gen.get_next_tokens()[0]))
    return tokens, np.stack(logits)


def latent_cache_shapes(model_dir) -> tuple[dict, list]:
    decoder = json.loads((model_dir / "genai_config.json").read_text())["model"]
    model = onnx.load(str(model_dir / "model.onnx"), load_external_data=False)
    dims = [[d.dim_value or d.dim_param for d in i.type.tensor_type.shape.dim] for i in model.graph.input
            if i.name.startswith("past_key_values")]
    return decoder, dims


@pytest.mark.parametrize("shape,recipe", CASES, ids=[f"{s}-{_name(r)}" for s, r in CASES])
def test_latent_cache_matches_quark(quark_exports, tmp_path, shape, recipe):
    export = quark_exports(shape, recipe)
    ref = np.load(export / "reference.npz")
    ids = ref["input_ids"]
    lat = build(export, tmp_path / "latent", "cpu", "fp32", accuracy_level=1, mla_cache="latent")
    mat = build(export, tmp_path / "materialized", "cpu", "fp32", accuracy_level=1)
    ops = op_types(lat)
    assert "GroupQueryAttention" not in ops and op_types(mat)["GroupQueryAttention"] == LAYERS
    diff = float(np.abs(prompt_logits(lat, ids) - ref["logits"]).max())
    assert diff <= BOUND, diff
    assert genai_greedy(lat, ids) == expected_greedy(ref)
    tok_lat, log_lat = og_step_logits(lat, ids, DECODE_STEPS)
    tok_mat, log_mat = og_step_logits(mat, ids, DECODE_STEPS)
    assert tok_lat == tok_mat
    step_diff = float(np.abs(log_lat - log_mat).max())
    assert step_diff <= DECODE_BOUND, step_diff
    # the cache: one "kv head" of (kv_lora_rank + qk_rope_head_dim) / 2 for key and for value
    cfg, dims = latent_cache_shapes(lat)
    from builder.arch import family_for
    _f, hp = family_for(json.loads((export / "quark" / "config.json").read_text()), "config.json")
    width = (hp.kv_lora_rank + hp.qk_rope_head_dim) // 2
    assert (cfg["decoder"]["num_key_value_heads"], cfg["decoder"]["head_size"]) == (1, width)
    assert dims == [["batch_size", 1, "past_sequence_length", width]] * (2 * LAYERS)
    _cfg_m, dims_m = latent_cache_shapes(mat)
    assert dims_m[0][1:] == [hp.num_heads, "past_sequence_length", hp.head_dim]
    assert json.loads((lat / "genai_config.json").read_text())["search"]["past_present_share_buffer"] is False


@pytest.mark.parametrize("branch", ["absorbed", "materialized"])
@pytest.mark.parametrize("shape,recipe", [("deepseek_v3", MXFP4_ATTN), ("deepseek_v3_qproj_yarn", "uint4_g32")],
                         ids=["deepseek_v3-mxfp4_attn", "deepseek_v3_qproj_yarn-uint4_g32"])
def test_each_attention_branch_matches_quark(quark_exports, tmp_path, monkeypatch, shape, recipe, branch):
    """The If picks the absorbed attention for up to absorbed_max_tokens new tokens (decode) and K/V materialised
    from the cached latent above (prompts); forced here to one branch for every call (prompt and decode steps)."""
    import builder.ops.mla_attention as mla
    monkeypatch.setattr(mla, "absorbed_max_tokens", lambda hp: (1 << 40) if branch == "absorbed" else 0)
    export = quark_exports(shape, recipe)
    ref = np.load(export / "reference.npz")
    out = build(export, tmp_path / "latent", "cpu", "fp32", accuracy_level=1, mla_cache="latent")
    diff = float(np.abs(prompt_logits(out, ref["input_ids"]) - ref["logits"]).max())
    assert diff <= BOUND, diff
    assert genai_greedy(out, ref["input_ids"]) == expected_greedy(ref)


def test_absorbed_max_tokens():
    from types import SimpleNamespace

    from builder.ops.mla_attention import absorbed_max_tokens
    v3 = SimpleNamespace(kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)
    assert absorbed_max_tokens(v3) == 170  # 512 * 256 / (1024 - 256)
    assert absorbed_max_tokens(SimpleNamespace(kv_lora_rank=32, qk_nope_head_dim=40, qk_rope_head_dim=8,
                                               v_head_dim=40)) > 1 << 40  # never materialised


@pytest.mark.parametrize("recipe", ["fp8_w8a8_kv", "mxfp4_attn_kv"])
def test_fp8_kv_cache_is_refused(quark_exports, tmp_path, recipe):
    """Quark's FP8 KV cache quantizes kv_b_proj's output, which the absorbed form never computes."""
    export = quark_exports("deepseek_v3", recipe)
    with pytest.raises(ConversionError, match="FP8 KV cache") as err:
        build(export, tmp_path / "latent", "cpu", "fp32", mla_cache="latent")
    assert "mla_cache" in str(err.value)
    assert not (tmp_path / "latent").exists()
    if recipe == "fp8_w8a8_kv":  # kv_b_proj itself float there: without the FP8 KV cache the latent form applies
        out = build(export, tmp_path / "off", "cpu", "fp32", mla_cache="latent", kv_cache="off")
        assert "GroupQueryAttention" not in op_types(out)


def test_other_eps_refused_cuda_built(quark_exports, tmp_path):
    export = quark_exports("deepseek_v3", "uint4_g32")
    for ep in ("rocm", "migraphx"):
        with pytest.raises(ConversionError, match="built for cpu, cuda only"):
            build(export, tmp_path / ep, ep, "fp16", mla_cache="latent")
    ops = op_types(build(export, tmp_path / "cuda", "cuda", "fp16", mla_cache="latent"))
    assert "GroupQueryAttention" not in ops and ops["If"] == LAYERS + MOE_LAYERS  # attention + routed experts


def test_bad_value_is_refused():
    with pytest.raises(ConversionError, match="unknown mla_cache value") as err:
        parse_extra_options(["mla_cache=compressed"])
    assert "materialized, latent" in str(err.value)


def test_fp16_io_latent_cache(quark_exports, tmp_path):
    """fp16 io: the latent cache in fp16, near Quark as the materialised fp16 form is (test_deepseek_v3.py)."""
    export = quark_exports("deepseek_v3", "uint4_g32")
    ref = np.load(export / "reference.npz")
    out = build(export, tmp_path / "latent", "cpu", "fp16", accuracy_level=1, mla_cache="latent")
    diff = float(np.abs(prompt_logits(out, ref["input_ids"]) - ref["logits"]).max())
    assert diff <= 2e-2, diff  # measured 4.5e-3 (the materialised fp16 form: 4.5e-3 too)
    assert genai_greedy(out, ref["input_ids"]) == expected_greedy(ref)
    _cfg, dims = latent_cache_shapes(out)
    assert dims[0] == ["batch_size", 1, "past_sequence_length", 24]


def test_left_padded_batch(quark_exports, tmp_path):
    """Batch of 2 with the first row left-padded by 3: its logits at the valid positions, and one decode step with
    the latent cache, equal those of the unpadded sequence alone (which test_latent_cache_matches_quark ties to
    Quark); the other row equals the full prompt alone. Measured 1.1e-6 (prompt), 9.5e-7 (decode step), 0."""
    import onnxruntime as ort
    export = quark_exports("deepseek_v3", "uint4_g32")
    ids = np.load(export / "reference.npz")["input_ids"].astype(np.int64)
    out = build(export, tmp_path / "latent", "cpu", "fp32", accuracy_level=1, mla_cache="latent")
    sess = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    outputs = [o.name for o in sess.get_outputs()]

    def run(inp, mask, past=None):
        feeds = {"input_ids": inp, "attention_mask": mask}
        for i in sess.get_inputs():
            if i.name.startswith("past"):
                feeds[i.name] = past[i.name] if past else np.zeros((inp.shape[0], 1, 0, i.shape[3]), np.float32)
        res = dict(zip(outputs, sess.run(outputs, feeds)))
        return res["logits"], {n.replace("present", "past_key_values"): v for n, v in res.items() if n != "logits"}

    pad = 3
    short = ids[:, pad:]
    batch = np.concatenate([np.concatenate([np.zeros((1, pad), np.int64), short], 1), ids])
    mask = np.ones_like(batch)
    mask[0, :pad] = 0
    logits, past = run(batch, mask)
    alone, past_alone = run(short, np.ones_like(short))
    assert float(np.abs(logits[0, pad:] - alone[0]).max()) <= 1e-5
    assert float(np.abs(logits[1] - run(ids, np.ones_like(ids))[0][0]).max()) <= 1e-5
    step = np.array([[5], [5]], np.int64)
    logits, _ = run(step, np.concatenate([mask, np.ones((2, 1), np.int64)], 1), past)
    alone, _ = run(step[:1], np.ones((1, short.shape[1] + 1), np.int64), past_alone)
    assert float(np.abs(logits[0] - alone[0]).max()) <= 1e-5
