// Reciprocal throughput of the instructions the decode attention kernels are built from, on this
// core: 8 independent instructions a loop iteration (no chain between them longer than 8 deep), in
// cycles an instruction at the clock a chain of dependent adds measures. On the Zen4 VM (2026-12-03):
// vpdpwssd, vpdpbusd, vdpbf16ps and vfmadd on zmm one a cycle; a zmm load one a cycle (so a dot
// product whose two operands both come from memory costs two cycles of loads); byte and word unpacks
// 1.5 a cycle; prefetcht1 1.5 a cycle.
//
//   gcc -O2 -march=native benchmarks/probes/vector_throughput.c -o /tmp/vector_throughput && /tmp/vector_throughput
#include "probe_util.h"

#define N 50000000L
#define R8(op)                                                                                               \
  op " %%zmm16, %%zmm17, %%zmm0\n\t" op " %%zmm16, %%zmm17, %%zmm1\n\t" op " %%zmm16, %%zmm17, %%zmm2\n\t" \
  op " %%zmm16, %%zmm17, %%zmm3\n\t" op " %%zmm16, %%zmm17, %%zmm4\n\t" op " %%zmm16, %%zmm17, %%zmm5\n\t" \
  op " %%zmm16, %%zmm17, %%zmm6\n\t" op " %%zmm16, %%zmm17, %%zmm7\n\t"
#define M8(op, step, dst)                                                                                   \
  op " (%0), " dst "0\n\t" op " " #step "(%0), " dst "1\n\t" op " 2*" #step "(%0), " dst "2\n\t"            \
  op " 3*" #step "(%0), " dst "3\n\t" op " 4*" #step "(%0), " dst "4\n\t" op " 5*" #step "(%0), " dst "5\n\t" \
  op " 6*" #step "(%0), " dst "6\n\t" op " 7*" #step "(%0), " dst "7\n\t"
#define RUN(name, code)                                                                                     \
  {                                                                                                          \
    const double t0 = now();                                                                                 \
    for (long i = 0; i < N; ++i)                                                                             \
      __asm__ volatile(code ::"r"(buf) : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "memory"); \
    printf("%-30s %.2f cycles\n", name, (now() - t0) * ghz * 1e9 / N / 8);                                  \
  }

int main(void) {
  static char buf[8192] __attribute__((aligned(64)));
  double t0 = now();
  unsigned long x = 1;
  for (long i = 0; i < 4 * N; ++i) __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x));
  const double ghz = 16.0 * N / (now() - t0) / 1e9;
  printf("clock ~%.2f GHz (dependent adds)\n", ghz);
  RUN("vpdpwssd zmm", R8("vpdpwssd"));
  RUN("vpdpbusd zmm", R8("vpdpbusd"));
  RUN("vdpbf16ps zmm", R8("vdpbf16ps"));
  RUN("vfmadd231ps zmm", R8("vfmadd231ps"));
  RUN("vpaddd zmm", R8("vpaddd"));
  RUN("vpunpcklbw zmm", R8("vpunpcklbw"));
  RUN("vpermd zmm", R8("vpermd"));
  RUN("vmovdqu64 zmm load", M8("vmovdqu64", 64, "%%zmm"));
  RUN("vpmovsxbw zmm <- m256", M8("vpmovsxbw", 32, "%%zmm"));
  RUN("prefetcht1", "prefetcht1 (%0)\n\tprefetcht1 64(%0)\n\tprefetcht1 128(%0)\n\tprefetcht1 192(%0)\n\t"
                    "prefetcht1 256(%0)\n\tprefetcht1 320(%0)\n\tprefetcht1 384(%0)\n\tprefetcht1 448(%0)\n\t");
  return (int)(x & 1);
}
