"""Named static rules that say where a built graph breaks an execution provider's known constraints.

A rule looks at one node with the model around it (`ModelView`: initializer shapes/dtypes, declared value types,
model-local functions, the EP profile) and returns a message, or None when the node is fine. Errors fail the
conversion; warnings are printed and the model is still written (it runs, but part of it leaves the accelerator).
Each rule's `source` says where the constraint was read or measured; docs/execution_providers.md lists them all.

Sources used below (read June-Nov 2026):
  MGX_PARSERS  AMDMIGraphX src/onnx/parse_*.cpp (commit f729a52, May 2026): the op types its ONNX parser accepts,
               parse_matmulnbits.cpp, parse_group_query_attention.cpp, parse_quantizelinear.cpp,
               parse_dequantizelinear.cpp, parse_cast.cpp, parse_constant.cpp, parse_mxqdq.cpp.
  MGX_TYPES    AMDMIGraphX src/onnx/onnx_parser.cpp get_type / parse_tensor_shape / parse_tensor (same commit).
  MGX_QDQ      AMDMIGraphX src/op/builder/include/migraphx/op/builder/quantize_dequantize_linear.hpp
               transform_quantize_dequantize_linear_inputs (per-tensor / per-axis / blocked scales).
  ORT_MGX_EP   onnxruntime core/providers/migraphx/migraphx_execution_provider.cc: GetUnsupportedNodeIndices (op list
               for ROCm < 7.2, migraphx::get_onnx_operators() from 7.2), IsTypeSupported, `unsupported_nodes.size() > 10`.
  ORT_CPU_PROBE  sessions created with onnxruntime 1.32 CPU on one-node graphs (tests/test_ep_cpu_kernels.py).
  ORT_CUDA     onnxruntime CUDA contrib kernel registrations (GroupQueryAttention: fp16/bf16 query only).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import onnx
from onnx import TensorProto

from .ep_configs.migraphx_ops import (MIGRAPHX_EP_OPS_BEFORE_ROCM_7_2, MIGRAPHX_INPUT_COUNTS, MIGRAPHX_MISREAD_TYPES,
                                      MIGRAPHX_ONNX_OPS, MIGRAPHX_PACKED_INT4, MIGRAPHX_PARSER_TYPES,
                                      ORT_MGX_EP_TENSOR_TYPES)

MS = "com.microsoft"
STANDARD_DOMAINS = ("", "ai.onnx", MS)
ERROR, WARNING = "error", "warning"
TYPE_NAMES = {v: k.lower() for k, v in TensorProto.DataType.items()}


def iter_nodes(graph: onnx.GraphProto):
    """Every node of the graph and of its subgraphs (If branches, Loop bodies), depth first."""
    for node in graph.node:
        yield node
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from iter_nodes(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for sub in a.graphs:
                    yield from iter_nodes(sub)


@dataclass
class ModelView:
    """What rules may look at besides the node: built once per check from the model (no weights loaded)."""
    model: onnx.ModelProto
    ep: object = None                                     # EPConfig
    initializers: dict = field(default_factory=dict)      # name -> TensorProto (dims, data_type; data may be external)
    value_types: dict = field(default_factory=dict)       # name -> TensorProto elem type, where declared
    functions: dict = field(default_factory=dict)         # (domain, name) -> FunctionProto

    @classmethod
    def of(cls, model: onnx.ModelProto, ep=None) -> "ModelView":
        view = cls(model, ep)
        g = model.graph
        for t in g.initializer:
            view.initializers[t.name] = t
            view.value_types[t.name] = t.data_type
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
                view.value_types[vi.name] = vi.type.tensor_type.elem_type
        for node in iter_nodes(g):
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                for a in node.attribute:
                    if a.name == "value":
                        view.value_types[node.output[0]] = a.t.data_type
        for f in model.functions:
            view.functions[(f.domain, f.name)] = f
        return view

    def type_of(self, name: str) -> int | None:
        return self.value_types.get(name) if name else None

    def dims_of(self, name: str) -> list[int] | None:
        t = self.initializers.get(name)
        return list(t.dims) if t is not None else None


@dataclass(frozen=True)
class Rule:
    """One named constraint. `check(node, view) -> message | None`; `ops` limits it to those op types."""
    name: str
    severity: str
    check: Callable
    source: str
    ops: tuple[str, ...] = ()

    def __call__(self, node: onnx.NodeProto, view: ModelView | None = None) -> str | None:
        if self.ops and node.op_type not in self.ops:
            return None
        return self.check(node, view)


@dataclass(frozen=True)
class ModelRule:
    """A constraint on the whole graph, given the per-node findings: `check(view, findings) -> message | None`."""
    name: str
    severity: str
    check: Callable
    source: str


def attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def input_at(node: onnx.NodeProto, i: int) -> str:
    return node.input[i] if i < len(node.input) else ""


def used_input_count(node: onnx.NodeProto) -> int:
    """Inputs up to the last non-empty one (trailing '' are absent optional inputs)."""
    n = len(node.input)
    while n and not node.input[n - 1]:
        n -= 1
    return n


def type_name(t: int | None) -> str:
    return TYPE_NAMES.get(t, "?") if t is not None else "?"


# ---------------------------------------------------------------------------------------------- MatMulNBits (all)

def _mnb_bits(node, view):
    bits = attr(node, "bits", 4)
    allowed = sorted(view.ep.matmul_nbits_bits) if view is not None and view.ep is not None else [2, 4, 8]
    if bits not in allowed:
        return f"bits={bits}; this EP runs MatMulNBits with bits in {allowed}"
    return None


def _mnb_block_size(node, view):
    bs = attr(node, "block_size", 0)
    if bs < 16 or bs & (bs - 1):
        return f"block_size={bs}; must be a power of two >= 16"
    return None


def _mnb_b_shape(node, view):
    k, n, bits, bs = (attr(node, a, 0) for a in ("K", "N", "bits", "block_size"))
    dims = view.dims_of(input_at(node, 1)) if view else None
    if dims is None or not bs:
        return None
    expected = [n, -(-k // bs), bs * bits // 8]
    if dims != expected:
        return f"B has shape {dims}; K={k} N={n} bits={bits} block_size={bs} need {expected}"
    return None


MATMULNBITS_RULES = (
    Rule("matmulnbits-bits", ERROR, _mnb_bits, "ort_facts.md; MGX_PARSERS parse_matmulnbits.cpp", ("MatMulNBits",)),
    Rule("matmulnbits-block-size", ERROR, _mnb_block_size, "ORT MatMulNBits schema; MGX_PARSERS",
         ("MatMulNBits",)),
    Rule("matmulnbits-b-shape", ERROR, _mnb_b_shape, "ORT MatMulNBits schema; MGX_PARSERS", ("MatMulNBits",)),
)


# ---------------------------------------------------------------------------------------------- any EP

def _unknown_domain(node, view):
    if node.domain in STANDARD_DOMAINS:
        return None
    if view is not None and (node.domain, node.op_type) in view.functions:
        return None
    return (f"domain '{node.domain}' has no model-local function: it runs only where a custom-op library "
            "registers a kernel (genai_config session_options.custom_ops_library)")


COMMON_RULES = (
    Rule("custom-op-needs-library", WARNING, _unknown_domain, "ort_facts.md (custom ops)"),
) + MATMULNBITS_RULES


# ---------------------------------------------------------------------------------------------- CPU

CPU_NO_KERNEL_OPS = ("MatMulBlockQuantizedFp8Weight", "MatMulBlockQuantizedFp4Weight")
# op types measured without a bf16 CPU kernel in onnxruntime 1.32 (ORT_CPU_PROBE)
CPU_NO_BF16_OPS = ("MatMulNBits", "GroupQueryAttention", "MatMul", "Add", "Mul", "Sub", "Div", "Sigmoid", "Softmax",
                   "RotaryEmbedding", "QuantizeLinear", "DequantizeLinear")
FP4, BF16, FP8_E4M3FN = TensorProto.FLOAT4E2M1, TensorProto.BFLOAT16, TensorProto.FLOAT8E4M3FN


def _cpu_no_kernel(node, view):
    if node.domain == MS and node.op_type in CPU_NO_KERNEL_OPS:
        return "no CPU kernel in onnxruntime (CUDA only)"
    return None


def _qdq_types(node, view):
    """(quantized type, scale type) of a QuantizeLinear/DequantizeLinear, where known."""
    scale_t = view.type_of(input_at(node, 1))
    if node.op_type == "DequantizeLinear":
        q_t = view.type_of(input_at(node, 0)) or view.type_of(input_at(node, 2))
    else:
        q_t = attr(node, "output_dtype") or view.type_of(input_at(node, 2)) or None
    return q_t, scale_t


def _cpu_fp4_qdq(node, view):
    q_t, _ = _qdq_types(node, view)
    if q_t == FP4:
        return f"{node.op_type} on float4e2m1 has no CPU kernel (onnxruntime 1.32)"
    return None


def _cpu_bf16(node, view):
    if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
        t = _qdq_types(node, view)[1]
    elif node.op_type == "MatMulNBits":
        t = view.type_of(input_at(node, 0)) or view.type_of(input_at(node, 2))  # scales have A's type
    elif node.op_type == "GroupQueryAttention":
        t = view.type_of(input_at(node, 0)) or view.type_of(input_at(node, 3))
    else:
        t = next((view.type_of(i) for i in node.input if view.type_of(i) is not None), None)
    if t == BF16:
        return f"{node.op_type} with bfloat16 has no CPU kernel (onnxruntime 1.32); use -p fp32 or fp16"
    return None


def _cpu_gqa_fp8_cache(node, view):
    if view.type_of(input_at(node, 3)) == FP8_E4M3FN:
        return "GroupQueryAttention with a float8e4m3fn KV cache has no CPU kernel (int8 and 4-bit do)"
    return None


CPU_RULES = COMMON_RULES + (
    Rule("cpu-no-kernel", ERROR, _cpu_no_kernel, "ORT_CPU_PROBE", CPU_NO_KERNEL_OPS),
    Rule("cpu-no-fp4-qdq", ERROR, _cpu_fp4_qdq, "ORT_CPU_PROBE", ("QuantizeLinear", "DequantizeLinear")),
    Rule("cpu-no-bf16", ERROR, _cpu_bf16, "ORT_CPU_PROBE", CPU_NO_BF16_OPS),
    Rule("cpu-gqa-no-fp8-cache", ERROR, _cpu_gqa_fp8_cache, "ORT_CPU_PROBE; ort_facts.md",
         ("GroupQueryAttention",)),
)


# ---------------------------------------------------------------------------------------------- CUDA

def _cuda_gqa_dtype(node, view):
    t = view.type_of(input_at(node, 0)) or view.type_of(input_at(node, 3))
    if t == TensorProto.FLOAT:
        return "GroupQueryAttention has CUDA kernels for fp16/bf16 only: fp32 runs it on CPU (use -p fp16)"
    return None


def _cuda_gqa_fp8_cache(node, view):
    if view.type_of(input_at(node, 3)) == FP8_E4M3FN:
        return "float8 KV cache needs an onnxruntime CUDA build with USE_FP8_KV_CACHE and an SM89+ GPU"
    return None


CUDA_RULES = COMMON_RULES + (
    Rule("cuda-gqa-dtype", WARNING, _cuda_gqa_dtype, "ORT_CUDA", ("GroupQueryAttention",)),
    Rule("cuda-gqa-fp8-cache", WARNING, _cuda_gqa_fp8_cache, "ORT_CUDA; ort_facts.md", ("GroupQueryAttention",)),
)


# ---------------------------------------------------------------------------------------------- MIGraphX

MIGRAPHX_CPU_FALLBACK_LIMIT = 10  # ORT_MGX_EP: `if (unsupported_nodes.size() > 10) return result;`


def _mgx_zero_points(node, view):
    zp = input_at(node, 3)
    if not zp:
        return None
    k, n, bits, bs = (attr(node, a, 0) for a in ("K", "N", "bits", "block_size"))
    expected = [n * -(-(-(-k // bs) * bits) // 8)] if bs else None
    dims = view.dims_of(zp)
    zp_t = view.type_of(zp)
    if zp_t is not None and zp_t != TensorProto.UINT8:
        return f"zero_points are {type_name(zp_t)}; MIGraphX unpacks them as packed uint8"
    if dims is not None and expected is not None and dims != expected:
        return f"zero_points have shape {dims}; MIGraphX accepts only the packed 1-D shape {expected}"
    return None


def _mgx_ignored_inputs(node, view):
    extra = [(i, name) for i, name in enumerate(node.input) if i >= 4 and name]
    if extra:
        what = ", ".join(f"input {i} ({'g_idx' if i == 4 else 'bias' if i == 5 else '?'}) '{n}'" for i, n in extra)
        return f"MIGraphX ignores {what}: emit the bias as a separate Add"
    return None


def _mgx_gqa_inputs(node, view):
    n = used_input_count(node)
    if n > 11:
        names = {11: "head_sink", 12: "k_scale", 13: "v_scale"}
        used = [names.get(i, str(i)) for i in range(11, n) if node.input[i]]
        return f"{n} inputs ({', '.join(used)}); MIGraphX parses 7-11 (no head_sink, no k_scale/v_scale)"
    if n < 7:
        return f"{n} inputs; MIGraphX parses 7-11"
    return None


def _mgx_gqa_kv_quant(node, view):
    kq, vq = attr(node, "k_quant_type", b"NONE"), attr(node, "v_quant_type", b"NONE")
    kq, vq = (x.decode() if isinstance(x, bytes) else x for x in (kq, vq))
    if kq != "NONE" or vq != "NONE":
        return f"k_quant_type={kq} v_quant_type={vq}; MIGraphX has no quantized KV cache"
    return None


def _mgx_gqa_softcap(node, view):
    softcap = attr(node, "softcap", 0.0)
    if softcap:
        return f"softcap={softcap}; MIGraphX throws on non-zero softcap"
    return None


def _mgx_unsupported_reason(node, view) -> str | None:
    """Why the MIGraphX EP would leave this node to the CPU EP, or None."""
    key = (node.domain, node.op_type)
    if node.domain not in STANDARD_DOMAINS and view is not None and key in view.functions:
        body = view.functions[key].node
        bad = sorted({n.op_type for n in body if n.op_type not in MIGRAPHX_ONNX_OPS})
        return f"its function body uses {bad}, which MIGraphX does not parse" if bad else None
    if node.op_type not in MIGRAPHX_ONNX_OPS:
        return f"MIGraphX has no parser for {node.domain + '.' if node.domain else ''}{node.op_type}"
    if view is not None:
        for name in list(node.input) + list(node.output):
            t = view.type_of(name)
            if t is not None and t not in ORT_MGX_EP_TENSOR_TYPES:
                return f"tensor '{name}' is {type_name(t)}, a type the MIGraphX EP does not take"
    return None


def _mgx_supported(node, view):
    reason = _mgx_unsupported_reason(node, view)
    if reason:
        return f"runs on CPU: {reason}"
    return None


def _mgx_old_rocm(node, view):
    if node.op_type in MIGRAPHX_ONNX_OPS and node.op_type not in MIGRAPHX_EP_OPS_BEFORE_ROCM_7_2:
        return f"{node.op_type} is claimed by the MIGraphX EP only on ROCm >= 7.2 (older builds use a fixed list)"
    return None


def _mgx_cpu_fallback(view, findings):
    unsupported = [f for f in findings if f.rule == "migraphx-supported-op"]
    if len(unsupported) > MIGRAPHX_CPU_FALLBACK_LIMIT:
        return (f"{len(unsupported)} nodes are unsupported (> {MIGRAPHX_CPU_FALLBACK_LIMIT}): the MIGraphX EP claims "
                "nothing and the WHOLE model runs on the CPU")
    return None


# ---------------------------------------------------------------------------------------------- MIGraphX parser
# What MIGraphX's ONNX parser itself accepts. A violation is an error: the EP hands the node over and session
# creation fails inside migraphx::parse_onnx (or, for misread types, computes on wrong bytes).

def parser_type_problem(t: int | None) -> str | None:
    """Why MIGraphX's parser cannot take element type t (MGX_TYPES get_type), or None."""
    if t is None or t == TensorProto.UNDEFINED:
        return None
    if t in MIGRAPHX_MISREAD_TYPES:
        return f"{type_name(t)} is misread: {MIGRAPHX_MISREAD_TYPES[t]}"
    if t not in MIGRAPHX_PARSER_TYPES:
        return f"{type_name(t)} ({t}) is refused: get_type throws 'Prototensor data type {t} not supported'"
    return None


def _mgx_node_types(node, view):
    """Element types on the node's inputs/outputs and in its type attributes (Cast to, QuantizeLinear
    output_dtype, Constant value): all go through onnx_parser.cpp get_type."""
    where = [(f"tensor '{name}'", view.type_of(name)) for name in list(node.input) + list(node.output) if name]
    if node.op_type in ("Cast",) and node.domain in ("", "ai.onnx"):
        where.append(("attribute to", attr(node, "to")))             # parse_cast.cpp: get_type(to)
    if node.op_type == "QuantizeLinear" and attr(node, "output_dtype") != TensorProto.FLOAT4E2M1:
        # parse_quantizelinear.cpp: get_type(output_dtype); float4e2m1 (fp4x2) is not a tensor read from bytes there:
        # op/builder/quantizelinear.cpp handle_fp4x2 emits quantizelinear + pack_fp4 + unpack_fp4 (amd_arch=gfx950;
        # tools/migraphx_gfx950_probe.py fp4_q_act / mx_dot parse and run)
        where.append(("attribute output_dtype", attr(node, "output_dtype")))
    if node.op_type in ("Constant", "ConstantOfShape"):
        for a in node.attribute:                                     # parse_constant.cpp -> parse_tensor
            if a.type == onnx.AttributeProto.TENSOR:
                where.append((f"attribute {a.name}", a.t.data_type))
    for what, t in where:
        problem = parser_type_problem(t)
        if problem:
            return f"{what}: {problem}"
    return None


def _mgx_input_count(node, view):
    limits = MIGRAPHX_INPUT_COUNTS.get(node.op_type)
    if limits is None:
        return None
    n = used_input_count(node)
    lo, hi = limits
    if not lo <= n <= hi:
        return f"{n} inputs; MIGraphX's {node.op_type} parser takes {lo}-{hi}"
    return None


def _qdq_scale_zp(node, view):
    return input_at(node, 1), input_at(node, 2)


def _mgx_qdq_types(node, view):
    """parse_quantizelinear.cpp / parse_dequantizelinear.cpp type checks."""
    x, (scale, zp) = input_at(node, 0), _qdq_scale_zp(node, view)
    x_t, s_t, zp_t = view.type_of(x), view.type_of(scale), view.type_of(zp)
    if node.op_type == "QuantizeLinear":
        opset = next((o.version for o in view.model.opset_import if o.domain in ("", "ai.onnx")), 0)
        if opset >= 19 and None not in (x_t, s_t) and x_t != s_t:
            return (f"x is {type_name(x_t)} but y_scale is {type_name(s_t)}; from opset 19 MIGraphX requires the "
                    "same type (parse_quantizelinear.cpp)")
        out_t = attr(node, "output_dtype")
        if out_t and zp_t is not None and out_t != zp_t:
            return f"output_dtype {type_name(out_t)} != zero point type {type_name(zp_t)} (parse_quantizelinear.cpp)"
    elif zp and None not in (x_t, zp_t) and x_t != zp_t:
        return f"x is {type_name(x_t)} but the zero point is {type_name(zp_t)} (parse_dequantizelinear.cpp)"
    s_dims, zp_dims = view.dims_of(scale), view.dims_of(zp)
    if zp and s_dims is not None and zp_dims is not None and s_dims != zp_dims:
        return f"scale shape {s_dims} != zero point shape {zp_dims} (MIGraphX requires equal shapes)"
    return None


def _mgx_qdq_granularity(node, view):
    """MGX_QDQ transform_quantize_dequantize_linear_inputs: per-tensor (1 element), per-axis (rank-1 scale of
    x.shape[axis]) or blocked (same rank, dims equal except axis, > 1 block, block_size in range)."""
    x_dims, s_dims = view.dims_of(input_at(node, 0)), view.dims_of(input_at(node, 1))
    if s_dims is None:
        return None
    n_scale = 1
    for d in s_dims:
        n_scale *= d
    if n_scale == 1:
        return None
    if x_dims is None:
        return None
    rank = len(x_dims)
    axis = attr(node, "axis", 1)
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis < rank:
        return f"axis={attr(node, 'axis', 1)} is out of range for rank {rank}"
    if len(s_dims) == 1:
        if s_dims[0] != x_dims[axis]:
            return f"per-axis scale of {s_dims[0]} values but x has {x_dims[axis]} on axis {axis}"
        return None
    if len(s_dims) != rank:
        return f"blocked scale rank {len(s_dims)} != x rank {rank}"
    if any(a != b for i, (a, b) in enumerate(zip(x_dims, s_dims)) if i != axis):
        return f"blocked scale shape {s_dims} differs from x {x_dims} off axis {axis}"
    di, si = x_dims[axis], s_dims[axis]
    if si <= 1:
        return f"blocked scale has {si} block(s) along axis {axis}; MIGraphX needs more than one (use per-axis)"
    lo, hi = -(-di // si), -(-di // (si - 1)) - 1
    bs = attr(node, "block_size", 0) or lo
    if not lo <= bs <= hi:
        return f"block_size={bs} outside [{lo}, {hi}] for {di} elements in {si} blocks"
    return None


def _mgx_matmulnbits_attrs(node, view):
    """parse_matmulnbits.cpp: N, K, bits, block_size required; scales hold N * ceil(K / block_size) values."""
    missing = [a for a in ("N", "K", "bits", "block_size") if attr(node, a) is None]
    if missing:
        return f"attribute(s) {missing} missing; MIGraphX requires N, K, bits, block_size"
    k, n, bs = attr(node, "K"), attr(node, "N"), attr(node, "block_size")
    dims = view.dims_of(input_at(node, 2))
    if dims is not None and bs:
        count = 1
        for d in dims:
            count *= d
        if count != n * -(-k // bs):
            return f"scales hold {count} values; MIGraphX expects N * ceil(K / block_size) = {n * -(-k // bs)}"
    return None


def _mgx_mxqdq(node, view):
    """parse_mxqdq.cpp: axis, block_size == 32, element_dtype 'fp4_e2m1', rounding_mode == 2 (ties to even)."""
    if attr(node, "axis") is None:
        return "attribute axis missing (MIGraphX reads it with attributes.at)"
    if attr(node, "block_size") != 32:
        return f"block_size={attr(node, 'block_size')}; MIGraphX supports 32 only"
    dt = attr(node, "element_dtype")
    dt = dt.decode() if isinstance(dt, bytes) else dt
    if dt != "fp4_e2m1":
        return f"element_dtype={dt}; MIGraphX supports fp4_e2m1 only"
    if attr(node, "rounding_mode") != 2:
        return f"rounding_mode={attr(node, 'rounding_mode')}; MIGraphX supports 2 (round ties to even) only"
    return None


def _mgx_graph_types(view, findings):
    """Every declared tensor (initializers, graph inputs/outputs, value_info) has a type the parser reads;
    packed INT4/UINT4 initializers have an even last dimension (onnx_parser.cpp parse_tensor_shape)."""
    g = view.model.graph
    bad = []
    for t in g.initializer:
        problem = parser_type_problem(t.data_type)
        if problem is None and t.data_type in MIGRAPHX_PACKED_INT4 and (not t.dims or t.dims[-1] % 2):
            problem = "packed int4 needs an even last dimension (parse_tensor_shape)"
        if problem:
            bad.append(f"initializer '{t.name}': {problem}")
    for kind, values in (("input", g.input), ("output", g.output), ("value_info", g.value_info)):
        for vi in values:
            if vi.type.HasField("tensor_type"):
                problem = parser_type_problem(vi.type.tensor_type.elem_type)
                if problem:
                    bad.append(f"graph {kind} '{vi.name}': {problem}")
    if bad:
        more = f" (+{len(bad) - 3} more)" if len(bad) > 3 else ""
        return f"{len(bad)} tensor(s) MIGraphX's ONNX parser cannot read: " + "; ".join(bad[:3]) + more
    return None


QDQ = ("QuantizeLinear", "DequantizeLinear")
MIGRAPHX_PARSER_RULES = (
    Rule("migraphx-parser-type", ERROR, _mgx_node_types, "MGX_TYPES get_type; MGX_PARSERS parse_cast.cpp, "
         "parse_quantizelinear.cpp, parse_constant.cpp"),
    Rule("migraphx-parser-input-count", ERROR, _mgx_input_count, "MGX_PARSERS (see MIGRAPHX_INPUT_COUNTS)",
         tuple(MIGRAPHX_INPUT_COUNTS)),
    Rule("migraphx-qdq-types", ERROR, _mgx_qdq_types, "MGX_PARSERS parse_quantizelinear.cpp, "
         "parse_dequantizelinear.cpp", QDQ),
    Rule("migraphx-qdq-granularity", ERROR, _mgx_qdq_granularity, "MGX_QDQ", QDQ),
    Rule("migraphx-matmulnbits-attrs", ERROR, _mgx_matmulnbits_attrs, "MGX_PARSERS parse_matmulnbits.cpp",
         ("MatMulNBits",)),
    Rule("migraphx-mxqdq-attrs", ERROR, _mgx_mxqdq, "MGX_PARSERS parse_mxqdq.cpp",
         ("MXQuantizeDequantize", "MXFixNeuron")),
)


MIGRAPHX_RULES = COMMON_RULES + MIGRAPHX_PARSER_RULES + (
    Rule("migraphx-matmulnbits-zero-points", ERROR, _mgx_zero_points, "MGX_PARSERS parse_matmulnbits.cpp",
         ("MatMulNBits",)),
    Rule("migraphx-matmulnbits-ignored-inputs", ERROR, _mgx_ignored_inputs, "MGX_PARSERS parse_matmulnbits.cpp",
         ("MatMulNBits",)),
    Rule("migraphx-gqa-inputs", ERROR, _mgx_gqa_inputs, "MGX_PARSERS parse_group_query_attention.cpp",
         ("GroupQueryAttention",)),
    Rule("migraphx-gqa-kv-quant", ERROR, _mgx_gqa_kv_quant, "MGX_PARSERS parse_group_query_attention.cpp",
         ("GroupQueryAttention",)),
    Rule("migraphx-gqa-softcap", ERROR, _mgx_gqa_softcap, "MGX_PARSERS parse_group_query_attention.cpp",
         ("GroupQueryAttention",)),
    Rule("migraphx-supported-op", WARNING, _mgx_supported, "MGX_PARSERS operators(); ORT_MGX_EP IsNodeSupported"),
    Rule("migraphx-op-needs-rocm-7.2", WARNING, _mgx_old_rocm, "ORT_MGX_EP GetUnsupportedNodeIndices"),
)
def _mgx_gpu_drops_fake_quant(view, findings):
    from .ops.keep_fake_quant import count_dropped
    n = count_dropped(view.model.graph)
    if n:
        return (f"{n} QuantizeLinear -> DequantizeLinear pair(s) with one scale feed no quantizable MatMul: MIGraphX's "
                "GPU pipeline drops them (simplify_qdq remove_qdq_pairs), so that fake quantization is not computed "
                "on an AMD GPU (the ref target keeps it); this converter writes them as Q(x + x, s + s)")
    return None


MIGRAPHX_MODEL_RULES = (
    ModelRule("migraphx-parser-graph-types", ERROR, _mgx_graph_types, "MGX_TYPES get_type, parse_tensor_shape"),
    ModelRule("migraphx-cpu-fallback", WARNING, _mgx_cpu_fallback, "ORT_MGX_EP GetCapability"),
    ModelRule("migraphx-gpu-drops-fake-quant", WARNING, _mgx_gpu_drops_fake_quant,
              "MGX src/simplify_qdq.cpp remove_qdq_pairs, src/targets/gpu/target.cpp"),
)
