/* Throughput of the AVX2 instructions the CPU kernels' decode loops use (custom_ops/src/qo_cpu_*.c), one thread:
 * ten independent copies of each instruction per loop iteration, so that latency does not bind, timed by the
 * thread's CPU time; printed as instructions per nanosecond and per cycle at the clock measured by a chain of
 * dependent 64-bit adds (one a cycle on every x86 core since the 1990s).
 *
 *     cc -O2 -mavx2 -mfma -mf16c benchmarks/x86_op_throughput.c -o /tmp/x86_op_throughput && /tmp/x86_op_throughput
 *
 * Not a test and not run by CI; results are quoted in custom_ops/README.md ("The AVX2 path on an AVX2-only CPU"). */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(void) {
  unsigned long long c = 0;
  const long n = 50000000;
  double best_ghz = 0;
  for (int r = 0; r < 3; ++r) {
    const double t0 = now();
    for (long i = 0; i < n; ++i)
      __asm__ volatile("add $1,%0\n add $1,%0\n add $1,%0\n add $1,%0\n add $1,%0\n add $1,%0\n add $1,%0\n add $1,%0" : "+r"(c));
    const double g = 8.0 * n / (now() - t0) / 1e9;
    if (g > best_ghz) best_ghz = g;
  }
  printf("clock: %.2f GHz (dependent adds)\n", best_ghz);
  __m256 a0 = _mm256_set1_ps(1), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0, a9 = a0;
  const __m256 x = _mm256_set1_ps(1.0f), y = _mm256_set1_ps(1.0f);
  float buf[64] __attribute__((aligned(64)));
  for (int i = 0; i < 64; ++i) buf[i] = 1.0f;
  const float* p = buf;
  double t0, d;
  t0 = now();
  for (long i = 0; i < n; ++i)
    __asm__ volatile("vfmadd231ps %[x],%[y],%[a0]\nvfmadd231ps %[x],%[y],%[a1]\nvfmadd231ps %[x],%[y],%[a2]\nvfmadd231ps %[x],%[y],%[a3]\nvfmadd231ps %[x],%[y],%[a4]\nvfmadd231ps %[x],%[y],%[a5]\nvfmadd231ps %[x],%[y],%[a6]\nvfmadd231ps %[x],%[y],%[a7]\nvfmadd231ps %[x],%[y],%[a8]\nvfmadd231ps %[x],%[y],%[a9]"
                     : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4), [a5] "+x"(a5),
                       [a6] "+x"(a6), [a7] "+x"(a7), [a8] "+x"(a8), [a9] "+x"(a9)
                     : [x] "x"(x), [y] "x"(y), [p] "r"(p)
                     : "memory");
  d = now() - t0;
  printf("%-28s %5.2f per ns, %4.2f per cycle\n", "vfmadd231ps ymm, ymm, ymm", 10.0 * n / d / 1e9, 10.0 * n / d / 1e9 / best_ghz);
  t0 = now();
  for (long i = 0; i < n; ++i)
    __asm__ volatile("vfmadd231ps (%[p]),%[y],%[a0]\nvfmadd231ps (%[p]),%[y],%[a1]\nvfmadd231ps (%[p]),%[y],%[a2]\nvfmadd231ps (%[p]),%[y],%[a3]\nvfmadd231ps (%[p]),%[y],%[a4]\nvfmadd231ps (%[p]),%[y],%[a5]\nvfmadd231ps (%[p]),%[y],%[a6]\nvfmadd231ps (%[p]),%[y],%[a7]\nvfmadd231ps (%[p]),%[y],%[a8]\nvfmadd231ps (%[p]),%[y],%[a9]"
                     : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4), [a5] "+x"(a5),
                       [a6] "+x"(a6), [a7] "+x"(a7), [a8] "+x"(a8), [a9] "+x"(a9)
                     : [x] "x"(x), [y] "x"(y), [p] "r"(p)
                     : "memory");
  d = now() - t0;
  printf("%-28s %5.2f per ns, %4.2f per cycle\n", "vfmadd231ps ymm, ymm, m256", 10.0 * n / d / 1e9, 10.0 * n / d / 1e9 / best_ghz);
  t0 = now();
  for (long i = 0; i < n; ++i)
    __asm__ volatile("vmulps %[x],%[y],%[a0]\nvmulps %[x],%[y],%[a1]\nvmulps %[x],%[y],%[a2]\nvmulps %[x],%[y],%[a3]\nvmulps %[x],%[y],%[a4]\nvmulps %[x],%[y],%[a5]\nvmulps %[x],%[y],%[a6]\nvmulps %[x],%[y],%[a7]\nvmulps %[x],%[y],%[a8]\nvmulps %[x],%[y],%[a9]"
                     : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4), [a5] "+x"(a5),
                       [a6] "+x"(a6), [a7] "+x"(a7), [a8] "+x"(a8), [a9] "+x"(a9)
                     : [x] "x"(x), [y] "x"(y), [p] "r"(p)
                     : "memory");
  d = now() - t0;
  printf("%-28s %5.2f per ns, %4.2f per cycle\n", "vmulps ymm", 10.0 * n / d / 1e9, 10.0 * n / d / 1e9 / best_ghz);
  t0 = now();
  for (long i = 0; i < n; ++i)
    __asm__ volatile("vaddps %[x],%[y],%[a0]\nvaddps %[x],%[y],%[a1]\nvaddps %[x],%[y],%[a2]\nvaddps %[x],%[y],%[a3]\nvaddps %[x],%[y],%[a4]\nvaddps %[x],%[y],%[a5]\nvaddps %[x],%[y],%[a6]\nvaddps %[x],%[y],%[a7]\nvaddps %[x],%[y],%[a8]\nvaddps %[x],%[y],%[a9]"
                     : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4), [a5] "+x"(a5),
                       [a6] "+x"(a6), [a7] "+x"(a7), [a8] "+x"(a8), [a9] "+x"(a9)
                     : [x] "x"(x), [y] "x"(y), [p] "r"(p)
                     : "memory");
  d = now() - t0;
  printf("%-28s %5.2f per ns, %4.2f per cycle\n", "vaddps ymm", 10.0 * n / d / 1e9, 10.0 * n / d / 1e9 / best_ghz);
  t0 = now();
  for (long i = 0; i < n; ++i)
    __asm__ volatile("vpaddd %[x],%[y],%[a0]\nvpaddd %[x],%[y],%[a1]\nvpaddd %[x],%[y],%[a2]\nvpaddd %[x],%[y],%[a3]\nvpaddd %[x],%[y],%[a4]\nvpaddd %[x],%[y],%[a5]\nvpaddd %[x],%[y],%[a6]\nvpaddd %[x],%[y],%[a7]\nvpaddd %[x],%[y],%[a8]\nvpaddd %[x],%[y],%[a9]"
                     : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4), [a5] "+x"(a5),
                       [a6] "+x"(a6), [a7] "+x"(a7), [a8] "+x"(a8), [a9] "+x"(a9)
                     : [x] "x"(x), [y] "x"(y), [p] "r"(p)
                     : "memory");
  d = now() - t0;
  printf("%-28s %5.2f per ns, %4.2f per cycle\n", "vpaddd ymm", 10.0 * n / d / 1e9, 10.0 * n / d / 1e9 / best_ghz);
  t0 = now();
  for (long i = 0; i < n; ++i)
    __asm__ volatile("vpsubb %[x],%[y],%[a0]\nvpsubb %[x],%[y],%[a1]\nvpsubb %[x],%[y],%[a2]\nvpsubb %[x],%[y],%[a3]\nvpsubb %[x],%[y],%[a4]\nvpsubb %[x],%[y],%[a5]\nvpsubb %[x],%[y],%[a6]\nvpsubb %[x],%[y],%[a7]\nvpsubb %[x],%[y],%[a8]\nvpsubb %[x],%[y],%[a9]"
                     : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4), [a5] "+x"(a5),
                       [a6] "+x"(a6), [a7] "+x"(a7), [a8] "+x"(a8), [a9] "+x"(a9)
                     : [x] "x"(x), [y] "x"(y), [p] "r"(p)
                     : "memory");
  d = now() - t0;
  printf("%-28s %5.2f per ns, %4.2f per cycle\n", "vpsubb ymm", 10.0 * n / d / 1e9, 10.0 * n / d / 1e9 / best_ghz);
  t0 = now();
  for (long i = 0; i < n; ++i)
    __asm__ volatile("vpslld $3,%[y],%[a0]\nvpslld $3,%[y],%[a1]\nvpslld $3,%[y],%[a2]\nvpslld $3,%[y],%[a3]\nvpslld $3,%[y],%[a4]\nvpslld $3,%[y],%[a5]\nvpslld $3,%[y],%[a6]\nvpslld $3,%[y],%[a7]\nvpslld $3,%[y],%[a8]\nvpslld $3,%[y],%[a9]"
                     : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4), [a5] "+x"(a5),
                       [a6] "+x"(a6), [a7] "+x"(a7), [a8] "+x"(a8), [a9] "+x"(a9)
                     : [x] "x"(x), [y] "x"(y), [p] "r"(p)
                     : "memory");
  d = now() - t0;
  printf("%-28s %5.2f per ns, %4.2f per cycle\n", "vpslld ymm, imm", 10.0 * n / d / 1e9, 10.0 * n / d / 1e9 / best_ghz);
  t0 = now();
  for (long i = 0; i < n; ++i)
    __asm__ volatile("vpsrlvd %[x],%[y],%[a0]\nvpsrlvd %[x],%[y],%[a1]\nvpsrlvd %[x],%[y],%[a2]\nvpsrlvd %[x],%[y],%[a3]\nvpsrlvd %[x],%[y],%[a4]\nvpsrlvd %[x],%[y],%[a5]\nvpsrlvd %[x],%[y],%[a6]\nvpsrlvd %[x],%[y],%[a7]\nvpsrlvd %[x],%[y],%[a8]\nvpsrlvd %[x],%[y],%[a9]"
                     : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4), [a5] "+x"(a5),
                       [a6] "+x"(a6), [a7] "+x"(a7), [a8] "+x"(a8), [a9] "+x"(a9)
                     : [x] "x"(x), [y] "x"(y), [p] "r"(p)
                     : "memory");
  d = now() - t0;
  printf("%-28s %5.2f per ns, %4.2f per cycle\n", "vpsrlvd ymm", 10.0 * n / d / 1e9, 10.0 * n / d / 1e9 / best_ghz);
  t0 = now();
  for (long i = 0; i < n; ++i)
    __asm__ volatile("vpshufb %[x],%[y],%[a0]\nvpshufb %[x],%[y],%[a1]\nvpshufb %[x],%[y],%[a2]\nvpshufb %[x],%[y],%[a3]\nvpshufb %[x],%[y],%[a4]\nvpshufb %[x],%[y],%[a5]\nvpshufb %[x],%[y],%[a6]\nvpshufb %[x],%[y],%[a7]\nvpshufb %[x],%[y],%[a8]\nvpshufb %[x],%[y],%[a9]"
                     : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4), [a5] "+x"(a5),
                       [a6] "+x"(a6), [a7] "+x"(a7), [a8] "+x"(a8), [a9] "+x"(a9)
                     : [x] "x"(x), [y] "x"(y), [p] "r"(p)
                     : "memory");
  d = now() - t0;
  printf("%-28s %5.2f per ns, %4.2f per cycle\n", "vpshufb ymm", 10.0 * n / d / 1e9, 10.0 * n / d / 1e9 / best_ghz);
  t0 = now();
  for (long i = 0; i < n; ++i)
    __asm__ volatile("vpshufb (%[p]),%[y],%[a0]\nvpshufb (%[p]),%[y],%[a1]\nvpshufb (%[p]),%[y],%[a2]\nvpshufb (%[p]),%[y],%[a3]\nvpshufb (%[p]),%[y],%[a4]\nvpshufb (%[p]),%[y],%[a5]\nvpshufb (%[p]),%[y],%[a6]\nvpshufb (%[p]),%[y],%[a7]\nvpshufb (%[p]),%[y],%[a8]\nvpshufb (%[p]),%[y],%[a9]"
                     : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4), [a5] "+x"(a5),
                       [a6] "+x"(a6), [a7] "+x"(a7), [a8] "+x"(a8), [a9] "+x"(a9)
                     : [x] "x"(x), [y] "x"(y), [p] "r"(p)
                     : "memory");
  d = now() - t0;
  printf("%-28s %5.2f per ns, %4.2f per cycle\n", "vpshufb ymm, m256", 10.0 * n / d / 1e9, 10.0 * n / d / 1e9 / best_ghz);
  t0 = now();
  for (long i = 0; i < n; ++i)
    __asm__ volatile("vpermps %[x],%[y],%[a0]\nvpermps %[x],%[y],%[a1]\nvpermps %[x],%[y],%[a2]\nvpermps %[x],%[y],%[a3]\nvpermps %[x],%[y],%[a4]\nvpermps %[x],%[y],%[a5]\nvpermps %[x],%[y],%[a6]\nvpermps %[x],%[y],%[a7]\nvpermps %[x],%[y],%[a8]\nvpermps %[x],%[y],%[a9]"
                     : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4), [a5] "+x"(a5),
                       [a6] "+x"(a6), [a7] "+x"(a7), [a8] "+x"(a8), [a9] "+x"(a9)
                     : [x] "x"(x), [y] "x"(y), [p] "r"(p)
                     : "memory");
  d = now() - t0;
  printf("%-28s %5.2f per ns, %4.2f per cycle\n", "vpermps ymm", 10.0 * n / d / 1e9, 10.0 * n / d / 1e9 / best_ghz);
  t0 = now();
  for (long i = 0; i < n; ++i)
    __asm__ volatile("vpermq $0xd8,%[y],%[a0]\nvpermq $0xd8,%[y],%[a1]\nvpermq $0xd8,%[y],%[a2]\nvpermq $0xd8,%[y],%[a3]\nvpermq $0xd8,%[y],%[a4]\nvpermq $0xd8,%[y],%[a5]\nvpermq $0xd8,%[y],%[a6]\nvpermq $0xd8,%[y],%[a7]\nvpermq $0xd8,%[y],%[a8]\nvpermq $0xd8,%[y],%[a9]"
                     : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4), [a5] "+x"(a5),
                       [a6] "+x"(a6), [a7] "+x"(a7), [a8] "+x"(a8), [a9] "+x"(a9)
                     : [x] "x"(x), [y] "x"(y), [p] "r"(p)
                     : "memory");
  d = now() - t0;
  printf("%-28s %5.2f per ns, %4.2f per cycle\n", "vpermq ymm, imm", 10.0 * n / d / 1e9, 10.0 * n / d / 1e9 / best_ghz);
  t0 = now();
  for (long i = 0; i < n; ++i)
    __asm__ volatile("vcvtdq2ps %[y],%[a0]\nvcvtdq2ps %[y],%[a1]\nvcvtdq2ps %[y],%[a2]\nvcvtdq2ps %[y],%[a3]\nvcvtdq2ps %[y],%[a4]\nvcvtdq2ps %[y],%[a5]\nvcvtdq2ps %[y],%[a6]\nvcvtdq2ps %[y],%[a7]\nvcvtdq2ps %[y],%[a8]\nvcvtdq2ps %[y],%[a9]"
                     : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4), [a5] "+x"(a5),
                       [a6] "+x"(a6), [a7] "+x"(a7), [a8] "+x"(a8), [a9] "+x"(a9)
                     : [x] "x"(x), [y] "x"(y), [p] "r"(p)
                     : "memory");
  d = now() - t0;
  printf("%-28s %5.2f per ns, %4.2f per cycle\n", "vcvtdq2ps ymm", 10.0 * n / d / 1e9, 10.0 * n / d / 1e9 / best_ghz);
  t0 = now();
  for (long i = 0; i < n; ++i)
    __asm__ volatile("vcvtph2ps %x[y],%[a0]\nvcvtph2ps %x[y],%[a1]\nvcvtph2ps %x[y],%[a2]\nvcvtph2ps %x[y],%[a3]\nvcvtph2ps %x[y],%[a4]\nvcvtph2ps %x[y],%[a5]\nvcvtph2ps %x[y],%[a6]\nvcvtph2ps %x[y],%[a7]\nvcvtph2ps %x[y],%[a8]\nvcvtph2ps %x[y],%[a9]"
                     : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4), [a5] "+x"(a5),
                       [a6] "+x"(a6), [a7] "+x"(a7), [a8] "+x"(a8), [a9] "+x"(a9)
                     : [x] "x"(x), [y] "x"(y), [p] "r"(p)
                     : "memory");
  d = now() - t0;
  printf("%-28s %5.2f per ns, %4.2f per cycle\n", "vcvtph2ps ymm, xmm", 10.0 * n / d / 1e9, 10.0 * n / d / 1e9 / best_ghz);
  t0 = now();
  for (long i = 0; i < n; ++i)
    __asm__ volatile("vpmovsxbd (%[p]),%[a0]\nvpmovsxbd (%[p]),%[a1]\nvpmovsxbd (%[p]),%[a2]\nvpmovsxbd (%[p]),%[a3]\nvpmovsxbd (%[p]),%[a4]\nvpmovsxbd (%[p]),%[a5]\nvpmovsxbd (%[p]),%[a6]\nvpmovsxbd (%[p]),%[a7]\nvpmovsxbd (%[p]),%[a8]\nvpmovsxbd (%[p]),%[a9]"
                     : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4), [a5] "+x"(a5),
                       [a6] "+x"(a6), [a7] "+x"(a7), [a8] "+x"(a8), [a9] "+x"(a9)
                     : [x] "x"(x), [y] "x"(y), [p] "r"(p)
                     : "memory");
  d = now() - t0;
  printf("%-28s %5.2f per ns, %4.2f per cycle\n", "vpmovsxbd ymm, m64", 10.0 * n / d / 1e9, 10.0 * n / d / 1e9 / best_ghz);
  t0 = now();
  for (long i = 0; i < n; ++i)
    __asm__ volatile("vpmaddubsw %[x],%[y],%[a0]\nvpmaddubsw %[x],%[y],%[a1]\nvpmaddubsw %[x],%[y],%[a2]\nvpmaddubsw %[x],%[y],%[a3]\nvpmaddubsw %[x],%[y],%[a4]\nvpmaddubsw %[x],%[y],%[a5]\nvpmaddubsw %[x],%[y],%[a6]\nvpmaddubsw %[x],%[y],%[a7]\nvpmaddubsw %[x],%[y],%[a8]\nvpmaddubsw %[x],%[y],%[a9]"
                     : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4), [a5] "+x"(a5),
                       [a6] "+x"(a6), [a7] "+x"(a7), [a8] "+x"(a8), [a9] "+x"(a9)
                     : [x] "x"(x), [y] "x"(y), [p] "r"(p)
                     : "memory");
  d = now() - t0;
  printf("%-28s %5.2f per ns, %4.2f per cycle\n", "vpmaddubsw ymm", 10.0 * n / d / 1e9, 10.0 * n / d / 1e9 / best_ghz);
  t0 = now();
  for (long i = 0; i < n; ++i)
    __asm__ volatile("vpmaddwd %[x],%[y],%[a0]\nvpmaddwd %[x],%[y],%[a1]\nvpmaddwd %[x],%[y],%[a2]\nvpmaddwd %[x],%[y],%[a3]\nvpmaddwd %[x],%[y],%[a4]\nvpmaddwd %[x],%[y],%[a5]\nvpmaddwd %[x],%[y],%[a6]\nvpmaddwd %[x],%[y],%[a7]\nvpmaddwd %[x],%[y],%[a8]\nvpmaddwd %[x],%[y],%[a9]"
                     : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4), [a5] "+x"(a5),
                       [a6] "+x"(a6), [a7] "+x"(a7), [a8] "+x"(a8), [a9] "+x"(a9)
                     : [x] "x"(x), [y] "x"(y), [p] "r"(p)
                     : "memory");
  d = now() - t0;
  printf("%-28s %5.2f per ns, %4.2f per cycle\n", "vpmaddwd ymm", 10.0 * n / d / 1e9, 10.0 * n / d / 1e9 / best_ghz);
  t0 = now();
  for (long i = 0; i < n; ++i)
    __asm__ volatile("vbroadcasti128 (%[p]),%[a0]\nvbroadcasti128 (%[p]),%[a1]\nvbroadcasti128 (%[p]),%[a2]\nvbroadcasti128 (%[p]),%[a3]\nvbroadcasti128 (%[p]),%[a4]\nvbroadcasti128 (%[p]),%[a5]\nvbroadcasti128 (%[p]),%[a6]\nvbroadcasti128 (%[p]),%[a7]\nvbroadcasti128 (%[p]),%[a8]\nvbroadcasti128 (%[p]),%[a9]"
                     : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4), [a5] "+x"(a5),
                       [a6] "+x"(a6), [a7] "+x"(a7), [a8] "+x"(a8), [a9] "+x"(a9)
                     : [x] "x"(x), [y] "x"(y), [p] "r"(p)
                     : "memory");
  d = now() - t0;
  printf("%-28s %5.2f per ns, %4.2f per cycle\n", "vbroadcasti128 ymm, m128", 10.0 * n / d / 1e9, 10.0 * n / d / 1e9 / best_ghz);
  t0 = now();
  for (long i = 0; i < n; ++i)
    __asm__ volatile("vbroadcastss (%[p]),%[a0]\nvbroadcastss (%[p]),%[a1]\nvbroadcastss (%[p]),%[a2]\nvbroadcastss (%[p]),%[a3]\nvbroadcastss (%[p]),%[a4]\nvbroadcastss (%[p]),%[a5]\nvbroadcastss (%[p]),%[a6]\nvbroadcastss (%[p]),%[a7]\nvbroadcastss (%[p]),%[a8]\nvbroadcastss (%[p]),%[a9]"
                     : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4), [a5] "+x"(a5),
                       [a6] "+x"(a6), [a7] "+x"(a7), [a8] "+x"(a8), [a9] "+x"(a9)
                     : [x] "x"(x), [y] "x"(y), [p] "r"(p)
                     : "memory");
  d = now() - t0;
  printf("%-28s %5.2f per ns, %4.2f per cycle\n", "vbroadcastss ymm, m32", 10.0 * n / d / 1e9, 10.0 * n / d / 1e9 / best_ghz);
  float o[8];
  _mm256_storeu_ps(o, _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                                    _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(_mm256_add_ps(a6, a7), _mm256_add_ps(a8, a9)))));
  printf("(%g)\n", o[0]);
  return 0;
}
