"""`--extra_options amd_arch=gfx950` (-e rocm / -e migraphx): MXFP4 linears as float4e2m1 Q/DQ on both MatMul
operands, the form MIGraphX's simplify_qdq match_find_mx_quantizable_ops lowers to gfx950's MX GEMM
(builder/quant/mx_gemm.py, docs/amd_generations.md).

ONNX Runtime CPU has no float4e2m1 Quantize/DequantizeLinear kernel, so the new graphs are checked here with ONNX's
own reference evaluator (onnx.reference, an implementation independent of ours and of ORT): every MX linear's two
MatMul operands, computed from the same input, must equal bit for bit what ORT CPU computes for the default graph's
operands (Quark's MXFP4 activation fake-quantization and the exact dq_int8 weight, which the family tests check
against Quark's own model). tests/test_migraphx_ref.py runs the whole graphs in MIGraphX's ref target.
"""
from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnx_helpers import build
from onnx_slice import back, producers, slice_model

REPO = Path(__file__).resolve().parents[1]
QUARK_EXPORTS = [("llama_h64", "mxfp4"), ("deepseek_v3", "mxfp4"), ("qwen3_moe", "mxfp4"), ("llama_h64", "fp8_w8a8_kv")]
FP4 = TensorProto.FLOAT4E2M1


def _mx_matmuls(model) -> list[onnx.NodeProto]:
    """MatMuls with a 2-input blocked DequantizeLinear of a float4e2m1 QuantizeLinear on both inputs (through Cast
    only): what match_find_mx_quantizable_ops' block_dq reads (no zero point, scale neither scalar nor 1-D)."""
    prod = producers(model.graph.node)
    inits = {t.name: t for t in model.graph.initializer}
    out = []
    for n in model.graph.node:
        if n.op_type != "MatMul":
            continue
        ok = True
        for i, x in enumerate(n.input[:2]):
            dq = back(prod, x)
            if dq is None or dq.op_type != "DequantizeLinear" or len(dq.input) != 2:
                ok = False
                break
            q = back(prod, dq.input[0], ())
            attrs = {a.name: helper.get_attribute_value(a) for a in q.attribute} if q is not None else {}
            if q is None or q.op_type != "QuantizeLinear" or attrs.get("output_dtype") != FP4:
                ok = False
                break
            scale = dq.input[1]
            if i == 1:  # the weight: a constant [K/32, N] scale, more than one block along K
                dims = list(inits[scale].dims)
                ok = ok and len(dims) == 2 and dims[0] > 1
            else:       # the activation: a run-time scale reshaped to x's rank ([..., K/32])
                ok = ok and prod[scale].op_type == "Reshape"
        if ok:
            out.append(n)
    return out


def _crafted_x(k: int, dtype) -> np.ndarray:
    """8 rows of K values: random, an all-zero block, e2m1 ties at several block scales (x/scale exactly halfway
    between grid points: .25 .75 1.25 1.75 2.5 3.5 5), block maxima at and next to 1.75 * 2^E (Quark's `even` scale
    rounding), large and tiny magnitudes, signed zeros."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((8, k)) * 3).astype(np.float32)
    x[1, :32] = 0.0
    ties = np.array([.25, .75, 1.25, 1.75, 2.5, 3.5, 5, -5, -.25, -1.25, 6.5, -7], np.float32)
    for j, e in enumerate((-3, 0, 2)):
        blk = np.resize(ties, 32) * np.float32(2.0 ** e)
        blk[0] = 6 * 2.0 ** e  # block max 6 * 2^e: scale 2^e
        x[2 + j, :32] = blk
    x[5, :32] = np.float32(1.75) * np.linspace(-1, 1, 32, dtype=np.float32)
    x[5, 32:64] = np.nextafter(np.float32(1.75), np.float32(0)) * np.linspace(-1, 1, 32, dtype=np.float32)
    x[6, :32] = rng.standard_normal(32).astype(np.float32) * (1000.0 if dtype == np.float16 else 1e6)
    x[7, :32] = rng.standard_normal(32).astype(np.float32) * 1e-3
    x[7, 32:34] = [0.0, -0.0]
    return x.reshape(1, 8, k).astype(dtype)


@pytest.fixture(scope="module")
def graphs(quark_exports, tmp_path_factory):
    def make(shape, recipe, precision, ep="rocm", **extra):
        out = tmp_path_factory.mktemp(f"{shape}-{recipe}-{precision}")
        build(quark_exports(shape, recipe), out / "default", ep, precision)
        build(quark_exports(shape, recipe), out / "gfx950", ep, precision, amd_arch="gfx950", **extra)
        return (onnx.load(str(out / "default" / "model.onnx")), onnx.load(str(out / "gfx950" / "model.onnx")), out)
    return make


@pytest.mark.parametrize("shape,precision", [("llama_h64", "fp32"), ("llama_h64", "fp16"), ("deepseek_v3", "fp32")])
def test_mx_operands_equal_the_default_forms_bit_for_bit(graphs, shape, precision):
    import onnxruntime as ort
    from onnx.reference import ReferenceEvaluator
    default, gfx950, _ = graphs(shape, "mxfp4", precision)
    assert gfx950.ir_version == 11 and {o.domain: o.version for o in gfx950.opset_import}[""] == 23
    mx = _mx_matmuls(gfx950)
    assert mx and not _mx_matmuls(default)
    io = TensorProto.FLOAT16 if precision == "fp16" else TensorProto.FLOAT
    dflt = {n.name: n for n in default.graph.node if n.op_type == "MatMul"}
    gprod = producers(gfx950.graph.node)
    checked = 0
    for mm in mx:
        act_prefix = gprod[back(gprod, mm.input[0]).input[0]].name.rsplit("/", 1)[0]   # .../MxFp4QdqAct
        x = next(n for n in gfx950.graph.node if n.name == f"{act_prefix}/Rows").input[0]
        k = next(t for t in gfx950.graph.initializer if t.name == back(gprod, mm.input[1]).input[1]).dims[0] * 32
        feed = {x: _crafted_x(k, np.float16 if precision == "fp16" else np.float32)}
        ours = ReferenceEvaluator(slice_model(gfx950, {x: io}, list(mm.input), TensorProto.FLOAT)).run(None, feed)
        # the MX MatMul runs in float32 (quant/mx_gemm.py emit_mx_matmul): its operands, cast to the io dtype, are
        # the default graph's io-dtype operands
        ours = [a.astype(np.float16) if precision == "fp16" else a for a in ours]
        ref = slice_model(default, {x: io}, list(dflt[mm.name].input), io)
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        want = ort.InferenceSession(ref.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feed)
        for a, b in zip(ours, want):
            assert a.dtype == b.dtype and a.shape == b.shape, mm.name
            np.testing.assert_array_equal(a, b, err_msg=mm.name)
        checked += 1
    assert checked == len(mx)


def test_every_eligible_linear_takes_the_mx_form_and_k32_keeps_todays(graphs, quark_exports):
    from builder.convert import describe_plan, plan_model
    from builder.options import parse_extra_options
    _, gfx950, _ = graphs("deepseek_v3", "mxfp4", "fp32")
    plan, ckpt = plan_model(quark_exports("deepseek_v3", "mxfp4") / "quark", "rocm", "fp32",
                            parse_extra_options(["amd_arch=gfx950"]))
    ckpt.close()
    lines = {ln.split()[0]: ln for ln in describe_plan(plan).splitlines() if ln.startswith("  ")}
    native = [n for n, ln in lines.items() if "AMD: MX FP4 GEMM (4-input quant_dot) on gfx950" in ln]
    k32 = [n for n, lp in plan.linears.items()
           if lp.scheme.name == "mxfp4" and lp.in_features == 32 and ".experts." not in n]
    assert native and k32 and not set(native) & set(k32)
    for name in k32:
        assert "amd_arch=gfx950 does not apply: one FP4 block along K=32" in lines[name], lines[name]
    mx = {n.name for n in _mx_matmuls(gfx950)}
    assert mx == {plan.linears[n].node_prefix + "/MatMul" for n in native}
    for name in k32:  # today's dq_int8 form: per-axis int8 DequantizeLinear, float activation emulation
        mm = next(n for n in gfx950.graph.node if n.name == plan.linears[name].node_prefix + "/MatMul")
        dq = producers(gfx950.graph.node)[mm.input[1]]
        assert dq.op_type == "DequantizeLinear" and dq.name.endswith("/DequantizeLinear")


def test_inspect_per_layer_and_generation(quark_exports):
    from builder.convert import describe_plan, plan_model
    from builder.options import parse_extra_options

    def lines(shape, recipe, ep, *extra):
        plan, ckpt = plan_model(quark_exports(shape, recipe) / "quark", ep, None, parse_extra_options(list(extra)))
        ckpt.close()
        text = describe_plan(plan)
        return {ln.split()[0]: ln for ln in text.splitlines() if ln.startswith("  ")}, text
    for ep in ("rocm", "migraphx"):
        ls, text = lines("llama_h64", "mxfp4", ep, "amd_arch=gfx950")
        assert ("[AMD: MX FP4 GEMM (4-input quant_dot) on gfx950; on gfx94x, gfx12 and older the same float4e2m1 Q/DQ "
                "computed in float") in ls["model.layers.0.mlp.down_proj"]
        assert "amd_arch=gfx950: 14 MXFP4 linear(s) take gfx950's MX GEMM form" in text
        assert "activation fake-quantization is plain float ops" not in text  # every MXFP4 layer is Q/DQ now
        ls, _ = lines("llama_h64", "mxfp4", ep)
        assert ls["model.layers.0.mlp.down_proj"].endswith(
            "[AMD: io-dtype GEMM on every gfx (no MX FP4 GEMM: gfx950's needs float4e2m1 Q/DQ on both operands)]")
        ls, text = lines("llama_h64", "fp8_w8a8_kv", ep, "amd_arch=gfx950")
        assert ("FP8 GEMM (fnuz quant_dot) on gfx94x; float GEMM on gfx950, gfx12 and older (amd_arch=gfx950 keeps "
                "fnuz: MIGraphX's parser refuses float8e4m3fn)") in ls["model.layers.0.self_attn.q_proj"]
        assert "amd_arch=gfx950: FP8 stays float8e4m3fnuz" in text
        assert "--extra_options amd_arch does not apply to this model" in text
        ls, _ = lines("qwen3_moe", "mxfp4", ep, "amd_arch=gfx950")
        assert "MX FP4 GEMM (batched 4-input quant_dot) on gfx950 (routed expert" in \
            ls["model.layers.0.mlp.experts.0.gate_proj"]  # tests/test_amd_arch_gfx950_moe.py
        assert "MX FP4 GEMM" in ls["model.layers.0.self_attn.q_proj"]


def _digest(folder: Path) -> str:
    return hashlib.sha256((folder / "model.onnx").read_bytes() + (folder / "model.onnx.data").read_bytes()).hexdigest()


def test_any_and_a_model_without_mxfp4_build_todays_graph(quark_exports, tmp_path):
    mx = quark_exports("llama_h64", "mxfp4")
    a = build(mx, tmp_path / "a", "rocm", "fp16")
    b = build(mx, tmp_path / "b", "rocm", "fp16", amd_arch="any")
    assert _digest(a) == _digest(b)
    fp8 = quark_exports("llama_h64", "fp8_w8a8_kv")
    c = build(fp8, tmp_path / "c", "migraphx", "fp16")
    d = build(fp8, tmp_path / "d", "migraphx", "fp16", amd_arch="gfx950")
    assert _digest(c) == _digest(d)


def test_moe_dense_experts_take_the_mx_form(graphs):
    _, gfx950, _ = graphs("qwen3_moe", "mxfp4", "fp32", moe="dense")
    names = {n.name for n in _mx_matmuls(gfx950)}
    assert any("/experts/" in n or ".experts." in n or "experts" in n for n in names), sorted(names)[:5]


@pytest.mark.parametrize("args,message", [
    (["-e", "rocm", "--extra_options", "amd_arch=gfx951"], "unknown amd_arch value (accepted: any, gfx950)"),
    (["-e", "cpu", "--extra_options", "amd_arch=gfx950"], "amd_arch chooses AMD GPU graph forms; it applies to rocm, "
                                                          "migraphx, not -e cpu"),
    (["-e", "cuda", "--extra_options", "amd_arch=gfx950"], "not -e cuda"),
])
def test_bad_amd_arch_is_one_line_exit_2(quark_exports, tmp_path, args, message):
    r = subprocess.run([sys.executable, "-m", "builder", "-i", str(quark_exports("llama_h64", "mxfp4") / "quark"),
                        "-o", str(tmp_path / "out"), *args], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()
