"""Every registered architecture has a tiny-model shape that the end-to-end tests convert and compare."""
from builder.arch import FAMILIES
from quark_factory import SHAPES
from test_int_weight_models import CASES


def test_every_registered_architecture_is_tested_end_to_end():
    tested = {SHAPES[shape].model_class_name for shape, _recipe in CASES}
    missing = set(FAMILIES) - tested
    assert not missing, f"add a tiny shape for {sorted(missing)} to tests/quark_factory.py SHAPES and to CASES"
