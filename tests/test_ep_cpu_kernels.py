"""The CPU rules say what onnxruntime's CPU EP really lacks: every graph a CPU error rule flags fails to get a session,
and every graph it passes gets one (onnxruntime as installed; the rules were measured on 1.32)."""
from __future__ import annotations

import onnxruntime as ort
import pytest
from ep_graph_kit import MS, dequantize, gqa, matmul_nbits, model, vi
from onnx import TensorProto as T
from onnx import helper as h

from builder.ep_check import check_findings
from builder.ep_configs import get_ep


def _fp8_weight_matmul():
    node = h.make_node("MatMulBlockQuantizedFp8Weight", ["A", "B", "S"], ["Y"], "/fp8", domain=MS, block_size=16)
    from ep_graph_kit import tensor
    return model([node], [vi("A", T.FLOAT16, [1, 32])], [vi("Y", T.FLOAT16, [1, 16])],
                 [tensor("B", T.FLOAT8E4M3FN, [16, 32]), tensor("S", T.FLOAT, [16, 2])])


CASES = {
    "matmulnbits-fp32-4bit": (lambda: matmul_nbits(), True),
    "matmulnbits-fp16-8bit-zp": (lambda: matmul_nbits(io=T.FLOAT16, bits=8, zero_points="packed-1d"), True),
    "matmulnbits-bf16": (lambda: matmul_nbits(io=T.BFLOAT16), False),
    "gqa-fp32": (lambda: gqa(io=T.FLOAT), True),
    "gqa-fp16": (lambda: gqa(io=T.FLOAT16), True),
    "gqa-bf16": (lambda: gqa(io=T.BFLOAT16), False),
    "gqa-int8-cache": (lambda: gqa(cache=T.INT8, kv_scales=True, k_quant_type="PER_TENSOR",
                                   v_quant_type="PER_TENSOR", kv_cache_bit_width=8), True),
    "gqa-fp8-cache": (lambda: gqa(cache=T.FLOAT8E4M3FN, kv_scales=True, k_quant_type="PER_TENSOR",
                                  v_quant_type="PER_TENSOR", kv_cache_bit_width=8), False),
    "dq-fp8": (lambda: dequantize(), True),
    "dq-int4-blocked": (lambda: dequantize(x_type=T.INT4, block=4), True),
    "dq-fp4-blocked": (lambda: dequantize(x_type=T.FLOAT4E2M1, block=4), False),
    "dq-bf16-scale": (lambda: dequantize(scale_type=T.BFLOAT16), False),
    "fp8-weight-matmul": (_fp8_weight_matmul, False),
}


def _session_ok(m) -> bool:
    try:
        ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        return True
    except Exception as exc:  # noqa: BLE001 - any failure to build the session means "no kernel"
        assert "NOT_IMPLEMENTED" in str(exc) or "kernel" in str(exc), exc
        return False


@pytest.mark.parametrize("case", sorted(CASES))
def test_cpu_rules_match_onnxruntime(case):
    make, runs = CASES[case]
    m = make()
    errors = [f for f in check_findings(m, get_ep("cpu")) if f.severity == "error"]
    assert _session_ok(m) is runs, f"onnxruntime {ort.__version__} CPU: expected session ok={runs}"
    assert (not errors) is runs, [str(f) for f in errors]
