"""Every registered architecture has a tiny-model shape that the end-to-end tests convert and compare."""
import test_deepseek_v3
from builder.arch import FAMILIES
from quark_factory import SHAPES
from test_int_weight_models import CASES

# modules whose QUARK_EXPORTS are compared with Quark's own model (logits and og.Generator greedy tokens)
END_TO_END_MODULES = (test_deepseek_v3,)


def test_every_registered_architecture_is_tested_end_to_end():
    cases = list(CASES) + [case for module in END_TO_END_MODULES for case in module.QUARK_EXPORTS]
    tested = {SHAPES[shape].model_class_name for shape, _recipe in cases}
    missing = set(FAMILIES) - tested
    assert not missing, f"add a tiny shape for {sorted(missing)} to tests/quark_factory.py SHAPES and to CASES"
