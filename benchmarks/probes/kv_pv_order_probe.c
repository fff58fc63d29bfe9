// How the order of the int8 decode kernel's P.V reads, and where the next tile's V prefetches go,
// change the rate at which it streams K/V from memory, with stand-in work (FMAs) in place of its
// arithmetic. 28 layers of int8 K and V pools (blocks of 16 tokens, rows of 1 KB: 8 kv heads x 128
// dims, blocks shuffled); per layer 2 threads split one request's tiles of 32 tokens. Per tile: the
// q.k phase reads each K row whole, prefetching the next tile's K row into L2, one line per line
// read; then the P.V phase reads the tile's V rows (from cache) in one of these orders:
//
//   PV 0: row order (each row whole, then the next: what P.V could do with its sums in memory)
//   PV 1: per head (128 bytes of every row, four rows at a time: the kernel's pv_i8, sums in registers)
//   PV 2: four rows at a time, whole rows (line j of rows i .. i + 3, then line j + 1)
//
// and the next tile's V rows are prefetched (PF 0) during q.k, one V line per K line, as the kernel
// does; (PF 1) during P.V, spread over it in address order; (PF 2) rows [0, SPLIT) during q.k and the
// rest during P.V. LAYOUT 0: K and V in pools of their own, token-major (the engine's); 3: V pools
// head-major within a block ([block][head][token][dim]), where per-head P.V reads run sequentially
// (PF 1 then prefetches per head, in that order); 1: a block's K then its V; 2: K|V per token row.
// WQK / WPV: FMAs per line read in each phase (WQK=18 WPV=10 take about the kernel's time in cache).
//
//   gcc -O2 -march=native -fopenmp -DWQK=18 -DWPV=10 benchmarks/probes/kv_pv_order_probe.c -o /tmp/pv_probe
//   OMP_NUM_THREADS=2 OMP_PROC_BIND=close OMP_PLACES=cores /tmp/pv_probe 2048 0 0 28 1   # the kernel's scheme
//   ... /tmp/pv_probe TOKENS LAYOUT PF LAYERS PV    (LAYERS 1 and 256 tokens: in cache)
#include <omp.h>

#include "probe_util.h"

#ifndef SPLIT
#define SPLIT 9
#endif

enum { ROW = 1024, BS = 16, TILE = 32, HEADS = 8, SEG = ROW / HEADS };

typedef struct {
  char* base;
  const int* order;
  size_t pool;  // bytes of K and V together
  int layout;
} Pools;

static inline const char* k_row(const Pools* p, int t) {
  const size_t blk = (size_t)p->order[t / BS], r = t % BS;
  switch (p->layout) {
    case 1: return p->base + blk * BS * ROW * 2 + r * ROW;
    case 2: return p->base + (blk * BS + r) * ROW * 2;
    default: return p->base + (blk * BS + r) * ROW;
  }
}

// head h's 128 bytes of token t's V row
static inline const char* v_seg(const Pools* p, int t, int h) {
  const size_t blk = (size_t)p->order[t / BS], r = t % BS;
  switch (p->layout) {
    case 1: return k_row(p, t) + BS * ROW + h * SEG;
    case 2: return k_row(p, t) + ROW + h * SEG;
    case 3: return p->base + p->pool / 2 + blk * BS * ROW + (size_t)h * BS * SEG + r * SEG;
    default: return p->base + p->pool / 2 + (blk * BS + r) * ROW + h * SEG;
  }
}

// line x (0 .. 15) of token t's V row: in layout 3, head x / 2's segment, half x % 2
static inline const char* v_line(const Pools* p, int t, int x) { return v_seg(p, t, x / 2) + (x % 2) * 64; }

int main(int argc, char** argv) {
  if (argc < 6) {
    fprintf(stderr, "usage: %s TOKENS LAYOUT PF LAYERS PV\n", argv[0]);
    return 2;
  }
  const int tokens = atoi(argv[1]), layout = atoi(argv[2]), pf = atoi(argv[3]), layers = atoi(argv[4]),
            pv = atoi(argv[5]), nb = tokens / BS;
  const size_t pool = (size_t)nb * BS * ROW * 2;
  char** mem = malloc(layers * sizeof(char*));
  for (int l = 0; l < layers; ++l) {
    mem[l] = huge_pages(pool, 1);
  }
  const int* order = shuffled_order(nb);
  double best = 1e9;
  volatile float sink = 0;
  for (int rep = 0; rep < 9; ++rep) {
    const double t0 = now();
    for (int l = 0; l < layers; ++l) {
#pragma omp parallel
      {
        const Pools P = {mem[l], order, pool, layout};
        const int th = omp_get_thread_num(), nt = omp_get_num_threads();
        const int tok0 = (tokens / TILE) * th / nt * TILE, tok1 = (tokens / TILE) * (th + 1) / nt * TILE;
        __m512 acc = _mm512_setzero_ps(), a[8];
        for (int i = 0; i < 8; ++i) a[i] = _mm512_setzero_ps();
        for (int t0_ = tok0; t0_ < tok1; t0_ += TILE) {
          const int next = t0_ + TILE < tok1 ? t0_ + TILE : -1;
          for (int i = 0; i < TILE; ++i) {  // q.k
            const char* k = k_row(&P, t0_ + i);
            for (int x = 0; x < ROW / 64; ++x) {
              if (next >= 0) {
                _mm_prefetch(k_row(&P, next + i) + x * 64, _MM_HINT_T1);
                if (pf == 0 || (pf == 2 && i < SPLIT)) _mm_prefetch(v_line(&P, next + i, x), _MM_HINT_T1);
              }
              const __m512 r = _mm512_load_ps((const float*)(k + x * 64));
              STAND_IN_WORK(r, WQK);
            }
          }
          // the V lines P.V prefetches (PF 1: all 32 rows; PF 2: rows SPLIT ..), spread over its reads
          const int pf_first = pf == 1 ? 0 : SPLIT, pf_lines = pf == 0 || next < 0 ? 0 : (TILE - pf_first) * ROW / 64;
          int pos = 0;
          const int reads = TILE * ROW / 64, per_read = (pf_lines + reads - 1) / reads;
#define PV_PREFETCH(h)                                                                                  \
  for (int z = 0; z < per_read && pos < pf_lines; ++z, ++pos) {                                         \
    if (layout == 3) /* per head, in order: head h's 2 lines of each of the 32 rows */                 \
      _mm_prefetch(v_seg(&P, next + (pos % 64) / 2, h) + (pos % 2) * 64, _MM_HINT_T1);                  \
    else                                                                                                \
      _mm_prefetch(v_line(&P, next + pf_first + pos / 16, pos % 16), _MM_HINT_T1);                      \
  }
          if (pv == 0) {
            for (int i = 0; i < TILE; ++i)
              for (int x = 0; x < ROW / 64; ++x) {
                PV_PREFETCH(x / 2);
                const __m512 r = _mm512_load_ps((const float*)v_line(&P, t0_ + i, x));
                STAND_IN_WORK(r, WPV);
              }
          } else if (pv == 1) {
            for (int h = 0; h < HEADS; ++h)
              for (int c = 0; c < SEG; c += 64)
                for (int i = 0; i < TILE; i += 4)
                  for (int u = 0; u < 4; ++u) {
                    PV_PREFETCH(h);
                    const __m512 r = _mm512_load_ps((const float*)(v_seg(&P, t0_ + i + u, h) + c));
                    STAND_IN_WORK(r, WPV);
                  }
          } else {
            for (int i = 0; i < TILE; i += 4)
              for (int x = 0; x < ROW / 64; ++x)
                for (int u = 0; u < 4; ++u) {
                  PV_PREFETCH(x / 2);
                  const __m512 r = _mm512_load_ps((const float*)v_line(&P, t0_ + i + u, x));
                  STAND_IN_WORK(r, WPV);
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
  printf("tokens %d layers %d layout %d pf %d pv %d WQK %d WPV %d: %.1f GB/s, %.1f ns a token a thread\n", tokens,
         layers, layout, pf, pv, WQK, WPV, (double)layers * pool / best / 1e9, best / ((double)layers * tokens / 2) * 1e9);
  (void)sink;
  return 0;
}
