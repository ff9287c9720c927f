"""`inspect` / the conversion log name why a MoE block stays dense: the first projection whose experts do not stack
(builder/ops/routed_experts.py why_not), not a guess at the usual causes."""
from types import SimpleNamespace as NS

from builder.ops import routed_experts
from builder.quant.float_linear import FloatLinear
from builder.quant.fp8_w8a8 import Fp8W8A8
from builder.quant.int_weight_only import IntWeightOnly


def _w(dtype="uint4", qscheme="per_group", group_size=32):
    return NS(dtype=dtype, qscheme=qscheme, group_size=group_size)


def _plan(name, scheme, spec=None, k=64, n=64):
    return NS(name=name, scheme=scheme, spec=spec, in_features=k, out_features=n)


def _experts(make, count=3):
    return [tuple(make(e, j) for j in range(3)) for e in range(count)]


def test_stacking_experts_have_no_reason():
    experts = _experts(lambda e, j: _plan(f"e{e}.p{j}", IntWeightOnly, NS(weight=[_w()])))
    assert routed_experts.why_not(experts) is None and routed_experts.applies(experts)


def test_mixed_quantization_names_both_experts():
    experts = _experts(lambda e, j: _plan(f"e{e}.p{j}", FloatLinear if e == 2 else IntWeightOnly,
                                          NS(weight=[_w()])))
    assert routed_experts.why_not(experts) == ("e0.p0 and e2.p0 differ in quantization "
                                               "(int/uint4/per_group/32 [64, 64] vs float [64, 64])")


def test_odd_width_of_a_4bit_weight():
    experts = _experts(lambda e, j: _plan(f"e{e}.p{j}", IntWeightOnly, NS(weight=[_w()]), n=63 if j == 1 else 64))
    assert routed_experts.why_not(experts) == "e0.p1: an odd output width (63) of its 4-bit packed weight"


def test_dynamic_fp8_activations():
    a = NS(is_dynamic=True, qscheme="per_tensor")
    spec = NS(weight=[_w("fp8_e4m3", "per_tensor", None)], input_tensors=[a], output_tensors=[])
    experts = _experts(lambda e, j: _plan(f"e{e}.p{j}", Fp8W8A8, spec))
    assert routed_experts.why_not(experts) == "e0.p0: dynamic per-tensor FP8 activations"


def test_shapes_that_differ():
    experts = _experts(lambda e, j: _plan(f"e{e}.p{j}", IntWeightOnly, NS(weight=[_w()]),
                                          k=128 if (e, j) == (1, 2) else 64))
    assert routed_experts.why_not(experts) == ("e0.p2 and e1.p2 differ in shape "
                                               "(int/uint4/per_group/32 [64, 64] vs int/uint4/per_group/32 [64, 128])")
