/* fmaf / fma for the qemu-x86_64 process itself (LD_PRELOAD; tools/qemu_user.py), never for the guest.
 *
 * QEMU 7.2's softfloat computes each emulated FMA lane (float32_muladd / float64_muladd, fpu/softfloat.c hardfloat
 * path) by calling the host libm's fmaf / fma, which glibc resolves to __fmaf_fma3 / __fma_fma3 (VEX encoded).
 * QEMU itself is built for baseline x86-64 (legacy SSE), and it reaches the helper with the upper halves of the
 * host's YMM registers dirty (XINUSE bit 2, read with XGETBV(1) in a counting variant of this shim: set on 6 % of
 * the calls even with the VZEROUPPER below, so something re-dirties them between calls; TCG's host AVX2 code for
 * the guest's 256-bit ops, presumably). Nothing cleans them without this shim (glibc's __fmaf_fma3 is a bare
 * vfmadd). On the Intel Xeon we measured (docs/real_model_numerics.md), an SSE -> VEX -> SSE round trip in that
 * state costs about 130 ns instead of 2-6 ns, so an emulated 8-lane AVX2 FMA costs about 1 us: the real-model
 * check under `-cpu Haswell` did not finish in 20 minutes there, where AMD Zen 5 took 130-240 s.
 * VZEROUPPER first makes the state clean; the result is the same FMA instruction's (intrinsics, so that no
 * compiler turns the body back into a call to fmaf). The upper YMM halves are call-clobbered in the SysV ABI, so
 * clearing them in a callee is what every compiler does at the end of a VEX function.
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
