"""The MIGraphX emitters on their own (builder/ops/fnuz.py, builder/quant/fp4_int8_dq.py): one-op graphs built with
the real GraphBuilder, run on ORT CPU and checked against numpy references written from Quark's formulas, and
against the MIGraphX parser rules. Covers the edges the tiny models do not reach: values beyond +-448 s (the
e4m3fnuz 240 = 480 e4m3fn saturation), -0, and FP4 layers with a single block along K (per-axis form)."""
from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T

from builder.ep_check import check_findings
from builder.ep_configs import get_ep
from builder.graph import IO_NUMPY, GraphBuilder
from builder.ops import fnuz
from builder.quant import fp4_codes
from builder.quant.fp4_int8_dq import emit_weight_dq_int8
from builder.quant.mxfp4 import Fp4Weight


@dataclass
class Ctx:
    graph: GraphBuilder
    io: str = "fp32"
    ep: object = field(default_factory=lambda: get_ep("migraphx"))
    notes: list = field(default_factory=list)

    @property
    def io_np(self):
        return IO_NUMPY[self.io]


def run(tmp_path, build, x: np.ndarray, io: str = "fp32"):
    g = GraphBuilder(tmp_path / "model.onnx.data")
    ctx = Ctx(g, io)
    io_t = {"fp32": T.FLOAT, "fp16": T.FLOAT16}[io]
    g.input("x", io_t, list(x.shape))
    y = build(ctx, "x")
    g.node("Identity", [y], "/out", outputs=["y"])
    g.output("y", io_t, None)
    g.finish(tmp_path / "model.onnx")
    assert [str(f) for f in check_findings(tmp_path / "model.onnx", get_ep("migraphx")) if f.severity == "error"] == []
    so = ort.SessionOptions()
    so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "1")
    sess = ort.InferenceSession(str(tmp_path / "model.onnx"), so, providers=["CPUExecutionProvider"])
    return sess.run(["y"], {"x": x})[0]


def quark_fp8(x, s):
    """Quark: clamp(x / s, +-448) -> float8_e4m3fn -> * s (w8a8_emulation.py)."""
    return (np.clip(x / s, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) * s).astype(np.float32)


@pytest.mark.parametrize("scale", [0.01, 0.37, 3.0])
def test_fnuz_static_qdq_equals_quark_fp8_beyond_saturation(tmp_path, scale):
    s = float(np.float32(scale))
    grid = np.concatenate([np.linspace(-600, 600, 4001), [-0.0, 0.0, 447, 448, 449, 460, 464, 470, 480, 500, 1e6]])
    x = (grid * s).astype(np.float32).reshape(1, -1)
    y = run(tmp_path, lambda ctx, v: fnuz.qdq_static(ctx, v, s, "/q"), x)
    np.testing.assert_array_equal(y, quark_fp8(x, s))


def test_fnuz_dynamic_unit_equals_quark_per_token(tmp_path):
    from builder.ops.qdq import fp8_dynamic_unit
    x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32) * np.array([[1e-3], [1.0], [50.0]],
                                                                                           np.float32)
    x[1, 5] = -0.0

    def build(ctx, v):
        u, s = fp8_dynamic_unit(ctx, v, True, "/dyn")
        return ctx.graph.op("Mul", [u, s], "/dyn/Mul")
    s = (np.abs(x).max(-1, keepdims=True) / np.float32(448)).astype(np.float32)
    np.testing.assert_array_equal(run(tmp_path, build, x), quark_fp8(x, s))  # fp8(x / s) * s, s = amax / 448


@pytest.mark.parametrize("k,group", [(64, 32), (32, 32), (48, 16), (16, 16)])
def test_fp4_int8_dequantize_is_exact_also_with_one_block(tmp_path, k, group):
    rng = np.random.default_rng(k + group)
    n = 8
    codes = rng.integers(0, 16, (n, k)).astype(np.uint8)
    scale = np.ldexp(np.float32(1), rng.integers(-6, 3, (n, k // group))).astype(np.float32)
    w = Fp4Weight(codes, scale, group)
    plan = SimpleNamespace(name="layer", node_prefix="/layer", in_features=k, out_features=n)
    x = rng.standard_normal((2, k)).astype(np.float32)
    y = run(tmp_path, lambda ctx, v: emit_weight_dq_int8(ctx, plan, v, w), x)
    dense = fp4_codes.dequantize(codes, scale, group)                 # [N, K], Quark's W
    np.testing.assert_allclose(y, x @ dense.T, rtol=0, atol=1e-5)
    model = onnx.load(str(tmp_path / "model.onnx"))
    dq = next(nd for nd in model.graph.node if nd.op_type == "DequantizeLinear")
    assert ("block_size" in {a.name for a in dq.attribute}) == (k // group > 1)
