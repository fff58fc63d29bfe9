// Whether a KV layout that makes one request's cache a single ascending stream (each block's K rows,
// then its V rows, side by side: [N, 2, bs, Hkv, D]) lets the hardware prefetchers carry the decode
// attention's reads, as they carry the weights' (one sequential stream a thread, no software
// prefetch). 28 layers of one request; the threads split its blocks in halves; per block (a tile) the
// K rows are read, then the V rows. WQK / WPV FMAs per line stand in for the kernel's work.
//
//   gcc -O2 -march=native -fopenmp -DWQK=8 -DWPV=8 benchmarks/probes/kv_block_layout_probe.c -o /tmp/kvl
//   OMP_NUM_THREADS=2 OMP_PROC_BIND=close OMP_PLACES=cores /tmp/kvl 2048 32768   # tokens, K bytes a block
//
// Modes (interleaved rounds): separate K and V pools, the next block's lines prefetched into L2 one
// per line read in each phase (the kernels' scheme), blocks ascending / shuffled; the joint layout,
// ascending / shuffled, with no software prefetch, with the next block prefetched as the kernels do,
// or with only its first lines prefetched (to start the hardware prefetchers); a plain read of as many
// bytes.
#include <omp.h>

#include "probe_util.h"

#ifndef HEAD_LINES
#define HEAD_LINES 16
#endif

typedef struct {
  int layers, nb;
  size_t blk;  // one block's K bytes (its V bytes alike)
  char* k[28];
  char* v[28];
  char* kv[28];
  int* order;
  int* ascending;
  float* plain;
  size_t plain_n;
} Ctx;

static float run(int mode, void* vctx) {
  Ctx* c = vctx;
  if (mode == 8) return read_all(c->plain, c->plain_n);
  // per mode: joint layout, shuffled blocks, prefetch (0 none, 1 the next block line for line, 2 its
  // first HEAD_LINES lines at the block's start)
  static const int kJoint[] = {0, 0, 1, 1, 1, 1, 1, 0}, kShuf[] = {0, 1, 0, 1, 0, 1, 1, 0}, kPf[] = {1, 1, 0, 0, 1, 1, 2, 0};
  const int joint = kJoint[mode], shuffled = kShuf[mode], pf = kPf[mode];
  const int* order = shuffled ? c->order : c->ascending;
  const size_t blk = c->blk;
  float r = 0;
  for (int l = 0; l < c->layers; ++l) {
#pragma omp parallel reduction(+ : r)
    {
      const int th = omp_get_thread_num(), nt = omp_get_num_threads();
      const int b0 = c->nb * th / nt, b1 = c->nb * (th + 1) / nt;
      __m512 acc = _mm512_setzero_ps(), a[8];
      for (int i = 0; i < 8; ++i) a[i] = _mm512_setzero_ps();
      for (int b = b0; b < b1; ++b) {
        const int bn = b + 1 < b1 ? order[b + 1] : order[b];
        for (int ph = 0; ph < 2; ++ph) {
          const char* p = joint ? c->kv[l] + (size_t)order[b] * 2 * blk + ph * blk : (ph ? c->v[l] : c->k[l]) + (size_t)order[b] * blk;
          const char* pn = joint ? c->kv[l] + (size_t)bn * 2 * blk + ph * blk : (ph ? c->v[l] : c->k[l]) + (size_t)bn * blk;
          if (pf == 2 && ph == 0)
            for (int x = 0; x < HEAD_LINES; ++x) _mm_prefetch(pn + 64 * x, _MM_HINT_T1);
          for (size_t x = 0; x < blk; x += 64) {
            if (pf == 1) _mm_prefetch(pn + x, _MM_HINT_T1);
            const __m512 rr = _mm512_load_ps((const float*)(p + x));
            if (ph == 0)
              STAND_IN_WORK(rr, WQK);
            else
              STAND_IN_WORK(rr, WPV);
          }
        }
      }
      for (int i = 0; i < 8; ++i) acc = _mm512_add_ps(acc, a[i]);
      r += _mm512_reduce_add_ps(acc);
    }
  }
  return r;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s TOKENS BLOCK_K_BYTES [ROUNDS]\n", argv[0]);
    return 2;
  }
  Ctx c;
  const int tokens = atoi(argv[1]), rounds = argc > 3 ? atoi(argv[3]) : 9;
  c.blk = (size_t)atol(argv[2]);
  c.layers = 28;
  // tokens a block: blk bytes of int8 rows of 1 KB (Qwen3-0.6B: 8 kv heads x 128)
  c.nb = (int)((size_t)tokens * 1024 / c.blk);
  for (int l = 0; l < c.layers; ++l) {
    c.k[l] = huge_pages((size_t)c.nb * c.blk, 1);
    c.v[l] = huge_pages((size_t)c.nb * c.blk, 1);
    c.kv[l] = huge_pages((size_t)c.nb * 2 * c.blk, 1);
  }
  c.order = shuffled_order(c.nb);
  c.ascending = malloc(c.nb * sizeof(int));
  for (int i = 0; i < c.nb; ++i) c.ascending[i] = i;
  const double bytes = 2.0 * c.layers * c.nb * c.blk;
  c.plain_n = (size_t)(bytes / 4) / 64 * 64;
  c.plain = huge_pages(c.plain_n * 4, 1);
  const char* names[] = {"separate, asc, T1 next", "separate, shuf, T1 next", "joint, asc, none",  "joint, shuf, none",
                         "joint, asc, T1 next",    "joint, shuf, T1 next",    "joint, shuf, head", "separate, asc, none", "plain read"};
  char prefix[64];
  snprintf(prefix, sizeof prefix, "%d tok, blk %zu: ", tokens, c.blk);
  time_modes(run, &c, names, 9, rounds, bytes, prefix);
  return 0;
}
