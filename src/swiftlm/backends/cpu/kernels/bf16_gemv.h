// The bf16 GEMV kernel of bf16_linear_cpu.cpp (its header comment has the design and the
// measurements), on raw pointers: shared with the decode layers op (decode_cpu.cpp), which calls it
// directly into buffers it allocates once per step.
#pragma once

#include <ATen/Parallel.h>

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common.h"  // bf16_bits

namespace swiftlm_gemv {

constexpr int64_t KB = 32;        // bf16 values per vector
constexpr int RN = 2;             // weight rows (output channels) per group
constexpr int MR = 4;             // activation rows per pass over a group
// Software prefetches: bytes ahead of the data being read, in memory order, and the cache they fill.
// Tuned per machine and keyed on its instruction sets: on the AMX Xeon VM, 4 KiB into L1 (8 KiB was
// slower); on a Zen4 VM (no AMX), 32 KiB into L2: decode 1.14x over 4 KiB into L1, 1.13x with 16 KiB
// (three builds in one interleaved run, Qwen3-0.6B shape, bf16, 1 request).
#if defined(__AMX_TILE__)
constexpr int64_t PREFETCH = 4096;
constexpr _mm_hint PREFETCH_HINT = _MM_HINT_T0;
#else
constexpr int64_t PREFETCH = 32768;
constexpr _mm_hint PREFETCH_HINT = _MM_HINT_T1;
#endif
// Up to this many activation rows, each weight row is read whole, one after the other, with no
// software prefetch (whole_rows): a thread's range is then one sequential stream, which the
// hardware prefetchers follow on their own. On a Zen4 VM (AVX512-BF16, no AMX), in one process
// alternating per request: batch-1 decode 1.29x (28.4 -> 36.5 tok/s; the layers' GEMVs 39.6 -> 49.2
// GB/s), the lm_head alone 1.30x with 1 row, 1.09x with 2, 0.91x with 4 and 0.60x with 8 (BENCHMARKS.md).
// Not measured on the AMX Xeon nor on AVX2-only CPUs, which keep the grouped reads.
#if defined(__AVX512BF16__) && !defined(__AMX_TILE__)
constexpr int64_t WHOLE_ROWS_UP_TO = 2;  // whole_rows takes 1 or 2
#else
constexpr int64_t WHOLE_ROWS_UP_TO = 0;
#endif

// R activation rows x C weight rows, full K (a multiple of 32). The group's C rows are C * K
// contiguous values, read as C interleaved streams; ``pf`` (when not null) walks the thread's
// range linearly PREFETCH bytes ahead of the data consumed, C lines per step of 32 columns, so
// the prefetches follow memory order whatever the row length (next rows, next group).
//
// AVX512-BF16: vdpbf16ps, 32 products into 16 lanes. AVX2 + FMA (CPUs without it): each 16 bf16
// values are read as 8 32-bit lanes and widened in place, the even values by a shift (<< 16) and
// the odd ones by a mask (bits 16..31), then multiplied and added into 8 float32 lanes with FMA.
// Products of bf16 values are exact in float32 either way; only the order of the sums differs.
template <int R, int C>
inline void block(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t k, uint16_t* out, int64_t ldo,
                  const char** pf, const char* pf_end) {
#if defined(__AVX512BF16__)
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
#else
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  // a 16-value half of a 32-value step, widened: [0] the even values, [1] the odd ones
  const auto widen = [high](const uint16_t* p, __m256* v) {
    const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    v[0] = _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
    v[1] = _mm256_castsi256_ps(_mm256_and_si256(u, high));
  };
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
#endif
  for (int64_t kk = 0; kk < k; kk += KB) {
    if (pf != nullptr && *pf < pf_end) {
      for (int c = 0; c < C; ++c) _mm_prefetch(*pf + 64 * c, PREFETCH_HINT);
      *pf += 64 * C;
    }
#if defined(__AVX512BF16__)
    __m512bh wv[C];
    for (int c = 0; c < C; ++c) wv[c] = (__m512bh)_mm512_loadu_si512(w + c * k + kk);
    for (int r = 0; r < R; ++r) {
      __m512bh xv = (__m512bh)_mm512_loadu_si512(x + r * ldx + kk);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, wv[c]);
    }
#else
    for (int64_t half = 0; half < KB; half += 16) {
      __m256 wv[C][2];
      for (int c = 0; c < C; ++c) widen(w + c * k + kk + half, wv[c]);
      for (int r = 0; r < R; ++r) {
        __m256 xv[2];
        widen(x + r * ldx + kk + half, xv);
        for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(xv[1], wv[c][1], _mm256_fmadd_ps(xv[0], wv[c][0], acc[r][c]));
      }
    }
#endif
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
#if defined(__AVX512BF16__)
      const float sum = _mm512_reduce_add_ps(acc[r][c]);
#else
      const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc[r][c]), _mm256_extractf128_ps(acc[r][c], 1));
      const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
      const float sum = _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
#endif
      out[r * ldo + c] = swiftlm_cpu::bf16_bits(sum);
    }
}

// Every activation row against one group: passes of MR rows; only the first pass prefetches.
template <int C>
inline void rows_over_group(const uint16_t* x, int64_t m, int64_t k, const uint16_t* w, uint16_t* out, int64_t n,
                            const char** pf, const char* pf_end) {
  int64_t r = 0;
  for (; r + MR <= m; r += MR) {
    block<MR, C>(x + r * k, k, w, k, out + r * n, n, r == 0 ? pf : nullptr, pf_end);
  }
  const char** first = r == 0 ? pf : nullptr;
  switch (m - r) {  // the last 0 .. MR - 1 rows in one pass
    case 3: block<3, C>(x + r * k, k, w, k, out + r * n, n, first, pf_end); break;
    case 2: block<2, C>(x + r * k, k, w, k, out + r * n, n, first, pf_end); break;
    case 1: block<1, C>(x + r * k, k, w, k, out + r * n, n, first, pf_end); break;
    default: break;
  }
}

// out[m, n] for m <= WHOLE_ROWS_UP_TO: every weight row read whole against the m activation rows, in
// the same order of sums as the grouped reads (one chain per output, K ascending), so the results are
// the same bits either way. Its own loop rather than block<R, 1>: 1.06-1.13x faster in batch-1 decode.
inline void whole_rows(const uint16_t* x, int64_t m, int64_t k, const uint16_t* w_all, int64_t n, uint16_t* out) {
#if defined(__AVX512BF16__)
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / k);  // ~128 KB of weights per task at least
  at::parallel_for(0, n, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const uint16_t* w = w_all + r * k;
      __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
      if (m == 1) {
        for (int64_t kk = 0; kk < k; kk += KB)
          acc0 = _mm512_dpbf16_ps(acc0, (__m512bh)_mm512_loadu_si512(x + kk), (__m512bh)_mm512_loadu_si512(w + kk));
      } else {  // two activation rows against the same weights
        for (int64_t kk = 0; kk < k; kk += KB) {
          const __m512bh wv = (__m512bh)_mm512_loadu_si512(w + kk);
          acc0 = _mm512_dpbf16_ps(acc0, (__m512bh)_mm512_loadu_si512(x + kk), wv);
          acc1 = _mm512_dpbf16_ps(acc1, (__m512bh)_mm512_loadu_si512(x + k + kk), wv);
        }
        out[n + r] = swiftlm_cpu::bf16_bits(_mm512_reduce_add_ps(acc1));
      }
      out[r] = swiftlm_cpu::bf16_bits(_mm512_reduce_add_ps(acc0));
    }
  });
#else
  (void)x, (void)m, (void)k, (void)w_all, (void)n, (void)out;
#endif
}

// Rows per pass over the weights when a call has many (CPUs whose dense bf16 matmul is slow send
// prefill rows here too, see limits.py): the block's activations stay in L2 while every weight
// group streams past them once.
constexpr int64_t ROW_BLOCK = 64;

#if !defined(__AVX512BF16__)
// Many rows on CPUs without AVX512-BF16 (prefill chunks: oneDNN has no bf16 matmul on AVX2 CPUs): a
// float32 GEMM. The activations are widened to float32 once a call; each panel of GN output channels
// is widened and transposed once into [k][GN] floats (64 KB at k = 1024, in L2), then every block of
// GM rows runs over it with GM x 2 accumulators in registers: per k, 2 panel loads, GM broadcasts and
// 2 GM FMAs, where the GEMV's passes widen both operands for every 4 rows x 2 channels. Each output is
// one float32 chain over k ascending (the GEMV's are 8 partial sums), rounded once to bf16: a row's
// bits may differ between calls of fewer and of GEMM_MIN_ROWS or more rows, as they already do where
// oneDNN takes the larger calls. Where the GEMM starts: at few rows its per-panel packing is paid for
// by few blocks, and the GEMV's passes are faster. On a 2-core Zen3 VM (AVX2), the four Qwen3-0.6B
// linears summed, GFLOP/s GEMM against GEMV, two builds interleaved in one process, medians of 5:
// 16 rows 63 / 85, 20: 67 / 84, 24: 74 / 82, 32: 70 / 75, 40: 89 / 89, 48: 94 / 88 (BENCHMARKS.md).
#ifndef SWIFTLM_GEMM_MIN_ROWS  // a build for A/B runs may move it (-DSWIFTLM_GEMM_MIN_ROWS=n)
#define SWIFTLM_GEMM_MIN_ROWS 40
#endif
constexpr int64_t GEMM_MIN_ROWS = SWIFTLM_GEMM_MIN_ROWS;
constexpr int GM = 6;   // rows of a register block: 12 accumulators, 2 panel vectors, a broadcast
constexpr int GN = 16;  // output channels of a panel: two vectors of 8

using swiftlm_cpu::bf16_to_float;

// bp[kk][j] = w[j][kk] as float32 for the panel's `cols` rows (j < GN, rows k values apart; rows past
// cols are zeros), kk < kc (a multiple of 8)
inline void pack_panel(const uint16_t* w, int64_t k, int64_t kc, int cols, float* bp) {
  for (int j0 = 0; j0 < GN; j0 += 8) {
    for (int64_t kk = 0; kk < kc; kk += 8) {
      __m256 r[8];
      for (int j = 0; j < 8; ++j) r[j] = j0 + j < cols ? swiftlm_cpu::load8(w + (j0 + j) * k + kk) : _mm256_setzero_ps();
      swiftlm_cpu::transpose8(r);
      for (int i = 0; i < 8; ++i) _mm256_storeu_ps(bp + (kk + i) * GN + j0, r[i]);
    }
  }
}

// c[r][0 .. GN) (+)= a_r . panel over kc values of k, for the GM rows of a block packed [k][GM] (rows
// past m zeros): each k's GM broadcasts read one 24-byte run (rows k floats apart would sit 4 KB apart
// at k = 1024, in one L1 set), and the panel's kc x GN floats (16 KB) stay in L1 across the blocks
template <bool kFirst>
inline void gemm_block(const float* ap, int64_t kc, const float* bp, float* c) {
  __m256 acc[GM][2];
  for (int r = 0; r < GM; ++r) {
    acc[r][0] = kFirst ? _mm256_setzero_ps() : _mm256_loadu_ps(c + r * GN);
    acc[r][1] = kFirst ? _mm256_setzero_ps() : _mm256_loadu_ps(c + r * GN + 8);
  }
  for (int64_t kk = 0; kk < kc; ++kk) {
    const __m256 b0 = _mm256_loadu_ps(bp + kk * GN), b1 = _mm256_loadu_ps(bp + kk * GN + 8);
#pragma GCC unroll 6
    for (int r = 0; r < GM; ++r) {
      const __m256 s = _mm256_broadcast_ss(ap + kk * GM + r);
      acc[r][0] = _mm256_fmadd_ps(s, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(s, b1, acc[r][1]);
    }
  }
  for (int r = 0; r < GM; ++r) {
    _mm256_storeu_ps(c + r * GN, acc[r][0]);
    _mm256_storeu_ps(c + r * GN + 8, acc[r][1]);
  }
}

constexpr int64_t GEMM_KC = 256;  // k values a panel chunk holds: 16 KB of floats

inline void gemm_into(const uint16_t* x, int64_t m, int64_t k, const uint16_t* w_all, int64_t n, uint16_t* out) {
  // the activations widened to float32 once, in blocks of GM rows packed [k][GM] (the last block's
  // missing rows zeros), kept by the calling thread (grow-only)
  thread_local std::vector<float> a_buf;
  const int64_t blocks = (m + GM - 1) / GM;
  if (a_buf.size() < size_t(blocks * k * GM)) a_buf.resize(size_t(blocks * k * GM));
  float* a = a_buf.data();
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      for (int r = 0; r < GM; ++r) {
        const int64_t row = b * GM + r;
        float* dst = a + b * k * GM + r;
        for (int64_t kk = 0; kk < k; ++kk) dst[kk * GM] = row < m ? bf16_to_float(x[row * k + kk]) : 0.0f;
      }
  });
  const int64_t panels = (n + GN - 1) / GN;
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    std::vector<float> bp(size_t(GEMM_KC * GN)), c(size_t(blocks * GM * GN));
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t n0 = p * GN;
      const int cols = int(std::min<int64_t>(GN, n - n0));
      for (int64_t k0 = 0; k0 < k; k0 += GEMM_KC) {  // k is a multiple of 32 (KB)
        const int64_t kc = std::min(GEMM_KC, k - k0);
        pack_panel(w_all + n0 * k + k0, k, kc, cols, bp.data());
        for (int64_t b = 0; b < blocks; ++b) {
          const float* ap = a + b * k * GM + k0 * GM;
          if (k0 == 0)
            gemm_block<true>(ap, kc, bp.data(), c.data() + b * GM * GN);
          else
            gemm_block<false>(ap, kc, bp.data(), c.data() + b * GM * GN);
        }
      }
      for (int64_t r = 0; r < m; ++r)  // float32 sums rounded once to bf16
        for (int j = 0; j < cols; ++j) out[r * n + n0 + j] = swiftlm_cpu::bf16_bits(c[r * GN + j]);
    }
  });
}
#endif

// out[m, n] = bf16(x[m, :] . w[n, :]) for x [m, k], w [n, k] row-major bf16 bits, out [m, n]; k % 32 == 0.
inline void gemv_into(const uint16_t* x, int64_t m, int64_t k, const uint16_t* w_all, int64_t n, uint16_t* out) {
  if (m == 0 || n == 0) return;
#if !defined(__AVX512BF16__)
  if (m >= GEMM_MIN_ROWS) {
    gemm_into(x, m, k, w_all, n, out);
    return;
  }
#endif
  if (m > ROW_BLOCK) {  // one pass over the weights per block of rows
    for (int64_t r0 = 0; r0 < m; r0 += ROW_BLOCK)
      gemv_into(x + r0 * k, std::min(ROW_BLOCK, m - r0), k, w_all, n, out + r0 * n);
    return;
  }
  if (m <= WHOLE_ROWS_UP_TO) {
    whole_rows(x, m, k, w_all, n, out);
    return;
  }
  const int64_t groups = (n + RN - 1) / RN;  // the last group may hold fewer than RN rows
  // grain: ~64 KB of weights per task at least, so that small layers do not pay for many threads
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / (RN * k));
  at::parallel_for(0, groups, grain, [&](int64_t g0, int64_t g1) {
    // this thread's weights: rows g0 * RN .. min(g1 * RN, n), one contiguous byte range
    const char* start = reinterpret_cast<const char*>(w_all + g0 * RN * k);
    const char* pf_end = reinterpret_cast<const char*>(w_all + std::min(g1 * RN, n) * k);
    const char* pf = start + PREFETCH;
    // its first PREFETCH bytes, which the walk ahead never covers, requested at once: a decode step
    // runs ~200 of these GEMVs, and each thread's start was read by demand misses alone (Zen4 VM,
    // batch-1 decode: 1.05-1.06x in three interleaved runs)
    for (const char* p = start; p < std::min(pf, pf_end); p += 64) _mm_prefetch(p, PREFETCH_HINT);
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t n0 = g * RN, rows = std::min<int64_t>(RN, n - n0);
      const uint16_t* w = w_all + n0 * k;
      uint16_t* o = out + n0;
      if (rows == RN) {
        rows_over_group<RN>(x, m, k, w, o, n, &pf, pf_end);
      } else {
        for (int64_t i = 0; i < rows; ++i) rows_over_group<1>(x, m, k, w + i * k, o + i, n, nullptr, pf_end);
      }
    }
  });
}

}  // namespace swiftlm_gemv
