// Whether the hardware prefetchers follow the bf16 P.V's reading order: K tiles of 64 KB read line
// by line, then V tiles either line by line or as the kernel reads them, 4 rows of 2 KB at a time,
// a 64-byte chunk of each in turn. Each with the hardware prefetchers alone and with each pool's
// next tile prefetched into L2 in its own phase; WORK FMAs a line stand in for the kernel's work.
//
//   gcc -O2 -march=native -fopenmp -DWORK=8 scripts/probes/kv_v_row_order.c -o /tmp/kv_v_row_order
//   OMP_NUM_THREADS=1 /tmp/kv_v_row_order
#include <omp.h>
#include "probe_util.h"
#define TILE 65536
#define ROW 2048
#ifndef WORK
#define WORK 8
#endif
static float pass(const char* K, const char* V, size_t bytes, int mode) {
  float r = 0;
#pragma omp parallel reduction(+ : r)
  {
    const int th = omp_get_thread_num(), nt = omp_get_num_threads();
    const size_t nt_tiles = bytes / TILE, t0 = nt_tiles * th / nt, t1 = nt_tiles * (th + 1) / nt;
    __m512 acc = _mm512_setzero_ps(), a[8];
    for (int i = 0; i < 8; ++i) a[i] = _mm512_setzero_ps();
    const int sw = mode & 1, inter = mode >> 1;
    for (size_t t = t0; t < t1; ++t) {
      const char* pk = K + (t + 1 < t1 ? t + 1 : t) * TILE;
      const char* pv = V + (t + 1 < t1 ? t + 1 : t) * TILE;
      const char* k = K + t * TILE;
      const char* v = V + t * TILE;
      for (size_t x = 0; x < TILE; x += 64) {
        if (sw) _mm_prefetch(pk + x, _MM_HINT_T1);
        const __m512 rr = _mm512_load_ps((const float*)(k + x));
        acc = _mm512_add_ps(acc, rr);
#pragma GCC unroll 64
        for (int w = 0; w < WORK; ++w) a[w & 7] = _mm512_fmadd_ps(rr, a[(w + 3) & 7], a[w & 7]);
      }
      if (!inter) {
        for (size_t x = 0; x < TILE; x += 64) {
          if (sw) _mm_prefetch(pv + x, _MM_HINT_T1);
          const __m512 rr = _mm512_load_ps((const float*)(v + x));
          acc = _mm512_add_ps(acc, rr);
#pragma GCC unroll 64
          for (int w = 0; w < WORK; ++w) a[w & 7] = _mm512_fmadd_ps(rr, a[(w + 3) & 7], a[w & 7]);
        }
      } else {
        for (size_t g = 0; g < TILE; g += 4 * ROW)      /* 4 rows */
          for (size_t c = 0; c < ROW; c += 64)          /* chunk of every row */
            for (int u = 0; u < 4; ++u) {
              const size_t x = g + u * ROW + c;
              if (sw) _mm_prefetch(pv + x, _MM_HINT_T1);
              const __m512 rr = _mm512_load_ps((const float*)(v + x));
              acc = _mm512_add_ps(acc, rr);
#pragma GCC unroll 64
              for (int w = 0; w < WORK; ++w) a[w & 7] = _mm512_fmadd_ps(rr, a[(w + 3) & 7], a[w & 7]);
            }
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
  const char* names[] = {"V seq, HW", "V seq, SW", "V 4-row, HW", "V 4-row, SW"};
  const int nm = 4, rounds = 7;
  double t[4][7];
  volatile float sink = 0;
  for (int r = 0; r < rounds; ++r)
    for (int m = 0; m < nm; ++m) {
      const double t0 = now();
      sink += pass(K, V, bytes, m);
      t[m][r] = now() - t0;
    }
  for (int m = 0; m < nm; ++m) {
    qsort(t[m], rounds, sizeof(double), by_value);
    printf("WORK %2d %-14s median %.1f GB/s\n", WORK, names[m], 2.0 * bytes / t[m][rounds / 2] / 1e9);
  }
  return 0;
}
