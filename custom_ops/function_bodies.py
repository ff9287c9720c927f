"""The bodies of the com.quark_onnx ONNX-function fallbacks, written with onnxscript: standard ONNX ops only, float32
arithmetic, the result cast back to A's dtype (float32 or float16; A and Y are left untyped for that reason).

Authored against opset 21; functions.py re-targets each FunctionProto to the model's own default opset (>= 19: every
op here means the same from 19 on). Tensor names inside a body are local to it. Shapes are read at run time
(Reshape with 0 / -1), so the K and N attributes are declared but not used.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper
from onnxscript import BFLOAT16, FLOAT, FLOAT8E4M3FN, INT8, INT32, UINT8, script
from onnxscript import opset21 as op
from onnxscript.values import Opset

from .functions import DOMAIN, DOMAIN_VERSION, DYNAMIC_SCALE_MIN, E4M3FN_MAX, MXFP4_BLOCK_SIZE, NVFP4_BLOCK_SIZE

quark_onnx = Opset(DOMAIN, DOMAIN_VERSION)
E2M1_MAGNITUDES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _tensor(name: str, array: np.ndarray) -> TensorProto:
    return numpy_helper.from_array(array, name)


def _ints(name: str, values) -> TensorProto:
    return _tensor(name, np.array(values, dtype=np.int64))


# 16 floats indexed by the 4-bit e2m1 code: codes 0-7 positive, 8-15 the same magnitudes negated.
FP4_TABLE = _tensor("fp4_table", np.array(E2M1_MAGNITUDES + [-m for m in E2M1_MAGNITUDES], dtype=np.float32))
# 256 floats indexed by the e8m0 byte: 2^(s-127), NaN at 255 (2^-127 is a float32 subnormal, exact).
_e8m0 = np.full(256, np.nan, dtype=np.float32)
_e8m0[:255] = np.exp2(np.arange(255, dtype=np.float64) - 127.0)
E8M0_TABLE = _tensor("e8m0_table", _e8m0)
LOW_MASK = _tensor("low_mask", np.array(0x0F, dtype=np.uint8))
NIBBLE_BITS = _tensor("nibble_bits", np.array(4, dtype=np.uint8))
LAST_AXIS = _ints("last_axis", [-1])
SHAPE_N_BLOCKS_32 = _ints("shape_n_blocks_32", [0, -1, MXFP4_BLOCK_SIZE])
SHAPE_N_BLOCKS_16 = _ints("shape_n_blocks_16", [0, -1, NVFP4_BLOCK_SIZE])
SHAPE_N_K = _ints("shape_n_k", [0, -1])
SHAPE_COLUMN = _ints("shape_col", [-1, 1])
SCALAR_SHAPE = _ints("scalar_shape", np.zeros((0,), dtype=np.int64))
SHAPE_E_BLOCKS_32 = _ints("shape_e_blocks_32", [0, 0, 0, -1, MXFP4_BLOCK_SIZE])
SHAPE_E_BLOCKS_16 = _ints("shape_e_blocks_16", [0, 0, 0, -1, NVFP4_BLOCK_SIZE])
SHAPE_E_N_K = _ints("shape_e_n_k", [0, 0, 0, -1])
SHAPE_E_GROUPS = _ints("shape_e_groups", [0, 0, 0, 0, -1])
SHAPE_E_COLUMN = _ints("shape_e_col", [0, 0, -1, 1])
SHAPE_E_SCALAR = _ints("shape_e_scalar", [0, 0, 1, 1])
SHAPE_ROWS_TAIL = _ints("shape_rows_tail", [-1, 1])
SHAPE_T_K_N = _ints("shape_t_k_n", [0, 0, -1])
FP8_ZERO = helper.make_tensor("fp8_zero", TensorProto.FLOAT8E4M3FN, [], np.zeros((), np.uint8).tobytes(), raw=True)
ONE = _tensor("one", np.array(1.0, dtype=np.float32))
FP8_MAX = _tensor("fp8_max", np.array(E4M3FN_MAX, dtype=np.float32))
SCALE_MIN = _tensor("scale_min", np.array(DYNAMIC_SCALE_MIN, dtype=np.float32))
ZERO_1D = _ints("zero_1d", [0])
ONE_1D = _ints("one_1d", [1])
SHAPE_N_ANY = _ints("shape_n_any", [0, -1])
INT8_ZERO = _tensor("int8_zero", np.array(0, dtype=np.int8))
TWO_1D = _ints("two_1d", [2])
ZERO_F = _tensor("zero_f", np.array(0.0, dtype=np.float32))
INT8_MAX_F = _tensor("int8_max_f", np.array(127.0, dtype=np.float32))
INT8_MIN_F = _tensor("int8_min_f", np.array(-127.0, dtype=np.float32))
INT4_DEFAULT_ZP = _tensor("int4_default_zp", np.array(8.0, dtype=np.float32))
MINUS_ONE_1D = _ints("minus_one_1d", [-1])
ZERO_I64 = _tensor("zero_i64", np.array(0, dtype=np.int64))
ONE_I64 = _tensor("one_i64", np.array(1, dtype=np.int64))
ZERO_6 = _ints("zero_6", [0] * 6)
LARGE_1D = _ints("large_1d", [2**62])
NEG_INF = _tensor("neg_inf", np.array(-np.inf, dtype=np.float32))
AXES_1_3 = _ints("axes_1_3", [1, 3])


@script(quark_onnx)
def MatMulMxfp4(A, B: UINT8[...], B_scale: UINT8[...], K: int, N: int):
    """Y [..., N] = A [..., K] @ W^T; W = e2m1(B) * 2^(B_scale - 127) per block of 32 along K (255: NaN).

    B uint8 [N, K/2]: element 2j is the low nibble of byte j. B_scale uint8 e8m0 [N, K/32]."""
    code_even = op.BitwiseAnd(B, op.Constant(value=LOW_MASK))
    code_odd = op.BitShift(B, op.Constant(value=NIBBLE_BITS), direction="RIGHT")
    last_axis = op.Constant(value=LAST_AXIS)
    code_pairs = op.Concat(op.Unsqueeze(code_even, last_axis), op.Unsqueeze(code_odd, last_axis), axis=-1)
    code_blocks = op.Reshape(code_pairs, op.Constant(value=SHAPE_N_BLOCKS_32))          # [N, K/32, 32]
    code_index = op.Cast(code_blocks, to=TensorProto.INT32)  # int32: half the constant-folding peak
    value_blocks = op.Gather(op.Constant(value=FP4_TABLE), code_index)
    block_scale = op.Gather(op.Constant(value=E8M0_TABLE), op.Cast(B_scale, to=TensorProto.INT64))  # [N, K/32]
    weight_blocks = op.Mul(value_blocks, op.Unsqueeze(block_scale, last_axis))
    weight_kn = op.Transpose(op.Reshape(weight_blocks, op.Constant(value=SHAPE_N_K)), perm=[1, 0])
    y_f32 = op.MatMul(op.Cast(A, to=TensorProto.FLOAT), weight_kn)
    Y = op.CastLike(y_f32, A)
    return Y


@script(quark_onnx)
def MatMulNvfp4(A, B: UINT8[...], B_scale: FLOAT8E4M3FN[...], B_scale_2: FLOAT[...], K: int, N: int):
    """Y = A @ W^T; W = e2m1(B) * float32(float32(B_scale) * B_scale_2) per block of 16 along K: Quark's order, the
    block scale times the global scale rounded once in float32. B uint8 [N, K/2] (low nibble first),
    B_scale e4m3fn [N, K/16], B_scale_2 float32 scalar."""
    code_even = op.BitwiseAnd(B, op.Constant(value=LOW_MASK))
    code_odd = op.BitShift(B, op.Constant(value=NIBBLE_BITS), direction="RIGHT")
    last_axis = op.Constant(value=LAST_AXIS)
    code_pairs = op.Concat(op.Unsqueeze(code_even, last_axis), op.Unsqueeze(code_odd, last_axis), axis=-1)
    code_blocks = op.Reshape(code_pairs, op.Constant(value=SHAPE_N_BLOCKS_16))          # [N, K/16, 16]
    code_index = op.Cast(code_blocks, to=TensorProto.INT32)  # int32: half the constant-folding peak
    value_blocks = op.Gather(op.Constant(value=FP4_TABLE), code_index)
    scale_2 = op.Reshape(B_scale_2, op.Constant(value=SCALAR_SHAPE))
    block_scale = op.Mul(op.Cast(B_scale, to=TensorProto.FLOAT), scale_2)                # [N, K/16]
    weight_blocks = op.Mul(value_blocks, op.Unsqueeze(block_scale, last_axis))
    weight_kn = op.Transpose(op.Reshape(weight_blocks, op.Constant(value=SHAPE_N_K)), perm=[1, 0])
    y_f32 = op.MatMul(op.Cast(A, to=TensorProto.FLOAT), weight_kn)
    Y = op.CastLike(y_f32, A)
    return Y


FOUR_1D = _ints("four_1d", [4])
SIXTEEN_1D = _ints("sixteen_1d", [16])
SIXTEEN_FOUR = _ints("sixteen_four", [16, 4])


@script(quark_onnx)
def Fp4TilesToRows(B: UINT8[...]):
    """The 16-row tiles (custom_ops/fp4_r16.py) of one FP4 weight or of a stack of them put back in the checkpoint's
    order: B [..., N/16, K/8, 64] -> [..., N, K/2]. (The block scales, uint8 or e4m3fn, go back in each op's body:
    a helper taking both types failed ORT's type check of the calling function.)"""
    minus_one = op.Constant(value=MINUS_ONE_1D)
    chunks = op.Shape(B, start=-2, end=-1)                                                      # K/8
    tiles = op.Reshape(B, op.Concat(minus_one, chunks, op.Constant(value=SIXTEEN_FOUR), axis=0))  # [L, K/8, 16, 4]
    rows = op.Transpose(tiles, perm=[0, 2, 1, 3])                                               # [L, 16, K/8, 4]
    b_rows = op.Reshape(rows, op.Concat(op.Shape(B, start=0, end=-3), minus_one,
                                        op.Mul(chunks, op.Constant(value=FOUR_1D)), axis=0))
    return b_rows


@script(quark_onnx)
def MatMulMxfp4R16(A, B: UINT8[...], B_scale: UINT8[...], K: int, N: int):
    """MatMulMxfp4 on the weight in 16-row tiles: B uint8 [N/16, K/8, 64], B_scale uint8 [N/16, K/32, 16], put back
    to the checkpoint's [N, K/2] / [N, K/32] (Fp4TilesToRows), then MatMulMxfp4's arithmetic."""
    b_rows = Fp4TilesToRows(B)
    blocks = op.Shape(B_scale, start=-2, end=-1)
    s_tiles = op.Reshape(B_scale, op.Concat(op.Constant(value=MINUS_ONE_1D), blocks, op.Constant(value=SIXTEEN_1D),
                                            axis=0))
    s_rows = op.Reshape(op.Transpose(s_tiles, perm=[0, 2, 1]), op.Concat(op.Shape(B_scale, start=0, end=-3),
                                                                         op.Constant(value=MINUS_ONE_1D), blocks, axis=0))
    Y = quark_onnx.MatMulMxfp4(A, b_rows, s_rows, K=K, N=N)
    return Y


@script(quark_onnx)
def MatMulNvfp4R16(A, B: UINT8[...], B_scale: FLOAT8E4M3FN[...], B_scale_2: FLOAT[...], K: int, N: int):
    """MatMulNvfp4 on the weight in 16-row tiles: B uint8 [N/16, K/8, 64], B_scale e4m3fn [N/16, K/16, 16]."""
    b_rows = Fp4TilesToRows(B)
    blocks = op.Shape(B_scale, start=-2, end=-1)
    s_tiles = op.Reshape(B_scale, op.Concat(op.Constant(value=MINUS_ONE_1D), blocks, op.Constant(value=SIXTEEN_1D),
                                            axis=0))
    s_rows = op.Reshape(op.Transpose(s_tiles, perm=[0, 2, 1]), op.Concat(op.Shape(B_scale, start=0, end=-3),
                                                                         op.Constant(value=MINUS_ONE_1D), blocks, axis=0))
    Y = quark_onnx.MatMulNvfp4(A, b_rows, s_rows, B_scale_2, K=K, N=N)
    return Y


# QuantizeDequantizeMxfp4: the constants of builder/ops/mx_activation.py's subgraph (its _CONST_VALUES, "pow2")
MXA_POW2 = _tensor("mxa_pow2", np.ldexp(np.float32(1), np.arange(255) - 127).astype(np.float32))
MXA_BLOCKS = _ints("mxa_blocks", [-1, MXFP4_BLOCK_SIZE])


def _f(name: str, value: float) -> TensorProto:
    return _tensor(name, np.array(value, dtype=np.float32))


MXA_MIN_NORMAL, MXA_INV_LN2 = _f("mxa_min_normal", 2.0 ** -126), _f("mxa_inv_ln2", 1.0 / np.log(2.0))
MXA_EXP_LO, MXA_EXP_HI, MXA_BIAS = _f("mxa_exp_lo", -126.0), _f("mxa_exp_hi", 127.0), _f("mxa_bias", 127.0)
MXA_HALF, MXA_TWO, MXA_QUARTER, MXA_ONE_75 = _f("mxa_half", 0.5), _f("mxa_two", 2.0), _f("mxa_quarter", 0.25), \
    _f("mxa_one_75", 1.75)
MXA_MIN_SCALE, MXA_ONE, MXA_FOUR = _f("mxa_min_scale", 2.0 ** -127), _f("mxa_one", 1.0), _f("mxa_four", 4.0)
MXA_E2M1_MAX, MXA_E2M1_MIN = _f("mxa_e2m1_max", 6.0), _f("mxa_e2m1_min", -6.0)


@script(quark_onnx)
def QuantizeDequantizeMxfp4(X: FLOAT[...]):
    """Quark's dynamic MXFP4 activation fake quantization ("even" block scales, blocks of 32 along the last axis):
    builder/ops/mx_activation.py's standard-op subgraph, op for op."""
    blocks = op.Reshape(X, op.Constant(value=MXA_BLOCKS))
    amax = op.ReduceMax(op.Abs(blocks), op.Constant(value=LAST_AXIS), keepdims=1)
    a = op.Max(amax, op.Constant(value=MXA_MIN_NORMAL))
    log2 = op.Mul(op.Log(a), op.Constant(value=MXA_INV_LN2))
    e_est = op.Clip(op.Floor(log2), op.Constant(value=MXA_EXP_LO), op.Constant(value=MXA_EXP_HI))
    idx = op.Cast(op.Add(e_est, op.Constant(value=MXA_BIAS)), to=TensorProto.INT64)
    pw = op.Gather(op.Constant(value=MXA_POW2), idx)
    half = op.Constant(value=MXA_HALF)
    pw = op.Where(op.Less(a, pw), op.Mul(pw, half), pw)
    pw_hi = op.Mul(pw, op.Constant(value=MXA_TWO))
    pw = op.Where(op.GreaterOrEqual(a, pw_hi), pw_hi, pw)
    base = op.Mul(pw, op.Constant(value=MXA_QUARTER))
    up = op.GreaterOrEqual(a, op.Mul(pw, op.Constant(value=MXA_ONE_75)))
    scale = op.Max(op.Where(up, op.Mul(pw, half), base), op.Constant(value=MXA_MIN_SCALE))
    scaled = op.Div(blocks, scale)
    mag = op.Abs(scaled)
    step = op.Where(op.Less(mag, op.Constant(value=MXA_FOUR)), op.Constant(value=MXA_ONE), op.Constant(value=MXA_TWO))
    step = op.Where(op.Less(mag, op.Constant(value=MXA_TWO)), half, step)
    q = op.Mul(op.Round(op.Div(scaled, step)), step)
    q = op.Clip(q, op.Constant(value=MXA_E2M1_MIN), op.Constant(value=MXA_E2M1_MAX))
    Y = op.Reshape(op.Mul(q, scale), op.Shape(X))
    return Y


NVA_BLOCK = _ints("nva_block", [NVFP4_BLOCK_SIZE])
NVA_SIX, NVA_ZERO, NVA_EPS = _f("nva_six", 6.0), _f("nva_zero", 0.0), _f("nva_eps", float(np.finfo(np.float32).eps))


@script(quark_onnx)
def QuantizeDequantizeNvfp4(X: FLOAT[...], input_scale_2: FLOAT[...]):
    """Quark's dynamic NVFP4 activation fake quantization (blocks of 16 along the last axis; the block scales
    amax / 6 fake-quantized to e4m3 with the static input_scale_2: a scalar, or [..., 1] broadcasting against X's
    leading axes, one scale per row): builder/ops/mx_activation.py's per-expert subgraph, op for op. With a scalar it
    is also that module's per-tensor subgraph bit for bit: QuantizeLinear(s, s2) is e4m3(s / s2) (the IEEE
    division, custom_ops/src/qo_cpu_fp8_qdq.c) and DequantizeLinear(., s2) multiplies by s2, as here."""
    k = op.Shape(X, start=-1)
    blocks = op.Reshape(X, op.Concat(op.Shape(X, start=0, end=-1), op.Div(k, op.Constant(value=NVA_BLOCK)),
                                     op.Constant(value=NVA_BLOCK), axis=0))           # [..., K/16, 16]
    amax = op.ReduceMax(op.Abs(blocks), op.Constant(value=LAST_AXIS), keepdims=1)
    zero, eps = op.Constant(value=NVA_ZERO), op.Constant(value=NVA_EPS)
    s = op.Div(amax, op.Constant(value=NVA_SIX))
    s = op.Where(op.Equal(s, zero), eps, s)
    s2 = op.Unsqueeze(input_scale_2, op.Constant(value=LAST_AXIS))                  # [] -> [1], [..., 1] -> [..., 1, 1]
    one = op.Constant(value=MXA_ONE)
    u = op.DequantizeLinear(op.QuantizeLinear(op.Div(s, s2), one, op.Constant(value=FP8_ZERO), saturate=1), one)
    sq = op.Mul(u, s2)
    den = op.Where(op.Equal(sq, zero), eps, sq)
    scaled = op.Div(blocks, den)
    mag = op.Abs(scaled)
    two = op.Constant(value=MXA_TWO)
    step = op.Where(op.Less(mag, op.Constant(value=MXA_FOUR)), op.Constant(value=MXA_ONE), two)
    step = op.Where(op.Less(mag, two), op.Constant(value=MXA_HALF), step)
    q = op.Mul(op.Round(op.Div(scaled, step)), step)
    q = op.Clip(q, op.Constant(value=MXA_E2M1_MIN), op.Constant(value=MXA_E2M1_MAX))
    y = op.Mul(q, sq)
    Y = op.Reshape(y, op.Concat(op.Shape(y, start=0, end=-2), k, axis=0))
    return Y


@script(quark_onnx)
def QuantizeDequantizeFp8(X: FLOAT[...], scale: FLOAT[...]):
    """Y = DequantizeLinear(QuantizeLinear(X, scale, e4m3fn zero, saturate=1), scale): a static per-tensor FP8
    activation fake quantization (scale: a scalar), the pair the graph has without the library."""
    s = op.Reshape(scale, op.Constant(value=SCALAR_SHAPE))
    Y = op.DequantizeLinear(op.QuantizeLinear(X, s, op.Constant(value=FP8_ZERO), saturate=1), s)
    return Y


@script(quark_onnx)
def MatMulFp8W8A8(A, B: FLOAT8E4M3FN[...], B_scale: FLOAT[...], A_scale: FLOAT[...]):
    """Y = (a_q * A_scale) @ (float32(B) * B_scale)^T with a_q = QuantizeLinear(float32(A), A_scale, e4m3fn,
    saturate=1). B_scale: a scalar or [N]; A_scale: a scalar."""
    a_scale = op.Reshape(A_scale, op.Constant(value=SCALAR_SHAPE))
    a_q = op.QuantizeLinear(op.Cast(A, to=TensorProto.FLOAT), a_scale, op.Constant(value=FP8_ZERO), saturate=1)
    a_dq = op.DequantizeLinear(a_q, a_scale)
    weight_nk = op.Mul(op.Cast(B, to=TensorProto.FLOAT), op.Reshape(B_scale, op.Constant(value=SHAPE_COLUMN)))
    y_f32 = op.MatMul(a_dq, op.Transpose(weight_nk, perm=[1, 0]))
    Y = op.CastLike(y_f32, A)
    return Y


@script(quark_onnx)
def MatMulFp8W8A8Dyn(A, B: FLOAT8E4M3FN[...], B_scale: FLOAT[...]):
    """As MatMulFp8W8A8 with a per-row scale s = max(max|row| / 448, 1e-12): a_q = saturate_e4m3fn(float32(A) / s)
    (QuantizeLinear with scale 1 does the rounding), Y = (a_q * s) @ (float32(B) * B_scale)^T."""
    a_f32 = op.Cast(A, to=TensorProto.FLOAT)
    row_amax = op.ReduceMax(op.Abs(a_f32), op.Constant(value=LAST_AXIS), keepdims=1)
    row_scale = op.Max(op.Div(row_amax, op.Constant(value=FP8_MAX)), op.Constant(value=SCALE_MIN))
    a_q = op.QuantizeLinear(op.Div(a_f32, row_scale), op.Constant(value=ONE), op.Constant(value=FP8_ZERO),
                            saturate=1)
    a_dq = op.Mul(op.Cast(a_q, to=TensorProto.FLOAT), row_scale)
    weight_nk = op.Mul(op.Cast(B, to=TensorProto.FLOAT), op.Reshape(B_scale, op.Constant(value=SHAPE_COLUMN)))
    y_f32 = op.MatMul(a_dq, op.Transpose(weight_nk, perm=[1, 0]))
    Y = op.CastLike(y_f32, A)
    return Y


@script(quark_onnx)
def MatMulFp8(A, B: FLOAT8E4M3FN[...], B_scale: FLOAT[...]):
    """Weight-only FP8: Y = float32(A) @ (float32(B) * B_scale)^T, B_scale a scalar or [N]. float32(e4m3) * B_scale
    is the product DequantizeLinear computes, so ORT folds this body into the dense fp32 form's weight at load."""
    weight_nk = op.Mul(op.Cast(B, to=TensorProto.FLOAT), op.Reshape(B_scale, op.Constant(value=SHAPE_COLUMN)))
    y_f32 = op.MatMul(op.Cast(A, to=TensorProto.FLOAT), op.Transpose(weight_nk, perm=[1, 0]))
    Y = op.CastLike(y_f32, A)
    return Y


@script(quark_onnx)
def MatMulInt8(A, B: INT8[...], B_scale: FLOAT[...]):
    """Weight-only symmetric INT8: Y = float32(A) @ (float32(B) * B_scale)^T, B_scale a scalar or [N]."""
    weight_nk = op.Mul(op.Cast(B, to=TensorProto.FLOAT), op.Reshape(B_scale, op.Constant(value=SHAPE_COLUMN)))
    y_f32 = op.MatMul(op.Cast(A, to=TensorProto.FLOAT), op.Transpose(weight_nk, perm=[1, 0]))
    Y = op.CastLike(y_f32, A)
    return Y


@script(quark_onnx)
def MatMulInt8W8A8(A, B: INT8[...], B_scale: FLOAT[...], A_scale: FLOAT[...]):
    """INT8 W8A8 (Quark's int8 fake quantizer on A, zero point 0): q = QuantizeLinear(float32(A) * fp32(1 / A_scale),
    1, int8 0), Y = (q * A_scale) @ (float32(B) * B_scale)^T. B_scale: a scalar or [N]; A_scale: a scalar. The kernel
    sums q @ B^T exactly in integers and scales once (qo_cpu_int8_w8a8.c)."""
    a_scale = op.Reshape(A_scale, op.Constant(value=SCALAR_SHAPE))
    a_q = op.QuantizeLinear(op.Mul(op.Cast(A, to=TensorProto.FLOAT), op.Reciprocal(a_scale)), op.Constant(value=ONE),
                            op.Constant(value=INT8_ZERO))
    # DequantizeLinear, not Mul(Cast(q), s): ORT's MatMulScaleFusion would fold a scalar Mul into the MatMul's alpha
    # (s * (q @ W) instead of (q * s) @ W), a different rounding of the same product than the Q/DQ form's
    a_dq = op.DequantizeLinear(a_q, a_scale)
    weight_nk = op.Mul(op.Cast(B, to=TensorProto.FLOAT), op.Reshape(B_scale, op.Constant(value=SHAPE_COLUMN)))
    y_f32 = op.MatMul(a_dq, op.Transpose(weight_nk, perm=[1, 0]))
    Y = op.CastLike(y_f32, A)
    return Y


@script(quark_onnx)
def MatMulBf16(A, B: BFLOAT16[...]):
    """Y = float32(A) @ float32(B)^T, B bfloat16 [N, K] (an lm_head as the checkpoint stores it). bf16 -> float32 is
    exact, so this is the float lm_head's own arithmetic (ORT folds Cast and Transpose of an initializer B)."""
    y_f32 = op.MatMul(op.Cast(A, to=TensorProto.FLOAT), op.Transpose(op.Cast(B, to=TensorProto.FLOAT), perm=[1, 0]))
    Y = op.CastLike(y_f32, A)
    return Y


# ---- MatMulExperts*: the routed standard-op form (Gather of the chosen experts' compact weights, the dense op's
# decode, a batched MatMul). A [T, K] or [T, k, K] -> [T, 1 or k, 1, K]; W [T, k, K, N]; Y [T, k, N].

@script(quark_onnx)
def MatMulExpertsMxfp4(A, expert_ids, B: UINT8[...], B_scale: UINT8[...]):
    """Y[t, s] = A[t] (or A[t, s]) @ W[expert_ids[t, s]]^T, W [E, N, K] stacked MatMulMxfp4 weights:
    B uint8 [E, N, K/2], B_scale e8m0 [E, N, K/32]."""
    codes = op.Gather(B, expert_ids, axis=0)                                            # [T, k, N, K/2]
    code_even = op.BitwiseAnd(codes, op.Constant(value=LOW_MASK))
    code_odd = op.BitShift(codes, op.Constant(value=NIBBLE_BITS), direction="RIGHT")
    last_axis = op.Constant(value=LAST_AXIS)
    code_pairs = op.Concat(op.Unsqueeze(code_even, last_axis), op.Unsqueeze(code_odd, last_axis), axis=-1)
    code_blocks = op.Reshape(code_pairs, op.Constant(value=SHAPE_E_BLOCKS_32))         # [T, k, N, K/32, 32]
    value_blocks = op.Gather(op.Constant(value=FP4_TABLE), op.Cast(code_blocks, to=TensorProto.INT32))
    scale_codes = op.Cast(op.Gather(B_scale, expert_ids, axis=0), to=TensorProto.INT64)
    block_scale = op.Gather(op.Constant(value=E8M0_TABLE), scale_codes)                 # [T, k, N, K/32]
    weight = op.Reshape(op.Mul(value_blocks, op.Unsqueeze(block_scale, last_axis)), op.Constant(value=SHAPE_E_N_K))
    rows = op.Concat(op.Shape(expert_ids, start=0, end=1), op.Constant(value=SHAPE_ROWS_TAIL), op.Shape(A, start=-1),
                     axis=0)
    a_rows = op.Reshape(op.Cast(A, to=TensorProto.FLOAT), rows)                          # [T, 1 | k, 1, K]
    y_f32 = op.Reshape(op.MatMul(a_rows, op.Transpose(weight, perm=[0, 1, 3, 2])), op.Constant(value=SHAPE_T_K_N))
    Y = op.CastLike(y_f32, A)
    return Y


@script(quark_onnx)
def MatMulExpertsNvfp4(A, expert_ids, B: UINT8[...], B_scale: FLOAT8E4M3FN[...], B_scale_2: FLOAT[...]):
    """As MatMulExpertsMxfp4 with MatMulNvfp4 weights: B uint8 [E, N, K/2], B_scale e4m3fn [E, N, K/16],
    B_scale_2 float32 [E] (each expert's global scale; block scale * global scale rounded once, Quark's order)."""
    codes = op.Gather(B, expert_ids, axis=0)
    code_even = op.BitwiseAnd(codes, op.Constant(value=LOW_MASK))
    code_odd = op.BitShift(codes, op.Constant(value=NIBBLE_BITS), direction="RIGHT")
    last_axis = op.Constant(value=LAST_AXIS)
    code_pairs = op.Concat(op.Unsqueeze(code_even, last_axis), op.Unsqueeze(code_odd, last_axis), axis=-1)
    code_blocks = op.Reshape(code_pairs, op.Constant(value=SHAPE_E_BLOCKS_16))         # [T, k, N, K/16, 16]
    value_blocks = op.Gather(op.Constant(value=FP4_TABLE), op.Cast(code_blocks, to=TensorProto.INT32))
    scale_2 = op.Reshape(op.Gather(B_scale_2, expert_ids, axis=0), op.Constant(value=SHAPE_E_SCALAR))
    # ONNX's Gather takes no float8 tensor: Cast first (ORT folds it for an initializer, as for the other fallbacks)
    block_scale = op.Mul(op.Gather(op.Cast(B_scale, to=TensorProto.FLOAT), expert_ids, axis=0), scale_2)
    weight = op.Reshape(op.Mul(value_blocks, op.Unsqueeze(block_scale, last_axis)), op.Constant(value=SHAPE_E_N_K))
    rows = op.Concat(op.Shape(expert_ids, start=0, end=1), op.Constant(value=SHAPE_ROWS_TAIL), op.Shape(A, start=-1),
                     axis=0)
    a_rows = op.Reshape(op.Cast(A, to=TensorProto.FLOAT), rows)
    y_f32 = op.Reshape(op.MatMul(a_rows, op.Transpose(weight, perm=[0, 1, 3, 2])), op.Constant(value=SHAPE_T_K_N))
    Y = op.CastLike(y_f32, A)
    return Y


@script(quark_onnx)
def MatMulExpertsMxfp4R16(A, expert_ids, B: UINT8[...], B_scale: UINT8[...]):
    """MatMulExpertsMxfp4 on stacks of 16-row tiles: B uint8 [E, N/16, K/8, 64], B_scale uint8 [E, N/16, K/32, 16],
    put back to [E, N, K/2] / [E, N, K/32] (Fp4TilesToRows), then MatMulExpertsMxfp4's body."""
    b_rows = Fp4TilesToRows(B)
    blocks = op.Shape(B_scale, start=-2, end=-1)
    s_tiles = op.Reshape(B_scale, op.Concat(op.Constant(value=MINUS_ONE_1D), blocks, op.Constant(value=SIXTEEN_1D),
                                            axis=0))
    s_rows = op.Reshape(op.Transpose(s_tiles, perm=[0, 2, 1]), op.Concat(op.Shape(B_scale, start=0, end=-3),
                                                                         op.Constant(value=MINUS_ONE_1D), blocks, axis=0))
    Y = quark_onnx.MatMulExpertsMxfp4(A, expert_ids, b_rows, s_rows)
    return Y


@script(quark_onnx)
def MatMulExpertsNvfp4R16(A, expert_ids, B: UINT8[...], B_scale: FLOAT8E4M3FN[...], B_scale_2: FLOAT[...]):
    """MatMulExpertsNvfp4 on stacks of 16-row tiles: B uint8 [E, N/16, K/8, 64], B_scale e4m3fn [E, N/16, K/16, 16]."""
    b_rows = Fp4TilesToRows(B)
    blocks = op.Shape(B_scale, start=-2, end=-1)
    s_tiles = op.Reshape(B_scale, op.Concat(op.Constant(value=MINUS_ONE_1D), blocks, op.Constant(value=SIXTEEN_1D),
                                            axis=0))
    s_rows = op.Reshape(op.Transpose(s_tiles, perm=[0, 2, 1]), op.Concat(op.Shape(B_scale, start=0, end=-3),
                                                                         op.Constant(value=MINUS_ONE_1D), blocks, axis=0))
    Y = quark_onnx.MatMulExpertsNvfp4(A, expert_ids, b_rows, s_rows, B_scale_2)
    return Y


@script(quark_onnx)
def MatMulExpertsFp8(A, expert_ids, B: FLOAT8E4M3FN[...], B_scale: FLOAT[...]):
    """As MatMulExpertsMxfp4 with MatMulFp8 weights: B e4m3fn [E, N, K], B_scale float32 [E] or [E, N]."""
    scale = op.Reshape(op.Gather(B_scale, expert_ids, axis=0), op.Constant(value=SHAPE_E_COLUMN))  # [T, k, 1|N, 1]
    # ONNX's Gather takes no float8 tensor: Cast first (ORT folds it for an initializer: the dense fp32 stack, as
    # the other ops' fallbacks hold their weights)
    weight = op.Gather(op.Cast(B, to=TensorProto.FLOAT), expert_ids, axis=0) * scale                 # [T, k, N, K]
    rows = op.Concat(op.Shape(expert_ids, start=0, end=1), op.Constant(value=SHAPE_ROWS_TAIL), op.Shape(A, start=-1),
                     axis=0)
    a_rows = op.Reshape(op.Cast(A, to=TensorProto.FLOAT), rows)
    y_f32 = op.Reshape(op.MatMul(a_rows, op.Transpose(weight, perm=[0, 1, 3, 2])), op.Constant(value=SHAPE_T_K_N))
    Y = op.CastLike(y_f32, A)
    return Y


@script(quark_onnx)
def MatMulExpertsInt8(A, expert_ids, B: INT8[...], B_scale: FLOAT[...]):
    """As MatMulExpertsMxfp4 with MatMulInt8 weights: B int8 [E, N, K], B_scale float32 [E] or [E, N]."""
    scale = op.Reshape(op.Gather(B_scale, expert_ids, axis=0), op.Constant(value=SHAPE_E_COLUMN))
    weight = op.Mul(op.Cast(op.Gather(B, expert_ids, axis=0), to=TensorProto.FLOAT), scale)
    rows = op.Concat(op.Shape(expert_ids, start=0, end=1), op.Constant(value=SHAPE_ROWS_TAIL), op.Shape(A, start=-1),
                     axis=0)
    a_rows = op.Reshape(op.Cast(A, to=TensorProto.FLOAT), rows)
    y_f32 = op.Reshape(op.MatMul(a_rows, op.Transpose(weight, perm=[0, 1, 3, 2])), op.Constant(value=SHAPE_T_K_N))
    Y = op.CastLike(y_f32, A)
    return Y


@script(quark_onnx)
def Int8BlockActivations(A, B: UINT8[...], accuracy_level: int = 1):
    """A in float32 as a 4-bit weight B [..., k_blocks, block/2] meets it: A itself at accuracy_level 1; at 4, per row
    and block of `block` elements (zero padded past K) the int8 activations of MatMulNBits / QMoE level 4 (MLAS
    CompInt8, the kernel qo_cpu_int4_a8.c): round(a * fp32(127 / amax)) half to even, clipped to +-127, times
    fp32(amax / 127). The float32 product then differs from the kernel's exact integer dots by float rounding only."""
    last_axis = op.Constant(value=LAST_AXIS)
    a = op.Cast(A, to=TensorProto.FLOAT)
    k = op.Shape(A, start=-1)
    block = op.Mul(op.Shape(B, start=-1), op.Constant(value=TWO_1D))
    k_blocks = op.Shape(B, start=-2, end=-1)
    pad_end = op.Sub(op.Mul(k_blocks, block), k)
    a_pad = op.Pad(a, op.Concat(op.Constant(value=ZERO_1D), pad_end, axis=0), op.Constant(value=ZERO_F), last_axis)
    blocks = op.Reshape(a_pad, op.Concat(op.Shape(a_pad, start=0, end=-1), k_blocks, block, axis=0))
    amax = op.ReduceMax(op.Abs(blocks), last_axis, keepdims=1)
    positive = op.Greater(amax, op.Constant(value=ZERO_F))
    inv = op.Where(positive, op.Div(op.Constant(value=INT8_MAX_F), amax), op.Constant(value=ZERO_F))
    codes = op.Clip(op.Round(op.Mul(blocks, inv)), op.Constant(value=INT8_MIN_F), op.Constant(value=INT8_MAX_F))
    dequantized = op.Mul(codes, op.Div(amax, op.Constant(value=INT8_MAX_F)))
    a_q = op.Slice(op.Reshape(dequantized, op.Shape(a_pad)), op.Constant(value=ZERO_1D), k, last_axis)
    int8 = op.Equal(op.Constant(value_int=accuracy_level), op.Constant(value_int=4))
    return op.Where(int8, a_q, a)


@script(quark_onnx)
def MatMulExpertsUint4(A, expert_ids, B: UINT8[...], scales: FLOAT[...], zero_points: UINT8[...],
                       accuracy_level: int = 1):
    """As MatMulExpertsMxfp4 with MatMulUint4 weights: B uint8 [E, N, k_blocks, block/2], scales float32
    [E, N, k_blocks], zero_points uint8 [E, N, ceil(k_blocks/2)]; W = (q - z) * s in float32, K read from A;
    accuracy_level 4: A as Int8BlockActivations quantizes it."""
    last_axis = op.Constant(value=LAST_AXIS)
    codes = op.Gather(B, expert_ids, axis=0)                                            # [T, k, N, kb, bs/2]
    code_even = op.BitwiseAnd(codes, op.Constant(value=LOW_MASK))
    code_odd = op.BitShift(codes, op.Constant(value=NIBBLE_BITS), direction="RIGHT")
    code_pairs = op.Concat(op.Unsqueeze(code_even, last_axis), op.Unsqueeze(code_odd, last_axis), axis=-1)
    code_blocks = op.Cast(op.Reshape(code_pairs, op.Constant(value=SHAPE_E_GROUPS)), to=TensorProto.FLOAT)
    zp_bytes = op.Gather(zero_points, expert_ids, axis=0)                               # [T, k, N, ceil(kb/2)]
    zp_even = op.BitwiseAnd(zp_bytes, op.Constant(value=LOW_MASK))
    zp_odd = op.BitShift(zp_bytes, op.Constant(value=NIBBLE_BITS), direction="RIGHT")
    zp_pairs = op.Concat(op.Unsqueeze(zp_even, last_axis), op.Unsqueeze(zp_odd, last_axis), axis=-1)
    zp_all = op.Reshape(zp_pairs, op.Constant(value=SHAPE_E_N_K))                       # [T, k, N, 2 ceil(kb/2)]
    zp = op.Slice(zp_all, op.Constant(value=ZERO_1D), op.Shape(B, start=2, end=3), last_axis)
    zp_f = op.Unsqueeze(op.Cast(zp, to=TensorProto.FLOAT), last_axis)                   # [T, k, N, kb, 1]
    scale = op.Unsqueeze(op.Gather(scales, expert_ids, axis=0), last_axis)              # [T, k, N, kb, 1]
    weight_padded = op.Reshape(op.Mul(op.Sub(code_blocks, zp_f), scale), op.Constant(value=SHAPE_E_N_K))
    weight = op.Slice(weight_padded, op.Constant(value=ZERO_1D), op.Shape(A, start=-1), last_axis)  # [T, k, N, K]
    rows = op.Concat(op.Shape(expert_ids, start=0, end=1), op.Constant(value=SHAPE_ROWS_TAIL), op.Shape(A, start=-1),
                     axis=0)
    a_rows = op.Reshape(Int8BlockActivations(A, B, accuracy_level=accuracy_level), rows)
    y_f32 = op.Reshape(op.MatMul(a_rows, op.Transpose(weight, perm=[0, 1, 3, 2])), op.Constant(value=SHAPE_T_K_N))
    Y = op.CastLike(y_f32, A)
    return Y


@script(quark_onnx)
def MatMulExpertsInt4(A, expert_ids, B: UINT8[...], scales: FLOAT[...], accuracy_level: int = 1):
    """MatMulExpertsUint4 with every zero point 8 (MatMulInt4's weights stacked): W = (u - 8) * s."""
    last_axis = op.Constant(value=LAST_AXIS)
    codes = op.Gather(B, expert_ids, axis=0)
    code_even = op.BitwiseAnd(codes, op.Constant(value=LOW_MASK))
    code_odd = op.BitShift(codes, op.Constant(value=NIBBLE_BITS), direction="RIGHT")
    code_pairs = op.Concat(op.Unsqueeze(code_even, last_axis), op.Unsqueeze(code_odd, last_axis), axis=-1)
    code_blocks = op.Cast(op.Reshape(code_pairs, op.Constant(value=SHAPE_E_GROUPS)), to=TensorProto.FLOAT)
    scale = op.Unsqueeze(op.Gather(scales, expert_ids, axis=0), last_axis)
    weight_blocks = op.Mul(op.Sub(code_blocks, op.Constant(value=INT4_DEFAULT_ZP)), scale)
    weight_padded = op.Reshape(weight_blocks, op.Constant(value=SHAPE_E_N_K))
    weight = op.Slice(weight_padded, op.Constant(value=ZERO_1D), op.Shape(A, start=-1), last_axis)
    rows = op.Concat(op.Shape(expert_ids, start=0, end=1), op.Constant(value=SHAPE_ROWS_TAIL), op.Shape(A, start=-1),
                     axis=0)
    a_rows = op.Reshape(Int8BlockActivations(A, B, accuracy_level=accuracy_level), rows)
    y_f32 = op.Reshape(op.MatMul(a_rows, op.Transpose(weight, perm=[0, 1, 3, 2])), op.Constant(value=SHAPE_T_K_N))
    Y = op.CastLike(y_f32, A)
    return Y


@script(quark_onnx)
def MatMulUint4(A, B: UINT8[...], scales: FLOAT[...], zero_points: UINT8[...], K: int, N: int, block_size: int):
    """Y = float32(A) @ W^T, W[n, k] = (q - z) * s in float32 (Quark's dequantization: the integer difference is exact,
    the product rounds once). MatMulNBits' 4-bit layout: B uint8 [N, k_blocks, block_size/2] (even k in the low
    nibble, K padded with zeros to k_blocks * block_size), scales float32 [N * k_blocks], zero_points uint8
    [N * ceil(k_blocks/2)] packed uint4 (block 2j in the low nibble)."""
    last_axis = op.Constant(value=LAST_AXIS)
    code_even = op.BitwiseAnd(B, op.Constant(value=LOW_MASK))
    code_odd = op.BitShift(B, op.Constant(value=NIBBLE_BITS), direction="RIGHT")
    codes = op.Concat(op.Unsqueeze(code_even, last_axis), op.Unsqueeze(code_odd, last_axis), axis=-1)
    n_kb = op.Shape(B, start=0, end=2)                                                   # [N, k_blocks]
    code_blocks = op.Cast(op.Reshape(codes, op.Concat(n_kb, last_axis, axis=0)), to=TensorProto.FLOAT)
    zp_even = op.BitwiseAnd(zero_points, op.Constant(value=LOW_MASK))
    zp_odd = op.BitShift(zero_points, op.Constant(value=NIBBLE_BITS), direction="RIGHT")
    zp_pairs = op.Concat(op.Unsqueeze(zp_even, last_axis), op.Unsqueeze(zp_odd, last_axis), axis=-1)
    zp_rows = op.Reshape(zp_pairs, op.Concat(op.Shape(B, start=0, end=1), last_axis, axis=0))  # [N, 2 ceil(kb/2)]
    zp = op.Slice(zp_rows, op.Constant(value=ZERO_1D), op.Shape(B, start=1, end=2), op.Constant(value=ONE_1D))
    zp_f = op.Unsqueeze(op.Cast(zp, to=TensorProto.FLOAT), last_axis)                   # [N, k_blocks, 1]
    scale = op.Reshape(scales, op.Concat(n_kb, op.Constant(value=ONE_1D), axis=0))      # [N, k_blocks, 1]
    weight_blocks = op.Mul(op.Sub(code_blocks, zp_f), scale)
    weight_padded = op.Reshape(weight_blocks, op.Constant(value=SHAPE_N_ANY))           # [N, k_blocks * bs]
    weight_nk = op.Slice(weight_padded, op.Constant(value=ZERO_1D), op.Shape(A, start=-1),
                         op.Constant(value=ONE_1D))
    y_f32 = op.MatMul(op.Cast(A, to=TensorProto.FLOAT), op.Transpose(weight_nk, perm=[1, 0]))
    Y = op.CastLike(y_f32, A)
    return Y


@script(quark_onnx)
def MatMulInt4(A, B: UINT8[...], scales: FLOAT[...], K: int, N: int, block_size: int):
    """MatMulUint4 with every zero point 8: a symmetric int4 weight q stored as q + 8 (MatMulNBits' layout without
    zero_points); W = (u - 8) * s = q * s."""
    last_axis = op.Constant(value=LAST_AXIS)
    code_even = op.BitwiseAnd(B, op.Constant(value=LOW_MASK))
    code_odd = op.BitShift(B, op.Constant(value=NIBBLE_BITS), direction="RIGHT")
    codes = op.Concat(op.Unsqueeze(code_even, last_axis), op.Unsqueeze(code_odd, last_axis), axis=-1)
    n_kb = op.Shape(B, start=0, end=2)
    code_blocks = op.Cast(op.Reshape(codes, op.Concat(n_kb, last_axis, axis=0)), to=TensorProto.FLOAT)
    scale = op.Reshape(scales, op.Concat(n_kb, op.Constant(value=ONE_1D), axis=0))
    weight_blocks = op.Mul(op.Sub(code_blocks, op.Constant(value=INT4_DEFAULT_ZP)), scale)
    weight_padded = op.Reshape(weight_blocks, op.Constant(value=SHAPE_N_ANY))
    weight_nk = op.Slice(weight_padded, op.Constant(value=ZERO_1D), op.Shape(A, start=-1),
                         op.Constant(value=ONE_1D))
    y_f32 = op.MatMul(op.Cast(A, to=TensorProto.FLOAT), op.Transpose(weight_nk, perm=[1, 0]))
    Y = op.CastLike(y_f32, A)
    return Y


@script(quark_onnx)
def GqaFixedOrderScores(query: FLOAT[...], key: FLOAT[...], value: FLOAT[...], past_key: FLOAT[...],
                        past_value: FLOAT[...], seqlens_k: INT32[...], total_sequence_length: INT32[...],
                        cos_cache: FLOAT[...], sin_cache: FLOAT[...], num_heads: int, kv_num_heads: int,
                        scale: float = 0.0, local_window_size: int = -1):
    """The shared part of GroupQueryAttentionFixedOrder(Sinks): com.microsoft GroupQueryAttention's semantics
    (do_rotary, half-split rotary on cos_cache's 2R dims) in standard ops: past length 0 on the first prompt
    (S == total_sequence_length), else seqlens_k + 1 - S per batch row; the rotated keys and the values written into
    rows [past, past + S) of present (past padded to max(total, past length)). Returns the scaled scores [B, H, S, T]
    with -inf where a query may not attend (keys after it, or at or before p - local_window_size when that is
    positive), the values repeated per query head [B, H, T, D], and present_key / present_value."""
    one = op.Constant(value=ONE_1D)
    zero = op.Constant(value=ZERO_1D)
    minus1 = op.Constant(value=MINUS_ONE_1D)
    last_axis = op.Constant(value=LAST_AXIS)
    b = op.Shape(query, start=0, end=1)
    s = op.Shape(query, start=1, end=2)
    heads = op.Reshape(op.Constant(value_int=num_heads), one)
    kv_heads = op.Reshape(op.Constant(value_int=kv_num_heads), one)
    q4 = op.Reshape(query, op.Concat(b, s, heads, minus1, axis=0))                      # [B, S, H, D]
    k4 = op.Reshape(key, op.Concat(b, s, kv_heads, minus1, axis=0))                     # [B, S, Hkv, D]
    v4 = op.Reshape(value, op.Concat(b, s, kv_heads, minus1, axis=0))
    d = op.Shape(q4, start=3, end=4)
    total = op.Reshape(op.Cast(total_sequence_length, to=TensorProto.INT64), one)
    past = op.Where(op.Equal(s, total), zero, op.Sub(op.Cast(seqlens_k, to=TensorProto.INT64), op.Sub(s, one)))
    steps = op.Range(op.Constant(value=ZERO_I64), op.Squeeze(s, zero), op.Constant(value=ONE_I64))
    pos = op.Add(op.Unsqueeze(past, one), op.Unsqueeze(steps, zero))                    # [B, S]
    axis2 = op.Constant(value=TWO_1D)
    cos = op.Unsqueeze(op.Gather(cos_cache, pos, axis=0), axis2)                        # [B, S, 1, R]
    sin = op.Unsqueeze(op.Gather(sin_cache, pos, axis=0), axis2)
    r = op.Shape(cos_cache, start=1, end=2)
    two_r = op.Add(r, r)
    large = op.Constant(value=LARGE_1D)
    q1 = op.Slice(q4, zero, r, last_axis)
    q2 = op.Slice(q4, r, two_r, last_axis)
    q_rot = op.Concat(op.Sub(op.Mul(q1, cos), op.Mul(q2, sin)), op.Add(op.Mul(q2, cos), op.Mul(q1, sin)),
                      op.Slice(q4, two_r, large, last_axis), axis=-1)
    k1 = op.Slice(k4, zero, r, last_axis)
    k2 = op.Slice(k4, r, two_r, last_axis)
    k_rot = op.Concat(op.Sub(op.Mul(k1, cos), op.Mul(k2, sin)), op.Add(op.Mul(k2, cos), op.Mul(k1, sin)),
                      op.Slice(k4, two_r, large, last_axis), axis=-1)
    q_t = op.Transpose(q_rot, perm=[0, 2, 1, 3])                                        # [B, H, S, D]
    k_t = op.Transpose(k_rot, perm=[0, 2, 1, 3])                                        # [B, Hkv, S, D]
    v_t = op.Transpose(v4, perm=[0, 2, 1, 3])
    p_len = op.Shape(past_key, start=2, end=3)
    t_len = op.Max(total, p_len)
    pads = op.Concat(op.Constant(value=ZERO_6), op.Sub(t_len, p_len), zero, axis=0)     # the end of axis 2
    rows = op.Expand(op.Unsqueeze(pos, op.Constant(value=AXES_1_3)), op.Shape(k_t))     # [B, Hkv, S, D]
    present_key = op.ScatterElements(op.Pad(past_key, pads), rows, k_t, axis=2)
    present_value = op.ScatterElements(op.Pad(past_value, pads), rows, v_t, axis=2)
    group = op.Div(heads, kv_heads)
    grouped = op.Concat(b, kv_heads, group, t_len, d, axis=0)
    flat = op.Concat(b, heads, t_len, d, axis=0)
    k_rep = op.Reshape(op.Expand(op.Unsqueeze(present_key, axis2), grouped), flat)      # [B, H, T, D]
    v_rep = op.Reshape(op.Expand(op.Unsqueeze(present_value, axis2), grouped), flat)
    scale_given = op.Constant(value_float=scale)
    default_scale = op.Div(op.Constant(value=ONE), op.Sqrt(op.Cast(op.Squeeze(d, zero), to=TensorProto.FLOAT)))
    alpha = op.Where(op.Equal(scale_given, op.Constant(value=ZERO_F)), default_scale, scale_given)
    scores = op.Mul(op.MatMul(q_t, op.Transpose(k_rep, perm=[0, 1, 3, 2])), alpha)      # [B, H, S, T]
    t_idx = op.Range(op.Constant(value=ZERO_I64), op.Squeeze(t_len, zero), op.Constant(value=ONE_I64))
    p4 = op.Unsqueeze(pos, op.Constant(value=AXES_1_3))                                 # [B, 1, S, 1]
    window = op.Constant(value_int=local_window_size)
    in_window = op.Or(op.LessOrEqual(window, op.Constant(value=ZERO_I64)), op.Greater(t_idx, op.Sub(p4, window)))
    allowed = op.And(op.LessOrEqual(t_idx, p4), in_window)
    masked = op.Where(allowed, scores, op.Constant(value=NEG_INF))
    return masked, v_rep, present_key, present_value


@script(quark_onnx)
def GroupQueryAttentionFixedOrder(query: FLOAT[...], key: FLOAT[...], value: FLOAT[...], past_key: FLOAT[...],
                                  past_value: FLOAT[...], seqlens_k: INT32[...], total_sequence_length: INT32[...],
                                  cos_cache: FLOAT[...], sin_cache: FLOAT[...], num_heads: int, kv_num_heads: int,
                                  scale: float = 0.0, local_window_size: int = -1):
    """GroupQueryAttention's semantics in standard ops (GqaFixedOrderScores), the softmax as ReduceMax, Exp,
    ReduceSum, Div (no ISA-dependent Softmax kernel)."""
    last_axis = op.Constant(value=LAST_AXIS)
    masked, v_rep, present_key, present_value = GqaFixedOrderScores(
        query, key, value, past_key, past_value, seqlens_k, total_sequence_length, cos_cache, sin_cache,
        num_heads=num_heads, kv_num_heads=kv_num_heads, scale=scale, local_window_size=local_window_size)
    e = op.Exp(op.Sub(masked, op.ReduceMax(masked, last_axis, keepdims=1)))
    probs = op.Div(e, op.ReduceSum(e, last_axis, keepdims=1))
    out = op.Transpose(op.MatMul(probs, v_rep), perm=[0, 2, 1, 3])                      # [B, S, H, D]
    Y = op.Reshape(out, op.Concat(op.Shape(query, start=0, end=2), op.Constant(value=MINUS_ONE_1D), axis=0))
    return Y, present_key, present_value


@script(quark_onnx)
def GroupQueryAttentionFixedOrderSinks(query: FLOAT[...], key: FLOAT[...], value: FLOAT[...], past_key: FLOAT[...],
                                       past_value: FLOAT[...], seqlens_k: INT32[...],
                                       total_sequence_length: INT32[...], cos_cache: FLOAT[...], sin_cache: FLOAT[...],
                                       head_sink: FLOAT[...], num_heads: int, kv_num_heads: int, scale: float = 0.0,
                                       local_window_size: int = -1):
    """GroupQueryAttentionFixedOrder with each head's sink logit (head_sink [H], gpt-oss) as one more column of the
    softmax, dropped after (transformers' gpt-oss attention)."""
    last_axis = op.Constant(value=LAST_AXIS)
    masked, v_rep, present_key, present_value = GqaFixedOrderScores(
        query, key, value, past_key, past_value, seqlens_k, total_sequence_length, cos_cache, sin_cache,
        num_heads=num_heads, kv_num_heads=kv_num_heads, scale=scale, local_window_size=local_window_size)
    heads = op.Reshape(op.Constant(value_int=num_heads), op.Constant(value=ONE_1D))
    column = op.Reshape(head_sink, op.Concat(op.Constant(value=ONE_1D), heads, op.Constant(value=ONE_1D),
                                             op.Constant(value=ONE_1D), axis=0))          # [1, H, 1, 1]
    column = op.Expand(column, op.Concat(op.Shape(masked, start=0, end=3), op.Constant(value=ONE_1D), axis=0))
    full = op.Concat(masked, column, axis=-1)                                           # [B, H, S, T + 1]
    e = op.Exp(op.Sub(full, op.ReduceMax(full, last_axis, keepdims=1)))
    probs = op.Slice(op.Div(e, op.ReduceSum(e, last_axis, keepdims=1)), op.Constant(value=ZERO_1D),
                     op.Constant(value=MINUS_ONE_1D), last_axis)
    out = op.Transpose(op.MatMul(probs, v_rep), perm=[0, 2, 1, 3])
    Y = op.Reshape(out, op.Concat(op.Shape(query, start=0, end=2), op.Constant(value=MINUS_ONE_1D), axis=0))
    return Y, present_key, present_value

BODIES = {fn.name: fn for fn in (MatMulUint4, MatMulInt4, MatMulMxfp4, MatMulFp8W8A8, MatMulFp8W8A8Dyn, MatMulBf16, MatMulFp8, MatMulInt8,
                                 MatMulInt8W8A8,
                                 MatMulNvfp4, Fp4TilesToRows, MatMulMxfp4R16, MatMulNvfp4R16, MatMulExpertsMxfp4R16, MatMulExpertsNvfp4R16, MatMulExpertsMxfp4, MatMulExpertsNvfp4, MatMulExpertsFp8,
                                 MatMulExpertsInt8, MatMulExpertsUint4, MatMulExpertsInt4,
                                 GroupQueryAttentionFixedOrder, GroupQueryAttentionFixedOrderSinks, GqaFixedOrderScores,
                                 Int8BlockActivations, QuantizeDequantizeFp8, QuantizeDequantizeMxfp4,
                                 QuantizeDequantizeNvfp4)}
