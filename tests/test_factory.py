"""The test fixtures themselves: Quark exports, their references and the independent decoder agree."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest

from independent_decode import dequantize_export, load_reference_model, unpack_int4
from quark_factory import RECIPES, REFERENCE_KEYS, SHAPES, combo_problem
from tiny_tokenizer import write_tokenizer

# every recipe on the base shape, plus each other shape with a few recipes that fit it
COMBOS = [("llama_h64", r) for r in RECIPES] + [
    ("llama_h64_bf16", "uint4_g64"), ("llama_h64_bf16", "int4_g64"), ("llama_h64_bf16", "fp8_w8a8"),
    ("llama_h64_bf16", "nvfp4"), ("llama_h64_bf16", "int8_wo_g64"),  # mxfp4: Quark CPU needs fp32
    ("llama_h64_fp16", "uint4_g64"), ("llama_h64_fp16", "uint4_per_channel"),
    ("llama_h96", "uint4_g32"), ("llama_h96", "int4_per_channel"), ("llama_h96", "int8_wo_g32"),
    ("llama_h96", "nvfp4"), ("llama_h96", "mxfp4"),
    ("llama_mha", "uint4_g64"), ("llama_bias", "uint4_g64"),
    ("qwen2", "uint4_g64"), ("qwen2", "int8_w8a8"), ("mistral", "uint4_g32_order"),
]
COMBO_IDS = [f"{s}-{r}" for s, r in COMBOS]
QUARK_EXPORTS = COMBOS


def _is_weight_only(export) -> bool:
    return json.loads((export / "info.json").read_text())["checks"]["weight_only"]


@pytest.fixture(scope="module")
def exports(quark_exports):
    return dict(zip(COMBOS, quark_exports.many(COMBOS)))


@pytest.mark.parametrize("combo", COMBOS, ids=COMBO_IDS)
def test_independent_decode_equals_quark_dequant(exports, combo):
    """Exactly equal; for bf16/fp16 models Quark holds the dequantized weight in the model dtype, so our exact
    fp32 product must round to it."""
    import torch

    export = exports[combo]
    ours = dequantize_export(export / "quark")
    model_dtype = getattr(torch, SHAPES[combo[0]].dtype)
    with np.load(export / "quark_dequant.npz") as quark:
        assert sorted(ours) == sorted(quark.files)
        for name in quark.files:
            rounded = torch.from_numpy(ours[name]).to(model_dtype).float().numpy()
            np.testing.assert_array_equal(rounded, quark[name], err_msg=f"{combo} {name}")


@pytest.mark.parametrize("combo", COMBOS, ids=COMBO_IDS)
def test_reference_npz(exports, combo):
    spec = SHAPES[combo[0]]
    with np.load(exports[combo] / "reference.npz") as ref:
        assert set(ref.files) == set(REFERENCE_KEYS)
        t = ref["input_ids"].shape[1]
        assert ref["logits"].shape == ref["float_logits"].shape == (1, t, spec.vocab)
        assert ref["logits"].dtype == np.float32 and ref["input_ids"].dtype == np.int64
        assert ref["greedy"].shape == ref["greedy_margins"].shape == ref["dequant_greedy"].shape == (16,)
        assert (ref["input_ids"] > 2).all()
        # quantization changed something, but not everything
        diff = np.abs(ref["logits"] - ref["float_logits"]).max()
        assert 0 < diff < np.abs(ref["float_logits"]).max()


@pytest.mark.parametrize("combo", COMBOS, ids=COMBO_IDS)
def test_reference_model_on_decoded_weights(exports, combo):
    """fp32 model on independently decoded weights reproduces the fp32 dequant reference; for weight-only fp32
    models that is also exactly what Quark's frozen model computes."""
    import torch

    export = exports[combo]
    model = load_reference_model(export / "quark")
    with np.load(export / "reference.npz") as ref:
        with torch.no_grad():
            logits = model(input_ids=torch.from_numpy(ref["input_ids"]), use_cache=False).logits.numpy()
        # dequant_logits used Quark's weights, rounded to the model dtype (see the test above)
        atol = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 2e-2}[SHAPES[combo[0]].dtype]
        np.testing.assert_allclose(logits, ref["dequant_logits"], atol=atol, rtol=0)
        if _is_weight_only(export) and SHAPES[combo[0]].dtype == "float32":
            np.testing.assert_allclose(logits, ref["logits"], atol=2e-5, rtol=0)


def test_cache_is_reused(quark_exports):
    quark_exports("llama_h64", "uint4_g64")
    t = time.time()
    again = quark_exports("llama_h64", "uint4_g64")
    assert time.time() - t < 1.0
    assert (again / "info.json").is_file()


def test_first_request_makes_every_declared_export_in_one_call(monkeypatch, tmp_path):
    """conftest batches the QUARK_EXPORTS of all collected modules into the first ensure_exports call."""
    import types

    import conftest

    calls = []

    refs = []

    def fake_ensure(root, items, importer_refs=()):
        calls.append([r.name for _, r in items])
        refs.append([r.name for _, r in importer_refs])
        return [root / r.name for _, r in items]

    monkeypatch.setattr(conftest, "ensure_exports", fake_ensure)
    modules = [types.SimpleNamespace(QUARK_EXPORTS=[("llama_h64", "uint4_g64"), ("llama_h64", "mxfp4")]),
               types.SimpleNamespace(QUARK_EXPORTS=[("llama_h64", "mxfp4")], QUARK_IMPORTER_REFERENCES=[
                   ("llama_h64", "mxfp4")]), types.SimpleNamespace()]
    exports = conftest.QuarkExports(tmp_path, conftest.declared_exports(modules),
                                    conftest.declared_exports(modules, "QUARK_IMPORTER_REFERENCES"))
    assert exports("llama_h64", "mxfp4") == tmp_path / "mxfp4"
    assert calls == [["uint4_g64", "mxfp4"]] and refs == [["mxfp4"]]  # importer references in the same job
    assert exports.many([("llama_h64", "uint4_g64")]) == [tmp_path / "uint4_g64"]
    assert calls[1:] == [["uint4_g64"]] and refs[1:] == [[]]  # only a cache lookup from now on
    with pytest.warns(UserWarning, match="not in any collected module"):
        exports("llama_h64", "nvfp4")


def test_expected_layouts(exports):
    """Spot checks of what the recipes asked for, read from the safetensors headers."""
    from independent_decode import read_config, safetensors_index

    def index(recipe, shape="llama_h64"):
        return safetensors_index(exports[(shape, recipe)] / "quark")

    assert index("uint4_g64")["model.layers.0.mlp.down_proj.weight"][:2] == ("I32", [128, 8])
    assert index("uint4_per_channel")["model.layers.0.mlp.down_proj.weight"][:2] == ("I32", [64, 16])
    assert index("int8_wo_g64")["model.layers.0.mlp.down_proj.weight"][:2] == ("I8", [128, 64])
    assert index("uint8_wo_per_channel")["model.layers.0.mlp.down_proj.weight"][:2] == ("U8", [64, 128])
    assert index("uint4_g64_fake")["model.layers.0.mlp.down_proj.weight"][:2] == ("F32", [64, 128])
    assert index("lmhead_g32")["lm_head.weight_scale"][1] == [2, 256]
    assert index("down_proj_wildcard_g32")["model.layers.1.mlp.down_proj.weight_scale"][1] == [4, 64]
    excluded = index("excluded_layers")
    assert "model.layers.0.mlp.down_proj.weight_scale" not in excluded
    assert "model.layers.1.mlp.down_proj.weight_scale" in excluded and "lm_head.weight_scale" not in excluded
    tied = exports[("llama_h64", "tied_lmhead")] / "quark"
    assert read_config(tied)["tie_word_embeddings"] is True and "lm_head.weight_scale" in safetensors_index(tied)
    assert "model.layers.0.self_attn.q_proj.bias" in index("uint4_g64", "qwen2")
    attn = index("fp8_w8a8_kv_attn")
    assert "model.layers.0.self_attn.prob_output_scale" in attn and "model.layers.0.self_attn.k_proj.output_scale" in attn
    assert index("uint4_g64", "llama_h64_bf16")["model.layers.0.mlp.down_proj.weight_scale"][0] == "BF16"


def test_unpack_int4_order_and_sign_matter():
    """The decoder can fail: the wrong pack order or signedness gives different values."""
    import torch

    values = torch.arange(16, dtype=torch.int64).reshape(1, 16) % 16
    order_map = (0, 2, 4, 6, 1, 3, 5, 7)
    words = torch.zeros(1, 2, dtype=torch.int64)
    for c in range(2):
        for slot, elem in enumerate(order_map):
            words[0, c] |= values[0, 8 * c + elem] << (4 * slot)
    packed = torch.from_numpy(words.numpy().astype(np.uint32).view(np.int32))
    assert unpack_int4(packed, "reorder", False, 16).tolist() == values.tolist()
    assert unpack_int4(packed, "order", False, 16).tolist() != values.tolist()
    signed = unpack_int4(packed, "reorder", True, 16)
    assert signed.tolist()[0][8:] == list(range(-8, 0))


def test_tokenizer_loads_in_hf_and_genai(tmp_path):
    og = pytest.importorskip("onnxruntime_genai")
    from transformers import AutoTokenizer

    for vocab in (256, 320):
        d = write_tokenizer(tmp_path / str(vocab), vocab)
        # og.Tokenizer(dir) needs a genai_config.json next to the tokenizer files
        (d / "genai_config.json").write_text(json.dumps({"model": {
            "type": "llama", "vocab_size": vocab, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
            "context_length": 256, "decoder": {"filename": "model.onnx", "head_size": 16, "hidden_size": 64,
                                               "num_attention_heads": 4, "num_key_value_heads": 2,
                                               "num_hidden_layers": 2, "inputs": {}, "outputs": {}}}}))
        hf = AutoTokenizer.from_pretrained(str(d))
        tok = og.Tokenizer(str(d))
        text = "hello world, the end!"
        ids = [int(i) for i in tok.encode(text)]
        assert ids == hf(text).input_ids
        assert max(ids) < vocab and len(hf) == vocab
        assert tok.decode(ids) == text
        stream = tok.create_stream()
        assert "".join(stream.decode(i) for i in ids) == text
        assert list(tok.eos_token_ids) == [2]


def test_combo_problem_flags_group_sizes():
    assert combo_problem(SHAPES["llama_h96"], RECIPES["uint4_g64"]) is not None
    assert combo_problem(SHAPES["llama_h96"], RECIPES["uint4_g32"]) is None


def test_committed_example_matches_its_reference():
    """examples/tiny-llama-uint4-quark decodes to weights whose fp32 forward matches the stored reference."""
    import torch

    from conftest import REPO_ROOT

    example = REPO_ROOT / "examples" / "tiny-llama-uint4-quark"
    model = load_reference_model(example)
    with np.load(example / "reference.npz") as ref:
        with torch.no_grad():
            logits = model(input_ids=torch.from_numpy(ref["input_ids"]), use_cache=False).logits.numpy()
        np.testing.assert_allclose(logits, ref["dequant_logits"], atol=2e-2, rtol=0)  # bf16 model, see above
        assert np.abs(logits - ref["float_logits"]).max() > 0.05  # it is really quantized
    assert combo_problem(SHAPES["llama_h64_bf16"], RECIPES["mxfp4"]) is not None
