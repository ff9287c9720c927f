"""`-e rocm` / `-e migraphx` graphs hold only what MIGraphX's ONNX parser reads, and compute Quark's numbers.

Types: AMDMIGraphX src/onnx/onnx_parser.cpp get_type (commit f729a52) reads 1-7, 9-13, 16, 18, 21, 22 and misreads
23 (float4e2m1, parse_tensor_shape); the list is written out here, independently of builder/ep_configs. Every
initializer, graph input/output, value_info, Constant value, Cast `to` and Quantize/DequantizeLinear `output_dtype`
(also inside model-local functions) is walked, and no float8e4m3fnuz initializer may hold byte 0x80 (NaN in FNUZ).
Numerics: the same graphs (fp32) run on ONNX Runtime CPU, whose QuantizeLinear/DequantizeLinear take float8e4m3fnuz:
  - FP8 / INT8 W8A8 (+ FP8 KV cache, FP8 attention), uint4 + FP8 attention: against the PyTorch emulation of Quark's
    fake quantization (tests/w8a8_emulation.py), as closely as the CPU graph (measured: identical logits, 0.0);
  - MXFP4 / NVFP4: against Quark's own model (reference.npz), and every INT8-coded weight decoded bit for bit against
    the independent decoder and Quark's dequantized weights;
  - uint4: against Quark's own model.
ORT CPU fuses DequantizeLinear(int8, blocked) -> MatMul into MatMulNBits at session.qdq_matmulnbits_accuracy_level
(default 4: int8 activations), so those runs hold it at 1 (ort_facts.md); the MIGraphX EP never sees that fusion.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from bad_input_kit import run_cli
from fp4_checks import LOGIT_TOL
from independent_decode import dequantize_export
from onnx import TensorProto as T
from onnx import numpy_helper
from onnx_helpers import build, genai_greedy, prompt_logits
from w8a8_emulation import TOL_VS_EMULATION, emulate

from builder.convert import convert
from builder.emit_context import BuildOptions
from builder.ep_check import check_findings
from builder.ep_configs import get_ep
from builder.errors import ConversionError

# onnx_parser.cpp get_type: the element types it maps (case 1..13 without 8, 16, 18, 21, 22); 23 is misread
MIGRAPHX_READS = {1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 16, 18, 21, 22}
EMULATED = ("fp8_w8a8_kv", "fp8_w8a8_kv_attn", "ptpc_fp8", "int8_w8a8", "uint4_g64_kv_attn")
FP4 = ("mxfp4", "nvfp4")
UINT4 = ("uint4_g64", "uint4_g32", "uint4_per_channel", "int4_per_channel")
RECIPES = EMULATED + FP4 + UINT4
QUARK_EXPORTS = [("llama_h64", r) for r in RECIPES]
# The graph's math on ORT CPU, whatever the CPU: without `session.disable_quant_qdq` ORT fuses INT8 Q/DQ -> MatMul
# into its u8s8 integer GEMM, which saturates on x86 without VNNI (measured on an AVX2-only Zen 3: 0.15 logit
# difference); MIGraphX itself is checked in tools/migraphx_ref.sh.
CPU_DQ_EXACT = {"session.qdq_matmulnbits_accuracy_level": "1", "session.disable_quant_qdq": "1"}
# measured max |logit difference| of the migraphx graph on ORT CPU (llama_h64, fp32), see the docstring
# (FP8/INT8 rows: the CPU graph measures the same figure and the two graphs' logits are identical, 0.0);
# asserted with 10x headroom
MEASURED = {"fp8_w8a8_kv": 8.4e-7, "fp8_w8a8_kv_attn": 8.4e-7, "ptpc_fp8": 1.7e-6, "int8_w8a8": 7.8e-7,
            "uint4_g64_kv_attn": 1.1e-6, "mxfp4": 5.4e-7, "nvfp4": 6.0e-7}
UINT4_TOL = 2e-5   # measured 1.3e-6 .. 1.7e-6: MatMulNBits accuracy_level 0 (fp32) vs Quark's fp32 model


@pytest.fixture(scope="module")
def exports(quark_exports):
    return dict(zip(RECIPES, quark_exports.many(QUARK_EXPORTS)))


def _convert(export: Path, out: Path, ep: str, precision=None, **extra):
    extra.setdefault("prefill_logits", "all")  # every prompt position, compared with Quark's (default: the last)
    convert(export / "quark", out, ep, precision, BuildOptions(extra=extra), log=lambda _m: None)
    return out


def element_types(model: onnx.ModelProto) -> list[tuple[str, int]]:
    """(where, element type) for everything MIGraphX's parser passes through get_type."""
    g = model.graph
    found = [(f"initializer {t.name}", t.data_type) for t in g.initializer]
    for kind, values in (("input", g.input), ("output", g.output), ("value_info", g.value_info)):
        found += [(f"{kind} {v.name}", v.type.tensor_type.elem_type) for v in values]
    nodes = list(g.node) + [n for f in model.functions for n in f.node]
    for n in nodes:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                found.append((f"{n.op_type} {n.name} {a.name}", a.t.data_type))
            elif a.name == "to" and n.op_type == "Cast":
                found.append((f"Cast {n.name} to", a.i))
            elif a.name == "output_dtype" and n.op_type in ("QuantizeLinear", "DequantizeLinear"):
                found.append((f"{n.op_type} {n.name} output_dtype", a.i))
    return found


def assert_parser_readable(model_dir: Path) -> dict[int, int]:
    model = onnx.load(str(model_dir / "model.onnx"), load_external_data=False)
    types = element_types(model)
    bad = [(w, T.DataType.Name(t)) for w, t in types if t not in MIGRAPHX_READS]
    assert not bad, bad[:5]
    full = onnx.load(str(model_dir / "model.onnx"))
    for t in full.graph.initializer:
        if t.data_type == T.FLOAT8E4M3FNUZ:
            raw = numpy_helper.to_array(t).view(np.uint8)
            assert not np.any(raw == 0x80), f"{t.name} holds 0x80 (NaN in float8e4m3fnuz)"
    counts: dict[int, int] = {}
    for _w, t in types:
        counts[t] = counts.get(t, 0) + 1
    return counts


def cpu_provider_copy(model_dir: Path, dest: Path) -> Path:
    """The same model folder with genai_config's provider set to CPU (og.Generator runs it here), at graph
    optimization level basic: the DQ(int8) -> MatMul -> MatMulNBits fusion (accuracy_level 4 by default) is an
    extended-level CPU transformer, and og 0.18's genai_config takes no session config entries to hold it at 1."""
    shutil.copytree(model_dir, dest)
    cfg_path = dest / "genai_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["model"]["decoder"]["session_options"]["provider_options"] = []
    cfg["model"]["decoder"]["session_options"]["graph_optimization_level"] = "ORT_ENABLE_BASIC"
    cfg_path.write_text(json.dumps(cfg, indent=2))
    return dest


# ---------------------------------------------------------------------------------------------- types
@pytest.mark.parametrize("ep", ["rocm", "migraphx"])
@pytest.mark.parametrize("recipe", RECIPES)
def test_only_parser_readable_types(exports, tmp_path, recipe, ep):
    out = _convert(exports[recipe], tmp_path / "o", ep)
    counts = assert_parser_readable(out)
    if recipe.startswith(("fp8", "ptpc")) or recipe.endswith("kv_attn"):
        assert counts.get(T.FLOAT8E4M3FNUZ, 0) > 0
    if recipe in FP4:
        assert counts.get(T.INT8, 0) >= 14


@pytest.mark.parametrize("recipe", EMULATED + FP4)
def test_cpu_graph_is_what_migraphx_refuses(exports, tmp_path, recipe):
    """The check's other half: the CPU EP's own graph of the same export does hold e4m3fn where FP8 is involved
    (built without the custom-op library, whose QuantizeDequantizeFp8 takes the place of a uint4 export's fp8 KV
    pairs: with it that graph holds no e4m3fn tensor at all)."""
    out = tmp_path / "cpu"
    convert(exports[recipe] / "quark", out, "cpu", None,
            BuildOptions(custom_ops_library="none", extra={"prefill_logits": "all"}), log=lambda _m: None)
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    types = {t for _w, t in element_types(model)}
    has_fn = recipe not in ("int8_w8a8", "mxfp4")
    assert (T.FLOAT8E4M3FN in types) == has_fn
    parser_errors = {f.rule for f in check_findings(out / "model.onnx", get_ep("migraphx")) if f.severity == "error"}
    assert ("migraphx-parser-type" in parser_errors) == has_fn
    assert ("migraphx-parser-graph-types" in parser_errors) == has_fn


# ---------------------------------------------------------------------------------------------- numerics
@pytest.mark.parametrize("recipe", EMULATED)
def test_emulated_schemes_match_quark_emulation_as_the_cpu_graph_does(exports, tmp_path, recipe):
    export = exports[recipe]
    ids = np.load(export / "reference.npz")["input_ids"]
    emu_logits, emu_greedy = emulate(export, ids)
    cpu = prompt_logits(build(export, tmp_path / "cpu", "cpu", "fp32", accuracy_level=1), ids)
    mgx_dir = _convert(export, tmp_path / "mgx", "migraphx", "fp32")
    mgx = prompt_logits(mgx_dir, ids, CPU_DQ_EXACT)
    d_cpu, d_mgx = float(np.abs(cpu - emu_logits).max()), float(np.abs(mgx - emu_logits).max())
    print(f"{recipe}: migraphx graph vs emulation {d_mgx:.2e}, cpu graph {d_cpu:.2e}, "
          f"migraphx vs cpu {float(np.abs(mgx - cpu).max()):.2e}")
    assert d_mgx < min(TOL_VS_EMULATION, 10 * MEASURED[recipe]), (d_mgx, d_cpu)
    assert d_mgx <= d_cpu + 1e-6, (d_mgx, d_cpu)
    assert genai_greedy(cpu_provider_copy(mgx_dir, tmp_path / "mgx_cpu"), ids) == emu_greedy


@pytest.mark.parametrize("recipe", FP4)
def test_fp4_int8_form_is_bit_exact_and_matches_quark(exports, tmp_path, recipe):
    export = exports[recipe]
    ref = np.load(export / "reference.npz")
    out = _convert(export, tmp_path / "mgx", "rocm", "fp32")
    model = onnx.load(str(out / "model.onnx"))
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    decoded = {}
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and inits.get(node.input[0], np.zeros(0)).dtype == np.int8:
            q, s = inits[node.input[0]].astype(np.float32), inits[node.input[1]].astype(np.float32)
            block = next(a.i for a in node.attribute if a.name == "block_size")
            assert np.all(np.isin(q, np.arange(-12, 13))) and len(node.input) == 2
            module = node.input[0][: -len(".weight_e2m1x2.T")]
            decoded[module] = (q * np.repeat(s, block, axis=0)).T
    independent, quark = dequantize_export(export / "quark"), dict(np.load(export / "quark_dequant.npz"))
    assert set(decoded) == set(independent) == set(quark) and len(decoded) == 14
    for module, w in independent.items():
        np.testing.assert_array_equal(decoded[module], w, err_msg=module)
        np.testing.assert_array_equal(decoded[module], quark[module], err_msg=module)
    logits = prompt_logits(out, ref["input_ids"], CPU_DQ_EXACT)
    d = float(np.abs(logits - ref["logits"]).max())
    print(f"{recipe}: rocm graph on ORT CPU vs Quark {d:.2e}")
    assert d < min(LOGIT_TOL, 10 * MEASURED[recipe]), d
    assert genai_greedy(cpu_provider_copy(out, tmp_path / "cpu"), ref["input_ids"]) == ref["greedy"].tolist()


@pytest.mark.parametrize("recipe", UINT4)
def test_uint4_forms_match_quark(exports, tmp_path, recipe):
    export = exports[recipe]
    ref = np.load(export / "reference.npz")
    out = _convert(export, tmp_path / "mgx", "migraphx", "fp32")
    d = float(np.abs(prompt_logits(out, ref["input_ids"]) - ref["logits"]).max())
    print(f"{recipe}: migraphx graph on ORT CPU vs Quark {d:.2e}")
    assert d < UINT4_TOL, d


def test_fnuz_recoding_is_exact_for_every_e4m3fn_byte():
    """Every finite e4m3fn byte read as e4m3fnuz is half its value, -0 becomes +0, and NaN bytes are refused."""
    from builder.ops.fnuz import fn_to_fnuz_bytes
    fn = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
    finite = ~np.isnan(fn.astype(np.float32))
    fnuz = fn_to_fnuz_bytes(fn[finite])
    np.testing.assert_array_equal(fnuz.astype(np.float32) * 2, fn[finite].astype(np.float32))
    assert not np.any(fnuz.view(np.uint8) == 0x80)
    with pytest.raises(ConversionError):
        fn_to_fnuz_bytes(fn[~finite])


# ---------------------------------------------------------------------------------------------- refusals, inspect
@pytest.mark.parametrize("ep", ["rocm", "migraphx"])
@pytest.mark.parametrize("recipe,option", [("fp8_w8a8_kv", "fp8_linear=matmul_block_fp8"),
                                           ("mxfp4", "fp4_linear=dq_fp8"), ("nvfp4", "fp4_linear=native"),
                                           ("mxfp4", "fp4_linear=matmul_nbits8")])
def test_unreadable_forms_are_refused_in_one_line(exports, tmp_path, recipe, option, ep):
    # forked from this warm process like `python -m builder` (tests/bad_input_kit.py: ~1 CPU s of imports saved)
    r = run_cli(["-i", exports[recipe] / "quark", "-o", tmp_path / "o", "-e", ep, "--extra_options", option])
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "not readable on" in lines[0] and option.split("=")[0] in lines[0], r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "o").exists()


def test_inspect_says_where_fnuz_fp8_computes_in_float(exports):
    def inspect(recipe):
        r = run_cli(["inspect", "-i", exports[recipe] / "quark", "-e", "rocm"])
        assert r.returncode == 0, r.stderr
        return r.stdout + r.stderr
    fp8 = inspect("fp8_w8a8_kv_attn")
    assert "float8e4m3fnuz" in fp8 and "gfx950" in fp8 and "in float" in fp8
    fp4 = inspect("nvfp4")
    assert "INT8 DequantizeLinear" in fp4 and "float8e4m3fnuz" in fp4 and "MXQuantizeDequantize" in fp4
    assert "float8e4m3fnuz" not in inspect("uint4_g64")
