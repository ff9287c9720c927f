"""Each EP x each registered scheme: a tiny Quark export converts, passes the EP check, and names the right provider
in genai_config.json; onnxruntime-genai 0.18 knows every provider name we write, and the CPU output generates."""
from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from onnx_helpers import genai_greedy, op_types

from builder.convert import convert
from builder.emit_context import BuildOptions
from builder.ep_check import check_findings
from builder.ep_configs import EP_NAMES, get_ep
from builder.ep_rules import Rule
from builder.errors import ConversionError
from builder.quant import SCHEMES

# scheme name -> (shape, recipe) exports that exercise it; "float" uses the export's own float model
SCHEME_EXPORTS = {
    "float": ("llama_h64", "uint4_g64"),
    "int-weight-only": ("llama_h64", "uint4_g64"),
    "fp8-w8a8": ("llama_h64", "fp8_w8a8"),
    "int8-w8a8": ("llama_h64", "int8_w8a8"),
    "mxfp4": ("llama_h64", "mxfp4"),
    "mxfp4-fp8": ("llama_h64", "mxfp4_fp8"),
    "nvfp4": ("llama_h64", "nvfp4"),
}
INT_RECIPES = ("uint4_g64", "int4_per_channel", "int8_wo_g64", "uint8_wo_per_channel")
EXPORTS = list(dict.fromkeys([("llama_h64", r) for r in INT_RECIPES] + [("llama_bias", "uint4_g64")]
                             + [e for name, e in SCHEME_EXPORTS.items() if name != "float"]))
QUARK_EXPORTS = EXPORTS
PROVIDER = {"cpu": [], "cuda": [{"cuda": {}}], "rocm": [{"AMDGPU": {}}], "migraphx": [{"MIGraphX": {}}]}


@pytest.fixture(scope="module")
def exports(quark_exports) -> dict[tuple[str, str], Path]:
    return dict(zip(EXPORTS, quark_exports.many(EXPORTS)))


def _convert(src: Path, out: Path, ep: str, **kw):
    return convert(src, out, ep, options=BuildOptions(**kw), log=lambda _m: None)


def test_every_registered_scheme_has_an_export_here():
    assert {s.name for s in SCHEMES} <= set(SCHEME_EXPORTS), "add an export for the new scheme to SCHEME_EXPORTS"


@pytest.mark.parametrize("ep", EP_NAMES)
@pytest.mark.parametrize("export", EXPORTS + [("llama_h64", "float")], ids=lambda e: f"{e[0]}-{e[1]}")
def test_converted_model_passes_its_ep_check(exports, tmp_path, ep, export):
    shape, recipe = export
    src = exports[(shape, "uint4_g64")] / "float" if recipe == "float" else exports[export] / "quark"
    bits8 = recipe.startswith(("int8_wo", "uint8_wo"))  # 8-bit weight-only: MatMulNBits bits=8
    plan = _convert(src, tmp_path / "out", ep)
    if bits8 and not get_ep(ep).matmul_nbits_bits & {8}:  # MIGraphX: DequantizeLinear(int8) -> MatMul instead
        ops = op_types(tmp_path / "out")
        assert ops.get("MatMulNBits", 0) == 0 and ops["DequantizeLinear"] == 14
    findings = check_findings(tmp_path / "out" / "model.onnx", get_ep(ep))
    assert [str(f) for f in findings] == []
    cfg = json.loads((tmp_path / "out" / "genai_config.json").read_text())
    assert cfg["model"]["decoder"]["session_options"]["provider_options"] == PROVIDER[ep]
    if get_ep(ep).matmul_nbits_bias_input is False and shape == "llama_bias":
        import onnx
        m = onnx.load(str(tmp_path / "out" / "model.onnx"), load_external_data=False)
        assert all(len([i for i in n.input if i]) <= 4 for n in m.graph.node if n.op_type == "MatMulNBits")
        # every bias reaches the graph through an Add (fused q/k/v share one concatenated bias)
        dims = {t.name: int(np.prod(t.dims)) for t in m.graph.initializer}
        added = sum(dims[i] for n in m.graph.node if n.name.endswith("BiasAdd") for i in n.input if i in dims)
        expected = sum(lp.out_features for lp in plan.linears.values() if lp.has_bias)
        assert expected and added == expected


def test_model_built_for_cpu_breaks_migraphx_rules(exports, tmp_path):
    """The wrong-EP case: an 8-bit CPU model fed to the MIGraphX check names every MatMulNBits."""
    _convert(exports[("llama_h64", "int8_wo_g64")] / "quark", tmp_path / "cpu", "cpu")
    findings = check_findings(tmp_path / "cpu" / "model.onnx", get_ep("migraphx"))
    bad = [f for f in findings if f.rule == "matmulnbits-bits"]
    assert bad and all(f.node.endswith("/MatMulNBits") and f.severity == "error" for f in bad)
    assert len(bad) == 4 * 2  # qkv (fused), o, gate_up (fused), down per layer; lm_head stays float


def test_cli_check_exit_codes(exports, tmp_path):
    from builder.__main__ import main
    _convert(exports[("llama_h64", "int8_wo_g64")] / "quark", tmp_path / "m", "cpu")
    assert main(["check", str(tmp_path / "m"), "-e", "cpu"]) == 0
    assert main(["check", str(tmp_path / "m"), "-e", "migraphx"]) == 1


def _flag_all(severity):
    return Rule("test-flag-matmulnbits", severity, lambda node, view: "flagged by the test", "test",
                ("MatMulNBits",))


def test_error_rules_fail_conversion_and_warnings_do_not(exports, tmp_path, monkeypatch):
    import builder.ep_configs.cpu as cpu_module
    src = exports[("llama_h64", "uint4_g64")] / "quark"
    base = replace(cpu_module.CONFIG, int4_linear="matmul_nbits")  # a MatMulNBits for the rule to flag
    monkeypatch.setattr(cpu_module, "CONFIG", replace(base, constraints=base.constraints + (_flag_all("error"),)))
    with pytest.raises(ConversionError, match=r"MatMulNBits \(MatMulNBits\): \[test-flag-matmulnbits\]"):
        _convert(src, tmp_path / "err", "cpu")
    assert not (tmp_path / "err").exists() and not list(tmp_path.glob(".err*"))
    monkeypatch.setattr(cpu_module, "CONFIG", replace(base, constraints=base.constraints + (_flag_all("warning"),)))
    _convert(src, tmp_path / "warn", "cpu")
    assert (tmp_path / "warn" / "model.onnx").exists()


# ------------------------------------------------------------------------------------------------ onnxruntime-genai

def _with_provider(model_dir: Path, dst: Path, entry: list) -> Path:
    shutil.copytree(model_dir, dst)
    cfg = json.loads((dst / "genai_config.json").read_text())
    cfg["model"]["decoder"]["session_options"]["provider_options"] = entry
    (dst / "genai_config.json").write_text(json.dumps(cfg))
    return dst


def test_cpu_output_generates_with_og_generator(exports, tmp_path):
    pytest.importorskip("onnxruntime_genai")
    export = exports[("llama_h64", "uint4_g64")]
    _convert(export / "quark", tmp_path / "cpu", "cpu", accuracy_level=1)
    ref = np.load(export / "reference.npz")
    out = genai_greedy(tmp_path / "cpu", ref["input_ids"].astype(np.int32), len(ref["greedy"]))
    # Quark's own fake-quantized PyTorch model is the reference (accuracy_level=1: fp32 activations)
    assert out == list(ref["greedy"])


@pytest.mark.parametrize("ep", ["cuda", "rocm", "migraphx"])
def test_genai_knows_each_gpu_provider_name(exports, tmp_path, ep):
    """A CPU-only onnxruntime-genai 0.18 rejects an unknown name with 'Unknown provider name'; a known one fails later,
    for want of the device library. The model is the CPU build; only the provider entry changes."""
    og = pytest.importorskip("onnxruntime_genai")
    _convert(exports[("llama_h64", "uint4_g64")] / "quark", tmp_path / "cpu", "cpu")
    entry = [dict(p) for p in get_ep(ep).genai_provider_options]
    try:
        og.Model(str(_with_provider(tmp_path / "cpu", tmp_path / ep, entry)))
        return  # the device is really there
    except Exception as exc:  # noqa: BLE001
        message = str(exc)
    assert "Unknown provider name" not in message, message
    expected = {"cuda": "Cuda interface not available", "rocm": "AMDGPU",
                "migraphx": "MIGraphX execution provider is not supported in this build"}[ep]
    assert expected in message, message


@pytest.mark.parametrize("name", ["rocm", "migraphx", "ROCMExecutionProvider"])
def test_genai_rejects_names_it_does_not_know(exports, tmp_path, name):
    og = pytest.importorskip("onnxruntime_genai")
    _convert(exports[("llama_h64", "uint4_g64")] / "quark", tmp_path / "cpu", "cpu")
    with pytest.raises(Exception, match="Unknown provider name"):
        og.Model(str(_with_provider(tmp_path / "cpu", tmp_path / "x", [{name: {}}])))
