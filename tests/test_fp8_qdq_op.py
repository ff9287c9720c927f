"""com.quark_onnx QuantizeDequantizeFp8 (custom_ops/src/qo_cpu_fp8_qdq.c): the static per-tensor FP8 activation
Q/DQ as one node, against ONNX Runtime's own QuantizeLinear(float8e4m3fn, saturate=1) + DequantizeLinear pair (the
graph's form without the library, an independent implementation), bit for bit:
  - the C kernel on every SIMD path, over a strided sweep of every float32 bit-pattern class and the rounding
    boundaries, for several scales;
  - the ORT op with 1 and 2 threads, and its ONNX-function fallback;
  - converted FP8-KV and PTPC models (-e cpu): every static FP8 pair, and every dynamic per-token one (unit scale),
    is the op, and their logits equal those of the same graphs with each op written back as the standard pair.
"""
from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from onnx_helpers import build, op_types, run_single_op, session_logits, shipped_library
from ort_library_fixture import ort_ops_library  # noqa: F401  (fixture)

SCALES = (0.0213, 1.0, 2.0 ** -10, 3.1e-5, 448.0, 1.7e-38)


def _inputs() -> np.ndarray:
    """Every 4099th float32 bit pattern (both signs, NaN and inf included), the e4m3fn rounding boundaries (each
    representable value and the midpoints between neighbours, +-1 ulp) and random values over 12 decades."""
    sweep = (np.arange(0, 2 ** 32, 4099, dtype=np.uint64).astype(np.uint32)).view(np.float32)
    codes = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    codes = np.unique(codes[np.isfinite(codes)])
    mids = (codes[:-1] + codes[1:]) / 2
    edges = np.concatenate([codes, mids, [448.0, 464.0, 480.0, 2.0 ** -6, 2.0 ** -9, 2.0 ** -10]]).astype(np.float32)
    near = np.concatenate([np.nextafter(edges, np.float32(np.inf)), np.nextafter(edges, np.float32(-np.inf)), edges])
    rng = np.random.default_rng(0)
    rand = (rng.standard_normal(200_000) * 10.0 ** rng.uniform(-8, 4, 200_000)).astype(np.float32)
    special = np.array([0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0x00000000, 0x80000000,
                        0x00000001, 0x807FFFFF, 0x7F7FFFFF, 0xFF7FFFFF], np.uint32).view(np.float32)
    return np.concatenate([sweep, near, -near, rand, special]).astype(np.float32)


def _ort_pair(x: np.ndarray, scale: float) -> np.ndarray:
    g = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], saturate=1),
         helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])], "pair",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])],
        initializer=[helper.make_tensor("s", TensorProto.FLOAT, [], [scale]),
                     helper.make_tensor("z", TensorProto.FLOAT8E4M3FN, [], [0])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a.view(np.uint32) == b.view(np.uint32)


@pytest.mark.parametrize("path", ["portable", "avx2", "avx512"])
def test_kernel_is_ort_pair_bit_for_bit(monkeypatch, path):
    from custom_ops import native
    lib = native.load_library()
    monkeypatch.setenv("QO_CPU_KERNELS", path)  # a path the CPU lacks falls back to a narrower one
    x = _inputs()
    for scale in SCALES:
        want = _ort_pair(x, scale)
        got = np.empty_like(x)
        assert lib.qo_qdq_fp8_f32(x.ctypes.data, ctypes.c_float(scale), got.ctypes.data, x.size) == 0
        bad = ~_same_bits(got, want)
        assert not bad.any(), (scale, x[bad][:5], want[bad][:5], got[bad][:5])


@pytest.mark.parametrize("threads", [1, 2])
def test_ort_op_and_fallback_are_ort_pair(ort_ops_library, threads):
    x = _inputs()[: 3 * 65536 + 123].reshape(-1, 1)  # several pool tasks and a tail
    x = np.ascontiguousarray(np.broadcast_to(x, (x.shape[0], 3)))
    for scale in (0.0213, 3.1e-5):
        want = _ort_pair(x.reshape(-1), scale).reshape(x.shape)
        for library in (ort_ops_library, None):
            got = run_single_op("QuantizeDequantizeFp8", x, {"scale": np.float32(scale)}, library, threads)
            assert _same_bits(got, want).all(), (library, scale)


# fp8_w8a8_kv: every static pair (the linears' inputs, the KV cache); ptpc_fp8: the dynamic per-token activations'
# unit-scale pairs (x / s_token, builder/ops/qdq.py fp8_dynamic_unit), one per linear input
@pytest.mark.parametrize("recipe", ["fp8_w8a8_kv", "ptpc_fp8"])
def test_fp8_model_runs_the_op_with_the_pairs_bits(quark_exports, tmp_path, recipe):
    export = quark_exports("llama_h64", recipe)
    out = build(export, tmp_path / "onnx", "cpu", "fp32")
    library = shipped_library(out)
    if library is None:
        pytest.skip("no custom-op library: the conversion wrote the standard pairs")
    ops = op_types(out)
    assert ops.get("QuantizeDequantizeFp8", 0) >= 8 and "QuantizeLinear" not in ops, ops
    model = onnx.load(str(out / "model.onnx"))
    nodes = []
    for n in model.graph.node:
        if n.op_type != "QuantizeDequantizeFp8":
            nodes.append(n)
            continue
        zero = f"{n.name}/zero"
        model.graph.initializer.append(helper.make_tensor(zero, TensorProto.FLOAT8E4M3FN, [], [0]))
        nodes += [helper.make_node("QuantizeLinear", [n.input[0], n.input[1], zero], [f"{n.name}/q"], saturate=1),
                  helper.make_node("DequantizeLinear", [f"{n.name}/q", n.input[1], zero], list(n.output))]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    pairs = out / "pairs.onnx"
    onnx.save(model, str(pairs))
    ids = np.load(export / "reference.npz")["input_ids"]

    assert _same_bits(session_logits(out / "model.onnx", ids, library), session_logits(pairs, ids, library)).all()


def test_sweep_covers_every_class():
    x = _inputs()
    assert np.isnan(x).any() and np.isinf(x).any() and (x == 0).any() and (np.abs(x) < 2.0 ** -126).any()
