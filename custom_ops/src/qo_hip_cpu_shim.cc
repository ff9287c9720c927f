// Host entry points for running the GPU kernels on the CPU through HIP-CPU (custom_ops/hip_cpu.py builds this file
// with qo_gpu_kernels.cu into one shared library). Under HIP-CPU "device" memory is host memory, so callers pass
// host pointers straight to the qo_gpu_* kernels, then call qo_hip_cpu_synchronize().
// This is a second translation unit that includes qo_fp_formats.h next to qo_gpu_kernels.cu: it fails to link if
// the header's functions ever stop being internal (the multiple-definition error of issue #19).
#include <stdint.h>

#include "qo_gpu_compat.h"
#include "qo_fp_formats.h"

extern "C" {

// The warp size the kernels were compiled for (HIP-CPU: a compile-time constant, see hip_cpu.py).
int qo_hip_cpu_warp_size(void) { return warpSize; }

// Waits for every launched kernel; 0 on success.
int qo_hip_cpu_synchronize(void) { return hipDeviceSynchronize() == hipSuccess ? 0 : 1; }

// The header's fp16 decoder from this unit (used by the test to check both units agree on one value).
float qo_hip_cpu_f16_to_f32(uint16_t bits) { return qo_f16_to_f32(bits); }

}  // extern "C"
