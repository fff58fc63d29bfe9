// Why the decode step's layer GEMVs stream slower than its lm_head: 28 layers of qkv [4096, 1024],
// o [1024, 2048], gate_up [6144, 1024], down [1024, 3072] (one OpenMP region a matrix, each thread a
// contiguous range of whole rows read with no software prefetch, as bf16_gemv.h's whole_rows), a
// serial stand-in of SPIN_US us after each matrix (the row steps the decode op runs between them),
// then the lm_head [151936, 1024]. Modes, interleaved: as the engine; each thread, done with its rows,
// requests the first HEAD_KB of its rows of the next matrix (memory is idle during the row steps); the
// same HEAD_KB requested at the start of each matrix instead. Medians of ROUNDS; the layers' GB/s and
// the lm_head's apart.
//
//   gcc -O3 -march=native -fopenmp benchmarks/probes/gemv_chain_probe.c -o /tmp/gcp
//   OMP_NUM_THREADS=2 OMP_PROC_BIND=close OMP_PLACES=cores /tmp/gcp
#include <omp.h>

#include "probe_util.h"

#ifndef SPIN_US
#define SPIN_US 6
#endif
#ifndef HEAD_KB
#define HEAD_KB 32
#endif
enum { ROUNDS = 15, LAYERS = 28, NMODES = 3 };

// thread id's rows of m: [r0, r1), as a static schedule splits them
static void rows_of(const Matrix* m, int id, int nt, int64_t* r0, int64_t* r1) {
  *r0 = m->n * id / nt;
  *r1 = m->n * (id + 1) / nt;
}

static void head(const Matrix* m, int id, int nt) {
  int64_t r0, r1;
  rows_of(m, id, nt, &r0, &r1);
  const char* p = (const char*)(m->w + r0 * m->k);
  const char* end = (const char*)(m->w + r1 * m->k);
  for (int64_t x = 0; x < HEAD_KB * 1024 && p + x < end; x += 64) _mm_prefetch(p + x, _MM_HINT_T1);
}

static void gemv(const Matrix* m, const Matrix* next, const uint16_t* x, float* out, int mode) {
  const int64_t k = m->k;
#pragma omp parallel
  {
    const int nt = omp_get_num_threads(), id = omp_get_thread_num();
    int64_t r0, r1;
    rows_of(m, id, nt, &r0, &r1);
    if (mode == 2) head(m, id, nt);
    for (int64_t r = r0; r < r1; ++r) {
      const uint16_t* w = m->w + r * k;
      __m512 acc = _mm512_setzero_ps();
      for (int64_t kk = 0; kk < k; kk += 32)
        acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(x + kk), (__m512bh)_mm512_loadu_si512(w + kk));
      out[r] = _mm512_reduce_add_ps(acc);
    }
    if (mode == 1 && next) head(next, id, nt);
  }
}

static void spin(double us) {
  const double t0 = now();
  while ((now() - t0) * 1e6 < us) {
  }
}

int main(void) {
  Matrix mats[LAYERS * 4 + 1];
  size_t layer_bytes, head_bytes;
  const int nm = step_matrices(mats, &layer_bytes, &head_bytes);
  uint16_t* x = huge_pages(3072 * 2, 0);
  for (int j = 0; j < 3072; ++j) x[j] = 0x3f80;
  float* out = huge_pages(151936 * 4, 0);
  const char* names[] = {"as the engine", "next head after rows", "own head at start"};
  double lay[NMODES][ROUNDS], lm[NMODES][ROUNDS];
  volatile float sink = 0;
  for (int r = 0; r < ROUNDS; ++r)
    for (int j = 0; j < NMODES; ++j) {
      const int mode = (j + r) % NMODES;  // rotate the order
      double t = now();
      for (int i = 0; i < nm - 1; ++i) {
        gemv(&mats[i], &mats[i + 1], x, out, mode);
        spin(SPIN_US);
      }
      const double t1 = now();
      gemv(&mats[nm - 1], NULL, x, out, mode);
      lm[mode][r] = head_bytes / (now() - t1) / 1e9;
      lay[mode][r] = layer_bytes / (t1 - t - (nm - 1) * SPIN_US * 1e-6) / 1e9;
      sink += out[0];
    }
  printf("SPIN_US %d, HEAD_KB %d; GB/s of the layers (their time less the stand-in) and of the lm_head\n", SPIN_US,
         HEAD_KB);
  for (int m = 0; m < NMODES; ++m) {
    qsort(lay[m], ROUNDS, sizeof(double), by_value);
    qsort(lm[m], ROUNDS, sizeof(double), by_value);
    printf("%-22s layers median %5.1f (%.1f-%.1f)  lm_head median %5.1f (%.1f-%.1f)\n", names[m], lay[m][ROUNDS / 2],
           lay[m][0], lay[m][ROUNDS - 1], lm[m][ROUNDS / 2], lm[m][0], lm[m][ROUNDS - 1]);
  }
  return 0;
}
