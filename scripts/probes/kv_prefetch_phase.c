// When to prefetch two pools read in turns: a K tile, then a V tile (TILE bytes each, contiguous, as
// ascending blocks are), WORK FMAs per 64-byte line read standing in for the kernel's work. Modes:
// the hardware prefetchers only; the next tile of both pools prefetched into L2 during the K phase
// (one line of each per line read); each pool's next tile prefetched during its own phase; K only;
// V only.
// Prints the median GB/s of 7 interleaved rounds per mode.
//
//   gcc -O2 -march=native -fopenmp -DWORK=8 scripts/probes/kv_prefetch_phase.c -o /tmp/kv_prefetch_phase
//   OMP_NUM_THREADS=1 /tmp/kv_prefetch_phase      # and 2 threads (OMP_PROC_BIND=close OMP_PLACES=cores)
#include <omp.h>
#include "probe_util.h"
#ifndef TILE
#define TILE 65536
#endif
#ifndef WORK
#define WORK 0
#endif
static float pass(const char* K, const char* V, size_t bytes, int mode) {
  float r = 0;
#pragma omp parallel reduction(+ : r)
  {
    const int th = omp_get_thread_num(), nt = omp_get_num_threads();
    const size_t nt_tiles = bytes / TILE, t0 = nt_tiles * th / nt, t1 = nt_tiles * (th + 1) / nt;
    __m512 acc = _mm512_setzero_ps(), a[8];
    for (int i = 0; i < 8; ++i) a[i] = _mm512_setzero_ps();
    for (size_t t = t0; t < t1; ++t)
      for (int ph = 0; ph < 2; ++ph) {
        const char* p = (ph ? V : K) + t * TILE;
        const char* pk = K + (t + 1 < t1 ? t + 1 : t) * TILE;
        const char* pv = V + (t + 1 < t1 ? t + 1 : t) * TILE;
        for (size_t x = 0; x < TILE; x += 64) {
          if (mode == 1 && ph == 0) { _mm_prefetch(pk + x, _MM_HINT_T1); _mm_prefetch(pv + x, _MM_HINT_T1); }
          if (mode == 2) _mm_prefetch((ph ? pv : pk) + x, _MM_HINT_T1);
          if (mode == 3 && ph == 0) _mm_prefetch(pk + x, _MM_HINT_T1);  /* K only */
          if (mode == 4 && ph == 1) _mm_prefetch(pv + x, _MM_HINT_T1);  /* V only */
          const __m512 rr = _mm512_load_ps((const float*)(p + x));
          acc = _mm512_add_ps(acc, rr);
#pragma GCC unroll 64
          for (int w = 0; w < WORK; ++w) a[w & 7] = _mm512_fmadd_ps(rr, a[(w + 3) & 7], a[w & 7]);
        }
      }
    for (int i = 0; i < 8; ++i) acc = _mm512_add_ps(acc, a[i]);
    r += _mm512_reduce_add_ps(acc);
  }
  return r;
}
int main(void) {
  const size_t bytes = (size_t)128 << 20;
  char* K = huge_pages(bytes, 1);
  char* V = huge_pages(bytes, 1);
  const char* names[] = {"HW only", "SW: K+V in K phase", "SW: each in its phase", "SW: K only", "SW: V only"};
  const int nm = 5, rounds = 7;
  double t[5][7];
  volatile float sink = 0;
  for (int r = 0; r < rounds; ++r)
    for (int m = 0; m < nm; ++m) {
      const double t0 = now();
      sink += pass(K, V, bytes, m);
      t[m][r] = now() - t0;
    }
  for (int m = 0; m < nm; ++m) {
    qsort(t[m], rounds, sizeof(double), by_value);
    printf("WORK %2d %-24s median %.1f GB/s\n", WORK, names[m], 2.0 * bytes / t[m][rounds / 2] / 1e9);
  }
  return 0;
}
