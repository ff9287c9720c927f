"""com.quark_onnx QuantizeDequantizeMxfp4 (custom_ops/src/qo_cpu_fp4_act.c): Quark's dynamic MXFP4 activation
fake quantization ("even" block scales) as one node, bit for bit against
  - the PyTorch emulation of Quark 0.13's code paths (tests/test_mxfp4_activation.py, independent of builder/ and
    custom_ops/), on every SIMD path of the C kernel;
  - the standard-op subgraph it replaces (builder/ops/mx_activation.py), in ORT with 1 and 2 threads, and its own
    ONNX-function fallback;
  - converted MXFP4 and NVFP4 models (-e cpu): every activation emulation is the op, and their logits equal those
    of the same graphs with the op's function inlined.
An MXFP4 block with an infinity comes out NaN in both forms, an NVFP4 one finite in both (its scale saturates)."""
from __future__ import annotations

import ctypes

import numpy as np
import onnx
import onnx.inliner
import pytest
import torch

from builder.ops.mx_activation import Fp4ActivationSpec
from onnx_helpers import build, op_types, run_single_op, session_logits, shipped_library
from ort_library_fixture import ort_ops_library  # noqa: F401  (fixture)
from test_mxfp4_activation import awkward_inputs, run_activation_graph, torch_mxfp4_qdq, torch_nvfp4_qdq

S2 = (1e-3, 0.0123, 3.0)  # input_scale_2 values (test_mxfp4_activation's), the last making many block scales 0


def _inputs() -> np.ndarray:
    """awkward_inputs (ties, zero / subnormal blocks, maxima around 1.75 * 2^E) plus blocks at the float32 range's
    ends and random blocks over 60 decades, [rows, 128]."""
    rng = np.random.default_rng(3)
    x = awkward_inputs(32).reshape(-1, 128)
    wide = (rng.standard_normal((400, 128)) * 10.0 ** rng.uniform(-30, 30, (400, 1))).astype(np.float32)
    ends = np.stack([np.full(128, 3.0e38, np.float32), np.full(128, -1.0e-45, np.float32),
                     np.linspace(-3.4e38, 3.4e38, 128, dtype=np.float32), np.full(128, -0.0, np.float32)])
    return np.concatenate([x, wide, ends]).astype(np.float32)


def _same_bits(a, b) -> bool:
    return bool(np.array_equal(np.asarray(a, np.float32).view(np.uint32), np.asarray(b, np.float32).view(np.uint32)))


@pytest.mark.parametrize("path", ["portable", "avx2", "avx512"])
def test_kernel_is_quarks_emulation(monkeypatch, path):
    from custom_ops import native
    lib = native.load_library()
    monkeypatch.setenv("QO_CPU_KERNELS", path)
    x = _inputs()
    got = np.empty_like(x)
    assert lib.qo_qdq_mxfp4_act_f32(x.ctypes.data, got.ctypes.data, x.size, 0) == 0
    want = torch_mxfp4_qdq(torch.from_numpy(x)).numpy()
    # equal values; the zeros' signs aside: the emulation's torch.sign drops a -0 that the subgraph (and the kernel,
    # bit for bit with it: the test below) keeps
    assert np.array_equal(got, want), np.argwhere(got != want)[:5]
    assert np.signbit(got[x == 0]).tolist() == np.signbit(x[x == 0]).tolist()
    assert lib.qo_qdq_mxfp4_act_f32(x.ctypes.data, got.ctypes.data, 31, 0) != 0  # not whole blocks


@pytest.mark.parametrize("path", ["portable", "avx2", "avx512"])
def test_nvfp4_kernel_is_quarks_emulation(monkeypatch, path):
    from custom_ops import native
    lib = native.load_library()
    monkeypatch.setenv("QO_CPU_KERNELS", path)
    x = _inputs()
    got = np.empty_like(x)
    for s2 in S2:
        assert lib.qo_qdq_nvfp4_act_f32(x.ctypes.data, ctypes.c_float(s2), got.ctypes.data, x.size) == 0
        want = torch_nvfp4_qdq(torch.from_numpy(x), s2).numpy()
        assert np.array_equal(got, want), (s2, np.argwhere(got != want)[:5])
    assert lib.qo_qdq_nvfp4_act_f32(x.ctypes.data, ctypes.c_float(1.0), got.ctypes.data, 15) != 0


@pytest.mark.parametrize("path", ["portable", "avx2", "avx512"])
def test_nvfp4_rows_kernel_is_quarks_emulation_per_row(monkeypatch, path):
    """qo_qdq_nvfp4_act_rows_f32: row r of Y is row x_rows[r] of X with input_scale_2[s_rows[r]] (the routed
    experts' form): each row equal to Quark's emulation with its own scale."""
    from custom_ops import native
    lib = native.load_library()
    monkeypatch.setenv("QO_CPU_KERNELS", path)
    x = _inputs()                                               # [rows, 128]
    rng = np.random.default_rng(5)
    scales = np.array(S2 + (0.5, 2.0 ** -20), np.float32)
    rows = 3 * len(x)                                           # more rows than X: rows repeat (several pool tasks)
    x_rows = rng.integers(0, len(x), rows).astype(np.int64)
    s_rows = rng.integers(0, len(scales), rows).astype(np.int64)
    got = np.empty((rows, x.shape[1]), np.float32)
    assert lib.qo_qdq_nvfp4_act_rows_f32(x.ctypes.data, x_rows.ctypes.data, scales.ctypes.data, s_rows.ctypes.data,
                                         got.ctypes.data, rows, x.shape[1]) == 0
    for si, s2 in enumerate(scales):
        sel = s_rows == si
        want = torch_nvfp4_qdq(torch.from_numpy(x[x_rows[sel]]), float(s2)).numpy()
        assert np.array_equal(got[sel], want), (s2, np.argwhere(got[sel] != want)[:5])
    assert lib.qo_qdq_nvfp4_act_rows_f32(x.ctypes.data, x_rows.ctypes.data, scales.ctypes.data, s_rows.ctypes.data,
                                         got.ctypes.data, rows, 120) != 0  # K not whole blocks


def _per_expert_subgraph(tmp_path, x: np.ndarray, s2: np.ndarray) -> np.ndarray:
    """builder/ops/mx_activation.py's per-expert NVFP4 subgraph (standard ops: the test context has no EP) on x
    [..., K] against the per-row scales s2 [..., 1]."""
    import onnxruntime as ort
    from builder.graph import GraphBuilder
    from builder.ops.mx_activation import emit_nvfp4_activation_per_expert
    from onnx import TensorProto
    from test_mxfp4_activation import _Ctx
    g = GraphBuilder(tmp_path / "rows.onnx.data")
    ctx = _Ctx(g, "fp32")
    y = emit_nvfp4_activation_per_expert(ctx, g.input("x", TensorProto.FLOAT, list(x.shape)),
                                         g.input("s2", TensorProto.FLOAT, list(s2.shape)), "/t")
    assert "QuantizeDequantizeNvfp4" not in {n.op_type for n in g.nodes}
    g.node("Identity", [y], "/t/out", outputs=["y"])
    g.output("y", TensorProto.FLOAT, None)
    g.finish(tmp_path / "rows.onnx")
    sess = ort.InferenceSession(str(tmp_path / "rows.onnx"), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x, "s2": s2})[0]


@pytest.mark.parametrize("threads", [1, 2])
def test_nvfp4_per_row_scales_are_the_per_expert_subgraph(tmp_path, ort_ops_library, threads):
    """The op with input_scale_2 [T, k, 1] against X [T, 1, K] (the routed experts' gathered scales): Y [T, k, K],
    bit for bit the per-expert subgraph the builder wrote before (NaN blocks aside), from the kernel and from the
    function fallback; a scale with too few rows is refused."""
    from custom_ops import functions, single_op
    x = _inputs()[:, None, :]                                    # [T, 1, 128]
    x[-1, 0, 5] = np.inf
    x[-2, 0, 40] = np.nan
    rng = np.random.default_rng(9)
    s2 = np.array(S2, np.float32)[rng.integers(0, len(S2), (x.shape[0], 4))][..., None]  # [T, 4, 1]
    want = _per_expert_subgraph(tmp_path, x, s2)
    assert want.shape == (x.shape[0], 4, x.shape[2])
    nan_block = np.broadcast_to(np.isnan(x.reshape(x.shape[0], 1, -1, 16)).any(axis=-1), (x.shape[0], 4, 8))
    model = single_op.single_op_model("QuantizeDequantizeNvfp4", np.float32, x.shape[-1],
                                      {"input_scale_2": np.float32(1.0)})
    del model.graph.initializer[:]                               # the scales fed as a graph input instead
    model.graph.input.append(onnx.helper.make_tensor_value_info("input_scale_2", onnx.TensorProto.FLOAT, None))
    for library in (ort_ops_library, None):
        sess = single_op.session(model, library=library, threads=threads)
        got = sess.run(None, {"X": x, "input_scale_2": s2})[0]
        assert got.shape == want.shape, library
        g, w = got.reshape(-1, 16), want.reshape(-1, 16)
        keep = ~nan_block.reshape(-1)
        assert _same_bits(g[keep], w[keep]), library
        if library:
            assert np.isnan(g[~keep]).all()
            with pytest.raises(Exception, match="broadcast"):
                sess.run(None, {"X": x, "input_scale_2": s2[:3]})
            empty = sess.run(None, {"X": x[:0], "input_scale_2": s2[:0]})[0]  # no rows: an empty Y
            assert empty.shape == (0, 4, x.shape[2])
    assert functions.OP_INPUTS["QuantizeDequantizeNvfp4"] == ("X", "input_scale_2")


@pytest.mark.parametrize("threads", [1, 2])
def test_ort_op_and_fallback_are_the_subgraph(tmp_path, ort_ops_library, threads):
    x = np.concatenate([_inputs()] * 6)  # several pool tasks
    x[-1, 5] = np.inf                    # one block with an infinity
    want = run_activation_graph(tmp_path, x, Fp4ActivationSpec("mxfp4", 32))
    finite = np.isfinite(x.reshape(-1, 32)).all(axis=1)
    for library in (ort_ops_library, None):
        got = run_single_op("QuantizeDequantizeMxfp4", x, {}, library, threads)
        g, w = got.reshape(-1, 32), want.reshape(-1, 32)
        assert _same_bits(g[finite], w[finite]), library
        assert np.isnan(g[~finite]).all() and np.isnan(w[~finite]).all(), library


@pytest.mark.parametrize("threads", [1, 2])
def test_nvfp4_ort_op_and_fallback_are_the_subgraph(tmp_path, ort_ops_library, threads):
    x = np.concatenate([_inputs()] * 3)
    x[-1, 5] = np.inf   # a block with an infinity: finite in both (the scale saturates at 448 s2)
    x[-2, 40] = np.nan  # a NaN block: all NaN in the op
    nan_block = np.isnan(x.reshape(-1, 16)).any(axis=1)
    for s2 in S2:
        want = run_activation_graph(tmp_path, x, Fp4ActivationSpec("nvfp4", 16, input_scale_2=s2))
        for library in (ort_ops_library, None):
            got = run_single_op("QuantizeDequantizeNvfp4", x, {"input_scale_2": np.float32(s2)}, library,
                                threads).reshape(-1, 16)
            assert _same_bits(got[~nan_block], want.reshape(-1, 16)[~nan_block]), (library, s2)
            assert np.isnan(got[nan_block]).all() or library is None, s2


@pytest.mark.parametrize("family,recipe,op,count", [
    ("llama_h64", "mxfp4", "QuantizeDequantizeMxfp4", 4 * 2),
    ("llama_h64", "nvfp4", "QuantizeDequantizeNvfp4", 4 * 2),
    # routed experts: the chosen experts' own input_scale_2 per row (gate, up, down of each of 2 layers), besides
    # the attention projections' per-tensor ones
    ("qwen3_moe", "nvfp4", "QuantizeDequantizeNvfp4", 2 * (4 + 3))])
def test_fp4_model_runs_the_op_with_the_subgraphs_bits(quark_exports, tmp_path, family, recipe, op, count):
    export = quark_exports(family, recipe)
    out = build(export, tmp_path / "onnx", "cpu", "fp32")
    library = shipped_library(out)
    if library is None:
        pytest.skip("no custom-op library: the conversion wrote the standard-op subgraphs")
    ops = op_types(out)
    assert ops.get(op, 0) >= count and "ReduceMax" not in ops, ops
    from custom_ops.functions import DOMAIN
    model = onnx.load(str(out / "model.onnx"))
    inlined = onnx.inliner.inline_selected_functions(model, [(DOMAIN, op)])
    assert op not in {n.op_type for n in inlined.graph.node}
    onnx.save(inlined, str(out / "inlined.onnx"))
    ids = np.load(export / "reference.npz")["input_ids"]

    assert _same_bits(session_logits(out / "model.onnx", ids, library),
                      session_logits(out / "inlined.onnx", ids, library))
