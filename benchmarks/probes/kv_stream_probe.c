// How fast a CPU streams the decode attention's access pattern, with no attention math: 28 layers of
// K and V pools cut into shuffled blocks; per layer the threads split one request's blocks, and per
// tile of two blocks they read K, then V, prefetching the same pool's block two ahead into L2, one
// line per line read. WORK adds that many FMAs per line read (a stand-in for the kernel's work), so
// the rate at which compute and memory stop overlapping can be read off.
//
//   gcc -O2 -march=native -fopenmp -DWORK=0 benchmarks/probes/kv_stream_probe.c -o /tmp/kv_stream_probe
//   OMP_NUM_THREADS=2 OMP_PROC_BIND=close OMP_PLACES=cores /tmp/kv_stream_probe 2048 1    # tokens, mode
//
// mode 0: loads only (hardware prefetchers); 1: loads and software prefetches; 2: prefetches only.
// BLOCK_BYTES: one block's K (or V) rows, all heads: 32768 for bf16 Qwen3-0.6B, 16384 for 8-bit.
#include <omp.h>

#include "probe_util.h"

#ifndef WORK
#define WORK 0
#endif
#ifndef BLOCK_BYTES
#define BLOCK_BYTES 32768
#endif

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s TOKENS MODE\n", argv[0]);
    return 2;
  }
  const int tokens = atoi(argv[1]), mode = atoi(argv[2]), layers = 28, nb = tokens / 16;
  const size_t pool = (size_t)nb * BLOCK_BYTES;
  char* k[28];
  char* v[28];
  for (int l = 0; l < layers; ++l) {
    k[l] = huge_pages(pool, 1);
    v[l] = huge_pages(pool, 1);
  }
  const int* order = shuffled_order(nb);
  double best = 1e9;
  volatile float sink = 0;
  for (int rep = 0; rep < 7; ++rep) {
    const double t0 = now();
    for (int l = 0; l < layers; ++l) {
#pragma omp parallel
      {
        const int th = omp_get_thread_num(), nt = omp_get_num_threads();
        const int b0 = nb * th / nt, b1 = nb * (th + 1) / nt;
        __m512 acc = _mm512_setzero_ps(), a[8];
        for (int i = 0; i < 8; ++i) a[i] = _mm512_setzero_ps();
        for (int b = b0; b < b1; b += 2)
          for (int pass = 0; pass < 2; ++pass) {
            char* base = pass ? v[l] : k[l];
            for (int bb = b; bb < b + 2 && bb < b1; ++bb) {
              const char* p = base + (size_t)order[bb] * BLOCK_BYTES;
              const char* pn = bb + 2 < b1 ? base + (size_t)order[bb + 2] * BLOCK_BYTES : p;
              for (int x = 0; x < BLOCK_BYTES; x += 64) {
                if (mode >= 1) _mm_prefetch(pn + x, _MM_HINT_T1);
                if (mode == 2) continue;
                const __m512 r = _mm512_load_ps((const float*)(p + x));
                acc = _mm512_add_ps(acc, r);
#pragma GCC unroll 64
                for (int w = 0; w < WORK; ++w) a[w & 7] = _mm512_fmadd_ps(r, a[(w + 3) & 7], a[w & 7]);
              }
            }
          }
        for (int i = 0; i < 8; ++i) acc = _mm512_add_ps(acc, a[i]);
        sink += _mm512_reduce_add_ps(acc);
      }
    }
    const double t = now() - t0;
    if (t < best) best = t;
  }
  printf("tokens %d, mode %d, WORK %d, BLOCK_BYTES %d: %.1f GB/s\n", tokens, mode, WORK, BLOCK_BYTES,
         2.0 * layers * pool / best / 1e9);
  (void)sink;
  return 0;
}
