"""Which op types and tensor types ONNX Runtime's MIGraphX execution provider hands to MIGraphX (facts, as data).

MIGRAPHX_ONNX_OPS: every op type an `operators()` list in AMDMIGraphX src/onnx/parse_*.cpp names (commit f729a52,
May 2026); from ROCm 7.2 the EP asks MIGraphX for exactly this list (migraphx::get_onnx_operators()). Domains are not
checked by the EP: com.microsoft ops (MatMulNBits, GroupQueryAttention, SimplifiedLayerNormalization, ...) are in it.
MIGRAPHX_EP_OPS_BEFORE_ROCM_7_2: the fixed list in onnxruntime migraphx_execution_provider.cc used by older builds
(it spells two names wrongly, "IsNan" and "Roialign", so IsNaN/RoiAlign never go to MIGraphX there).
MIGRAPHX_TENSOR_TYPES: IsTypeSupported in the same file; a node touching any other type stays on CPU.
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

MIGRAPHX_TENSOR_TYPES = frozenset(getattr(TensorProto, t) for t in (
    "FLOAT16", "BFLOAT16", "FLOAT", "FLOAT4E2M1", "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ",
    "DOUBLE", "INT4", "INT8", "INT16", "INT32", "INT64", "UINT4", "UINT8", "UINT16", "UINT32", "UINT64", "BOOL"))
