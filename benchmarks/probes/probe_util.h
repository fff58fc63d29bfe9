// Helpers shared by the memory probes in this folder (each probe is one C file built with
// gcc -O2 -march=native -fopenmp; this header sits next to them).
#pragma once

#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static inline double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

// bytes on 2 MiB transparent huge pages (madvise mode), filled with the byte `fill` (faulted in now)
static inline void* huge_pages(size_t bytes, int fill) {
  const size_t huge = (size_t)2 << 20, size = (bytes + huge - 1) / huge * huge;
  char* p = mmap(0, size + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    exit(1);
  }
  p = (char*)(((uintptr_t)p + huge - 1) & ~(uintptr_t)(huge - 1));
  madvise(p, size, MADV_HUGEPAGE);
  memset(p, fill, bytes);
  return p;
}

// 0 .. n - 1 in a fixed shuffled order (the same every run): a long-lived pool's block ids
static inline int* shuffled_order(int n) {
  int* order = malloc(n * sizeof(int));
  for (int i = 0; i < n; ++i) order[i] = i;
  srand(1);
  for (int i = n - 1; i > 0; --i) {
    const int j = rand() % (i + 1), t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
  return order;
}

// the sum of n floats (n a multiple of 64), read by every OpenMP thread: the plain read probe
static inline float read_all(const float* a, size_t n) {
  float r = 0;
#pragma omp parallel reduction(+ : r)
  {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
#pragma omp for schedule(static)
    for (size_t i = 0; i < n; i += 64) {
      s0 = _mm512_add_ps(s0, _mm512_load_ps(a + i));
      s1 = _mm512_add_ps(s1, _mm512_load_ps(a + i + 16));
      s2 = _mm512_add_ps(s2, _mm512_load_ps(a + i + 32));
      s3 = _mm512_add_ps(s3, _mm512_load_ps(a + i + 48));
    }
    r += _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
  }
  return r;
}

static inline int by_value(const void* a, const void* b) {  // qsort of doubles
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

// Stand-in work for the attention-kernel probes (STAND_IN_WORK): WQK / WPV FMAs per 64-byte line read in the q.k and
// P.V phases (-DWQK=.. -DWPV=..), on accumulators `acc` and `a[8]` the caller declares.
#ifndef WQK
#define WQK 0
#endif
#ifndef WPV
#define WPV 0
#endif
#define STAND_IN_WORK(r, n)                                                                                         \
  do {                                                                                                     \
    acc = _mm512_add_ps(acc, r);                                                                           \
    _Pragma("GCC unroll 64") for (int w = 0; w < (n); ++w) a[w & 7] = _mm512_fmadd_ps(r, a[(w + 3) & 7], a[w & 7]); \
  } while (0)

// Interleaved rounds (at most 16) of nm access modes: pass(mode, ctx) reads `bytes` once (its result is
// kept live). Prints each mode's median GB/s (and best) after `prefix`.
typedef float (*probe_pass)(int mode, void* ctx);
static inline void time_modes(probe_pass pass, void* ctx, const char* const* names, int nm, int rounds, double bytes,
                              const char* prefix) {
  double t[32][16];
  volatile float sink = 0;
  for (int r = 0; r < rounds; ++r)
    for (int m = 0; m < nm; ++m) {
      const double t0 = now();
      sink += pass(m, ctx);
      t[m][r] = now() - t0;
    }
  for (int m = 0; m < nm; ++m) {
    qsort(t[m], rounds, sizeof(double), by_value);
    printf("%s%-24s median %.1f GB/s (best %.1f)\n", prefix, names[m], bytes / t[m][rounds / 2] / 1e9, bytes / t[m][0] / 1e9);
  }
}

// One bf16 weight matrix of a decode step: n rows of k values.
typedef struct {
  int64_t n, k;
  const uint16_t* w;
} Matrix;

// The matrices one Qwen3-0.6B decode step streams, in order: 28 layers of qkv [4096, 1024], o [1024,
// 2048], gate_up [6144, 1024], down [1024, 3072], then lm_head [151936, 1024], each on huge pages and
// filled with bf16 1.0. mats: room for 28 * 4 + 1. Returns how many; *layer_bytes, *head_bytes: the
// bytes of the 112 layer matrices and of the lm_head.
enum { STEP_LAYERS = 28 };
static inline int step_matrices(Matrix* mats, size_t* layer_bytes, size_t* head_bytes) {
  const int64_t shapes[5][2] = {{4096, 1024}, {1024, 2048}, {6144, 1024}, {1024, 3072}, {151936, 1024}};
  int nm = 0;
  *layer_bytes = *head_bytes = 0;
  for (int l = 0; l <= STEP_LAYERS; ++l)
    for (int s = 0; s < (l == STEP_LAYERS ? 1 : 4); ++s) {
      const int i = l == STEP_LAYERS ? 4 : s;
      Matrix m = {shapes[i][0], shapes[i][1], 0};
      const size_t bytes = (size_t)m.n * m.k * 2;
      uint16_t* w = huge_pages(bytes, 0);
      for (size_t j = 0; j < bytes / 2; ++j) w[j] = 0x3f80;
      m.w = w;
      mats[nm++] = m;
      *(l == STEP_LAYERS ? head_bytes : layer_bytes) += bytes;
    }
  return nm;
}
