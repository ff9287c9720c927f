"""Which op types and tensor types ONNX Runtime's MIGraphX execution provider hands to MIGraphX (facts, as data).

MIGRAPHX_ONNX_OPS: every op type an `operators()` list in AMDMIGraphX src/onnx/parse_*.cpp names (commit f729a52,
May 2026); from ROCm 7.2 the EP asks MIGraphX for exactly this list (migraphx::get_onnx_operators()). Domains are not
checked by the EP: com.microsoft ops (MatMulNBits, GroupQueryAttention, SimplifiedLayerNormalization, ...) are in it.
MIGRAPHX_EP_OPS_BEFORE_ROCM_7_2: the fixed list in onnxruntime migraphx_execution_provider.cc used by older builds
(it spells two names wrongly, "IsNan" and "Roialign", so IsNaN/RoiAlign never go to MIGraphX there).
ORT_MGX_EP_TENSOR_TYPES: IsTypeSupported in the same file: what the EP *hands to* MIGraphX (a node touching any other
type stays on CPU). It is wider than what MIGraphX's parser reads: float8e4m3fn/e5m2/e5m2fnuz and float4e2m1 pass
the EP and then fail (or are misread) in the parser, so conformance is checked against MIGRAPHX_PARSER_TYPES.
MIGRAPHX_PARSER_TYPES: AMDMIGraphX src/onnx/onnx_parser.cpp get_type() (commit f729a52): the element types it maps
to a shape type; anything else throws "Prototensor data type N not supported". Used for initializers
(parse_tensor), graph inputs (parse_type), Cast `to` (parse_cast.cpp) and QuantizeLinear `output_dtype`
(parse_quantizelinear.cpp).
MIGRAPHX_MISREAD_TYPES: types get_type accepts but reads wrongly.
"""
from onnx import TensorProto

MIGRAPHX_ONNX_OPS = frozenset("""
    ATen Abs Acos Acosh Add And ArgMax ArgMin Asin Asinh Atan Atanh Attention AveragePool BatchNormalization BiasAdd
    BiasGelu BiasSplitGelu BitwiseAnd Cast CastLike Ceil Celu Clip Concat Constant ConstantFill ConstantOfShape Conv
    ConvInteger ConvTranspose Cos Cosh CumSum DepthToSpace DequantizeLinear Div Dropout DynamicQuantizeLinear
    DynamicScale Einsum Elu Equal Erf Exp Expand EyeLike FastGelu Flatten Floor GRU Gather GatherElements GatherND
    Gelu Gemm GlobalAveragePool GlobalLpPool GlobalMaxPool Greater GreaterOrEqual GridSample GroupNorm
    GroupNormalization GroupQueryAttention HardSigmoid HardSwish Hardmax Identity If ImageScaler
    InstanceNormalization IsInf IsNaN LRN LSTM LayerNormalization LeakyRelu Less LessOrEqual Log LogSoftmax Loop
    LpNormalization LpPool MXFixNeuron MXQuantizeDequantize MatMul MatMulBnb4 MatMulInteger MatMulIntegerToFloat
    MatMulNBits Max MaxPool Mean MeanVarianceNormalization Min Mod Mul MultiHeadAttention Multinomial Neg
    NegativeLogLikelihoodLoss NhwcConv NonMaxSuppression NonZero Not OneHot Or PRelu Pad Pow QLinearAdd
    QLinearAveragePool QLinearConcat QLinearConv QLinearGlobalAveragePool QLinearLeakyRelu QLinearMatMul QLinearMul
    QLinearSigmoid QuantizeLinear QuickGelu RNN RandomNormal RandomNormalLike RandomUniform RandomUniformLike Range
    Reciprocal ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum
    ReduceSumSquare Relu Reshape Resize ReverseSequence RoiAlign RotaryEmbedding Round Scan Scatter ScatterElements
    ScatterND Selu Shape Shrink Sigmoid Sign SimplifiedLayerNormalization Sin Sinh Size SkipLayerNormalization
    SkipSimplifiedLayerNormalization Slice Softmax SoftmaxCrossEntropyLoss Softplus Softsign SpaceToDepth Split Sqrt
    Squeeze Sub Sum Tan Tanh ThresholdedRelu Tile TopK Transpose Trilu Unique Unsqueeze Upsample Where Xor
""".split())

MIGRAPHX_EP_OPS_BEFORE_ROCM_7_2 = frozenset("""
    ATen Abs Acos Acosh Add And ArgMax ArgMin Asin Asinh Atan Atanh Attention AveragePool BatchNormalization
    BiasGelu Cast Ceil Celu Clip Concat Constant ConstantFill ConstantOfShape Conv ConvInteger ConvTranspose Cos
    Cosh CumSum DepthToSpace DequantizeLinear Div Dropout DynamicQuantizeLinear Einsum Elu Equal Erf Exp Expand
    EyeLike FastGelu Flatten Floor GRU Gather GatherElements GatherND Gelu Gemm GlobalAveragePool GlobalMaxPool
    Greater GreaterOrEqual GroupNorm GroupNormalization GroupQueryAttention HardSigmoid HardSwish Identity If
    ImageScaler InstanceNormalization IsNan LRN LSTM LayerNormalization LeakyRelu Less LessOrEqual Log LogSoftmax
    Loop LpNormalization MatMul MatMulInteger MatMulNBits Max MaxPool Mean Min Mod Mul MultiHeadAttention
    Multinomial Neg NegativeLogLikelihoodLoss NhwcConv NonMaxSuppression NonZero Not OneHot Or PRelu Pad Pow
    QLinearAdd QLinearConv QLinearMatMul QuantizeLinear QuickGelu RNN RandomNormal RandomNormalLike RandomUniform
    RandomUniformLike Range Reciprocal ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin
    ReduceProd ReduceSum ReduceSumSquare Relu Reshape Resize ReverseSequence Roialign RotaryEmbedding Round Scatter
    ScatterElements ScatterND Selu Shape Sigmoid Sign SimplifiedLayerNormalization Sin Sinh Size
    SkipLayerNormalization SkipSimplifiedLayerNormalization Slice Softmax SoftmaxCrossEntropyLoss Softplus Softsign
    SpaceToDepth Split Sqrt Squeeze Sub Sum Tan Tanh ThresholdedRelu Tile TopK Transpose Trilu Unsqueeze Upsample
    Where Xor
""".split())

ORT_MGX_EP_TENSOR_TYPES = frozenset(getattr(TensorProto, t) for t in (
    "FLOAT16", "BFLOAT16", "FLOAT", "FLOAT4E2M1", "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ",
    "DOUBLE", "INT4", "INT8", "INT16", "INT32", "INT64", "UINT4", "UINT8", "UINT16", "UINT32", "UINT64", "BOOL"))

_T = TensorProto
# onnx_parser.cpp get_type: case 1..13 (not 8 STRING), 16 (bf16), 18 (fp8e4m3fnuz), 21/22 (uint4/int4 as 8-bit), 23
MIGRAPHX_PARSER_TYPES = frozenset((
    _T.FLOAT, _T.UINT8, _T.INT8, _T.UINT16, _T.INT16, _T.INT32, _T.INT64, _T.BOOL, _T.FLOAT16, _T.DOUBLE, _T.UINT32,
    _T.UINT64, _T.BFLOAT16, _T.FLOAT8E4M3FNUZ, _T.UINT4, _T.INT4))
MIGRAPHX_MISREAD_TYPES = {
    # get_type: `case 23: return shape::fp4x2_type;` but parse_tensor_shape halves the packed last dimension only
    # when is_type_packed_int4 (INT4/UINT4), so the byte count is wrong; the ref target cannot visit fp4x2 (issue 9)
    _T.FLOAT4E2M1: "get_type maps it to fp4x2 but parse_tensor_shape halves the packed dim for INT4/UINT4 only",
    # get_type: `case 14: case 15: case 16: return shape::bf16_type;`
    _T.COMPLEX64: "get_type reads complex64 as bf16",
    _T.COMPLEX128: "get_type reads complex128 as bf16",
}
# parse_tensor_shape: INT4/UINT4 initializers need an even, non-zero last dimension ("Int4: currently supports only
# even-sized packed tensors")
MIGRAPHX_PACKED_INT4 = frozenset((_T.INT4, _T.UINT4))

# Input counts each parser checks (min, max), transcribed from its MIGRAPHX_THROW:
MIGRAPHX_INPUT_COUNTS = {
    "QuantizeLinear": (2, 3),                    # parse_quantizelinear.cpp: "must have either 2 or 3 inputs"
    "DequantizeLinear": (2, 3),                  # parse_dequantizelinear.cpp: "must have either 2 or 3 inputs"
    "SimplifiedLayerNormalization": (2, 2),      # parse_simplified_layer_normalization.cpp: "expected 2"
    "SkipSimplifiedLayerNormalization": (3, 4),  # parse_skip_simplified_layer_normalization.cpp
    "Shape": (1, 1),                             # parse_shape.cpp: "operator should have 1 operand"
    "CastLike": (2, 2),                          # parse_castlike.cpp: "must have exactly 2 inputs"
    "MXQuantizeDequantize": (1, 1),              # parse_mxqdq.cpp: "must have only 1 input"
    "MXFixNeuron": (1, 1),                       # parse_mxqdq.cpp (same parser)
    # GroupQueryAttention 7-11 (parse_group_query_attention.cpp): its own rule, migraphx-gqa-inputs
    "MatMulNBits": (3, 6),                       # parse_matmulnbits.cpp reads A, B, scales, zero_points (4, 5 ignored)
}
