// Why the bf16 GEMV lost to a plain read in fast minutes: one 240 MiB bf16 buffer (2 MiB huge pages)
// read by the OpenMP threads in contiguous halves, six ways, interleaved (the order reversing every
// round), 60 rounds; prints each way's median ratio to the plain read (mode 0) of the same round, over
// the rounds where the plain read ran above 42 GB/s (fast) and the others (slow).
//
//   gcc -O3 -march=native -fopenmp benchmarks/probes/weight_stream_prefetch.c -o /tmp/wsf
//   OMP_NUM_THREADS=2 OMP_PROC_BIND=close OMP_PLACES=cores /tmp/wsf
//
// modes: 0 plain read (4 add chains); 1 vdpbf16ps, 8 chains, x in a register; 2 the same with x loaded
// (a 1024-value row, from L1); 3 vdpbf16ps, 2 chains, x in a register; 4 mode 1 with an L2 prefetch
// 32 KiB ahead per line read (bf16_gemv.h's distance and hint); 5 mode 0 with the same prefetches.
#include <omp.h>

#include "probe_util.h"

enum { ROUNDS = 60, MODES = 6 };
static float run(int mode, const uint16_t* w, size_t n, const uint16_t* x) {
  float res = 0;
#pragma omp parallel reduction(+ : res)
  {
    const int nt = omp_get_num_threads(), id = omp_get_thread_num();
    const size_t per = n / nt, b = per * id, e = b + per;  // uint16 indices, multiples of 1024
    __m512 a[8];
    for (int i = 0; i < 8; ++i) a[i] = _mm512_setzero_ps();
    const __m512bh xr = (__m512bh)_mm512_loadu_si512(x);
    if (mode == 0) {
      for (size_t i = b; i < e; i += 128) {
        a[0] = _mm512_add_ps(a[0], _mm512_load_ps((const float*)(w + i)));
        a[1] = _mm512_add_ps(a[1], _mm512_load_ps((const float*)(w + i + 32)));
        a[2] = _mm512_add_ps(a[2], _mm512_load_ps((const float*)(w + i + 64)));
        a[3] = _mm512_add_ps(a[3], _mm512_load_ps((const float*)(w + i + 96)));
      }
    } else if (mode == 1) {  // dpbf16, 8 chains, x in a register
      for (size_t i = b; i < e; i += 256)
        for (int c = 0; c < 8; ++c) a[c] = _mm512_dpbf16_ps(a[c], xr, (__m512bh)_mm512_load_si512(w + i + 32 * c));
    } else if (mode == 2) {  // dpbf16, 8 chains, x loaded (a 1024-value row of x, L1)
      for (size_t i = b; i < e; i += 256)
        for (int c = 0; c < 8; ++c) a[c] = _mm512_dpbf16_ps(a[c], (__m512bh)_mm512_loadu_si512(x + ((i + 32 * c) & 1023)), (__m512bh)_mm512_load_si512(w + i + 32 * c));
    } else if (mode == 3) {  // dpbf16, 2 chains, x in a register
      for (size_t i = b; i < e; i += 64) {
        a[0] = _mm512_dpbf16_ps(a[0], xr, (__m512bh)_mm512_load_si512(w + i));
        a[1] = _mm512_dpbf16_ps(a[1], xr, (__m512bh)_mm512_load_si512(w + i + 32));
      }
    } else if (mode == 4) {  // dpbf16 8 chains, x in a register, L2 prefetch 32 KiB ahead, one line per line
      for (size_t i = b; i < e; i += 256)
        for (int c = 0; c < 8; ++c) {
          _mm_prefetch((const char*)(w + i + 32 * c) + 32768, _MM_HINT_T1);
          a[c] = _mm512_dpbf16_ps(a[c], xr, (__m512bh)_mm512_load_si512(w + i + 32 * c));
        }
    } else {  // plain add with prefetch 32 KiB ahead
      for (size_t i = b; i < e; i += 128) {
        _mm_prefetch((const char*)(w + i) + 32768, _MM_HINT_T1);
        _mm_prefetch((const char*)(w + i) + 32768 + 64, _MM_HINT_T1);
        _mm_prefetch((const char*)(w + i) + 32768 + 128, _MM_HINT_T1);
        _mm_prefetch((const char*)(w + i) + 32768 + 192, _MM_HINT_T1);
        a[0] = _mm512_add_ps(a[0], _mm512_load_ps((const float*)(w + i)));
        a[1] = _mm512_add_ps(a[1], _mm512_load_ps((const float*)(w + i + 32)));
        a[2] = _mm512_add_ps(a[2], _mm512_load_ps((const float*)(w + i + 64)));
        a[3] = _mm512_add_ps(a[3], _mm512_load_ps((const float*)(w + i + 96)));
      }
    }
    for (int i = 1; i < 8; ++i) a[0] = _mm512_add_ps(a[0], a[i]);
    res += _mm512_reduce_add_ps(a[0]);
  }
  return res;
}
int main(void) {
  const size_t n = (size_t)122880 * 1024, bytes = n * 2;
  uint16_t* w = huge_pages(bytes, 0);
  for (size_t i = 0; i < n; ++i) w[i] = 0x3f80;
  uint16_t* x = huge_pages(4096, 0);
  for (int i = 0; i < 1024; ++i) x[i] = 0x3f80;
  static double g[MODES][ROUNDS];
  volatile float sink = 0;
  for (int r = 0; r < ROUNDS; ++r)
    for (int j = 0; j < MODES; ++j) {
      const int m = r % 2 ? j : MODES - 1 - j;
      const double t = now();
      sink += run(m, w, n, x);
      g[m][r] = bytes / (now() - t) / 1e9;
    }
  const char* names[] = {"plain add", "dpbf16 x8 xreg", "dpbf16 x8 xload", "dpbf16 x2 xreg", "dpbf16 x8 +pf", "plain +pf"};
  for (int m = 0; m < MODES; ++m) {
    double f[ROUNDS], s[ROUNDS]; int nf = 0, ns = 0;
    for (int r = 0; r < ROUNDS; ++r) { if (g[0][r] > 42) f[nf++] = g[m][r] / g[0][r]; else s[ns++] = g[m][r] / g[0][r]; }
    qsort(f, nf, sizeof(double), by_value); qsort(s, ns, sizeof(double), by_value);
    printf("%-16s fast %2d: %.2f | slow %2d: %.2f\n", names[m], nf, nf ? f[nf / 2] : 0, ns, ns ? s[ns / 2] : 0);
  }
  return sink == 1.0f;
}
