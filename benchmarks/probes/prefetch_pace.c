// Whether software prefetches issued faster than memory serves them arrive: a cold 64 KB region (its
// page's TLB entry warmed by one load) prefetched into L2 one T1 a line, the issue paced by a chain of
// 0-32 dependent multiplies a line (-1: no prefetch), then, after 15 us, read and timed. A read from L2
// takes ~0.85 us here; a cold read ~2.5. 150 trials a pace, medians. (rdtsc takes ~10 ns in this VM,
// too coarse to pace with.)
//
//   gcc -O2 -march=native benchmarks/probes/prefetch_pace.c -o /tmp/prefetch_pace && /tmp/prefetch_pace
#include "probe_util.h"
static inline void spin_ns(double ns) { const double t0 = now(); while ((now() - t0) * 1e9 < ns) {} }
int main(void) {
  const size_t span = (size_t)1 << 30;
  char* buf = huge_pages(span, 1);
  const int region = 64 << 10;
  const int paces[] = {-1, 0, 1, 2, 4, 8, 16, 32};
  const int np = 8, trials = 150;
  double t[8][150], issue[8][150];
  size_t pos = 0;
  volatile float sink = 0;
  for (int r = 0; r < trials; ++r)
    for (int m = 0; m < np; ++m) {
      const char* p = buf + pos;
      pos = (pos + region + 4096 * 17) & (span - 1);
      if (pos + region > span) pos = 0;
      sink += *(volatile const float*)(p + region - 64);
      spin_ns(1000);
      const double t0 = now();
      unsigned long acc = 1;
      if (paces[m] >= 0)
        for (int x = 0; x < region; x += 64) {
          _mm_prefetch(p + x, _MM_HINT_T1);
          for (int k = 0; k < paces[m]; ++k) __asm__ volatile("imul $3, %0, %0" : "+r"(acc));
        }
      issue[m][r] = now() - t0;
      sink += acc;
      spin_ns(15000);
      const double t1 = now();
      __m512 s = _mm512_setzero_ps();
      for (int x = 0; x < region; x += 64) s = _mm512_add_ps(s, _mm512_load_ps((const float*)(p + x)));
      t[m][r] = now() - t1;
      sink += _mm512_reduce_add_ps(s);
    }
  for (int m = 0; m < np; ++m) {
    qsort(t[m], trials, sizeof(double), by_value);
    qsort(issue[m], trials, sizeof(double), by_value);
    printf("pace %3d imuls: issue %.2f ns a line; read after: median %.2f us\n", paces[m],
           issue[m][trials / 2] / (region / 64) * 1e9, t[m][trials / 2] * 1e6);
  }
  return 0;
}
