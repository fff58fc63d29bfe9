// The engine's bf16 GEMV (bf16_gemv.h, as built on this CPU) against weight_stream_patterns.c's loop
// with 2 and 4 rows a group, on one lm_head-sized matrix ([151936, 1024] bf16, 2 MiB huge pages), one
// activation row, 2 threads. Each round times the four after a 256 MiB plain read (which also evicts
// the matrix from the caches and gives the round's memory state), in an order reversing every round;
// 100 rounds. Prints each one's median ratio to the kernel in the rounds whose plain read ran above
// 42 GB/s (fast) and the others (slow), and its share of the plain read's rate.
//
//   T=.venv/lib/python3.11/site-packages/torch
//   g++ -O3 -march=native -fopenmp -fpermissive -std=c++20 -I$T/include -I$T/include/torch/csrc/api/include \
//       benchmarks/probes/gemv_kernel_vs_loop.cpp -o /tmp/gkl -L$T/lib -ltorch_cpu -lc10 -Wl,-rpath,$T/lib
//   OMP_NUM_THREADS=2 OMP_PROC_BIND=close OMP_PLACES=cores /tmp/gkl
#include <algorithm>
#include <vector>

extern "C" {
#include "probe_util.h"
}
#include "../../src/swiftlm/backends/cpu/kernels/bf16_gemv.h"

// weight_stream_patterns.c's loop: C rows a group, one chain a row, prefetch 32 KiB ahead into L2
template <int C>
static void loop(const uint16_t* x, const uint16_t* w, int64_t n, int64_t k, float* out) {
#pragma omp parallel
  {
    const int nt = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t groups = n / C, g0 = groups * id / nt, g1 = groups * (id + 1) / nt;
    const char* pf = (const char*)(w + g0 * C * k) + 32768;
    const char* pf_end = (const char*)(w + g1 * C * k);
    for (int64_t g = g0; g < g1; ++g) {
      const uint16_t* wg = w + g * C * k;
      __m512 acc[C];
      for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
      for (int64_t kk = 0; kk < k; kk += 32) {
        if (pf < pf_end) {
          for (int c = 0; c < C; ++c) _mm_prefetch(pf + 64 * c, _MM_HINT_T1);
          pf += 64 * C;
        }
        const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + kk);
        for (int c = 0; c < C; ++c)
          acc[c] = _mm512_dpbf16_ps(acc[c], xv, (__m512bh)_mm512_loadu_si512(wg + c * k + kk));
      }
      for (int c = 0; c < C; ++c) out[g * C + c] = _mm512_reduce_add_ps(acc[c]);
    }
  }
}

int main() {
  const int64_t n = 151936, k = 1024, rounds = 100;
  const size_t bytes = n * k * 2, plain_floats = (size_t)1 << 26;
  auto* w = (uint16_t*)huge_pages(bytes, 0);
  for (size_t i = 0; i < bytes / 2; ++i) w[i] = 0x3f80;  // bf16 1.0
  auto* x = (uint16_t*)huge_pages(k * 2, 0);
  for (int64_t i = 0; i < k; ++i) x[i] = 0x3f80;
  auto* out = (uint16_t*)huge_pages(n * 2, 0);
  auto* fout = (float*)huge_pages(n * 4, 0);
  auto* big = (float*)huge_pages(plain_floats * 4, 0);
  const char* names[] = {"kernel", "loop C=2", "loop C=4"};
  constexpr int kinds = 3;
  std::vector<double> gbs[kinds], plain[kinds];
  volatile float sink = 0;
  for (int r = 0; r < rounds; ++r)
    for (int j = 0; j < kinds; ++j) {
      const int i = r % 2 ? j : kinds - 1 - j;
      double t = now();
      sink += read_all(big, plain_floats);
      plain[i].push_back(plain_floats * 4.0 / (now() - t) / 1e9);
      t = now();
      if (i == 0) swiftlm_gemv::gemv_into(x, 1, k, w, n, out);
      else if (i == 1) loop<2>(x, w, n, k, fout);
      else loop<4>(x, w, n, k, fout);
      gbs[i].push_back(bytes / (now() - t) / 1e9);
    }
  const auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  for (int i = 0; i < kinds; ++i) {
    std::vector<double> fast, slow, fast_share, slow_share;
    for (int r = 0; r < rounds; ++r) {
      const bool is_fast = plain[0][r] > 42;
      (is_fast ? fast : slow).push_back(gbs[i][r] / gbs[0][r]);
      (is_fast ? fast_share : slow_share).push_back(gbs[i][r] / plain[i][r]);
    }
    printf("%-9s median %.1f GB/s; fast rounds %zu: %.3f of the kernel, %.2f of plain | slow %zu: %.3f, %.2f\n",
           names[i], median(gbs[i]), fast.size(), median(fast), median(fast_share), slow.size(), median(slow),
           median(slow_share));
  }
  return sink == 12345.0f;
}
