// How fast a bf16 GEMV (one activation row) can stream its weights, by reading pattern, against a
// plain sequential read of the same bytes. Each configuration streams one 240 MiB matrix
// ([122880, 1024] bf16, on 2 MiB huge pages) with OpenMP threads over contiguous row ranges;
// configurations run interleaved, 9 rounds, with a 1 GiB read probe at the start of each round.
//
//   gcc -O3 -march=native -fopenmp benchmarks/probes/weight_stream_patterns.c -o /tmp/wsp
//   OMP_NUM_THREADS=2 OMP_PROC_BIND=close OMP_PLACES=cores /tmp/wsp 0,1,0,0 2,1,32768,1 8,1,0,0,1
//
// A configuration is "C,ACC,PF,HINT[,PACKED]":
//   C       weight rows read together (C = 0: the plain sequential read of the matrix's bytes)
//   ACC     accumulators per row (independent dot-product chains)
//   PF      software prefetch distance in bytes, walking the thread's range in memory order (0: none)
//   HINT    0: into L1 (T0), 1: into L2 (T1), 2: T2, 3: T1 at PF and T0 4 KiB ahead as well
//   PACKED  1: the C rows interleaved 64 bytes at a time, so a group reads as one sequential stream;
//           0 (default): nn.Linear's row-major layout, C streams one row (2 KiB) apart.
// "2,1,32768,1" is what bf16_gemv.h does on CPUs without AMX.
#include <omp.h>

#include "probe_util.h"

enum { ROUNDS = 40, MAX_CONFIGS = 32 };

typedef struct {
  int c, acc, pf, hint, packed;
} Config;

static inline void prefetch(const char* p, int hint) {
  if (hint == 0) _mm_prefetch(p, _MM_HINT_T0);
  else if (hint == 1) _mm_prefetch(p, _MM_HINT_T1);
  else if (hint == 2) _mm_prefetch(p, _MM_HINT_T2);
  else _mm_prefetch(p, _MM_HINT_T1);  // 3: T1 at the distance, and T0 4 KiB ahead
}

// out[n] = w[n, :] . x over this thread's groups of cfg.c rows (k a multiple of 32 * cfg.acc).
static void gemv(const Config* cfg, const uint16_t* x, const uint16_t* w, int64_t n, int64_t k, float* out) {
#pragma omp parallel
  {
    const int C = cfg->c, A = cfg->acc, nt = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t groups = n / C, g0 = groups * id / nt, g1 = groups * (id + 1) / nt;
    const char* pf = (const char*)(w + g0 * C * k) + cfg->pf;
    const char* pf_end = (const char*)(w + g1 * C * k);
    for (int64_t g = g0; g < g1; ++g) {
      const uint16_t* wg = w + g * C * k;
      __m512 acc[16][8];
      for (int c = 0; c < C; ++c)
        for (int a = 0; a < A; ++a) acc[c][a] = _mm512_setzero_ps();
      for (int64_t kk = 0; kk < k; kk += 32 * A)
        for (int a = 0; a < A; ++a) {
          const int64_t col = kk + 32 * a;  // 32 values: one 64-byte line per row
          if (cfg->pf && pf < pf_end) {
            for (int c = 0; c < C; ++c) prefetch(pf + 64 * c, cfg->hint);
            if (cfg->hint == 3)
              for (int c = 0; c < C; ++c) _mm_prefetch(pf - cfg->pf + 4096 + 64 * c, _MM_HINT_T0);
            pf += 64 * C;
          }
          const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + col);
          for (int c = 0; c < C; ++c) {
            const uint16_t* src = cfg->packed ? wg + col * C + 32 * c : wg + c * k + col;
            acc[c][a] = _mm512_dpbf16_ps(acc[c][a], xv, (__m512bh)_mm512_loadu_si512(src));
          }
        }
      for (int c = 0; c < C; ++c) {
        __m512 s = acc[c][0];
        for (int a = 1; a < A; ++a) s = _mm512_add_ps(s, acc[c][a]);
        out[g * C + c] = _mm512_reduce_add_ps(s);
      }
    }
  }
}

int main(int argc, char** argv) {
  const int64_t k = 1024, n = 3072 * 40;
  const size_t bytes = (size_t)n * k * 2;
  uint16_t* w = huge_pages(bytes, 0);
  uint16_t* x = huge_pages(k * 2, 0);
  float* out = huge_pages(n * 4, 0);
  for (int64_t i = 0; i < n * k; ++i) w[i] = 0x3f80;  // bf16 1.0
  for (int64_t i = 0; i < k; ++i) x[i] = 0x3f80;

  int nc = 0;
  Config cfg[MAX_CONFIGS];
  for (int a = 1; a < argc && nc < MAX_CONFIGS; ++a) {
    Config c = {0, 1, 0, 1, 0};
    if (sscanf(argv[a], "%d,%d,%d,%d,%d", &c.c, &c.acc, &c.pf, &c.hint, &c.packed) < 4 || c.c < 0 || c.c > 16 ||
        c.acc < 1 || c.acc > 8) {
      fprintf(stderr, "bad configuration %s (C,ACC,PF,HINT[,PACKED]; C <= 16, 1 <= ACC <= 8)\n", argv[a]);
      return 2;
    }
    cfg[nc++] = c;
  }
  static double gbs[MAX_CONFIGS][ROUNDS];
  volatile float sink = 0;
  for (int r = 0; r < ROUNDS; ++r) {
    for (int i = 0; i < nc; ++i) {
      const double t = now();
      if (cfg[i].c == 0) sink += read_all((const float*)w, bytes / 4);
      else gemv(&cfg[i], x, w, n, k, out), sink += out[0];
      gbs[i][r] = bytes / (now() - t) / 1e9;
    }
  }
  double first[ROUNDS];  // the first configuration's rates, sorted: the midpoint of their range splits the rounds
  memcpy(first, gbs[0], sizeof(first));
  qsort(first, ROUNDS, sizeof(double), by_value);
  const double split = (first[0] + first[ROUNDS - 1]) / 2;
  int n_fast = 0;
  for (int r = 0; r < ROUNDS; ++r) n_fast += gbs[0][r] >= split;
  printf("%s: median %.1f GB/s (%.1f-%.1f); %d rounds at %.1f or more (fast), %d below (slow)\n", argv[1],
         first[ROUNDS / 2], first[0], first[ROUNDS - 1], n_fast, split, ROUNDS - n_fast);
  for (int i = 1; i < nc; ++i) {
    double fast[ROUNDS], slow[ROUNDS], all[ROUNDS];
    int nf = 0, ns = 0;
    for (int r = 0; r < ROUNDS; ++r) {
      const double q = gbs[i][r] / gbs[0][r];
      if (gbs[0][r] >= split) fast[nf++] = q;
      else slow[ns++] = q;
    }
    memcpy(all, gbs[i], sizeof(all));
    qsort(all, ROUNDS, sizeof(double), by_value);
    qsort(fast, nf, sizeof(double), by_value);
    qsort(slow, ns, sizeof(double), by_value);
    printf("%-16s median %5.1f GB/s; of the first: %.2f in the fast rounds, %.2f in the slow ones\n", argv[i + 1],
           all[ROUNDS / 2], fast[nf / 2], slow[ns / 2]);
  }
  return sink == 12345.0f;
}
