"""`--extra_options amd_arch=gfx950` on routed MoE experts (the Gather form, builder/ops/routed_experts.py): MXFP4
experts with MXFP4 activations take the form MIGraphX's simplify_qdq match_find_mx_quantizable_ops lowers to gfx950's
MX GEMM, batched: both operands of each expert MatMul are DequantizeLinear(QuantizeLinear(., blocked scale,
float4e2m1), same-shaped scale) (builder/quant/mx_gemm.py emit_routed_weight_mx, docs/amd_generations.md).

As tests/test_amd_arch_gfx950.py for the dense linears: ONNX Runtime CPU has no float4e2m1 Quantize/DequantizeLinear
kernel, so each MX expert MatMul's two operands (in both If branches: the routed Gather branch [T, k, ...] and the
every-expert branch [C, T, ...]) are evaluated by ONNX's reference evaluator on the gfx950 graph and must equal bit
for bit what ORT CPU computes for the default graph's operands (Quark's MXFP4 activation fake-quantization and the
exact decoded expert weights, which the MoE family tests check against Quark's model), from the same crafted
activations and routing indices. tests/test_migraphx_ref.py runs the whole graphs in MIGraphX's ref target.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnx_helpers import build
from onnx_slice import all_nodes, back, producers, slice_model
from test_amd_arch_gfx950 import FP4, _crafted_x

QUARK_EXPORTS = [("qwen3_moe", "mxfp4"), ("gpt_oss", "mxfp4"), ("deepseek_v3", "mxfp4"), ("mixtral", "mxfp4"),
                 ("qwen2_moe", "mxfp4"), ("qwen3_moe", "mxfp4_fp8")]


def _attrs(n):
    return {a.name: helper.get_attribute_value(a) for a in n.attribute}


def _mx_dq(prod, name):
    """The 2-input DequantizeLinear of a float4e2m1 QuantizeLinear that `name` is (through Reshape: the routed rows
    of x), or None: what block_dq + skip_post_dq_ops read."""
    dq = back(prod, name, ("Reshape",))
    if dq is None or dq.op_type != "DequantizeLinear" or len(dq.input) != 2:
        return None
    q = prod.get(dq.input[0])
    if q is None or q.op_type != "QuantizeLinear" or _attrs(q).get("output_dtype") != FP4:
        return None
    return dq


def expert_mx_matmuls(model) -> list[onnx.NodeProto]:
    """Expert MatMuls inside If branches with the MX form on both operands, each scale at the operand's rank with
    more than one block along K (a blocked scale: block_dq's 'neither scalar nor 1-D')."""
    nodes = all_nodes(model.graph)
    top = {id(n) for n in model.graph.node}
    prod = producers(nodes)
    return [n for n in nodes if n.op_type == "MatMul" and id(n) not in top
            and all(_mx_dq(prod, x) is not None for x in n.input[:2])]


def _activation_input(prod, matmul) -> str:
    """The io-dtype value whose MXFP4 quantization is operand 0 (the Q's x before keep_fake_quant's doubling and the
    float32 cast): the same value name in the default graph feeds its Round emulation."""
    q = prod[_mx_dq(prod, matmul.input[0]).input[0]]
    x = q.input[0]
    if prod[x].op_type == "Add" and prod[x].name.endswith("/KeepX2"):
        x = prod[x].input[0]
    if prod.get(x) is not None and prod[x].name.endswith("/CastF32"):
        x = prod[x].input[0]
    return x


def _feeds(model, matmul, x_name: str, idx_name: str, io_np, k_dim: int) -> dict[str, np.ndarray]:
    """Crafted activations (tests/test_amd_arch_gfx950.py _crafted_x: ties, all-zero block, 1.75 * 2^E maxima, ...)
    in the shape the branch gives them, and routing indices [8, k] covering several experts."""
    nodes = all_nodes(model.graph)
    inits = {t.name: t for t in model.graph.initializer}
    prod = producers(nodes)
    idx_node = prod[idx_name]                                    # Reshape(top_idx, [-1, k])
    top_k = int(onnx.numpy_helper.to_array(inits[idx_node.input[1]])[-1])
    w_gather = back(prod, _mx_dq(prod, matmul.input[1]).input[0], ())
    data = next(n for n in nodes if n.name == w_gather.name.rsplit("/weight/", 1)[0] + "/weight/GatherWeight")
    e_count = inits[data.input[0]].dims[0]
    rng = np.random.default_rng(3)
    idx = np.stack([rng.permutation(e_count)[:top_k] for _ in range(8)]).astype(np.int64)
    rows = _crafted_x(k_dim, io_np).reshape(8, k_dim)
    if x_name.endswith("/Tokens/output_0"):                      # gate/up input: the token rows [T, H]
        x = rows
    elif "/routed/" in matmul.name:                              # down input, routed branch: [T, k, 1, I]
        x = np.stack([np.roll(rows, j, axis=1) for j in range(top_k)], axis=1)[:, :, None, :]
    else:                                                        # down input, every-expert branch: [C, T, I]
        chunk = next(n for n in nodes if n.name == matmul.name.rsplit("/", 2)[0] + "/Experts")
        c = inits[chunk.input[0]].dims[0] if chunk.input[0] in inits else 1
        x = np.stack([np.roll(rows, j, axis=1) for j in range(c)], axis=0)
    return {x_name: np.ascontiguousarray(x.astype(io_np)), idx_name: idx}


@pytest.fixture(scope="module")
def graphs(quark_exports, tmp_path_factory):
    def make(shape, recipe, precision, **extra):
        out = tmp_path_factory.mktemp(f"{shape}-{recipe}-{precision}")
        build(quark_exports(shape, recipe), out / "default", "rocm", precision)
        build(quark_exports(shape, recipe), out / "gfx950", "rocm", precision, amd_arch="gfx950", **extra)
        return onnx.load(str(out / "default" / "model.onnx")), onnx.load(str(out / "gfx950" / "model.onnx"))
    return make


# (shape, precision, MX expert MatMuls expected per MoE layer and If branch: projections with K > 32)
CASES = [("qwen3_moe", "fp32", 3), ("qwen3_moe", "fp16", 3), ("gpt_oss", "fp32", 2), ("deepseek_v3", "fp32", 2),
         ("mixtral", "fp32", 3), ("qwen2_moe", "fp32", 3)]


@pytest.mark.parametrize("shape,precision,per_branch", CASES)
def test_expert_mx_operands_equal_the_default_forms_bit_for_bit(graphs, shape, precision, per_branch):
    import onnxruntime as ort
    from onnx.reference import ReferenceEvaluator
    default, gfx950 = graphs(shape, "mxfp4", precision)
    mx = expert_mx_matmuls(gfx950)
    assert not expert_mx_matmuls(default)
    layers = sum(n.op_type == "If" for n in gfx950.graph.node)
    chunks = sum(1 for n in all_nodes(gfx950.graph) if "/all_experts/chunk" in n.name and n.name.endswith("/Experts"))
    assert layers and len(mx) == per_branch * (layers + chunks), (len(mx), layers, chunks)
    io = TensorProto.FLOAT16 if precision == "fp16" else TensorProto.FLOAT
    io_np = np.float16 if precision == "fp16" else np.float32
    nodes = all_nodes(gfx950.graph)
    prod = producers(nodes)
    dflt = {n.name: n for n in all_nodes(default.graph) if n.op_type == "MatMul"}
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    for mm in mx:
        x = _activation_input(prod, mm)
        block = mm.name.split("/routed/")[0] if "/routed/" in mm.name else mm.name.split("/all_experts/")[0]
        idx = next(n.output[0] for n in nodes if n.name == f"{block}/router/IdxRows")
        scale = _mx_dq(prod, mm.input[1]).input[1]
        blocks = next(n for n in nodes if n.output[0] == scale)                 # Reshape(.., [..., G, N])
        k_dim = int(onnx.numpy_helper.to_array(next(t for t in gfx950.graph.initializer
                                                    if t.name == blocks.input[1]))[-2]) * 32
        assert k_dim > 32
        feed = _feeds(gfx950, mm, x, idx, io_np, k_dim)
        inputs = {x: io, idx: TensorProto.INT64}
        ours = ReferenceEvaluator(slice_model(gfx950, inputs, list(mm.input), TensorProto.FLOAT)).run(None, feed)
        ours = [a.astype(io_np) for a in ours]  # the MX MatMul runs in float32 (quant/mx_gemm.py emit_mx_matmul)
        ref = slice_model(default, inputs, list(dflt[mm.name].input), io)
        want = ort.InferenceSession(ref.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feed)
        for a, b in zip(ours, want):
            assert a.dtype == b.dtype and a.shape == b.shape, (mm.name, a.shape, b.shape)
            np.testing.assert_array_equal(a, b, err_msg=mm.name)
        # the weight operand really is the chosen experts': not all zero, several scales
        assert np.count_nonzero(want[1]) > want[1].size // 4, mm.name


def test_k32_and_fp8_activation_experts_keep_todays_form(graphs):
    """deepseek_v3's experts have K = 32 on down_proj (one block: the parser's blocked Q/DQ needs more than one):
    that projection keeps the decoded form; MXFP4 weights with FP8 activations (mxfp4_fp8) take no MX form."""
    _, gfx950 = graphs("deepseek_v3", "mxfp4", "fp32")
    names = {n.name for n in expert_mx_matmuls(gfx950)}
    assert names and not any("/down/" in n for n in names)
    _, gfx950 = graphs("qwen3_moe", "mxfp4_fp8", "fp32")
    assert not expert_mx_matmuls(gfx950)


def test_inspect_states_the_routed_mx_form_per_layer(quark_exports):
    from builder.convert import describe_plan, plan_model
    from builder.options import parse_extra_options

    def lines(shape, *extra):
        plan, ckpt = plan_model(quark_exports(shape, "mxfp4") / "quark", "rocm", None, parse_extra_options(list(extra)))
        ckpt.close()
        text = describe_plan(plan)
        return {ln.split()[0]: ln for ln in text.splitlines() if ln.startswith("  ")}, text
    ls, text = lines("qwen3_moe", "amd_arch=gfx950")
    for proj in ("gate_proj", "up_proj", "down_proj"):
        line = ls[f"model.layers.0.mlp.experts.0.{proj}"]
        assert "[AMD: MX FP4 GEMM (batched 4-input quant_dot) on gfx950 (routed expert" in line, line
    assert "amd_arch=gfx950: 15 MXFP4 linear(s) take gfx950's MX GEMM form" in text
    assert "amd_arch=gfx950: 6 routed MoE expert projection(s) (stacks over the experts, in 2 MoE layer(s))" in text
    assert "activation fake-quantization is plain float ops" not in text  # every MXFP4 layer is Q/DQ now
    ls, _ = lines("deepseek_v3", "amd_arch=gfx950")
    assert "MX FP4 GEMM (batched" in ls["model.layers.1.mlp.experts.0.gate_proj"]
    down = ls["model.layers.1.mlp.experts.0.down_proj"]
    assert "routed expert: weights decoded in ops; amd_arch=gfx950 does not apply: one FP4 block along K=32" in down
    ls, _ = lines("qwen3_moe")
    assert ls["model.layers.0.mlp.experts.0.gate_proj"].endswith(
        "[AMD: io-dtype GEMM on every gfx (routed expert: weights decoded in ops)]")
