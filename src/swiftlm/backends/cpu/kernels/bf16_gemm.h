// A bf16 GEMM for prefill rows on AVX-512 CPUs without AMX (op torch.ops.swiftlm_gemm.gemm, see
// bf16_gemm_cpu.cpp), on either of two arithmetics, whichever the CPU runs faster (the backend times
// both at load, gemm_cpu.py):
//
//   DPBF16  vdpbf16ps: 32 bf16 products summed pairwise into 16 float32 lanes (Zen4 issues it at
//           full rate: 2x the float32 FMA's FLOPs)
//   FMA32   bf16 widened to float32 in registers, float32 FMAs (Intel cores that issue vdpbf16ps at
//           half rate: there the FMA has 2x its FLOPs)
//
//   out[m, n] = bf16( sum_k x[m, k] * w[n, k] )   x [M, K], w [N, K] row-major (nn.Linear's layout)
//
// The weight is read where it lies, in nn.Linear's layout (the tensor the decode GEMV streams; no
// second copy): a microkernel holds MV x 16 activation rows in the lanes of MV vectors and NB weight
// rows as broadcast scalars, MV x NB accumulators in registers, C transposed (lanes over rows m):
//
//   acc[v][j][i] += x[16 v + i, k] * w[j, k]        v < MV, j < NB, i < 16 (lanes)
//
// so each step reads MV vectors of packed activations and NB 4-byte weight values (DPBF16: a pair of
// k; FMA32: one k, widened once per call into a float32 panel of the NB rows). The activations are
// packed once a call, 16 rows at a time, into the lanes' order:
//
//   DPBF16: xp[b][p][i] = (x[16 b + i, 2 p], x[16 b + i, 2 p + 1]) as one 32-bit lane   p < K / 2
//   FMA32:  xp[b][k][i] = float(x[16 b + i, k])                                         k < K
//
// (rows past M are zeros). Calls of up to 24 rows read 32 values of k per vector from both operands
// instead (micro_klanes, on vdpbf16ps: CPUs without AVX512-BF16 send such calls elsewhere, gemm_cpu.py). Both threads work on one matmul: each takes a contiguous range of NB-row
// weight blocks, reads each block from memory once, and runs every activation block over it (the
// block's NB x K weights stay in L1/L2; the packed activations, read once per weight block, in L2/L3).
// Each output is one float32 sum over k ascending per lane (DPBF16: pairs), rounded once to bf16:
// the same values as F.linear to float32 rounding before the final bf16 rounding.
#pragma once

#include <ATen/Parallel.h>

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "common.h"

namespace swiftlm_gemm {

enum Arith : int64_t { DPBF16 = 0, FMA32 = 1 };

constexpr int LANES = 16;
// The microkernel's shape: MV activation vectors (16 rows each) x NB weight rows = 24 accumulators of the
// 32 registers. Measured on a 2-core Zen4 VM (Qwen3-0.6B's linears, 2 threads, builds of each shape in
// one process, interleaved): 3 x 8 at 400-428 GFLOP/s from 32 rows up, 4 x 6 at 385-417, 2 x 12 at
// 341-393 (the most broadcasts a vector); 1 x 24 spills its 24 weight-row pointers (60-120).
constexpr int MV = 3;
constexpr int NB = 8;

constexpr bool has_dpbf16() {
#if defined(__AVX512BF16__)
  return true;
#else
  return false;
#endif
}

using swiftlm_cpu::bf16_to_float;

inline uint32_t load_u32(const uint16_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Calls f(integral_constant<int, A>, integral_constant<int, B>) for the runtime 1 <= a <= MAXA, 1 <= b <= MAXB.
template <typename F, int... As, int... Bs>
inline void with_tile_impl(int a, int b, F&& f, std::integer_sequence<int, As...>, std::integer_sequence<int, Bs...>) {
  const auto for_a = [&](auto A) {
    ((b == Bs + 1 ? (f(A, std::integral_constant<int, Bs + 1>{}), true) : false) || ...);
  };
  ((a == As + 1 ? (for_a(std::integral_constant<int, As + 1>{}), true) : false) || ...);
}
template <int MAXA, int MAXB, typename F>
inline void with_tile(int a, int b, F&& f) {
  with_tile_impl(a, b, f, std::make_integer_sequence<int, MAXA>{}, std::make_integer_sequence<int, MAXB>{});
}

// c[j][v * 16 + i] = the (V x 16) x J block's sums; xp: the V packed activation blocks, `stride`
// 32-bit lanes apart; w: the J weight rows, k values apart; steps: K / 2 pairs.
template <int V, int J>
inline void micro_dpbf16(const uint32_t* xp, int64_t stride, const uint16_t* w, int64_t k, float* c) {
#if defined(__AVX512BF16__)
  __m512 acc[V][J];
  for (int v = 0; v < V; ++v)
    for (int j = 0; j < J; ++j) acc[v][j] = _mm512_setzero_ps();
  const int64_t pairs = k / 2;
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh a[V];
    for (int v = 0; v < V; ++v) a[v] = (__m512bh)_mm512_loadu_si512(xp + v * stride + p * LANES);
    for (int j = 0; j < J; ++j) {
      const __m512bh b = (__m512bh)_mm512_set1_epi32(static_cast<int>(load_u32(w + j * k + 2 * p)));
      for (int v = 0; v < V; ++v) acc[v][j] = _mm512_dpbf16_ps(acc[v][j], a[v], b);
    }
  }
  for (int j = 0; j < J; ++j)
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(c + j * (MV * LANES) + v * LANES, acc[v][j]);
#else
  (void)xp, (void)stride, (void)w, (void)k, (void)c;
#endif
}

#if defined(__AVX512F__)
// out[i] = the sum of the 16 lanes of a[i], i < n: four vectors at a time through one tree of shuffles
// (15 instructions for four sums, where _mm512_reduce_add_ps takes ~9 for one), the rest one by one.
// Each sum is added in the same order wherever its vector sits: (lanes i + i+8), then the two 4-lane
// halves of that, then lanes 0+2 and 1+3, then those two.
inline void sum_lanes(const __m512* a, int n, float* out) {
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m512 t0 = _mm512_add_ps(_mm512_shuffle_f32x4(a[i], a[i + 1], 0x44), _mm512_shuffle_f32x4(a[i], a[i + 1], 0xEE));
    const __m512 t1 =
        _mm512_add_ps(_mm512_shuffle_f32x4(a[i + 2], a[i + 3], 0x44), _mm512_shuffle_f32x4(a[i + 2], a[i + 3], 0xEE));
    // u: four 128-bit chunks, chunk c the 4 partial sums of a[i + c]
    const __m512 u = _mm512_add_ps(_mm512_shuffle_f32x4(t0, t1, 0x88), _mm512_shuffle_f32x4(t0, t1, 0xDD));
    const __m512 x = _mm512_add_ps(u, _mm512_shuffle_ps(u, u, 0x4E));  // [p0 + p2, p1 + p3, ...] in each chunk
    const __m512 y = _mm512_add_ps(x, _mm512_shuffle_ps(x, x, 0xB1));  // the chunk's sum in each of its lanes
    // lanes 0, 4, 8, 12 to the first four (a compressing store is microcode on Zen4: ~2x slower here)
    const __m512 sums = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), y);
    _mm_storeu_ps(out + i, _mm512_castps512_ps128(sums));
  }
  for (; i < n; ++i) {
    alignas(64) float one[4];
    const __m512 t = _mm512_add_ps(a[i], _mm512_shuffle_f32x4(a[i], a[i], 0xEE));
    const __m512 u = _mm512_add_ps(t, _mm512_shuffle_f32x4(t, t, 0xB1));
    const __m512 x = _mm512_add_ps(u, _mm512_shuffle_ps(u, u, 0x4E));
    const __m512 y = _mm512_add_ps(x, _mm512_shuffle_ps(x, x, 0xB1));
    _mm_store_ps(one, _mm512_castps512_ps128(y));
    out[i] = one[0];
  }
}
#endif

// Lanes over k instead (small calls, up to KLANES_UP_TO rows, where the broadcast form has one activation
// vector and a broadcast per product): R activation rows x C weight rows, each step 32 values of k of each,
// R + C vector loads for R x C vdpbf16ps, the 16 lanes summed once at the end (c[r][c], stride C).
template <int R, int C>
inline void micro_klanes(const uint16_t* x, const uint16_t* w, int64_t k, float* c) {
#if defined(__AVX512BF16__)
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < C; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int64_t kk = 0; kk < k; kk += 32) {
    __m512bh wv[C];
    for (int j = 0; j < C; ++j) wv[j] = (__m512bh)_mm512_loadu_si512(w + j * k + kk);
    for (int r = 0; r < R; ++r) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + r * k + kk);
      for (int j = 0; j < C; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], xv, wv[j]);
    }
  }
  sum_lanes(&acc[0][0], R * C, c);
#else
  (void)x, (void)w, (void)k, (void)c;
#endif
}

constexpr int KR = 4, KC = 6;  // micro_klanes' tile: 24 accumulators, 6 weight vectors, 1 activation
// Calls of up to this many rows take micro_klanes (on vdpbf16ps whichever arithmetic the larger calls
// take: FMA32 widens every weight once a call, 23-60 GFLOP/s at 8-16 rows): there the broadcast form has a single
// activation vector, one broadcast per vdpbf16ps, and ran at 160-180 GFLOP/s at 16 rows on the Zen4 VM
// where this form ran at 290-350; from 32 rows the broadcast form is faster (385-407 against 287-347),
// at 17-24 rows this one (279-357 against 203-308).
constexpr int64_t KLANES_UP_TO = 24;

// out[m, n] through micro_klanes: threads over blocks of KC weight rows, KR activation rows at a time
inline void gemm_klanes(const uint16_t* x, int64_t m, int64_t k, const uint16_t* w_all, int64_t n, uint16_t* out) {
  const int64_t wblocks = (n + KC - 1) / KC;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / (KC * k));
  at::parallel_for(0, wblocks, grain, [&](int64_t q0, int64_t q1) {
    float c[KR * KC];
    for (int64_t q = q0; q < q1; ++q) {
      const int64_t n0 = q * KC;
      const int cols = int(std::min<int64_t>(KC, n - n0));
      for (int64_t r0 = 0; r0 < m; r0 += KR) {
        const int rows = int(std::min<int64_t>(KR, m - r0));
        const auto run = [&](auto R, auto C) { micro_klanes<R, C>(x + r0 * k, w_all + n0 * k, k, c); };
        with_tile<KR, KC>(rows, cols, run);
        for (int r = 0; r < rows; ++r)
          for (int j = 0; j < cols; ++j) out[(r0 + r) * n + n0 + j] = swiftlm_cpu::bf16_bits(c[r * cols + j]);
      }
    }
  });
}

// The same block in float32: xp packed [k][16] floats per block, wp the J rows widened to float32
// [k][NB] (a panel per weight block).
template <int V, int J>
inline void micro_fma32(const float* xp, int64_t stride, const float* wp, int64_t k, float* c) {
  __m512 acc[V][J];
  for (int v = 0; v < V; ++v)
    for (int j = 0; j < J; ++j) acc[v][j] = _mm512_setzero_ps();
  for (int64_t kk = 0; kk < k; ++kk) {
    __m512 a[V];
    for (int v = 0; v < V; ++v) a[v] = _mm512_loadu_ps(xp + v * stride + kk * LANES);
    for (int j = 0; j < J; ++j) {
      const __m512 b = _mm512_set1_ps(wp[kk * NB + j]);
      for (int v = 0; v < V; ++v) acc[v][j] = _mm512_fmadd_ps(a[v], b, acc[v][j]);
    }
  }
  for (int j = 0; j < J; ++j)
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(c + j * (MV * LANES) + v * LANES, acc[v][j]);
}

// The activations packed for `arith` into xp (see the header comment); blocks of 16 rows, in parallel.
inline void pack_activations(const uint16_t* x, int64_t m, int64_t k, Arith arith, void* xp) {
  const int64_t blocks = (m + LANES - 1) / LANES;
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int rows = int(std::min<int64_t>(LANES, m - b * LANES));
      if (arith == DPBF16) {
        uint32_t* dst = static_cast<uint32_t*>(xp) + b * (k / 2) * LANES;
        for (int i = 0; i < LANES; ++i)
          for (int64_t p = 0; p < k / 2; ++p)
            dst[p * LANES + i] = i < rows ? load_u32(x + (b * LANES + i) * k + 2 * p) : 0u;
      } else {
        float* dst = static_cast<float*>(xp) + b * k * LANES;
        for (int i = 0; i < LANES; ++i)
          for (int64_t kk = 0; kk < k; ++kk)
            dst[kk * LANES + i] = i < rows ? bf16_to_float(x[(b * LANES + i) * k + kk]) : 0.0f;
      }
    }
  });
}

// out[m, n] = bf16(x[m, :] . w[n, :]); k % 32 == 0 (as the GEMV's callers guarantee).
inline void gemm_into(const uint16_t* x, int64_t m, int64_t k, const uint16_t* w_all, int64_t n, uint16_t* out,
                      Arith arith) {
  if (m == 0 || n == 0) return;
#if defined(__AVX512BF16__)
  if (m <= KLANES_UP_TO) {  // whichever arithmetic the larger calls take: FMA32 would widen every weight
    gemm_klanes(x, m, k, w_all, n, out);
    return;
  }
#endif
  const int64_t blocks = (m + LANES - 1) / LANES;
  // the packed activations, kept by the calling thread (grow-only): 64 bytes per row and 32 values of k
  thread_local std::vector<float> xp_buf;
  const size_t need = size_t(blocks * LANES) * size_t(arith == DPBF16 ? k / 2 : k);
  if (xp_buf.size() < need) xp_buf.resize(need);
  float* xp = xp_buf.data();  // (a thread_local named inside the lambda would be each worker's own)
  pack_activations(x, m, k, arith, xp);
  const int64_t stride = arith == DPBF16 ? (k / 2) * LANES : k * LANES;  // lanes between packed blocks
  const int64_t groups = (blocks + MV - 1) / MV;
  const int64_t wblocks = (n + NB - 1) / NB;
  // grain: ~128 KB of weights a task at least, so that small layers do not pay for two threads
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / (NB * k));
  at::parallel_for(0, wblocks, grain, [&](int64_t q0, int64_t q1) {
    alignas(64) float c[NB * MV * LANES];
    std::vector<float> wp(arith == FMA32 ? size_t(k * NB) : 0);
    for (int64_t q = q0; q < q1; ++q) {
      const int64_t n0 = q * NB;
      const int cols = int(std::min<int64_t>(NB, n - n0));
      const uint16_t* w = w_all + n0 * k;
      if (arith == FMA32)  // the block's rows widened once: wp[kk][j] = w[j, kk]
        for (int j = 0; j < NB; ++j)
          for (int64_t kk = 0; kk < k; ++kk) wp[kk * NB + j] = j < cols ? bf16_to_float(w[j * k + kk]) : 0.0f;
      // the activation blocks in `groups` runs of near-equal size (MV or MV - 1 blocks, never a lone
      // block beside full runs: one vector a microkernel runs at half the rate)
      for (int64_t g = 0, b = 0; g < groups; ++g) {
        const int v = int(blocks / groups + (g < blocks % groups ? 1 : 0));
        with_tile<MV, NB>(v, cols, [&](auto V, auto J) {
          if (arith == DPBF16)
            micro_dpbf16<V, J>(reinterpret_cast<const uint32_t*>(xp) + b * stride, stride, w, k, c);
          else
            micro_fma32<V, J>(xp + b * stride, stride, wp.data(), k, c);
        });
        const int64_t rows = std::min<int64_t>(int64_t(v) * LANES, m - b * LANES);
        for (int64_t r = 0; r < rows; ++r) {
          uint16_t* o = out + (b * LANES + r) * n + n0;
          for (int j = 0; j < cols; ++j) o[j] = swiftlm_cpu::bf16_bits(c[j * (MV * LANES) + r]);
        }
        b += v;
      }
    }
  });
}

}  // namespace swiftlm_gemm
