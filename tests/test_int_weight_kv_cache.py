"""4-bit weights next to FP8 KV-cache / FP8-attention scales: the weights go to MatMulNBits (fused q/k/v), the
k/v/q output scales and the softmax scale go to the attention variant. Reference: tests/w8a8_emulation.py (Quark's
fake quantization in PyTorch with the export's scales, on Quark's dequantized weights), not the converter."""
from __future__ import annotations

import numpy as np
import pytest

from onnx_helpers import build, fp8_quantize_count, genai_greedy, int4_linear_count, op_types, prompt_logits
from w8a8_emulation import TOL_VS_EMULATION, emulate

QUARK_EXPORTS = [("llama_h64", "uint4_g64_kv"), ("llama_h64", "uint4_g64_kv_attn")]


@pytest.mark.parametrize("recipe", ["uint4_g64_kv", "uint4_g64_kv_attn"])
def test_uint4_with_fp8_kv_matches_emulation(quark_exports, tmp_path, recipe):
    export = quark_exports("llama_h64", recipe)
    out = build(export, tmp_path / "onnx", "cpu", "fp32", accuracy_level=1)
    ops = op_types(out)
    assert int4_linear_count(ops) == 4 * 2  # qkv, o, gate_up, down per layer (lm_head excluded, float)
    assert fp8_quantize_count(ops) >= 2 * 2  # k and v of each layer at least
    if recipe.endswith("attn"):
        # the FP8 probability quantizer reads the softmax: on cpu its fixed-order form (issue 21)
        assert "GroupQueryAttention" not in ops and "Softmax" not in ops and ops["Exp"] == 2
    else:  # weight-only activations, FP8 KV: QDQ(k), QDQ(v) in front of the cpu default's fixed-order fused op
        assert ops["GroupQueryAttentionFixedOrder"] == 2 and "GroupQueryAttention" not in ops
    ids = np.load(export / "reference.npz")["input_ids"]
    emu_logits, emu_greedy = emulate(export, ids)
    diff = float(np.abs(prompt_logits(out, ids) - emu_logits).max())
    assert diff <= TOL_VS_EMULATION, diff
    assert genai_greedy(out, ids) == list(emu_greedy)


def test_output_quantization_on_other_layers_is_refused(quark_exports, tmp_path):
    import json
    import shutil

    from builder.convert import plan_model
    from builder.errors import ConversionError
    src = tmp_path / "src"
    shutil.copytree(quark_exports("llama_h64", "uint4_g64_kv") / "quark", src)
    cfg = json.loads((src / "config.json").read_text())
    q = cfg["quantization_config"]
    q["layer_quant_config"]["*down_proj"] = dict(q["global_quant_config"],
                                                 output_tensors=q["kv_cache_quant_config"]["*k_proj"]["output_tensors"])
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionError, match="q/k/v projections only") as err:
        plan_model(src, "cpu")
    assert "layer model.layers.0.mlp.down_proj" in str(err.value)
