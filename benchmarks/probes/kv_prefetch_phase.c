// When to prefetch two pools read in turns: a K tile, then a V tile (TILE bytes each, contiguous, as
// ascending blocks are), WORK FMAs per 64-byte line read standing in for the kernel's work. Modes:
// the hardware prefetchers only; the next tile of both pools prefetched into L2 during the K phase
// (one line of each per line read); each pool's next tile prefetched during its own phase; K only;
// V only; and the first and third again with V read as the bf16 P.V reads it, 4 rows of ROW bytes at a
// time, a 64-byte chunk of each in turn. Prints the median GB/s of 7 interleaved rounds per mode.
//
//   gcc -O2 -march=native -fopenmp -DWORK=8 benchmarks/probes/kv_prefetch_phase.c -o /tmp/kv_prefetch_phase
//   OMP_NUM_THREADS=1 /tmp/kv_prefetch_phase      # and 2 threads (OMP_PROC_BIND=close OMP_PLACES=cores)
#include <omp.h>
#include "probe_util.h"
#ifndef TILE
#define TILE 65536
#endif
#ifndef WORK
#define WORK 0
#endif
#ifndef ROW
#define ROW 2048
#endif
static float pass(const char* K, const char* V, size_t bytes, int mode) {
  float r = 0;
#pragma omp parallel reduction(+ : r)
  {
    const int th = omp_get_thread_num(), nt = omp_get_num_threads();
    const size_t nt_tiles = bytes / TILE, t0 = nt_tiles * th / nt, t1 = nt_tiles * (th + 1) / nt;
    __m512 acc = _mm512_setzero_ps(), a[8];
    for (int i = 0; i < 8; ++i) a[i] = _mm512_setzero_ps();
    const int rows = mode >= 5;            // V in 4-row order
    const int sw = mode >= 5 ? (mode == 6 ? 2 : 0) : mode;  // the prefetch scheme (0-4)
    for (size_t t = t0; t < t1; ++t)
      for (int ph = 0; ph < 2; ++ph) {
        const char* p = (ph ? V : K) + t * TILE;
        const char* pk = K + (t + 1 < t1 ? t + 1 : t) * TILE;
        const char* pv = V + (t + 1 < t1 ? t + 1 : t) * TILE;
        for (size_t i = 0; i < TILE; i += 64) {
          // line i of the phase; in 4-row order: rows g .. g + 3, chunk c of each in turn
          const size_t g = i / (4 * ROW) * (4 * ROW), c = i % (4 * ROW) / 256 * 64, u = i / 64 % 4;
          const size_t x = ph == 1 && rows ? g + u * ROW + c : i;
          if (sw == 1 && ph == 0) { _mm_prefetch(pk + x, _MM_HINT_T1); _mm_prefetch(pv + x, _MM_HINT_T1); }
          if (sw == 2) _mm_prefetch((ph ? pv : pk) + x, _MM_HINT_T1);
          if (sw == 3 && ph == 0) _mm_prefetch(pk + x, _MM_HINT_T1);  /* K only */
          if (sw == 4 && ph == 1) _mm_prefetch(pv + x, _MM_HINT_T1);  /* V only */
          const __m512 rr = _mm512_load_ps((const float*)(p + x));
          STAND_IN_WORK(rr, WORK);
        }
      }
    for (int i = 0; i < 8; ++i) acc = _mm512_add_ps(acc, a[i]);
    r += _mm512_reduce_add_ps(acc);
  }
  return r;
}
struct pools {
  const char *k, *v;
  size_t bytes;
};
static float run(int mode, void* ctx) {
  const struct pools* p = ctx;
  return pass(p->k, p->v, p->bytes, mode);
}
int main(void) {
  const size_t bytes = (size_t)128 << 20;
  struct pools p = {huge_pages(bytes, 1), huge_pages(bytes, 1), bytes};
  const char* names[] = {"HW only", "SW: K+V in K phase", "SW: each in its phase", "SW: K only", "SW: V only",
                         "HW only, V 4-row", "SW: each phase, V 4-row"};
  char prefix[32];
  snprintf(prefix, sizeof prefix, "WORK %2d ", WORK);
  time_modes(run, &p, names, 7, 7, 2.0 * bytes, prefix);
  return 0;
}
