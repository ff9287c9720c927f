"""fp8_linear=custom_op: FP8 W8A8 linears as com.quark_onnx MatMulFp8W8A8 (static) / MatMulFp8W8A8Dyn (per-token),
run through ORT with the custom-op library, against a PyTorch emulation of Quark's fake quantization on Quark's own
dequantized weights (tests/w8a8_emulation.py, independent of builder/ and custom_ops/), and against the CPU EP's
default form (fp32 dequantized weight + activation Q/DQ)."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx_helpers import build, op_types, prompt_logits
from w8a8_emulation import emulate

from builder.__main__ import main as cli_main

from ort_library_fixture import ort_ops_library  # noqa: F401  (fixture)

RECIPES = {"fp8_w8a8_kv": "MatMulFp8W8A8", "ptpc_fp8": "MatMulFp8W8A8Dyn"}
QUARK_EXPORTS = [("llama_h64", r) for r in RECIPES]
# max |logit difference| measured (llama_h64 fp32, ORT 1.32 CPU kernel): vs emulation fp8_w8a8_kv 8.3e-7,
# ptpc_fp8 1.9e-6; vs the default CPU form 9.5e-7 / 1.2e-6 (the function bodies: 8.3e-7 / 1.3e-6). Bounds ~5x.
TOL_VS_EMULATION = 1e-5
TOL_VS_DEFAULT_FORM = 1e-5


def logits_with_library(model_dir, input_ids, library):
    so = ort.SessionOptions()
    so.register_custom_ops_library(library)
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(model_dir / "model.onnx"), so, providers=["CPUExecutionProvider"])
    feeds = {"input_ids": input_ids, "attention_mask": np.ones_like(input_ids)}
    for inp in sess.get_inputs():
        if inp.name.startswith("past_key_values"):
            feeds[inp.name] = np.zeros((input_ids.shape[0], inp.shape[1], 0, inp.shape[3]), dtype=np.float32)
    return sess.run(["logits"], feeds)[0]


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_custom_op_form_keeps_quarks_numerics(quark_exports, ort_ops_library, tmp_path, recipe):
    export = quark_exports("llama_h64", recipe)
    ids = np.load(export / "reference.npz")["input_ids"]
    out = build(export, tmp_path / "custom", fp8_linear="custom_op")
    counts = op_types(out)
    assert counts.get(RECIPES[recipe]) == 14, counts
    emu_logits, _ = emulate(export, ids)
    kernel = logits_with_library(out, ids, ort_ops_library)
    default = prompt_logits(build(export, tmp_path / "default"), ids)
    function = prompt_logits(out, ids)  # no library: ORT inlines the function bodies
    vs_emu, vs_default = np.abs(kernel - emu_logits).max(), np.abs(kernel - default).max()
    print(f"{recipe}: kernel vs emulation {vs_emu:.2e}, vs default CPU form {vs_default:.2e}, "
          f"function vs emulation {np.abs(function - emu_logits).max():.2e}")
    assert vs_emu < TOL_VS_EMULATION and vs_default < TOL_VS_DEFAULT_FORM
    assert np.abs(function - emu_logits).max() < TOL_VS_EMULATION


def test_custom_op_form_other_modes_keep_the_ep_form(quark_exports, tmp_path):
    """fp16 io keeps the op; bf16 io has no kernel and keeps the EP's own form (cuda: MatMulBlockQuantizedFp8Weight)."""
    export = quark_exports("llama_h64", "fp8_w8a8_kv")
    fp16 = op_types(build(export, tmp_path / "fp16", ep="cuda", precision="fp16", fp8_linear="custom_op"))
    assert fp16.get("MatMulFp8W8A8") == 14
    bf16 = op_types(build(export, tmp_path / "bf16", ep="cuda", precision="bf16", fp8_linear="custom_op"))
    assert "MatMulFp8W8A8" not in bf16 and bf16.get("MatMulBlockQuantizedFp8Weight") == 14, bf16


def test_custom_op_form_refused_on_migraphx(quark_exports, tmp_path, capsys):
    export = quark_exports("llama_h64", "fp8_w8a8_kv")
    rc = cli_main(["-i", str(export / "quark"), "-o", str(tmp_path / "o"), "-e", "migraphx",
                   "--extra_options", "fp8_linear=custom_op"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "fp8_linear='custom_op'" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("library,expect", [(None, "its ONNX function"), ("lib", "the CPU kernel of")])
def test_inspect_names_the_kernel(quark_exports, ort_ops_library, capsys, library, expect):
    export = quark_exports("llama_h64", "ptpc_fp8")
    extra = ["fp8_linear=custom_op", f"custom_ops_library={ort_ops_library if library else 'none'}"]
    assert cli_main(["inspect", "-i", str(export / "quark"), "-e", "cpu", "--extra_options", *extra]) == 0
    out = capsys.readouterr().out
    assert f"note: com.quark_onnx.MatMulFp8W8A8Dyn x14 on cpu: {expect}" in out, out
