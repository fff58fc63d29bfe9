// How fast one bf16 decode step's GEMVs stream the Qwen3-0.6B weights, by weight layout: 28 layers of
// qkv [4096, 1024], o [1024, 2048], gate_up [6144, 1024], down [1024, 3072], then lm_head
// [151936, 1024], one activation row, each matrix split over the threads in contiguous row ranges
// (one OpenMP region a matrix, as at::parallel_for), on 2 MiB huge pages. Layouts run interleaved,
// 9 rounds, with a 1 GiB plain read at the start of each round; medians.
//
//   gcc -O3 -march=native -fopenmp benchmarks/probes/decode_weights_probe.c -o /tmp/dwp
//   OMP_NUM_THREADS=2 OMP_PROC_BIND=close OMP_PLACES=cores /tmp/dwp
//
// layout "rows2": nn.Linear's row-major layout, 2 rows a group, a thread's range prefetched 32 KiB
//   ahead into L2 in memory order, its first 32 KiB requested at once (bf16_gemv.h on CPUs without AMX)
// layout "il8": groups of 8 rows interleaved 64 bytes at a time ([n / 8][k / 32][8][32]), so a
//   thread reads one sequential stream; no software prefetch (the hardware's streamer)
// layout "il8+burst": il8 with each thread's first 32 KiB requested at once
// layout "il16": groups of 16 rows interleaved
#include <omp.h>

#include "probe_util.h"

enum { ROUNDS = 9, LAYERS = 28 };

// out[i] = w[i, :] . x; C rows a group; packed: the group's rows interleaved 64 bytes at a time
static void gemv(const Matrix* m, const uint16_t* x, float* out, int C, int packed, int prefetch, int burst) {
  const int64_t n = m->n, k = m->k;
#pragma omp parallel
  {
    const int nt = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t groups = n / C, g0 = groups * id / nt, g1 = groups * (id + 1) / nt;
    const char* start = (const char*)(m->w + g0 * C * k);
    const char* end = (const char*)(m->w + g1 * C * k);
    const char* pf = start + 32768;
    if (burst)
      for (const char* p = start; p < start + 32768 && p < end; p += 64) _mm_prefetch(p, _MM_HINT_T1);
    for (int64_t g = g0; g < g1; ++g) {
      const uint16_t* wg = m->w + g * C * k;
      __m512 acc[16];
      for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
      for (int64_t kk = 0; kk < k; kk += 32) {
        if (prefetch && pf < end) {
          for (int c = 0; c < C; ++c) _mm_prefetch(pf + 64 * c, _MM_HINT_T1);
          pf += 64 * C;
        }
        const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + kk);
        for (int c = 0; c < C; ++c) {
          const uint16_t* src = packed ? wg + kk * C + 32 * c : wg + c * k + kk;
          acc[c] = _mm512_dpbf16_ps(acc[c], xv, (__m512bh)_mm512_loadu_si512(src));
        }
      }
      for (int c = 0; c < C; ++c) out[g * C + c] = _mm512_reduce_add_ps(acc[c]);
    }
  }
}

int main(void) {
  Matrix mats[LAYERS * 4 + 1];
  size_t layer_bytes, head_bytes;
  const int nm = step_matrices(mats, &layer_bytes, &head_bytes);
  const size_t total = layer_bytes + head_bytes;
  uint16_t* x = huge_pages(3072 * 2, 0);
  for (int j = 0; j < 3072; ++j) x[j] = 0x3f80;
  float* out = huge_pages(151936 * 4, 0);
  const size_t probe_floats = (size_t)1 << 28;
  float* probe = huge_pages(probe_floats * 4, 0);
  for (size_t i = 0; i < probe_floats; ++i) probe[i] = 1.0f;

  const char* names[] = {"rows2", "il8", "il8+burst", "il16"};
  const int cs[] = {2, 8, 8, 16}, packed[] = {0, 1, 1, 1}, pfs[] = {1, 0, 0, 0}, bursts[] = {1, 0, 1, 0};
  const int nl = 4;
  double gbs[4][ROUNDS], probe_gbs[ROUNDS];
  volatile float sink = 0;
  for (int r = 0; r < ROUNDS; ++r) {
    double t = now();
    sink += read_all(probe, probe_floats);
    probe_gbs[r] = probe_floats * 4.0 / (now() - t) / 1e9;
    for (int j = 0; j < nl; ++j) {
      const int L = (j + r) % nl;  // rotate the order
      t = now();
      for (int i = 0; i < nm; ++i) gemv(&mats[i], x, out, cs[L], packed[L], pfs[L], bursts[L]);
      gbs[L][r] = total / (now() - t) / 1e9;
      sink += out[0];
    }
  }
  qsort(probe_gbs, ROUNDS, sizeof(double), by_value);
  printf("weights %.2f GB; probe (1 GiB read): median %.1f GB/s (%.1f-%.1f)\n", total / 1e9, probe_gbs[ROUNDS / 2],
         probe_gbs[0], probe_gbs[ROUNDS - 1]);
  for (int L = 0; L < nl; ++L) {
    qsort(gbs[L], ROUNDS, sizeof(double), by_value);
    printf("%-10s median %5.1f GB/s (%.1f-%.1f): a step %.1f ms\n", names[L], gbs[L][ROUNDS / 2], gbs[L][0],
           gbs[L][ROUNDS - 1], total / gbs[L][ROUNDS / 2] / 1e6);
  }
  return 0;
}
