// A row's scans shared by the greedy pick (fused_cpu.cpp) and the token draw (token_draw_cpu.cpp):
// its largest value with a finiteness check in one pass (AVX2 lanes where the CPU has them), and
// the first column holding a value. Includes common.h (AVX2 intrinsics) itself.
#pragma once

#include "common.h"

#include <cstdint>
#include <limits>

namespace swiftlm_rows_scan {

constexpr float kInf = std::numeric_limits<float>::infinity();

// The row's largest value (NaN never wins) and whether every value is finite (z sums x * 0: 0 for
// finite x, NaN for an infinite or NaN one); y = x / t into `scaled` when t > 0.
inline float scan_row(const float* x, int64_t v, float t, float* scaled, bool* finite) {
  int64_t j = 0;
  float mx = -kInf, zs = 0.0f;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 m0 = _mm256_set1_ps(-kInf), m1 = m0, z0 = _mm256_setzero_ps(), z1 = z0;
  const __m256 zero = _mm256_setzero_ps(), tv = _mm256_set1_ps(t);
  for (; j + 16 <= v; j += 16) {
    __m256 a = _mm256_loadu_ps(x + j), b = _mm256_loadu_ps(x + j + 8);
    z0 = _mm256_add_ps(z0, _mm256_mul_ps(a, zero));
    z1 = _mm256_add_ps(z1, _mm256_mul_ps(b, zero));
    if (scaled != nullptr) {
      a = _mm256_div_ps(a, tv), b = _mm256_div_ps(b, tv);
      _mm256_storeu_ps(scaled + j, a), _mm256_storeu_ps(scaled + j + 8, b);
    }
    m0 = _mm256_max_ps(a, m0), m1 = _mm256_max_ps(b, m1);  // max_ps(a, m): m where a is NaN
  }
  alignas(32) float lanes[8], zl[8];
  _mm256_store_ps(lanes, _mm256_max_ps(m0, m1));
  _mm256_store_ps(zl, _mm256_add_ps(z0, z1));
  for (int k = 0; k < 8; ++k) mx = lanes[k] > mx ? lanes[k] : mx, zs += zl[k];
#endif
  for (; j < v; ++j) {
    float y = x[j];
    zs += y * 0.0f;
    if (scaled != nullptr) scaled[j] = y = y / t;
    mx = y > mx ? y : mx;
  }
  *finite = zs == 0.0f;
  return mx;
}

// The first j with y[j] == target, or -1.
inline int64_t find_value(const float* y, int64_t v, float target) {
  int64_t j = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 tv = _mm256_set1_ps(target);
  for (; j + 8 <= v; j += 8) {
    const int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(y + j), tv, _CMP_EQ_OQ));
    if (mask != 0) return j + __builtin_ctz(static_cast<unsigned>(mask));
  }
#endif
  for (; j < v; ++j)
    if (y[j] == target) return j;
  return -1;
}

}  // namespace swiftlm_rows_scan
