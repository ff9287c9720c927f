// ONNX Runtime registration of the com.quark_onnx kernels, written against the public C API only
// (onnxruntime_c_api.h; no C++ wrapper, no link against onnxruntime: the API table arrives with RegisterCustomOps).
//
// Built and tested in CI (custom_ops/ort_library.py fetches onnxruntime_c_api.h from Debian 13's libonnxruntime-dev;
// tests/test_custom_ops_ort.py, tests/test_custom_ops_genai.py). By hand:
//   cmake -S custom_ops -B build -DQO_WITH_ORT=ON -DONNXRUNTIME_ROOT=<ort package or source tree> [-DQO_WITH_CUDA=ON]
//
// Each op is registered once per activation type (float, float16) and per provider (CPU; CUDA when built with
// QO_WITH_CUDA). OrtCustomOp.version is pinned to kOrtApiVersion (ORT >= 1.16) so the library also loads in newer
// runtimes; errors come back as OrtStatus through CreateKernelV2 / KernelComputeV2 (no exception crosses the ABI).
// CPU kernels split their work over ORT's intra-op thread pool (KernelContext_ParallelFor, ORT >= 1.17) instead of
// OpenMP, so ORT's spinning workers and OpenMP's never compete for the same cores; on ORT 1.16 they use OpenMP.
#include <stdint.h>

#include <algorithm>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "onnxruntime_c_api.h"
#include "qo_kernels.h"

namespace {

constexpr uint32_t kOrtApiVersion = 16;  // CreateKernelV2 / KernelComputeV2 / KernelContext_GetGPUComputeStream
constexpr const char* kDomain = "com.quark_onnx";

constexpr uint32_t kOrtApiVersionParallelFor = 17;  // KernelContext_ParallelFor

const OrtApi* g_api = nullptr;
bool g_has_parallel_for = false;

enum class OpKind { kMxfp4, kFp8, kFp8Dyn, kBf16, kFp8Weight, kInt8, kNvfp4,  // each on CPU, and CUDA when built
                    kUint4, kInt4,    // CPU only (qo_cpu_int4.c)
                    kInt8W8A8,        // CPU only (qo_cpu_int8_w8a8.c)
                    kMxfp4R16, kNvfp4R16 };  // CPU only, float32 (qo_cpu_fp4_r16.c: the weight in 16-row tiles)

bool IsInt4(OpKind kind) { return kind == OpKind::kUint4 || kind == OpKind::kInt4; }
bool IsR16(OpKind kind) { return kind == OpKind::kMxfp4R16 || kind == OpKind::kNvfp4R16; }
bool CpuOnly(OpKind kind) { return IsInt4(kind) || kind == OpKind::kInt8W8A8 || IsR16(kind); }
bool HasAScale(OpKind kind) {
  return kind == OpKind::kFp8 || kind == OpKind::kNvfp4 || kind == OpKind::kInt8W8A8 || kind == OpKind::kNvfp4R16;
}

struct QoCustomOp : OrtCustomOp {
  OpKind kind;
  ONNXTensorElementDataType a_type;
  bool gpu;
};

struct QoKernel {
  OpKind kind;
  bool half;
  bool gpu;
  int64_t attr_k = -1;  // MatMulMxfp4 / MatMulNvfp4 attributes, checked against the tensors
  int64_t attr_n = -1;
  int64_t attr_block = -1;  // MatMulUint4 / MatMulInt4
  bool fp8_nan_free = false;  // FP8 ops on CPU: B is a constant initializer without a NaN code (ConstantFp8NanFree)
};

OrtStatus* Error(const std::string& message) {
  return g_api->CreateStatus(ORT_INVALID_ARGUMENT, (std::string(kDomain) + ": " + message).c_str());
}

#define QO_RETURN_IF_ERROR(expr)        \
  do {                                  \
    OrtStatus* qo_status_ = (expr);     \
    if (qo_status_) return qo_status_;  \
  } while (0)

struct TensorView {
  const OrtValue* value = nullptr;
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  std::vector<int64_t> shape;
  int64_t elements() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

OrtStatus* Describe(const OrtValue* value, TensorView* out) {
  out->value = value;
  OrtTensorTypeAndShapeInfo* info = nullptr;
  QO_RETURN_IF_ERROR(g_api->GetTensorTypeAndShape(value, &info));
  size_t rank = 0;
  OrtStatus* status = g_api->GetTensorElementType(info, &out->type);
  if (!status) status = g_api->GetDimensionsCount(info, &rank);
  if (!status) {
    out->shape.resize(rank);
    status = g_api->GetDimensions(info, out->shape.data(), rank);
  }
  g_api->ReleaseTensorTypeAndShapeInfo(info);
  return status;
}

OrtStatus* Input(OrtKernelContext* context, size_t index, TensorView* out, const void** data) {
  const OrtValue* value = nullptr;
  QO_RETURN_IF_ERROR(g_api->KernelContext_GetInput(context, index, &value));
  if (!value) return Error("missing input " + std::to_string(index));
  QO_RETURN_IF_ERROR(Describe(value, out));
  void* raw = nullptr;
  QO_RETURN_IF_ERROR(g_api->GetTensorMutableData(const_cast<OrtValue*>(value), &raw));
  *data = raw;
  return nullptr;
}

#if defined(QO_WITH_CPU)
int OrtParallelFor(void* context, qo_task_fn task, size_t total, void* data) {
  OrtStatus* status = g_api->KernelContext_ParallelFor(static_cast<const OrtKernelContext*>(context), task, total, 0,
                                                       data);
  if (!status) return QO_OK;
  g_api->ReleaseStatus(status);
  return QO_ERR_DEVICE;
}

// Sets the ORT thread-pool runner on this thread for the duration of one kernel call.
struct ScopedOrtRunner {
  qo_parallel_runner runner;
  explicit ScopedOrtRunner(OrtKernelContext* context) : runner{OrtParallelFor, context} {
    if (g_has_parallel_for) qo_cpu_set_parallel_runner(&runner);
  }
  ~ScopedOrtRunner() { qo_cpu_set_parallel_runner(nullptr); }
};

// Whether input `index` of the node is a constant initializer holding no e4m3fn NaN code: scanned once, when the
// kernel is created (a pass over the weight's bytes; about 1 s for the FP8 weights of an 8B model on one core).
// Any failure, or an input that is not constant: false, and the AVX2 FP8 GEMV tests the codes itself on every call
// (custom_ops/README.md, "FP8 weights scanned for NaN codes once"). KernelInfoGetConstantInput_tensor: ORT >= 1.15.
bool ConstantFp8NanFree(const OrtApi* api, const OrtKernelInfo* info, size_t index) {
  int is_constant = 0;
  const OrtValue* value = nullptr;
  if (OrtStatus* status = api->KernelInfoGetConstantInput_tensor(info, index, &is_constant, &value)) {
    api->ReleaseStatus(status);
    return false;
  }
  if (!is_constant || !value) return false;
  TensorView view;
  void* data = nullptr;
  OrtStatus* status = Describe(value, &view);
  if (!status) status = api->GetTensorMutableData(const_cast<OrtValue*>(value), &data);
  if (status) {
    api->ReleaseStatus(status);
    return false;
  }
  if (view.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E4M3FN || !data) return false;
  return qo_cpu_fp8_codes_nan_free(static_cast<const uint8_t*>(data), view.elements()) != 0;
}

// Sets qo_cpu_set_fp8_weight_nan_free on this thread for the duration of one kernel call.
struct ScopedFp8NanFree {
  explicit ScopedFp8NanFree(bool nan_free) { qo_cpu_set_fp8_weight_nan_free(nan_free ? 1 : 0); }
  ~ScopedFp8NanFree() { qo_cpu_set_fp8_weight_nan_free(0); }
};
#endif

int RunCpu(const QoKernel& k, OrtKernelContext* context, const void* a, const void* b, const void* b_scale,
           int64_t b_scale_count, const float* a_scale, void* y, int64_t M, int64_t N, int64_t K) {
#if defined(QO_WITH_CPU)
  using u16 = uint16_t;
  ScopedOrtRunner runner(context);
  ScopedFp8NanFree nan_free(k.fp8_nan_free);
  switch (k.kind) {
    case OpKind::kMxfp4:
      return k.half ? qo_matmul_mxfp4_f16((const u16*)a, (const uint8_t*)b, (const uint8_t*)b_scale, (u16*)y, M, N, K)
                    : qo_matmul_mxfp4_f32((const float*)a, (const uint8_t*)b, (const uint8_t*)b_scale, (float*)y, M, N, K);
    case OpKind::kFp8:
      return k.half ? qo_matmul_fp8_w8a8_f16((const u16*)a, (const uint8_t*)b, (const float*)b_scale, b_scale_count,
                                             *a_scale, (u16*)y, M, N, K)
                    : qo_matmul_fp8_w8a8_f32((const float*)a, (const uint8_t*)b, (const float*)b_scale, b_scale_count,
                                             *a_scale, (float*)y, M, N, K);
    case OpKind::kFp8Dyn:
      return k.half ? qo_matmul_fp8_w8a8_dyn_f16((const u16*)a, (const uint8_t*)b, (const float*)b_scale,
                                                 b_scale_count, (u16*)y, M, N, K)
                    : qo_matmul_fp8_w8a8_dyn_f32((const float*)a, (const uint8_t*)b, (const float*)b_scale,
                                                 b_scale_count, (float*)y, M, N, K);
    case OpKind::kBf16:
      return k.half ? qo_matmul_bf16_f16((const u16*)a, (const u16*)b, (u16*)y, M, N, K)
                    : qo_matmul_bf16_f32((const float*)a, (const u16*)b, (float*)y, M, N, K);
    case OpKind::kFp8Weight:
      return k.half ? qo_matmul_fp8_f16((const u16*)a, (const uint8_t*)b, (const float*)b_scale, b_scale_count,
                                        (u16*)y, M, N, K)
                    : qo_matmul_fp8_f32((const float*)a, (const uint8_t*)b, (const float*)b_scale, b_scale_count,
                                        (float*)y, M, N, K);
    case OpKind::kInt8:
      return k.half ? qo_matmul_int8_f16((const u16*)a, (const int8_t*)b, (const float*)b_scale, b_scale_count,
                                         (u16*)y, M, N, K)
                    : qo_matmul_int8_f32((const float*)a, (const int8_t*)b, (const float*)b_scale, b_scale_count,
                                         (float*)y, M, N, K);
    case OpKind::kNvfp4:  // a_scale carries B_scale_2 (a host float)
      return k.half ? qo_matmul_nvfp4_f16((const u16*)a, (const uint8_t*)b, (const uint8_t*)b_scale, *a_scale,
                                          (u16*)y, M, N, K)
                    : qo_matmul_nvfp4_f32((const float*)a, (const uint8_t*)b, (const uint8_t*)b_scale, *a_scale,
                                          (float*)y, M, N, K);
    case OpKind::kInt8W8A8:
      return k.half ? qo_matmul_int8_w8a8_f16((const u16*)a, (const int8_t*)b, (const float*)b_scale, b_scale_count,
                                              *a_scale, (u16*)y, M, N, K)
                    : qo_matmul_int8_w8a8_f32((const float*)a, (const int8_t*)b, (const float*)b_scale, b_scale_count,
                                              *a_scale, (float*)y, M, N, K);
    case OpKind::kMxfp4R16:  // float32 only (AllOps)
      return qo_matmul_mxfp4_r16_f32((const float*)a, (const uint8_t*)b, (const uint8_t*)b_scale, (float*)y, M, N, K);
    case OpKind::kNvfp4R16:
      return qo_matmul_nvfp4_r16_f32((const float*)a, (const uint8_t*)b, (const uint8_t*)b_scale, *a_scale, (float*)y,
                                     M, N, K);
    case OpKind::kUint4:
    case OpKind::kInt4: break;  // ComputeInt4
  }
  (void)b_scale; (void)b_scale_count; (void)a_scale;
#else
  (void)k; (void)context; (void)a; (void)b; (void)b_scale; (void)b_scale_count; (void)a_scale; (void)y; (void)M;
  (void)N; (void)K;
#endif
  return QO_ERR_ARGUMENT;
}

int RunGpu(const QoKernel& k, const void* a, const void* b, const void* b_scale, int64_t b_scale_count,
           const float* a_scale_device, void* y, int64_t M, int64_t N, int64_t K, void* stream) {
#if defined(QO_WITH_CUDA)
  using u16 = uint16_t;
  switch (k.kind) {
    case OpKind::kMxfp4:
      return k.half ? qo_gpu_matmul_mxfp4_f16((const u16*)a, (const uint8_t*)b, (const uint8_t*)b_scale, (u16*)y, M, N,
                                              K, stream)
                    : qo_gpu_matmul_mxfp4_f32((const float*)a, (const uint8_t*)b, (const uint8_t*)b_scale, (float*)y, M,
                                              N, K, stream);
    case OpKind::kFp8:
      return k.half ? qo_gpu_matmul_fp8_w8a8_f16((const u16*)a, (const uint8_t*)b, (const float*)b_scale,
                                                 b_scale_count, a_scale_device, (u16*)y, M, N, K, stream)
                    : qo_gpu_matmul_fp8_w8a8_f32((const float*)a, (const uint8_t*)b, (const float*)b_scale,
                                                 b_scale_count, a_scale_device, (float*)y, M, N, K, stream);
    case OpKind::kFp8Dyn: {
      float* row_scale = static_cast<float*>(qo_gpu_workspace_alloc((M > 0 ? M : 1) * (int64_t)sizeof(float), stream));
      if (!row_scale) return QO_ERR_ALLOC;
      const int status =
          k.half ? qo_gpu_matmul_fp8_w8a8_dyn_f16((const u16*)a, (const uint8_t*)b, (const float*)b_scale,
                                                  b_scale_count, row_scale, (u16*)y, M, N, K, stream)
                 : qo_gpu_matmul_fp8_w8a8_dyn_f32((const float*)a, (const uint8_t*)b, (const float*)b_scale,
                                                  b_scale_count, row_scale, (float*)y, M, N, K, stream);
      qo_gpu_workspace_free(row_scale, stream);  // stream-ordered: freed after the kernels ran
      return status;
    }
    case OpKind::kBf16:
      return k.half ? qo_gpu_matmul_bf16_f16((const u16*)a, (const u16*)b, (u16*)y, M, N, K, stream)
                    : qo_gpu_matmul_bf16_f32((const float*)a, (const u16*)b, (float*)y, M, N, K, stream);
    case OpKind::kFp8Weight:
      return k.half ? qo_gpu_matmul_fp8_f16((const u16*)a, (const uint8_t*)b, (const float*)b_scale, b_scale_count,
                                            (u16*)y, M, N, K, stream)
                    : qo_gpu_matmul_fp8_f32((const float*)a, (const uint8_t*)b, (const float*)b_scale, b_scale_count,
                                            (float*)y, M, N, K, stream);
    case OpKind::kInt8:
      return k.half ? qo_gpu_matmul_int8_f16((const u16*)a, (const int8_t*)b, (const float*)b_scale, b_scale_count,
                                             (u16*)y, M, N, K, stream)
                    : qo_gpu_matmul_int8_f32((const float*)a, (const int8_t*)b, (const float*)b_scale, b_scale_count,
                                             (float*)y, M, N, K, stream);
    case OpKind::kNvfp4:  // a_scale_device carries B_scale_2, which InputMemoryType keeps in host memory
      return k.half ? qo_gpu_matmul_nvfp4_f16((const u16*)a, (const uint8_t*)b, (const uint8_t*)b_scale,
                                              *a_scale_device, (u16*)y, M, N, K, stream)
                    : qo_gpu_matmul_nvfp4_f32((const float*)a, (const uint8_t*)b, (const uint8_t*)b_scale,
                                              *a_scale_device, (float*)y, M, N, K, stream);
    case OpKind::kUint4:
    case OpKind::kInt4:
    case OpKind::kInt8W8A8:
    case OpKind::kMxfp4R16:
    case OpKind::kNvfp4R16: break;  // CPU only
  }
#else
  (void)k; (void)a; (void)b; (void)b_scale; (void)b_scale_count; (void)a_scale_device; (void)y; (void)M; (void)N;
  (void)K; (void)stream;
#endif
  return QO_ERR_ARGUMENT;
}

// MatMulUint4 (A, B, scales, zero_points) / MatMulInt4 (A, B, scales; zero point 8): MatMulNBits' 4-bit layout.
OrtStatus* ComputeInt4(const QoKernel& k, OrtKernelContext* context) {
  const char* name = k.kind == OpKind::kUint4 ? "MatMulUint4" : "MatMulInt4";
  TensorView a, b, scales, zp;
  const void *a_data = nullptr, *b_data = nullptr, *s_data = nullptr, *zp_data = nullptr;
  QO_RETURN_IF_ERROR(Input(context, 0, &a, &a_data));
  QO_RETURN_IF_ERROR(Input(context, 1, &b, &b_data));
  QO_RETURN_IF_ERROR(Input(context, 2, &scales, &s_data));
  if (k.kind == OpKind::kUint4) QO_RETURN_IF_ERROR(Input(context, 3, &zp, &zp_data));
  if (a.shape.empty()) return Error(std::string(name) + ": A must have rank >= 1");
  const int64_t K = a.shape.back(), N = k.attr_n, bs = k.attr_block;
  if (K != k.attr_k) return Error(std::string(name) + ": A's last dimension is not the attribute K");
  if (bs < 16 || (bs & (bs - 1))) return Error(std::string(name) + ": block_size must be a power of two >= 16");
  const int64_t k_blocks = (K + bs - 1) / bs;
  if (b.shape.size() != 3 || b.shape[0] != N || b.shape[1] != k_blocks || b.shape[2] != bs / 2)
    return Error(std::string(name) + ": B must be [N, ceil(K / block_size), block_size / 2]");
  if (scales.elements() != N * k_blocks) return Error(std::string(name) + ": scales must hold N * ceil(K / block_size)");
  if (k.kind == OpKind::kUint4 && zp.elements() != N * ((k_blocks + 1) / 2))
    return Error(std::string(name) + ": zero_points must hold N * ceil(ceil(K / block_size) / 2) bytes");
  const int64_t M = K > 0 ? a.elements() / K : 0;
  std::vector<int64_t> y_shape = a.shape;
  y_shape.back() = N;
  OrtValue* y = nullptr;
  QO_RETURN_IF_ERROR(g_api->KernelContext_GetOutput(context, 0, y_shape.data(), y_shape.size(), &y));
  void* y_data = nullptr;
  QO_RETURN_IF_ERROR(g_api->GetTensorMutableData(y, &y_data));
  if (M == 0 || N == 0) return nullptr;
  int status = QO_ERR_ARGUMENT;
#if defined(QO_WITH_CPU)
  ScopedOrtRunner runner(context);
  const uint8_t* z = static_cast<const uint8_t*>(zp_data);
  status = k.half ? qo_matmul_int4_f16((const uint16_t*)a_data, (const uint8_t*)b_data, (const float*)s_data, z,
                                       (uint16_t*)y_data, M, N, K, bs)
                  : qo_matmul_int4_f32((const float*)a_data, (const uint8_t*)b_data, (const float*)s_data, z,
                                       (float*)y_data, M, N, K, bs);
#endif
  if (status != QO_OK) return Error(std::string(name) + ": kernel failed with status " + std::to_string(status));
  return nullptr;
}

OrtStatus* ORT_API_CALL Compute(void* op_kernel, OrtKernelContext* context) {
  const QoKernel& k = *static_cast<const QoKernel*>(op_kernel);
  if (IsInt4(k.kind)) return ComputeInt4(k, context);
  TensorView a, b, b_scale, a_scale;
  const void *a_data = nullptr, *b_data = nullptr, *b_scale_data = nullptr, *a_scale_data = nullptr;
  QO_RETURN_IF_ERROR(Input(context, 0, &a, &a_data));
  QO_RETURN_IF_ERROR(Input(context, 1, &b, &b_data));
  if (k.kind != OpKind::kBf16) QO_RETURN_IF_ERROR(Input(context, 2, &b_scale, &b_scale_data));
  if (HasAScale(k.kind)) QO_RETURN_IF_ERROR(Input(context, 3, &a_scale, &a_scale_data));

  if (IsR16(k.kind)) {  // B [N/16, K/8, 64], B_scale [N/16, K/block, 16]
    const char* name = k.kind == OpKind::kMxfp4R16 ? "MatMulMxfp4R16" : "MatMulNvfp4R16";
    const int64_t block = k.kind == OpKind::kMxfp4R16 ? 32 : 16;
    if (a.shape.empty() || b.shape.size() != 3 || b.shape[2] != 64)
      return Error(std::string(name) + ": A must have rank >= 1 and B be [N/16, K/8, 64]");
    if (b.shape[1] * 8 != a.shape.back() || a.shape.back() % block != 0)
      return Error(std::string(name) + ": B must be [N/16, K/8, 64] with K % " + std::to_string(block) + " == 0");
    if (b_scale.shape.size() != 3 || b_scale.shape[0] != b.shape[0] || b_scale.shape[1] != a.shape.back() / block ||
        b_scale.shape[2] != 16)
      return Error(std::string(name) + ": B_scale must be [N/16, K/" + std::to_string(block) + ", 16]");
    if (k.kind == OpKind::kNvfp4R16 && a_scale.elements() != 1)
      return Error("MatMulNvfp4R16: B_scale_2 must be a scalar");
    if ((k.attr_k > 0 && k.attr_k != a.shape.back()) || (k.attr_n > 0 && k.attr_n != b.shape[0] * 16))
      return Error(std::string(name) + ": attributes K/N do not match the tensors");
  } else if (a.shape.empty() || b.shape.size() != 2) {
    return Error("A must have rank >= 1 and B rank 2");
  }
  const int64_t K = a.shape.back();
  const int64_t N = IsR16(k.kind) ? b.shape[0] * 16 : b.shape[0];
  const int64_t M = K > 0 ? a.elements() / K : 0;
  if (IsR16(k.kind)) {
  } else if (k.kind == OpKind::kMxfp4) {
    if (b.shape[1] * 2 != K || K % 32 != 0) return Error("MatMulMxfp4: B must be [N, K/2] with K % 32 == 0");
    if (b_scale.shape.size() != 2 || b_scale.shape[0] != N || b_scale.shape[1] != K / 32)
      return Error("MatMulMxfp4: B_scale must be [N, K/32]");
    if ((k.attr_k > 0 && k.attr_k != K) || (k.attr_n > 0 && k.attr_n != N))
      return Error("MatMulMxfp4: attributes K/N do not match the tensors");
  } else if (k.kind == OpKind::kBf16) {
    if (b.shape[1] != K) return Error("MatMulBf16: B must be [N, K]");
  } else if (k.kind == OpKind::kNvfp4) {
    if (b.shape[1] * 2 != K || K % 16 != 0) return Error("MatMulNvfp4: B must be [N, K/2] with K % 16 == 0");
    if (b_scale.shape.size() != 2 || b_scale.shape[0] != N || b_scale.shape[1] != K / 16)
      return Error("MatMulNvfp4: B_scale must be [N, K/16]");
    if (a_scale.elements() != 1) return Error("MatMulNvfp4: B_scale_2 must be a scalar");
    if ((k.attr_k > 0 && k.attr_k != K) || (k.attr_n > 0 && k.attr_n != N))
      return Error("MatMulNvfp4: attributes K/N do not match the tensors");
  } else if (k.kind == OpKind::kFp8Weight || k.kind == OpKind::kInt8 || k.kind == OpKind::kInt8W8A8) {
    const char* name = k.kind == OpKind::kInt8 ? "MatMulInt8" : k.kind == OpKind::kInt8W8A8 ? "MatMulInt8W8A8"
                                                                                            : "MatMulFp8";
    if (b.shape[1] != K) return Error(std::string(name) + ": B must be [N, K]");
    const int64_t count = b_scale.elements();
    if (count != 1 && !(b_scale.shape.size() == 1 && count == N))
      return Error(std::string(name) + ": B_scale must be a scalar or [N]");
    if (k.kind == OpKind::kInt8W8A8) {
      if (a_scale.elements() != 1) return Error("MatMulInt8W8A8: A_scale must be a scalar");
      const float s = *static_cast<const float*>(a_scale_data);
      if (!(s > 0.0f) || s > 3.4028235e38f) return Error("MatMulInt8W8A8: A_scale must be positive and finite");
      if (K > (1 << 24)) return Error("MatMulInt8W8A8: K must be <= 2^24");
    }
  } else {
    if (b.shape[1] != K) return Error("MatMulFp8W8A8: B must be [N, K]");
    const int64_t count = b_scale.elements();
    if (count != 1 && !(b_scale.shape.size() == 1 && count == N))
      return Error("MatMulFp8W8A8: B_scale must be a scalar or [N]");
    if (k.kind == OpKind::kFp8 && a_scale.elements() != 1) return Error("MatMulFp8W8A8: A_scale must be a scalar");
  }

  std::vector<int64_t> y_shape = a.shape;
  y_shape.back() = N;
  OrtValue* y = nullptr;
  QO_RETURN_IF_ERROR(g_api->KernelContext_GetOutput(context, 0, y_shape.data(), y_shape.size(), &y));
  void* y_data = nullptr;
  QO_RETURN_IF_ERROR(g_api->GetTensorMutableData(y, &y_data));
  if (M == 0 || N == 0) return nullptr;

  const int64_t b_scale_count = b_scale.elements();
  int status;
  if (k.gpu) {
    void* stream = nullptr;
    QO_RETURN_IF_ERROR(g_api->KernelContext_GetGPUComputeStream(context, &stream));
    status = RunGpu(k, a_data, b_data, b_scale_data, b_scale_count, static_cast<const float*>(a_scale_data), y_data,
                    M, N, K, stream);
  } else {
    status = RunCpu(k, context, a_data, b_data, b_scale_data, b_scale_count, static_cast<const float*>(a_scale_data),
                    y_data, M, N, K);
  }
  if (status != QO_OK) return Error("kernel failed with status " + std::to_string(status));
  return nullptr;
}

OrtStatus* ORT_API_CALL CreateKernel(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info,
                                     void** kernel) {
  const QoCustomOp* qo = static_cast<const QoCustomOp*>(op);
  QoKernel* k = new (std::nothrow) QoKernel{qo->kind, qo->a_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16, qo->gpu};
  if (!k) return api->CreateStatus(ORT_FAIL, "com.quark_onnx: out of memory");
  if (qo->kind == OpKind::kMxfp4 || qo->kind == OpKind::kNvfp4 || IsInt4(qo->kind) || IsR16(qo->kind)) {
    OrtStatus* status = api->KernelInfoGetAttribute_int64(info, "K", &k->attr_k);
    if (!status) status = api->KernelInfoGetAttribute_int64(info, "N", &k->attr_n);
    if (!status && IsInt4(qo->kind)) status = api->KernelInfoGetAttribute_int64(info, "block_size", &k->attr_block);
    if (status) {  // attributes are required by the op definition
      delete k;
      return status;
    }
  }
#if defined(QO_WITH_CPU)
  if (!qo->gpu && (qo->kind == OpKind::kFp8 || qo->kind == OpKind::kFp8Dyn || qo->kind == OpKind::kFp8Weight))
    k->fp8_nan_free = ConstantFp8NanFree(api, info, 1);
#endif
  *kernel = k;
  return nullptr;
}

const char* ORT_API_CALL GetName(const OrtCustomOp* op) {
  switch (static_cast<const QoCustomOp*>(op)->kind) {
    case OpKind::kMxfp4: return "MatMulMxfp4";
    case OpKind::kFp8: return "MatMulFp8W8A8";
    case OpKind::kFp8Dyn: return "MatMulFp8W8A8Dyn";
    case OpKind::kBf16: return "MatMulBf16";
    case OpKind::kFp8Weight: return "MatMulFp8";
    case OpKind::kInt8: return "MatMulInt8";
    case OpKind::kNvfp4: return "MatMulNvfp4";
    case OpKind::kUint4: return "MatMulUint4";
    case OpKind::kInt4: return "MatMulInt4";
    case OpKind::kInt8W8A8: return "MatMulInt8W8A8";
    case OpKind::kMxfp4R16: return "MatMulMxfp4R16";
    case OpKind::kNvfp4R16: return "MatMulNvfp4R16";
  }
  return "";
}

const char* ORT_API_CALL GetProvider(const OrtCustomOp* op) {
  return static_cast<const QoCustomOp*>(op)->gpu ? "CUDAExecutionProvider" : "CPUExecutionProvider";
}

size_t ORT_API_CALL GetInputTypeCount(const OrtCustomOp* op) {
  switch (static_cast<const QoCustomOp*>(op)->kind) {
    case OpKind::kFp8:
    case OpKind::kNvfp4:
    case OpKind::kInt8W8A8:
    case OpKind::kNvfp4R16:
    case OpKind::kUint4: return 4;
    case OpKind::kBf16: return 2;
    default: return 3;
  }
}

ONNXTensorElementDataType ORT_API_CALL GetInputType(const OrtCustomOp* op, size_t index) {
  const QoCustomOp* qo = static_cast<const QoCustomOp*>(op);
  if (index == 0) return qo->a_type;
  if (qo->kind == OpKind::kMxfp4 || qo->kind == OpKind::kMxfp4R16) return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
  if (IsInt4(qo->kind)) return index == 2 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT : ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
  if (qo->kind == OpKind::kBf16) return ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
  if (qo->kind == OpKind::kInt8 || qo->kind == OpKind::kInt8W8A8)  // B int8; B_scale (and A_scale) float
    return index == 1 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  if (qo->kind == OpKind::kNvfp4 || qo->kind == OpKind::kNvfp4R16) {  // B uint8, B_scale e4m3fn, B_scale_2 float
    if (index == 1) return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
    if (index == 2) return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E4M3FN;
    return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
  if (index == 1) return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E4M3FN;
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;                                 // B_scale, A_scale
}

size_t ORT_API_CALL GetOutputTypeCount(const OrtCustomOp*) { return 1; }

ONNXTensorElementDataType ORT_API_CALL GetOutputType(const OrtCustomOp* op, size_t) {
  return static_cast<const QoCustomOp*>(op)->a_type;
}

void ORT_API_CALL KernelDestroy(void* op_kernel) { delete static_cast<QoKernel*>(op_kernel); }

OrtCustomOpInputOutputCharacteristic ORT_API_CALL Required(const OrtCustomOp*, size_t) {
  return INPUT_OUTPUT_REQUIRED;
}

// MatMulNvfp4's B_scale_2 (input 3) is read on the host by the GPU kernel's launcher (a kernel argument by value).
OrtMemType ORT_API_CALL InputMemoryType(const OrtCustomOp* op, size_t index) {
  const QoCustomOp* qo = static_cast<const QoCustomOp*>(op);
  return (qo->gpu && qo->kind == OpKind::kNvfp4 && index == 3) ? OrtMemTypeCPUInput : OrtMemTypeDefault;
}

int ORT_API_CALL MinArity(const OrtCustomOp*) { return 1; }
int ORT_API_CALL Homogeneous(const OrtCustomOp*) { return 0; }

QoCustomOp MakeOp(OpKind kind, ONNXTensorElementDataType a_type, bool gpu) {
  QoCustomOp op{};  // zero: every callback newer than kOrtApiVersion stays null
  op.version = kOrtApiVersion;
  op.CreateKernel = nullptr;  // the V2 entry points below are used instead
  op.GetName = GetName;
  op.GetExecutionProviderType = GetProvider;
  op.GetInputType = GetInputType;
  op.GetInputTypeCount = GetInputTypeCount;
  op.GetOutputType = GetOutputType;
  op.GetOutputTypeCount = GetOutputTypeCount;
  op.KernelCompute = nullptr;
  op.KernelDestroy = KernelDestroy;
  op.GetInputCharacteristic = Required;
  op.GetOutputCharacteristic = Required;
  op.GetInputMemoryType = InputMemoryType;
  op.GetVariadicInputMinArity = MinArity;
  op.GetVariadicInputHomogeneity = Homogeneous;
  op.GetVariadicOutputMinArity = MinArity;
  op.GetVariadicOutputHomogeneity = Homogeneous;
  op.CreateKernelV2 = CreateKernel;
  op.KernelComputeV2 = Compute;
  op.kind = kind;
  op.a_type = a_type;
  op.gpu = gpu;
  return op;
}

std::vector<QoCustomOp>& AllOps() {
  static std::vector<QoCustomOp> ops = [] {
    std::vector<QoCustomOp> list;
    std::vector<bool> providers;
#if defined(QO_WITH_CPU)
    providers.push_back(false);
#endif
#if defined(QO_WITH_CUDA)
    providers.push_back(true);
#endif
    for (bool gpu : providers)
      for (OpKind kind : {OpKind::kMxfp4, OpKind::kFp8, OpKind::kFp8Dyn, OpKind::kBf16, OpKind::kFp8Weight,
                          OpKind::kInt8, OpKind::kNvfp4, OpKind::kUint4, OpKind::kInt4, OpKind::kInt8W8A8,
                          OpKind::kMxfp4R16, OpKind::kNvfp4R16})
        for (ONNXTensorElementDataType t : {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16})
          if (!(gpu && CpuOnly(kind)) && !(IsR16(kind) && t != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT))
            list.push_back(MakeOp(kind, t, gpu));
    return list;
  }();
  return ops;
}

// ---- MatMulExperts{Mxfp4,Nvfp4,Fp8,Int8,Uint4,Int4} (CPU, float32): routed experts read in place from the stacked
// weight (qo_cpu_experts.c). Inputs A [T, K] or [T, k, K], expert_ids int64 [T, k], B [E, N, ...], B_scale, (NVFP4)
// B_scale_2 [E]; (Uint4 / Int4) B [E, N, k_blocks, block/2], scales [E, N, k_blocks], (Uint4) zero_points
// [E, N, ceil(k_blocks/2)], the block size read from B's shape, attribute accuracy_level 1 (default: float32
// activations, exact) or 4 (int8 activations per block: MatMulNBits / QMoE level 4's arithmetic); output Y [T, k, N]. ----
// Formats of the experts ops: QO_FMT_* (qo_kernels.h) plus the two 4-bit integer ones (both QO_FMT_INT4 kernels).
constexpr int kExpertsUint4 = 100, kExpertsInt4 = 101;

struct QoExpertsOp : OrtCustomOp {
  int fmt;  // QO_FMT_* or kExperts*4
};

const char* ExpertsOpName(int fmt) {
  switch (fmt) {
    case QO_FMT_MXFP4: return "MatMulExpertsMxfp4";
    case QO_FMT_NVFP4: return "MatMulExpertsNvfp4";
    case QO_FMT_MXFP4_R16: return "MatMulExpertsMxfp4R16";
    case QO_FMT_NVFP4_R16: return "MatMulExpertsNvfp4R16";
    case QO_FMT_FP8: return "MatMulExpertsFp8";
    case kExpertsUint4: return "MatMulExpertsUint4";
    case kExpertsInt4: return "MatMulExpertsInt4";
    default: return "MatMulExpertsInt8";
  }
}

const char* ORT_API_CALL ExpertsName(const OrtCustomOp* op) {
  return ExpertsOpName(static_cast<const QoExpertsOp*>(op)->fmt);
}

const char* ORT_API_CALL ExpertsProvider(const OrtCustomOp*) { return "CPUExecutionProvider"; }

size_t ORT_API_CALL ExpertsInputCount(const OrtCustomOp* op) {
  const int fmt = static_cast<const QoExpertsOp*>(op)->fmt;
  return fmt == QO_FMT_NVFP4 || fmt == QO_FMT_NVFP4_R16 || fmt == kExpertsUint4 ? 5 : 4;
}

ONNXTensorElementDataType ORT_API_CALL ExpertsInputType(const OrtCustomOp* op, size_t index) {
  const int fmt = static_cast<const QoExpertsOp*>(op)->fmt;
  if (fmt == kExpertsUint4 || fmt == kExpertsInt4) {  // A, expert_ids, B, scales, (zero_points)
    static const ONNXTensorElementDataType types[] = {
        ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8,
        ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8};
    return types[index < 5 ? index : 4];
  }
  switch (index) {
    case 0: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    case 1: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
    case 2:
      return fmt == QO_FMT_FP8 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E4M3FN
             : fmt == QO_FMT_INT8 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8 : ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
    case 3:
      return fmt == QO_FMT_MXFP4 || fmt == QO_FMT_MXFP4_R16 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8
             : fmt == QO_FMT_NVFP4 || fmt == QO_FMT_NVFP4_R16 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E4M3FN
                                                              : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    default: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
}

ONNXTensorElementDataType ORT_API_CALL ExpertsOutputType(const OrtCustomOp*, size_t) {
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}

struct ExpertsKernel {
  int fmt;
  int64_t accuracy_level;  // Uint4 / Int4: 1 (absent, or 0): float32 activations; 4: int8 (MatMulNBits level 4)
  bool fp8_nan_free = false;  // MatMulExpertsFp8: the stacked weight (input 2) is constant, without a NaN code
};

OrtStatus* ORT_API_CALL ExpertsCreate(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info,
                                      void** kernel) {
  const int fmt = static_cast<const QoExpertsOp*>(op)->fmt;
  int64_t level = 1;
  if (fmt == kExpertsUint4 || fmt == kExpertsInt4) {
    if (OrtStatus* absent = api->KernelInfoGetAttribute_int64(info, "accuracy_level", &level)) {
      api->ReleaseStatus(absent);
      level = 1;
    }
    if (level == 0) level = 1;
    if (level != 1 && level != 4)
      return api->CreateStatus(ORT_INVALID_ARGUMENT, (std::string(ExpertsOpName(fmt)) + ": accuracy_level " +
                                                      std::to_string(level) + " (1: float32 activations, 4: int8)").c_str());
  }
  ExpertsKernel* k = new (std::nothrow) ExpertsKernel{fmt, level};
  if (!k) return api->CreateStatus(ORT_FAIL, "com.quark_onnx: out of memory");
#if defined(QO_WITH_CPU)
  if (fmt == QO_FMT_FP8) k->fp8_nan_free = ConstantFp8NanFree(api, info, 2);
#endif
  *kernel = k;
  return nullptr;
}

OrtMemType ORT_API_CALL ExpertsMemType(const OrtCustomOp*, size_t) { return OrtMemTypeDefault; }

void ORT_API_CALL ExpertsDestroy(void* kernel) { delete static_cast<ExpertsKernel*>(kernel); }

OrtStatus* ORT_API_CALL ExpertsCompute(void* kernel, OrtKernelContext* context) {
  const int fmt = static_cast<const ExpertsKernel*>(kernel)->fmt;
  const bool int8_activations = static_cast<const ExpertsKernel*>(kernel)->accuracy_level == 4;
  const char* name = ExpertsOpName(fmt);
  const bool int4 = fmt == kExpertsUint4 || fmt == kExpertsInt4;
  TensorView a, ids, b, b_scale, b_scale_2;
  const void *a_data = nullptr, *ids_data = nullptr, *b_data = nullptr, *s_data = nullptr, *s2_data = nullptr;
  QO_RETURN_IF_ERROR(Input(context, 0, &a, &a_data));
  QO_RETURN_IF_ERROR(Input(context, 1, &ids, &ids_data));
  QO_RETURN_IF_ERROR(Input(context, 2, &b, &b_data));
  QO_RETURN_IF_ERROR(Input(context, 3, &b_scale, &s_data));
  const bool r16 = fmt == QO_FMT_MXFP4_R16 || fmt == QO_FMT_NVFP4_R16;  // B [E, N/16, K/8, 64]
  if (fmt == QO_FMT_NVFP4 || fmt == QO_FMT_NVFP4_R16 || fmt == kExpertsUint4)
    QO_RETURN_IF_ERROR(Input(context, 4, &b_scale_2, &s2_data));
  if (ids.shape.size() != 2 || b.shape.size() != (int4 || r16 ? 4u : 3u) || (a.shape.size() != 2 && a.shape.size() != 3))
    return Error(std::string(name) + ": A must be [T, K] or [T, k, K], expert_ids [T, k], B [E, N, ...]");
  const int64_t T = ids.shape[0], k = ids.shape[1], E = b.shape[0], N = r16 ? 16 * b.shape[1] : b.shape[1],
                K = a.shape.back();
  const int64_t a_slots = a.shape.size() == 3 ? k : 1;
  if (a.shape[0] != T || (a.shape.size() == 3 && a.shape[1] != k))
    return Error(std::string(name) + ": A's leading dimensions must match expert_ids [T, k]");
  const bool fp4 = fmt == QO_FMT_MXFP4 || fmt == QO_FMT_NVFP4;
  const int64_t block = int4 ? 2 * b.shape[3] : fmt == QO_FMT_MXFP4 || fmt == QO_FMT_MXFP4_R16 ? 32 : 16;
  const int64_t k_blocks = block > 0 ? (K + block - 1) / block : 0;
  if (int4) {
    if (block < 16 || (block & (block - 1)) || b.shape[2] != k_blocks || K <= 0)
      return Error(std::string(name) + ": B must be [E, N, ceil(K / block), block / 2], block a power of two >= 16");
    if (b_scale.elements() != E * N * k_blocks) return Error(std::string(name) + ": scales must be [E, N, k_blocks]");
    if (fmt == kExpertsUint4 && b_scale_2.elements() != E * N * ((k_blocks + 1) / 2))
      return Error(std::string(name) + ": zero_points must be [E, N, ceil(k_blocks / 2)]");
  } else if (r16) {
    if (b.shape[3] != 64 || b.shape[2] * 8 != K || K % block != 0)
      return Error(std::string(name) + ": B must be [E, N/16, K/8, 64] with K % " + std::to_string(block) + " == 0");
    if (b_scale.shape.size() != 4 || b_scale.shape[0] != E || b_scale.shape[1] != N / 16 ||
        b_scale.shape[2] != K / block || b_scale.shape[3] != 16)
      return Error(std::string(name) + ": B_scale must be [E, N/16, K/" + std::to_string(block) + ", 16]");
    if (fmt == QO_FMT_NVFP4_R16 && b_scale_2.elements() != E)
      return Error(std::string(name) + ": B_scale_2 must be [E]");
  } else if (fp4) {
    if (b.shape[2] * 2 != K || K % block != 0)
      return Error(std::string(name) + ": B must be [E, N, K/2] with K % " + std::to_string(block) + " == 0");
    if (b_scale.shape.size() != 3 || b_scale.shape[0] != E || b_scale.shape[1] != N || b_scale.shape[2] != K / block)
      return Error(std::string(name) + ": B_scale must be [E, N, K/" + std::to_string(block) + "]");
    if (fmt == QO_FMT_NVFP4 && b_scale_2.elements() != E) return Error(std::string(name) + ": B_scale_2 must be [E]");
  } else {
    if (b.shape[2] != K) return Error(std::string(name) + ": B must be [E, N, K]");
    if (b_scale.elements() != E && b_scale.elements() != E * N)
      return Error(std::string(name) + ": B_scale must be [E] or [E, N]");
  }
  const int64_t y_shape[3] = {T, k, N};
  OrtValue* y = nullptr;
  QO_RETURN_IF_ERROR(g_api->KernelContext_GetOutput(context, 0, y_shape, 3, &y));
  void* y_data = nullptr;
  QO_RETURN_IF_ERROR(g_api->GetTensorMutableData(y, &y_data));
  if (T == 0 || k == 0 || N == 0) return nullptr;
  int status = QO_ERR_ARGUMENT;
#if defined(QO_WITH_CPU)
  ScopedOrtRunner runner(context);
  const float* A = static_cast<const float*>(a_data);
  const int64_t* id = static_cast<const int64_t*>(ids_data);
  const uint8_t* B = static_cast<const uint8_t*>(b_data);
  float* Y = static_cast<float*>(y_data);
  switch (fmt) {
    case QO_FMT_MXFP4:
      status = qo_matmul_experts_mxfp4_f32(A, id, B, (const uint8_t*)s_data, Y, T, k, a_slots, E, N, K);
      break;
    case QO_FMT_NVFP4:
      status = qo_matmul_experts_nvfp4_f32(A, id, B, (const uint8_t*)s_data, (const float*)s2_data, Y, T, k, a_slots,
                                           E, N, K);
      break;
    case QO_FMT_MXFP4_R16:
      status = qo_matmul_experts_mxfp4_r16_f32(A, id, B, (const uint8_t*)s_data, Y, T, k, a_slots, E, N, K);
      break;
    case QO_FMT_NVFP4_R16:
      status = qo_matmul_experts_nvfp4_r16_f32(A, id, B, (const uint8_t*)s_data, (const float*)s2_data, Y, T, k,
                                               a_slots, E, N, K);
      break;
    case QO_FMT_FP8: {
      ScopedFp8NanFree nan_free(static_cast<const ExpertsKernel*>(kernel)->fp8_nan_free);
      status = qo_matmul_experts_fp8_f32(A, id, B, (const float*)s_data, b_scale.elements(), Y, T, k, a_slots, E, N,
                                         K);
      break;
    }
    case kExpertsUint4:
    case kExpertsInt4:
      status = (int8_activations ? qo_matmul_experts_int4_a8_f32 : qo_matmul_experts_int4_f32)(
          A, id, B, (const float*)s_data, fmt == kExpertsUint4 ? (const uint8_t*)s2_data : nullptr, Y, T, k, a_slots,
          E, N, K, block);
      break;
    default:
      status = qo_matmul_experts_int8_f32(A, id, (const int8_t*)B, (const float*)s_data, b_scale.elements(), Y, T, k,
                                          a_slots, E, N, K);
  }
#endif
  if (status != QO_OK)
    return Error(std::string(name) + ": kernel failed with status " + std::to_string(status) +
                 (status == QO_ERR_ARGUMENT ? " (an expert id outside [0, E)?)" : ""));
  return nullptr;
}

// A CPU, float32 op of its own callbacks (the experts and the attention op): MakeOp's defaults otherwise.
struct CpuOpCallbacks {
  const char*(ORT_API_CALL* name)(const OrtCustomOp*);
  ONNXTensorElementDataType(ORT_API_CALL* input_type)(const OrtCustomOp*, size_t);
  size_t(ORT_API_CALL* input_count)(const OrtCustomOp*);
  size_t(ORT_API_CALL* output_count)(const OrtCustomOp*);
  OrtStatus*(ORT_API_CALL* create)(const OrtCustomOp*, const OrtApi*, const OrtKernelInfo*, void**);
  OrtStatus*(ORT_API_CALL* compute)(void*, OrtKernelContext*);
  void(ORT_API_CALL* destroy)(void*);
};

OrtCustomOp MakeCpuOp(const CpuOpCallbacks& c) {
  OrtCustomOp op = MakeOp(OpKind::kMxfp4, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, false);
  op.GetName = c.name;
  op.GetExecutionProviderType = ExpertsProvider;
  op.GetInputType = c.input_type;
  op.GetInputTypeCount = c.input_count;
  op.GetOutputType = ExpertsOutputType;
  op.GetOutputTypeCount = c.output_count;
  op.GetInputMemoryType = ExpertsMemType;
  op.CreateKernelV2 = c.create;
  op.KernelComputeV2 = c.compute;
  op.KernelDestroy = c.destroy;
  return op;
}

std::vector<QoExpertsOp>& ExpertOps() {
  static std::vector<QoExpertsOp> ops = [] {
    std::vector<QoExpertsOp> list;
#if defined(QO_WITH_CPU)
    for (int fmt : {int(QO_FMT_MXFP4), int(QO_FMT_NVFP4), int(QO_FMT_FP8), int(QO_FMT_INT8), kExpertsUint4, kExpertsInt4,
                    int(QO_FMT_MXFP4_R16), int(QO_FMT_NVFP4_R16)}) {
      QoExpertsOp op{};
      static_cast<OrtCustomOp&>(op) = MakeCpuOp({ExpertsName, ExpertsInputType, ExpertsInputCount, GetOutputTypeCount,
                                                 ExpertsCreate, ExpertsCompute, ExpertsDestroy});
      op.fmt = fmt;
      list.push_back(op);
    }
#endif
    return list;
  }();
  return ops;
}

// ---- GroupQueryAttentionFixedOrder (CPU, float32): com.microsoft GroupQueryAttention's inputs and outputs
// (query [B, S, H*D], key / value [B, S, Hkv*D], past_key / past_value [B, Hkv, P, D], seqlens_k int32 [B],
// total_sequence_length int32 scalar, cos_cache / sin_cache [max_positions, R]) -> output [B, S, H*D],
// present_key / present_value [B, Hkv, max(total, P), D]; attributes num_heads, kv_num_heads, scale (0: 1/sqrt(D)),
// local_window_size (-1: none). onnxruntime-genai's past_present_share_buffer binds present to past's buffer: the
// kernel then writes the new rows in place (qo_cpu_attention.c). ----
// GroupQueryAttentionFixedOrderSinks: the same plus input 9, head_sink float [H] (gpt-oss's sinks: one more softmax
// column per head, dropped after).
constexpr const char* kGqaName = "GroupQueryAttentionFixedOrder";
constexpr const char* kGqaSinksName = "GroupQueryAttentionFixedOrderSinks";

struct GqaOp : OrtCustomOp {
  bool sinks;
};

struct GqaKernel {
  int64_t num_heads, kv_heads, window;
  float scale;
  bool sinks;
};

const char* ORT_API_CALL GqaOpName(const OrtCustomOp* op) {
  return static_cast<const GqaOp*>(op)->sinks ? kGqaSinksName : kGqaName;
}
size_t ORT_API_CALL GqaInputCount(const OrtCustomOp* op) { return static_cast<const GqaOp*>(op)->sinks ? 10 : 9; }
size_t ORT_API_CALL GqaOutputCount(const OrtCustomOp*) { return 3; }

ONNXTensorElementDataType ORT_API_CALL GqaInputType(const OrtCustomOp*, size_t index) {
  return index == 5 || index == 6 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}

OrtStatus* ORT_API_CALL GqaCreate(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info, void** kernel) {
  GqaKernel k{0, 0, -1, 0.0f, static_cast<const GqaOp*>(op)->sinks};
  QO_RETURN_IF_ERROR(api->KernelInfoGetAttribute_int64(info, "num_heads", &k.num_heads));
  QO_RETURN_IF_ERROR(api->KernelInfoGetAttribute_int64(info, "kv_num_heads", &k.kv_heads));
  if (OrtStatus* absent = api->KernelInfoGetAttribute_float(info, "scale", &k.scale)) {
    api->ReleaseStatus(absent);
    k.scale = 0.0f;
  }
  if (OrtStatus* absent = api->KernelInfoGetAttribute_int64(info, "local_window_size", &k.window)) {
    api->ReleaseStatus(absent);
    k.window = -1;
  }
  if (k.num_heads <= 0 || k.kv_heads <= 0 || k.num_heads % k.kv_heads != 0)
    return api->CreateStatus(ORT_INVALID_ARGUMENT, (std::string(kDomain) + ": " + GqaOpName(op) + ": num_heads " +
                                                    std::to_string(k.num_heads) + " must be a positive multiple of "
                                                    "kv_num_heads " + std::to_string(k.kv_heads)).c_str());
  GqaKernel* made = new (std::nothrow) GqaKernel(k);
  if (!made) return api->CreateStatus(ORT_FAIL, "com.quark_onnx: out of memory");
  *kernel = made;
  return nullptr;
}

void ORT_API_CALL GqaDestroy(void* kernel) { delete static_cast<GqaKernel*>(kernel); }

OrtStatus* ORT_API_CALL GqaCompute(void* kernel, OrtKernelContext* context) {
  const GqaKernel& kk = *static_cast<const GqaKernel*>(kernel);
  const std::string name = kk.sinks ? kGqaSinksName : kGqaName;
  TensorView t[10];
  const void* data[10] = {};
  const size_t inputs = kk.sinks ? 10 : 9;
  for (size_t i = 0; i < inputs; ++i) QO_RETURN_IF_ERROR(Input(context, i, &t[i], &data[i]));
  if (kk.sinks && t[9].elements() != kk.num_heads) return Error(name + ": head_sink must be [num_heads]");
  const TensorView &q = t[0], &k = t[1], &v = t[2], &pk = t[3], &pv = t[4], &sl = t[5], &tot = t[6], &cs = t[7],
                   &sn = t[8];
  if (q.shape.size() != 3 || k.shape.size() != 3 || v.shape != k.shape || pk.shape.size() != 4 || pv.shape != pk.shape)
    return Error(name + ": query / key / value must be [B, S, heads * D], past_key / past_value [B, Hkv, P, D]");
  const int64_t B = q.shape[0], S = q.shape[1], H = kk.num_heads, Hkv = kk.kv_heads;
  if (q.shape[2] % H != 0) return Error(name + ": query's last dimension is not num_heads * D");
  const int64_t D = q.shape[2] / H;
  if (k.shape[0] != B || k.shape[1] != S || k.shape[2] != Hkv * D || pk.shape[0] != B || pk.shape[1] != Hkv ||
      pk.shape[3] != D)
    return Error(name + ": key / value [B, S, kv_num_heads * D] and past [B, kv_num_heads, P, D] must match query");
  if (sl.elements() != B || tot.elements() != 1)
    return Error(name + ": seqlens_k must be [B], total_sequence_length a scalar");
  if (cs.shape.size() != 2 || sn.shape != cs.shape || 2 * cs.shape[1] > D)
    return Error(name + ": cos_cache / sin_cache must be [max_positions, R] with 2R <= head size");
  const int64_t total = *static_cast<const int32_t*>(data[6]), P = pk.shape[2];
  const int64_t T = total > P ? total : P;
  const int64_t out_shape[3] = {B, S, H * D}, cache_shape[4] = {B, Hkv, T, D};
  OrtValue *out = nullptr, *present_k = nullptr, *present_v = nullptr;
  QO_RETURN_IF_ERROR(g_api->KernelContext_GetOutput(context, 0, out_shape, 3, &out));
  QO_RETURN_IF_ERROR(g_api->KernelContext_GetOutput(context, 1, cache_shape, 4, &present_k));
  QO_RETURN_IF_ERROR(g_api->KernelContext_GetOutput(context, 2, cache_shape, 4, &present_v));
  void *out_data = nullptr, *pk_out = nullptr, *pv_out = nullptr;
  QO_RETURN_IF_ERROR(g_api->GetTensorMutableData(out, &out_data));
  QO_RETURN_IF_ERROR(g_api->GetTensorMutableData(present_k, &pk_out));
  QO_RETURN_IF_ERROR(g_api->GetTensorMutableData(present_v, &pv_out));
  int status = QO_ERR_ARGUMENT;
#if defined(QO_WITH_CPU)
  ScopedOrtRunner runner(context);
  status = qo_gqa_fixed_order_f32(static_cast<const float*>(data[0]), static_cast<const float*>(data[1]),
                                  static_cast<const float*>(data[2]), static_cast<const float*>(data[3]),
                                  static_cast<const float*>(data[4]), P, static_cast<float*>(pk_out),
                                  static_cast<float*>(pv_out), T, static_cast<const int32_t*>(data[5]), total,
                                  static_cast<const float*>(data[7]), static_cast<const float*>(data[8]), cs.shape[0],
                                  cs.shape[1], static_cast<float*>(out_data), B, S, H, Hkv, D, kk.scale, kk.window,
                                  kk.sinks ? static_cast<const float*>(data[9]) : nullptr);
#endif
  if (status != QO_OK)
    return Error(name + ": kernel failed with status " + std::to_string(status) +
                 (status == QO_ERR_ARGUMENT ? " (positions past the rotary tables or the cache, or seqlens_k "
                                              "inconsistent with total_sequence_length?)" : ""));
  return nullptr;
}

std::vector<GqaOp>& GqaOps() {
  static std::vector<GqaOp> ops = [] {
    std::vector<GqaOp> list;
#if defined(QO_WITH_CPU)
    for (bool sinks : {false, true}) {
      GqaOp op{};
      static_cast<OrtCustomOp&>(op) =
          MakeCpuOp({GqaOpName, GqaInputType, GqaInputCount, GqaOutputCount, GqaCreate, GqaCompute, GqaDestroy});
      op.sinks = sinks;
      list.push_back(op);
    }
#endif
    return list;
  }();
  return ops;
}

// output 0 with x's shape (the elementwise activation ops below)
OrtStatus* SameShapeOutput(OrtKernelContext* context, const TensorView& x, void** y_data) {
  OrtValue* y = nullptr;
  QO_RETURN_IF_ERROR(g_api->KernelContext_GetOutput(context, 0, x.shape.data(), x.shape.size(), &y));
  return g_api->GetTensorMutableData(y, y_data);
}

// ---- QuantizeDequantizeFp8 (CPU, float32): X [any shape], scale float scalar -> Y [X's shape] =
// DequantizeLinear(QuantizeLinear(X, scale, float8e4m3fn zero, saturate=1), scale), bit for bit
// (qo_cpu_fp8_qdq.c): the static FP8 activation quantization of one node instead of two. ----
constexpr const char* kQdqFp8Name = "QuantizeDequantizeFp8";

struct QdqFp8Kernel {
  int unused;
};

const char* ORT_API_CALL QdqFp8Name(const OrtCustomOp*) { return kQdqFp8Name; }
size_t ORT_API_CALL QdqFp8InputCount(const OrtCustomOp*) { return 2; }
ONNXTensorElementDataType ORT_API_CALL QdqFp8InputType(const OrtCustomOp*, size_t) {
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}

OrtStatus* ORT_API_CALL QdqFp8Create(const OrtCustomOp*, const OrtApi* api, const OrtKernelInfo*, void** kernel) {
  QdqFp8Kernel* k = new (std::nothrow) QdqFp8Kernel{0};
  if (!k) return api->CreateStatus(ORT_FAIL, "com.quark_onnx: out of memory");
  *kernel = k;
  return nullptr;
}

void ORT_API_CALL QdqFp8Destroy(void* kernel) { delete static_cast<QdqFp8Kernel*>(kernel); }

OrtStatus* ORT_API_CALL QdqFp8Compute(void*, OrtKernelContext* context) {
  TensorView x, scale;
  const void *x_data = nullptr, *scale_data = nullptr;
  QO_RETURN_IF_ERROR(Input(context, 0, &x, &x_data));
  QO_RETURN_IF_ERROR(Input(context, 1, &scale, &scale_data));
  if (scale.elements() != 1) return Error(std::string(kQdqFp8Name) + ": scale must be a scalar");
  void* y_data = nullptr;
  QO_RETURN_IF_ERROR(SameShapeOutput(context, x, &y_data));
  int status = QO_ERR_ARGUMENT;
#if defined(QO_WITH_CPU)
  ScopedOrtRunner runner(context);
  status = qo_qdq_fp8_f32(static_cast<const float*>(x_data), *static_cast<const float*>(scale_data),
                          static_cast<float*>(y_data), x.elements());
#endif
  if (status != QO_OK) return Error(std::string(kQdqFp8Name) + ": kernel failed with status " + std::to_string(status));
  return nullptr;
}

// ---- QuantizeDequantizeMxfp4 (CPU, float32): X [..., K], K % 32 == 0 -> Y [X's shape], Quark's dynamic MXFP4
// activation fake quantization with "even" block scales (qo_cpu_fp4_act.c). ----
constexpr const char* kQdqMxfp4Name = "QuantizeDequantizeMxfp4";

const char* ORT_API_CALL QdqMxfp4Name(const OrtCustomOp*) { return kQdqMxfp4Name; }
size_t ORT_API_CALL QdqMxfp4InputCount(const OrtCustomOp*) { return 1; }

OrtStatus* ORT_API_CALL QdqMxfp4Compute(void*, OrtKernelContext* context) {
  TensorView x;
  const void* x_data = nullptr;
  QO_RETURN_IF_ERROR(Input(context, 0, &x, &x_data));
  if (x.shape.empty() || x.shape.back() % 32 != 0)
    return Error(std::string(kQdqMxfp4Name) + ": X's last dimension must be a multiple of 32");
  void* y_data = nullptr;
  QO_RETURN_IF_ERROR(SameShapeOutput(context, x, &y_data));
  int status = QO_ERR_ARGUMENT;
#if defined(QO_WITH_CPU)
  ScopedOrtRunner runner(context);
  status = qo_qdq_mxfp4_act_f32(static_cast<const float*>(x_data), static_cast<float*>(y_data), x.elements(),
                                QO_MX_SCALE_EVEN);
#endif
  if (status != QO_OK)
    return Error(std::string(kQdqMxfp4Name) + ": kernel failed with status " + std::to_string(status));
  return nullptr;
}

// ---- QuantizeDequantizeNvfp4 (CPU, float32): X [..., K], K % 16 == 0, input_scale_2 a scalar or [..., 1] whose
// leading axes broadcast against X's (numpy rules) -> Y [broadcast leading axes..., K]: Quark's dynamic NVFP4
// activation fake quantization with the static second-level scale, each row with its own where input_scale_2 has
// rows (routed experts: X [T, 1, K] against the chosen experts' scales [T, k, 1] -> [T, k, K]; qo_cpu_fp4_act.c). ----
constexpr const char* kQdqNvfp4Name = "QuantizeDequantizeNvfp4";

const char* ORT_API_CALL QdqNvfp4Name(const OrtCustomOp*) { return kQdqNvfp4Name; }

// Y's leading shape and, per row of Y, its row of X and its input_scale_2 (row-major leading axes, numpy broadcast)
bool BroadcastRows(const std::vector<int64_t>& x_lead, const std::vector<int64_t>& s_lead, std::vector<int64_t>* y_lead,
                   std::vector<int64_t>* x_rows, std::vector<int64_t>* s_rows) {
  const size_t rank = std::max(x_lead.size(), s_lead.size());
  std::vector<int64_t> xd(rank, 1), sd(rank, 1);
  std::copy(x_lead.begin(), x_lead.end(), xd.begin() + (rank - x_lead.size()));
  std::copy(s_lead.begin(), s_lead.end(), sd.begin() + (rank - s_lead.size()));
  y_lead->assign(rank, 1);
  for (size_t i = 0; i < rank; ++i) {
    if (xd[i] != sd[i] && xd[i] != 1 && sd[i] != 1) return false;
    (*y_lead)[i] = xd[i] == 1 ? sd[i] : xd[i];
  }
  int64_t rows = 1;
  for (int64_t d : *y_lead) rows *= d;
  x_rows->assign(static_cast<size_t>(rows), 0);
  s_rows->assign(static_cast<size_t>(rows), 0);
  std::vector<int64_t> index(rank, 0);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t xo = 0, so = 0;
    for (size_t i = 0; i < rank; ++i) {
      xo = xo * xd[i] + (xd[i] == 1 ? 0 : index[i]);
      so = so * sd[i] + (sd[i] == 1 ? 0 : index[i]);
    }
    (*x_rows)[static_cast<size_t>(r)] = xo;
    (*s_rows)[static_cast<size_t>(r)] = so;
    for (size_t i = rank; i-- > 0;) {  // the next index, last axis fastest
      if (++index[i] < (*y_lead)[i]) break;
      index[i] = 0;
    }
  }
  return true;
}

OrtStatus* ORT_API_CALL QdqNvfp4Compute(void*, OrtKernelContext* context) {
  TensorView x, s2;
  const void *x_data = nullptr, *s2_data = nullptr;
  QO_RETURN_IF_ERROR(Input(context, 0, &x, &x_data));
  QO_RETURN_IF_ERROR(Input(context, 1, &s2, &s2_data));
  if (x.shape.empty() || x.shape.back() % 16 != 0)
    return Error(std::string(kQdqNvfp4Name) + ": X's last dimension must be a multiple of 16");
  const int64_t K = x.shape.back();
  const std::vector<int64_t> x_lead(x.shape.begin(), x.shape.end() - 1);
  std::vector<int64_t> s_lead;
  if (s2.elements() != 1 || !s2.shape.empty()) {  // [..., 1]: one scale per row (a one-element [1] too)
    if (s2.shape.empty() || s2.shape.back() != 1)
      return Error(std::string(kQdqNvfp4Name) + ": input_scale_2 must be a scalar or [..., 1]");
    s_lead.assign(s2.shape.begin(), s2.shape.end() - 1);
  }
  std::vector<int64_t> y_lead, x_rows, s_rows;
  if (!BroadcastRows(x_lead, s_lead, &y_lead, &x_rows, &s_rows))
    return Error(std::string(kQdqNvfp4Name) + ": input_scale_2's leading axes do not broadcast against X's");
  std::vector<int64_t> y_shape = y_lead;
  y_shape.push_back(K);
  OrtValue* y = nullptr;
  void* y_data = nullptr;
  QO_RETURN_IF_ERROR(g_api->KernelContext_GetOutput(context, 0, y_shape.data(), y_shape.size(), &y));
  QO_RETURN_IF_ERROR(g_api->GetTensorMutableData(y, &y_data));
  if (K == 0 || x_rows.empty()) return nullptr;  // an empty Y
  int status = QO_ERR_ARGUMENT;
#if defined(QO_WITH_CPU)
  ScopedOrtRunner runner(context);
  status = qo_qdq_nvfp4_act_rows_f32(static_cast<const float*>(x_data), x_rows.data(),
                                     static_cast<const float*>(s2_data), s_rows.data(), static_cast<float*>(y_data),
                                     static_cast<int64_t>(x_rows.size()), K);
#endif
  if (status != QO_OK)
    return Error(std::string(kQdqNvfp4Name) + ": kernel failed with status " + std::to_string(status));
  return nullptr;
}

std::vector<OrtCustomOp>& QdqFp8Ops() {  // and QuantizeDequantizeMxfp4 / Nvfp4
  static std::vector<OrtCustomOp> ops = [] {
    std::vector<OrtCustomOp> list;
#if defined(QO_WITH_CPU)
    list.push_back(MakeCpuOp({QdqFp8Name, QdqFp8InputType, QdqFp8InputCount, GetOutputTypeCount, QdqFp8Create,
                              QdqFp8Compute, QdqFp8Destroy}));
    list.push_back(MakeCpuOp({QdqMxfp4Name, QdqFp8InputType, QdqMxfp4InputCount, GetOutputTypeCount, QdqFp8Create,
                              QdqMxfp4Compute, QdqFp8Destroy}));
    list.push_back(MakeCpuOp({QdqNvfp4Name, QdqFp8InputType, QdqFp8InputCount, GetOutputTypeCount, QdqFp8Create,
                              QdqNvfp4Compute, QdqFp8Destroy}));
#endif
    return list;
  }();
  return ops;
}

}  // namespace

extern "C" QO_API OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  static std::mutex mutex;
  static OrtCustomOpDomain* domain = nullptr;  // lives as long as the library: sessions keep pointers into it
  std::lock_guard<std::mutex> lock(mutex);
  if (!g_api) {
    g_api = api_base->GetApi(kOrtApiVersionParallelFor);
    g_has_parallel_for = g_api != nullptr;
    if (!g_api) g_api = api_base->GetApi(kOrtApiVersion);
  }
  if (!g_api) return nullptr;  // runtime older than 1.16: nothing registered, the ONNX-function fallbacks run
  if (!domain) {
    QO_RETURN_IF_ERROR(g_api->CreateCustomOpDomain(kDomain, &domain));
    for (QoCustomOp& op : AllOps()) QO_RETURN_IF_ERROR(g_api->CustomOpDomain_Add(domain, &op));
    for (QoExpertsOp& op : ExpertOps()) QO_RETURN_IF_ERROR(g_api->CustomOpDomain_Add(domain, &op));
    for (GqaOp& op : GqaOps()) QO_RETURN_IF_ERROR(g_api->CustomOpDomain_Add(domain, &op));
    for (OrtCustomOp& op : QdqFp8Ops()) QO_RETURN_IF_ERROR(g_api->CustomOpDomain_Add(domain, &op));
  }
  return g_api->AddCustomOpDomain(options, domain);
}
