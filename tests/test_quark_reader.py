"""Config parsing and per-layer resolution, on dicts only (the order Quark applies at quantization time)."""
import copy

import pytest

from builder.errors import ConversionError
from builder.quark_reader import parse_quant_config
from synthetic_export import QUANT_CONFIG, WEIGHT_SPEC


def spec(**overrides):
    s = dict(WEIGHT_SPEC)
    s.update(overrides)
    return {"weight": s, "input_tensors": None, "output_tensors": None, "bias": None, "target_device": None}


def config(**top):
    q = copy.deepcopy(QUANT_CONFIG)
    q.update(top)
    return q


def group(cfg, layer):
    s = parse_quant_config(cfg, "config.json").resolve(layer)
    return None if s is None else s.weight[0].group_size


def test_global_applies_and_lm_head_excluded():
    q = parse_quant_config(config(), "config.json")
    assert q.resolve("model.layers.0.mlp.down_proj").weight[0].dtype == "uint4"
    assert q.resolve("lm_head") is None


def test_exact_key_beats_pattern_and_first_pattern_wins():
    cfg = config(layer_quant_config={"*down_proj": spec(group_size=16), "*proj": spec(group_size=64),
                                     "model.layers.0.mlp.down_proj": spec(group_size=128)})
    assert group(cfg, "model.layers.0.mlp.down_proj") == 128
    assert group(cfg, "model.layers.1.mlp.down_proj") == 16
    assert group(cfg, "model.layers.1.mlp.up_proj") == 64


def test_layer_type_then_global():
    cfg = config(layer_type_quant_config={"Linear": spec(group_size=16)})
    assert group(cfg, "model.layers.0.mlp.up_proj") == 16


def test_exclude_patterns_and_exact_names():
    cfg = config(exclude=["*mlp.down_proj", "model.layers.1.self_attn.q_proj"])
    assert group(cfg, "model.layers.3.mlp.down_proj") is None
    assert group(cfg, "model.layers.1.self_attn.q_proj") is None
    assert group(cfg, "model.layers.11.self_attn.q_proj") == 32  # exact name, not a prefix match


def test_exclude_beats_layer_config_but_kv_output_survives():
    out = {"dtype": "fp8_e4m3", "qscheme": "per_tensor", "symmetric": True, "is_dynamic": False}
    kv = {"weight": None, "input_tensors": None, "output_tensors": out, "bias": None, "target_device": None}
    cfg = config(exclude=["model.layers.0.self_attn.k_proj"], kv_cache_quant_config={"*k_proj": kv},
                 layer_quant_config={"*k_proj": spec(group_size=16)})
    s = parse_quant_config(cfg, "config.json").resolve("model.layers.0.self_attn.k_proj")
    assert s.weight == () and s.output_tensors[0].dtype == "fp8_e4m3"


def test_legacy_keys_accepted():
    w = dict(WEIGHT_SPEC)
    w["dynamic"] = w.pop("is_dynamic")
    w["axis"] = w.pop("ch_axis")
    cfg = config(global_quant_config={"weight": w, "input_tensors": None, "output_tensors": None, "bias": None})
    assert parse_quant_config(cfg, "c").global_spec.weight[0].ch_axis == -1


@pytest.mark.parametrize("mutate,field,value", [
    (lambda q: q["global_quant_config"]["weight"].update(dtype="int5"), "global_quant_config.weight.dtype", "int5"),
    (lambda q: q["global_quant_config"]["weight"].update(qscheme="per_row"), "global_quant_config.weight.qscheme",
     "per_row"),
    (lambda q: q["export"].update(pack_method="zigzag"), "export.pack_method", "zigzag"),
    (lambda q: q["export"].update(weight_format="half"), "export.weight_format", "half"),
    (lambda q: q.update(quant_method="awq"), "quant_method", "awq"),
    (lambda q: q.update(surprise=1), "surprise", 1),
    (lambda q: q["global_quant_config"]["weight"].update(mystery=True), "global_quant_config.weight.mystery", True),
    (lambda q: q.update(algo_config=[{"name": "quarot"}]), "algo_config[0].name", "quarot"),
])
def test_strict_rejections_name_field_and_value(mutate, field, value):
    q = config()
    mutate(q)
    with pytest.raises(ConversionError) as err:
        parse_quant_config(q, "some/config.json")
    line = err.value.one_line()
    assert "some/config.json" in line and f"quantization_config.{field}={value!r}" in line
    assert "\n" not in line
