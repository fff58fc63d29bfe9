// Whether the int8 decode kernel's K/V reads stream faster as two long sequential runs (every K row of
// a chunk, then every V row of it, whole rows, no software prefetch: the pattern at which one stream of
// weight rows reads at a plain read's rate) than as the kernel's tiles (32 tokens: K rows with the next
// tile's K and V lines prefetched into L2, one of each per line read, then P.V per head from cache).
// Stand-in work (FMAs per line read) takes the place of the arithmetic; rounds interleave the schemes
// with a plain read of the same bytes.
//
// 28 layers of int8 K and V pools (the engine's: one [blocks, 16, 8, 128] tensor each, rows of 1 KB),
// blocks in ascending or shuffled order; 2 threads split the request's tokens in halves.
//
//   MODE 0: the kernel's tiles
//   MODE 1: chunks of CHUNK tokens: q.k over the chunk's K rows, then P.V over its V rows, in token order,
//           no software prefetch
//   MODE 2: as 1, and at each block's start the next block's first KICK lines of K (q.k) or V (P.V)
//           prefetched into L2 (the hardware restarts its stream at each block of shuffled pools)
//   MODE 3: as 1, prefetching the next block's lines spread over the current block's reads
//   MODE 4: as 3 for q.k; P.V per head over tiles of 32 tokens (4 rows at a time, the kernel's order, its
//           sums in registers), the next tile's V lines prefetched in address order spread over it
//
//   gcc -O2 -march=native -fopenmp -DWQK=18 -DWPV=10 benchmarks/probes/kv_two_phase_probe.c -o /tmp/two_phase
//   OMP_NUM_THREADS=2 OMP_PROC_BIND=close OMP_PLACES=cores /tmp/two_phase TOKENS ORDER CHUNK ROUNDS
//   (ORDER 0 ascending, 1 shuffled; CHUNK 0: a thread's whole half)
#include <omp.h>

#include "probe_util.h"

#ifndef KICK
#define KICK 8
#endif

enum { ROW = 1024, BS = 16, TILE = 32, HEADS = 8, SEG = ROW / HEADS, LINES = ROW / 64, LAYERS = 28, MODES = 5 };

typedef struct {
  const char* k;  // K pool
  const char* v;  // V pool
  const int* order;
} Pools;

static inline size_t row_off(const Pools* p, int t) { return ((size_t)p->order[t / BS] * BS + t % BS) * ROW; }

static float kernel_tiles(const Pools* P, int tok0, int tok1) {
  __m512 acc = _mm512_setzero_ps(), a[8];
  for (int i = 0; i < 8; ++i) a[i] = _mm512_setzero_ps();
  for (int t0 = tok0; t0 < tok1; t0 += TILE) {
    const int next = t0 + TILE < tok1 ? t0 + TILE : -1;
    for (int i = 0; i < TILE; ++i) {  // q.k
      const char* k = P->k + row_off(P, t0 + i);
      for (int x = 0; x < LINES; ++x) {
        if (next >= 0) {
          _mm_prefetch(P->k + row_off(P, next + i) + x * 64, _MM_HINT_T1);
          _mm_prefetch(P->v + row_off(P, next + i) + x * 64, _MM_HINT_T1);
        }
        const __m512 r = _mm512_load_ps((const float*)(k + x * 64));
        STAND_IN_WORK(r, WQK);
      }
    }
    for (int h = 0; h < HEADS; ++h)  // P.V per head, 4 rows at a time
      for (int c = 0; c < SEG; c += 64)
        for (int i = 0; i < TILE; i += 4)
          for (int u = 0; u < 4; ++u) {
            const __m512 r = _mm512_load_ps((const float*)(P->v + row_off(P, t0 + i + u) + h * SEG + c));
            STAND_IN_WORK(r, WPV);
          }
  }
  for (int i = 0; i < 8; ++i) acc = _mm512_add_ps(acc, a[i]);
  return _mm512_reduce_add_ps(acc);
}

// one phase over [t0, t1): every line of each row in token order; pf 1: the next block's first KICK
// lines at each block's start, pf 2: the next block's lines spread over this block's reads
#define PHASE(pool, W)                                                                  \
  for (int t = t0; t < t1; ++t) {                                                       \
    const char* row = pool + row_off(P, t);                                             \
    const int nb = t / BS + 1, first = t % BS == 0;                                     \
    const char* nxt = nb * BS < t1 ? pool + row_off(P, nb * BS) : 0;                    \
    if (pf == 1 && first && nxt)                                                        \
      for (int z = 0; z < KICK; ++z) _mm_prefetch(nxt + z * 64, _MM_HINT_T1);           \
    for (int x = 0; x < LINES; ++x) {                                                   \
      if (pf == 2 && nxt) _mm_prefetch(nxt + ((t % BS) * LINES + x) * 64, _MM_HINT_T1); \
      const __m512 r = _mm512_load_ps((const float*)(row + x * 64));                    \
      STAND_IN_WORK(r, W);                                                                       \
    }                                                                                   \
  }

// P.V of [t0, t1) per head, tiles of 32 tokens, the next tile's V lines prefetched spread over each
#define PV_PER_HEAD                                                                                  \
  for (int s0 = t0; s0 < t1; s0 += TILE) {                                                          \
    const int nx = s0 + TILE < t1 ? s0 + TILE : -1;                                                 \
    int pos = 0;                                                                                    \
    for (int h = 0; h < HEADS; ++h)                                                                 \
      for (int c = 0; c < SEG; c += 64)                                                             \
        for (int i = 0; i < TILE; i += 4)                                                           \
          for (int u = 0; u < 4; ++u, ++pos) {                                                      \
            if (nx >= 0) _mm_prefetch(P->v + row_off(P, nx + pos / LINES) + (pos % LINES) * 64, _MM_HINT_T1); \
            const __m512 r = _mm512_load_ps((const float*)(P->v + row_off(P, s0 + i + u) + h * SEG + c)); \
            STAND_IN_WORK(r, WPV);                                                                           \
          }                                                                                         \
  }

static float two_phase(const Pools* P, int tok0, int tok1, int chunk, int mode) {
  __m512 acc = _mm512_setzero_ps(), a[8];
  for (int i = 0; i < 8; ++i) a[i] = _mm512_setzero_ps();
  if (chunk <= 0) chunk = tok1 - tok0;
  int pf = mode < 3 ? mode : 2;
  for (int c0 = tok0; c0 < tok1; c0 += chunk) {
    const int t0 = c0, t1 = c0 + chunk < tok1 ? c0 + chunk : tok1;
    PHASE(P->k, WQK)
    if (mode == 3) {
      // the chunk's first tile of V, prefetched at once (the rest follows during P.V)
      for (int z = 0; z < TILE * LINES; ++z) _mm_prefetch(P->v + row_off(P, t0 + z / LINES) + (z % LINES) * 64, _MM_HINT_T1);
      PV_PER_HEAD
    } else {
      PHASE(P->v, WPV)
    }
  }
  for (int i = 0; i < 8; ++i) acc = _mm512_add_ps(acc, a[i]);
  return _mm512_reduce_add_ps(acc);
}

int main(int argc, char** argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: %s TOKENS ORDER CHUNK ROUNDS\n", argv[0]);
    return 2;
  }
  const int tokens = atoi(argv[1]), shuffled = atoi(argv[2]), chunk = atoi(argv[3]), rounds = atoi(argv[4]);
  const int nb = tokens / BS;
  const size_t pool = (size_t)nb * BS * ROW;
  char *k[LAYERS], *v[LAYERS];
  for (int l = 0; l < LAYERS; ++l) k[l] = huge_pages(pool, 1), v[l] = huge_pages(pool, 1);
  float* plain = huge_pages(pool * 2 * LAYERS, 0);
  int* order = shuffled_order(nb);
  if (!shuffled)
    for (int i = 0; i < nb; ++i) order[i] = i;
  double* gbs = malloc(sizeof(double) * rounds * (MODES + 1));
  volatile float sink = 0;
  for (int r = 0; r < rounds; ++r) {
    for (int m = 0; m <= MODES; ++m) {
      double best = 1e9;
      for (int rep = 0; rep < 3; ++rep) {
        const double t0 = now();
        if (m == MODES) {
          sink += read_all(plain, pool * 2 * LAYERS / 4);
        } else {
          for (int l = 0; l < LAYERS; ++l) {
#pragma omp parallel
            {
              const Pools P = {k[l], v[l], order};
              const int th = omp_get_thread_num(), nt = omp_get_num_threads();
              // token halves in whole tiles
              const int a0 = (tokens / TILE) * th / nt * TILE, a1 = (tokens / TILE) * (th + 1) / nt * TILE;
              const float s = m == 0 ? kernel_tiles(&P, a0, a1) : two_phase(&P, a0, a1, chunk, m - 1);
#pragma omp atomic
              sink += s;
            }
          }
        }
        const double t = now() - t0;
        if (t < best) best = t;
      }
      gbs[r * (MODES + 1) + m] = pool * 2.0 * LAYERS / best / 1e9;
    }
  }
  const char* names[MODES + 1] = {"kernel tiles", "two phases", "two phases + kick", "two phases + spread", "spread, P.V per head", "plain read"};
  printf("tokens %d %s chunk %d WQK %d WPV %d KICK %d, %d rounds: median GB/s (ratio to the plain read, median)\n",
         tokens, shuffled ? "shuffled" : "ascending", chunk, WQK, WPV, KICK, rounds);
  for (int m = 0; m <= MODES; ++m) {
    double x[256], q[256];
    for (int r = 0; r < rounds; ++r) {
      x[r] = gbs[r * (MODES + 1) + m];
      q[r] = x[r] / gbs[r * (MODES + 1) + MODES];
    }
    qsort(x, rounds, sizeof(double), by_value);
    qsort(q, rounds, sizeof(double), by_value);
    printf("  %-22s %6.1f GB/s  %.2f\n", names[m], x[rounds / 2], q[rounds / 2]);
  }
  (void)sink;
  return 0;
}
