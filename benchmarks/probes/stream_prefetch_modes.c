// The rate at which one pass over 256 MB streams, per reading order and prefetch: 32 KB blocks (one
// bf16 block's K rows of Qwen3-0.6B) in address order or shuffled, read line by line, with the
// hardware prefetchers alone or with software prefetches of the block `dist` ahead (into L2 with
// T1, L1 with T0, NTA; every line, every other line, or a block's first 1 KB). 7 interleaved
// rounds, medians.
//
//   gcc -O2 -march=native -fopenmp benchmarks/probes/stream_prefetch_modes.c -o /tmp/stream_prefetch_modes
//   OMP_NUM_THREADS=1 /tmp/stream_prefetch_modes    # and 2 threads (OMP_PROC_BIND=close OMP_PLACES=cores)
#include <omp.h>
#include "probe_util.h"
#ifndef BLK
#define BLK 32768 /* -DBLK=131072 etc.: other block sizes (the buffer stays 256 MB) */
#endif
static float pass(const char* buf, const int* order, int nb, int mode, int dist) {
  float r = 0;
#pragma omp parallel reduction(+ : r)
  {
    const int th = omp_get_thread_num(), nt = omp_get_num_threads();
    const int b0 = nb * th / nt, b1 = nb * (th + 1) / nt;
    __m512 s0 = _mm512_setzero_ps(), s1 = s0;
    for (int b = b0; b < b1; ++b) {
      const char* p = buf + (size_t)order[b] * BLK;
      const char* pn = b + dist < b1 ? buf + (size_t)order[b + dist] * BLK : p;
      for (int x = 0; x < BLK; x += 128) {
        if (mode == 1) { _mm_prefetch(pn + x, _MM_HINT_T1); _mm_prefetch(pn + x + 64, _MM_HINT_T1); }
        if (mode == 2) { _mm_prefetch(pn + x, _MM_HINT_T0); _mm_prefetch(pn + x + 64, _MM_HINT_T0); }
        if (mode == 3) { _mm_prefetch(pn + x, _MM_HINT_NTA); _mm_prefetch(pn + x + 64, _MM_HINT_NTA); }
        if (mode == 4) { _mm_prefetch(pn + x, _MM_HINT_T1); }  /* every other line */
        if (mode == 5 && x < 1024) { _mm_prefetch(pn + x, _MM_HINT_T1); _mm_prefetch(pn + x + 64, _MM_HINT_T1); } /* first 1 KB of each block */
        s0 = _mm512_add_ps(s0, _mm512_load_ps((const float*)(p + x)));
        s1 = _mm512_add_ps(s1, _mm512_load_ps((const float*)(p + x + 64)));
      }
    }
    r += _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
  }
  return r;
}
struct stream {
  const char* buf;
  const int* ords[10];
  int nb;
};
static float run(int m, void* ctx) {
  static const int modes[] = {0, 1, 0, 1, 2, 3, 4, 5, 1, 1}, dists[] = {2, 2, 2, 2, 2, 2, 2, 2, 1, 4};
  const struct stream* s = ctx;
  return pass(s->buf, s->ords[m], s->nb, modes[m], dists[m]);
}
int main(void) {
  const int nb = (int)(((size_t)256 << 20) / BLK);
  int* seq = malloc(nb * sizeof(int));
  for (int i = 0; i < nb; ++i) seq[i] = i;
  const int* shuf = shuffled_order(nb);
  struct stream s = {huge_pages((size_t)nb * BLK, 1), {seq, seq, shuf, shuf, shuf, shuf, shuf, shuf, shuf, shuf}, nb};
  const char* names[] = {"seq none", "seq T1+2", "shuf none", "shuf T1+2", "shuf T0+2", "shuf NTA+2", "shuf T1 half",
                         "shuf T1 1KB", "shuf T1+1", "shuf T1+4"};
  time_modes(run, &s, names, 10, 7, (double)nb * BLK, "");
  return 0;
}
