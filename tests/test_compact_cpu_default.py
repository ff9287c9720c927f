"""The compact CPU default (builder/compact_forms.py): every FP8 / INT8 / MXFP4 / NVFP4 linear keeps the checkpoint's
bytes in a com.quark_onnx op, the library ships with the output, the output stays near the export's size, and
without a library the conversion says so in one line and writes the dense fp32 forms.

The logits of the compact default against Quark are checked by the scheme tests, which convert with the default:
test_fp8_w8a8.py (FP8 static / +KV / +attention / PTPC vs the emulation of Quark), test_int8_w8a8.py,
test_mxfp4_model.py and test_nvfp4_model.py (vs Quark's own model, weights bit-exact vs Quark's dequantized ones).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx_helpers import build, op_types, prompt_logits

from builder import compact_forms
from builder.custom_ops_library import OP_SYMBOLS, exported_kernels

# (recipe, compact op, linears): the tiny Llama (2 layers x 7 linears) exported by amd-quark
SCHEMES = [("fp8_w8a8", "MatMulFp8"), ("fp8_w8a8_kv", "MatMulFp8"), ("fp8_w8a8_kv_attn", "MatMulFp8"),
           ("ptpc_fp8", "MatMulFp8"), ("int8_w8a8", "MatMulInt8W8A8"), ("mxfp4", "MatMulMxfp4"),
           ("nvfp4", "MatMulNvfp4R16")]  # NVFP4: the weight in 16-row tiles (builder/quant/fp4_tiles.py)
QUARK_EXPORTS = [("llama_h64", recipe) for recipe, _ in SCHEMES] + [("llama_h64_bf16", r) for r in ("fp8_w8a8", "int4_g64", "nvfp4")]
SIZE_BOUND = 1.15  # issue #22's target: CPU default output <= 1.15x the export
ROTARY = ("cos_cache", "sin_cache")


@pytest.fixture(scope="module")
def exports(quark_exports):
    return dict(zip([r for r, _ in SCHEMES], quark_exports.many(QUARK_EXPORTS)))


def export_bytes(export: Path) -> int:
    return sum(f.stat().st_size for f in (export / "quark").glob("*.safetensors"))


def output_tensor_bytes(model_dir: Path) -> tuple[int, int]:
    """(bytes of every initializer, of those the rotary cos/sin caches). At this size (2 layers, hidden 64) the graph
    itself (model.onnx: 25-50 KB of nodes, constant per layer) and the rotary caches (built from config.json, not read
    from the export) are a third of the output, so the bound is taken on the tensors the export holds;
    benchmarks/real_size.py measures whole outputs at real shapes."""
    model = onnx.load(str(model_dir / "model.onnx"), load_external_data=False)
    sizes = {t.name: int(np.prod(t.dims, dtype=np.int64)) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
             for t in model.graph.initializer}
    return sum(sizes.values()), sum(v for k, v in sizes.items() if k.endswith(ROTARY))


def float_matrices(model_dir: Path) -> list[str]:
    """2-D float32 initializers other than the embedding and lm_head (float in the float32 export): the dense
    weight of a quantized linear would show up here."""
    model = onnx.load(str(model_dir / "model.onnx"), load_external_data=False)
    return [t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT and len(t.dims) == 2
            and not t.name.endswith(ROTARY) and "embed_tokens" not in t.name and "lm_head" not in t.name]


COMPACT = {"MatMulFp8": {"fp8_linear": "compact"}, "MatMulInt8W8A8": {"int8_linear": "compact"},
           "MatMulMxfp4": {"fp4_linear": "compact"}, "MatMulNvfp4": {"fp4_linear": "compact"},
           "MatMulNvfp4R16": {"fp4_linear": "compact"}}


@pytest.mark.parametrize("recipe,op", SCHEMES)
def test_compact_form_keeps_checkpoint_bytes(exports, recipe, op, tmp_path):
    """The compact form (the default where the library has the op's kernel): the checkpoint's bytes, <= 1.15x."""
    out = build(exports[recipe], tmp_path / "m", **COMPACT[op])
    assert op_types(out).get(op) == 14, op_types(out)
    assert not float_matrices(out), float_matrices(out)
    total, rotary = output_tensor_bytes(out)
    ratio = (total - rotary) / export_bytes(exports[recipe])
    assert ratio <= SIZE_BOUND, f"{recipe}: output {total - rotary} B = {ratio:.3f}x the export"
    cfg = json.loads((out / "genai_config.json").read_text())
    library = cfg["model"]["decoder"]["session_options"]["custom_ops_library"]
    assert (out / library).is_file()


@pytest.mark.parametrize("recipe,op", [("fp8_w8a8_kv", "MatMulFp8"), ("ptpc_fp8", "MatMulFp8"),
                                       ("int8_w8a8", "MatMulInt8W8A8"), ("mxfp4", "MatMulMxfp4"),
                                       ("nvfp4", "MatMulNvfp4R16")])
def test_compact_form_logits(exports, recipe, op, tmp_path):
    """FP4: the compact form vs Quark's own model (reference.npz, the FP4 tests' tolerance). FP8/INT8: vs the dense
    fp32 form, which the scheme tests hold to the emulation of Quark (tests/test_fp8_w8a8.py, test_int8_w8a8.py):
    the same weight products, float32 summation order apart."""
    ref = np.load(exports[recipe] / "reference.npz")
    out = build(exports[recipe], tmp_path / "m", **COMPACT[op])
    logits = prompt_logits(out, ref["input_ids"])
    if op in ("MatMulMxfp4", "MatMulNvfp4R16"):
        assert np.abs(logits - ref["logits"]).max() < 1e-4
    else:
        dense = build(exports[recipe], tmp_path / "d", custom_ops_library="none")
        assert np.abs(logits - prompt_logits(dense, ref["input_ids"])).max() < 1e-5


@pytest.mark.parametrize("has_kernel", [False, True])
def test_default_follows_the_library_kernels(exports, has_kernel, tmp_path, monkeypatch):
    """The default is the compact form only for ops whose kernel the library has (else ORT folds the function's
    weight to fp32 at load): a library without MatMulFp8 keeps FP8 dense, with a note; with it, MatMulFp8."""
    from builder import custom_ops_library
    symbol = "qo_matmul_mxfp4_f32" if has_kernel else "qo_matmul_no_such_kernel"  # an exported one, or none
    monkeypatch.setitem(custom_ops_library.OP_SYMBOLS, "MatMulFp8", symbol)
    from builder.convert import convert
    plan = convert(exports["fp8_w8a8"] / "quark", tmp_path / "m", "cpu", "fp32", log=lambda m: None)
    assert op_types(tmp_path / "m").get("MatMulFp8", 0) == (14 if has_kernel else 0)
    assert any(n.startswith("fp8_linear: the dense fp32 form") for n in plan.notes) != has_kernel, plan.notes
    assert len(float_matrices(tmp_path / "m")) == (0 if has_kernel else 14)


def test_dense_fp32_form_is_bigger(exports, tmp_path):
    """The old default (custom_ops_library=none: dense fp32 weights) for comparison: the size test can fail."""
    out = build(exports["fp8_w8a8"], tmp_path / "m", custom_ops_library="none")
    total, rotary = output_tensor_bytes(out)
    assert (total - rotary) / export_bytes(exports["fp8_w8a8"]) > 1.5 * SIZE_BOUND  # measured 2.02x (fp32 export)
    assert "MatMulFp8" not in op_types(out) and len(float_matrices(out)) == 14


def _no_library(monkeypatch) -> None:
    from custom_ops import ort_library

    monkeypatch.setattr(ort_library, "available", lambda: (None, "not built"))

    def no_compiler(**_kwargs):
        raise ort_library.BuildFailed("no C and C++ compiler found (set CC/CXX) to build the ORT custom-op library")
    monkeypatch.setattr(ort_library, "build", no_compiler)


def test_no_library_one_line_and_fp32_forms(exports, tmp_path, monkeypatch):
    """Library neither built nor buildable: one warning naming the reason and the command, the fp32 forms, a
    genai_config without a library, and the same logits as the compact form."""
    from builder.convert import convert
    from builder.emit_context import BuildOptions

    src = exports["ptpc_fp8"]
    compact = build(src, tmp_path / "compact")
    _no_library(monkeypatch)
    warnings, logs = [], []
    convert(src / "quark", tmp_path / "dense", "cpu", "fp32", BuildOptions(extra={"prefill_logits": "all"}),
            log=logs.append, warn=warnings.append)
    assert len(warnings) == 1, warnings
    assert "no C and C++ compiler" in warnings[0] and compact_forms.BUILD_COMMAND in warnings[0]
    assert "\n" not in warnings[0]
    dense = tmp_path / "dense"
    assert not any(op.startswith("MatMulFp8") for op in op_types(dense)) and len(float_matrices(dense)) == 14
    cfg = json.loads((dense / "genai_config.json").read_text())
    assert "custom_ops_library" not in cfg["model"]["decoder"].get("session_options", {})
    assert not list(dense.glob("*.so"))
    ids = np.load(src / "reference.npz")["input_ids"]
    diff = np.abs(prompt_logits(dense, ids) - prompt_logits(compact, ids)).max()
    assert diff < 1e-4, diff


def test_compact_output_runs_without_library(exports, tmp_path):
    """The ONNX-function fallbacks: the library deleted from the output, the logits are unchanged."""
    src = exports["nvfp4"]
    out = build(src, tmp_path / "m", fp4_linear="compact")
    ids = np.load(src / "reference.npz")["input_ids"]
    with_lib = prompt_logits(out, ids)
    without = prompt_logits(out, ids, custom_ops_library="")
    assert np.abs(with_lib - without).max() < 1e-4


def _optimized_initializers(model_dir: Path, library: str, tmp_path: Path) -> tuple[dict, list[str]]:
    """({initializer name: (onnx dtype, rank)}, node op types) of the graph ORT runs after its optimizer, with the library registered."""
    tmp_path.mkdir()
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.register_custom_ops_library(library)
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    so.add_session_config_entry("session.optimized_model_external_initializers_file_name", "optimized.data")
    ort.InferenceSession(str(model_dir / "model.onnx"), so, providers=["CPUExecutionProvider"])
    model = onnx.load(str(tmp_path / "optimized.onnx"), load_external_data=False)
    return {t.name: (t.data_type, len(t.dims)) for t in model.graph.initializer}, [n.op_type for n in model.graph.node]


@pytest.mark.parametrize("recipe,op", [("mxfp4", "MatMulMxfp4"), ("fp8_w8a8", "MatMulFp8"),
                                       ("int8_w8a8", "MatMulInt8W8A8"), ("nvfp4", "MatMulNvfp4R16")])
def test_ort_keeps_compact_weights(exports, recipe, op, tmp_path):
    """With the library's kernel, ORT's optimizer leaves the node and its compact weight alone (no fp32 copy)."""
    out = build(exports[recipe], tmp_path / "m", **COMPACT[op])
    cfg = json.loads((out / "genai_config.json").read_text())
    library = str(out / cfg["model"]["decoder"]["session_options"]["custom_ops_library"])
    if OP_SYMBOLS[op] not in exported_kernels(library):
        pytest.skip(f"this build of the library has no {op} kernel yet ({OP_SYMBOLS[op]}): ORT folds its function")
    inits, ops = _optimized_initializers(out, library, tmp_path / "opt")
    assert ops.count(op) == 14, sorted(set(ops))
    float_weights = [n for n, (t, rank) in inits.items() if t == onnx.TensorProto.FLOAT and rank == 2
                     and not n.endswith(ROTARY) and "embed_tokens" not in n and "lm_head" not in n]
    compact = [n for n, (t, _) in inits.items() if t != onnx.TensorProto.FLOAT
               and n.endswith((".fp8", ".int8", ".weight")) and "layers" in n]
    assert not float_weights and len(compact) == 14, (float_weights, compact)


def test_no_library_4bit_weights_get_matmul_nbits(quark_exports, tmp_path, monkeypatch):
    """The 4-bit default (MatMulInt4, exact) without the library: one warning, and MatMulNBits at accuracy_level 4
    (the cpu form before the exact default)."""
    from builder.convert import convert
    from builder.emit_context import BuildOptions

    _no_library(monkeypatch)
    warnings = []
    out = tmp_path / "m"
    convert(quark_exports("llama_h64_bf16", "int4_g64") / "quark", out, "cpu", "fp32", BuildOptions(),
            log=lambda _m: None, warn=warnings.append)
    assert len(warnings) == 1 and compact_forms.BUILD_COMMAND in warnings[0], warnings
    ops = op_types(out)
    assert ops.get("MatMulNBits", 0) >= 7 and "MatMulInt4" not in ops and "MatMulUint4" not in ops, ops
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    assert {a.i for n in model.graph.node if n.op_type == "MatMulNBits" for a in n.attribute
            if a.name == "accuracy_level"} == {4}


@pytest.mark.parametrize("recipe,op", [("fp8_w8a8", "MatMulFp8"), ("int4_g64", "MatMulInt4"),
                                       ("nvfp4", "MatMulNvfp4R16")])
def test_bf16_checkpoint_keeps_bf16_embedding_and_lm_head(quark_exports, recipe, op, tmp_path):
    """A bf16 export, 4-bit integer schemes included: the embedding (Gather + Cast) and the lm_head (MatMulBf16) keep
    the checkpoint's bf16 bits by default; exact, so the logits equal the fp32 form's up to summation order."""
    export = quark_exports("llama_h64_bf16", recipe)
    out = build(export, tmp_path / "m", **COMPACT.get(op, {}))
    ops = op_types(out)
    assert ops.get(op, 0) >= 7 and ops.get("MatMulBf16") == 1 and "Gemm" not in ops, ops
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    bf16 = {t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.BFLOAT16}
    assert {"model.embed_tokens.weight.bf16", "lm_head.weight.bf16"} <= bf16, bf16
    total, rotary = output_tensor_bytes(out)
    assert (total - rotary) / export_bytes(export) <= SIZE_BOUND
    # without the library: fp32 tables, and for 4-bit weights MatMulNBits (its exact level 1, as the default's op is)
    dense = build(export, tmp_path / "d", custom_ops_library="none", **({"accuracy_level": 1} if op == "MatMulInt4" else {}))
    assert "MatMulBf16" not in op_types(dense)
    ids = np.load(export / "reference.npz")["input_ids"]
    assert np.abs(prompt_logits(out, ids) - prompt_logits(dense, ids)).max() <= 5e-6


def test_fp4_tiles_and_checkpoint_order_forms(exports, tmp_path):
    """NVFP4 (float A after its activation emulation): the default writes the weight in 16-row tiles
    (MatMulNvfp4R16, builder/quant/fp4_tiles.py); `fp4_linear=compact_rows` keeps MatMulNvfp4 on the checkpoint's
    order. The same bytes, and both within the FP4 tolerance of Quark's logits. MXFP4 whose activations the graph
    puts on the MXFP4 grid keeps MatMulMxfp4 (its exact block-integer path); a cpu-only form on cuda is refused."""
    from builder.errors import ConversionError
    ref = np.load(exports["nvfp4"] / "reference.npz")
    tiles = build(exports["nvfp4"], tmp_path / "t")
    rows = build(exports["nvfp4"], tmp_path / "r", fp4_linear="compact_rows")
    assert op_types(tiles).get("MatMulNvfp4R16") == 14 and "MatMulNvfp4" not in op_types(tiles)
    assert op_types(rows).get("MatMulNvfp4") == 14 and "MatMulNvfp4R16" not in op_types(rows)
    assert output_tensor_bytes(tiles) == output_tensor_bytes(rows)
    for out in (tiles, rows):
        assert np.abs(prompt_logits(out, ref["input_ids"]) - ref["logits"]).max() < 1e-4
    assert op_types(build(exports["mxfp4"], tmp_path / "m")).get("MatMulMxfp4") == 14
    with pytest.raises(ConversionError, match="compact_rows is a cpu EP form"):
        build(exports["nvfp4"], tmp_path / "c", ep="cuda", fp4_linear="compact_rows")


def test_library_without_the_tile_kernel_keeps_the_checkpoint_order(exports, tmp_path, monkeypatch):
    """A library built before MatMulNvfp4R16 (its symbol absent) but with MatMulNvfp4: the default takes
    fp4_linear=compact_rows (still the checkpoint's bytes), with a note, not the dense fp32 form."""
    from builder import custom_ops_library
    from builder.convert import convert
    monkeypatch.setitem(custom_ops_library.OP_SYMBOLS, "MatMulNvfp4R16", "qo_matmul_no_such_kernel")
    plan = convert(exports["nvfp4"] / "quark", tmp_path / "m", "cpu", "fp32", log=lambda m: None)
    ops = op_types(tmp_path / "m")
    assert ops.get("MatMulNvfp4") == 14 and "MatMulNvfp4R16" not in ops, ops
    assert any(n.startswith("fp4_linear: MatMulNvfp4 on the checkpoint's order") for n in plan.notes), plan.notes
    assert not float_matrices(tmp_path / "m")
