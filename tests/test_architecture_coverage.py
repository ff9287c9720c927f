"""Every registered architecture has a tiny-model shape that the end-to-end tests convert and compare with Quark's
own model (logits and greedy tokens through og.Generator); a MoE family (module flag MOE_FAMILY) needs that for
4-bit integer AND MXFP4 experts at least.

END_TO_END: the test modules whose CASES ((SHAPES key, RECIPES key), ...) all go through such a comparison."""
import importlib

from builder.arch import FAMILIES
from quark_factory import RECIPES, SHAPES

END_TO_END = ("test_int_weight_models", "test_mixtral", "test_qwen3_moe", "test_gpt_oss", "test_deepseek_v3")
MOE_REQUIRED = {"4-bit integer": ("int4", "uint4"), "MXFP4": ("mxfp4",)}


def _tested_cases() -> set[tuple[str, str]]:
    cases = set()
    for name in END_TO_END:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError:  # a family's test module that is not there: its families count as untested
            continue
        cases |= set(getattr(module, "CASES", None) or module.QUARK_EXPORTS)
    return cases


def _weight_dtypes(recipe: str) -> set[str]:
    scheme = RECIPES[recipe].scheme
    return {prefix for prefixes in MOE_REQUIRED.values() for prefix in prefixes if scheme.startswith(prefix)}


def test_every_registered_architecture_is_tested_end_to_end():
    tested = {SHAPES[shape].model_class_name for shape, _recipe in _tested_cases()}
    missing = set(FAMILIES) - tested
    assert not missing, f"add a tiny shape for {sorted(missing)} to tests/quark_factory.py SHAPES and to CASES"


def test_every_moe_family_is_tested_with_4bit_and_mxfp4_experts():
    schemes: dict[str, set[str]] = {}
    for shape, recipe in _tested_cases():
        schemes.setdefault(SHAPES[shape].model_class_name, set()).update(_weight_dtypes(recipe))
    for arch, module in FAMILIES.items():
        if not getattr(module, "MOE_FAMILY", False):
            continue
        for label, prefixes in MOE_REQUIRED.items():
            assert set(prefixes) & schemes.get(arch, set()), f"{arch}: no end-to-end test with {label} experts"


def test_moe_families_are_flagged(tmp_path):
    """A family with experts (a per-expert linear in its layer list) must carry MOE_FAMILY."""
    from safetensors.numpy import save_file
    save_file({}, str(tmp_path / "model.safetensors"))  # families that look at tensor names find none
    for arch, module in FAMILIES.items():
        has_experts = any(".experts." in name for name in _linear_names(module, arch, tmp_path / "config.json"))
        assert has_experts == bool(getattr(module, "MOE_FAMILY", False)), arch


def _linear_names(module, arch: str, config_file) -> list[str]:
    from builder.arch import family_for
    shape = next(s for s, spec in SHAPES.items() if spec.model_class_name == arch)
    cfg = SHAPES[shape].hf_config().to_dict()
    cfg["architectures"] = [arch]
    _family, hp = family_for(cfg, str(config_file))
    return [name for name, *_ in module.linear_layers(hp)]
