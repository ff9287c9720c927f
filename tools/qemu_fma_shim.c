/* fmaf / fma for the qemu-x86_64 process itself (LD_PRELOAD; tools/qemu_user.py), never for the guest.
 *
 * QEMU 7.2's softfloat computes each emulated FMA lane (float32_muladd / float64_muladd, fpu/softfloat.c hardfloat
 * path) by calling the host libm's fmaf / fma, which glibc resolves to __fmaf_fma3 / __fma_fma3 (VEX encoded).
 * QEMU itself is built for baseline x86-64 (legacy SSE), and its TCG code leaves the upper halves of the host's
 * YMM registers dirty when it calls the helper. On the Intel Xeon we measured, every SSE -> VEX -> SSE round trip
 * in that state costs about 130 ns instead of 2 ns, so an emulated AVX2 FMA (8 lanes) costs about 1 us and the
 * real-model check under `-cpu Haswell` ran 6x+ slower than on AMD Zen (which has no such penalty).
 * VZEROUPPER first makes the state clean; the result is the same FMA instruction's (intrinsics, so that no
 * compiler turns the body back into a call to fmaf). The upper YMM halves are
 * call-clobbered in the SysV ABI, so clearing them in a callee is what every compiler does at a VEX function's end.
 */
#include <immintrin.h>

__attribute__((target("avx,fma"))) float fmaf(float a, float b, float c) {
  _mm256_zeroupper();
  return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}

__attribute__((target("avx,fma"))) double fma(double a, double b, double c) {
  _mm256_zeroupper();
  return _mm_cvtsd_f64(_mm_fmadd_sd(_mm_set_sd(a), _mm_set_sd(b), _mm_set_sd(c)));
}
