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


@pytest.mark.parametrize("recipe,op", [("mxfp4", "QuantizeDequantizeMxfp4"), ("nvfp4", "QuantizeDequantizeNvfp4")])
def test_fp4_model_runs_the_op_with_the_subgraphs_bits(quark_exports, tmp_path, recipe, op):
    export = quark_exports("llama_h64", recipe)
    out = build(export, tmp_path / "onnx", "cpu", "fp32")
    library = shipped_library(out)
    if library is None:
        pytest.skip("no custom-op library: the conversion wrote the standard-op subgraphs")
    ops = op_types(out)
    assert ops.get(op, 0) >= 4 * 2 and "ReduceMax" not in ops, ops
    from custom_ops.functions import DOMAIN
    model = onnx.load(str(out / "model.onnx"))
    inlined = onnx.inliner.inline_selected_functions(model, [(DOMAIN, op)])
    assert op not in {n.op_type for n in inlined.graph.node}
    onnx.save(inlined, str(out / "inlined.onnx"))
    ids = np.load(export / "reference.npz")["input_ids"]

    assert _same_bits(session_logits(out / "model.onnx", ids, library),
                      session_logits(out / "inlined.onnx", ids, library))
