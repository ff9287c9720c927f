"""GraphBuilder: what it streams to model.onnx.data, what it keeps inline, and that chunked writes are exact."""
import ml_dtypes
import numpy as np
import onnx
from onnx import numpy_helper

from builder.graph import GraphBuilder


def _load(tmp_path, build):
    g = GraphBuilder(tmp_path / "model.onnx.data")
    build(g)
    g.finish(tmp_path / "model.onnx")
    model = onnx.load(str(tmp_path / "model.onnx"))  # loads external data too
    return {t.name: t for t in model.graph.initializer}, g


def test_chunked_cast_and_transpose_are_exact(tmp_path):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((300, 70)).astype(ml_dtypes.bfloat16)

    def build(g):
        g.initializer("cast", w, cast_to=np.float32)
        g.initializer_transposed("transposed", w, cast_to=np.float16, rows_per_chunk=16)
        g.initializer("as_is", w)
    inits, _ = _load(tmp_path, build)
    np.testing.assert_array_equal(numpy_helper.to_array(inits["cast"]), w.astype(np.float32))
    np.testing.assert_array_equal(numpy_helper.to_array(inits["transposed"]), w.astype(np.float32).T.astype(np.float16))
    assert numpy_helper.to_array(inits["as_is"]).dtype == np.dtype(ml_dtypes.bfloat16)


def test_scalars_stay_0d_and_shape_constants_inline(tmp_path):
    def build(g):
        g.scalar("s", 2.5, np.float32)
        g.const_i64("split_sizes", list(range(40)))  # 320 bytes: still inline (ORT shape inference needs it)
        g.initializer("big", np.zeros(1000, np.float32))
    _load(tmp_path, build)
    model = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False)
    inits = {t.name: t for t in model.graph.initializer}
    assert list(inits["s"].dims) == []
    assert inits["split_sizes"].data_location == onnx.TensorProto.DEFAULT
    assert inits["big"].data_location == onnx.TensorProto.EXTERNAL


def test_external_offsets_are_aligned(tmp_path):
    def build(g):
        for i in range(5):
            g.initializer(f"t{i}", np.ones(17 + i, np.float32))
    _load(tmp_path, build)
    model = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False)
    offsets = [int(next(e.value for e in t.external_data if e.key == "offset")) for t in model.graph.initializer]
    assert all(o % 64 == 0 for o in offsets) and len(set(offsets)) == 5


def test_writer_thread_error_reaches_the_caller():
    """A failed background pwrite (here ENOSPC from /dev/full) is raised in the thread that adds tensors, by a later
    put or by finish(), never lost; abort() after it returns."""
    import errno

    import pytest

    g = GraphBuilder("/dev/full")
    assert g._writer is not None  # the writer thread is on by default
    blocks = (np.zeros((1024, 1024), np.float32) for _ in range(32))  # 4 MiB each, above the writer's minimum
    with pytest.raises(OSError) as excinfo:
        g.stream("big", np.float32, (32 * 1024, 1024), blocks)
        g._close()
    assert excinfo.value.errno == errno.ENOSPC
    g.abort()


def test_writer_thread_output_equals_inline_writes(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    blocks = [rng.standard_normal((512, 1024)).astype(np.float32) for _ in range(6)]
    out = {}
    for mode in ("1", "0"):
        monkeypatch.setenv("QO_WRITER_THREAD", mode)
        g = GraphBuilder(tmp_path / f"w{mode}.data")
        assert (g._writer is not None) == (mode == "1")
        g.initializer("small", np.arange(10, dtype=np.float32))
        g.stream("big", np.float32, (3072, 1024), iter(blocks))
        g.finish(tmp_path / f"w{mode}.onnx")
        out[mode] = (tmp_path / f"w{mode}.data").read_bytes()
    assert out["1"] == out["0"] and len(out["1"]) >= 3072 * 1024 * 4
