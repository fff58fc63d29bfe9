// One token row of each of the Qwen3 layer's elementwise steps, on raw pointers: the code that both
// the fused ops (fused_cpu.cpp) and the decode layers op (decode_cpu.cpp) run, so that the two give
// the same values bit for bit. The rounding rules are in fused_cpu.cpp's header comment.
#pragma once

#include <c10/util/BFloat16.h>

#include <cmath>
#include <cstdint>

#include "common.h"  // exp_ps, 16-lane loads and stores

namespace swiftlm_rows {

template <typename T>
inline float rd(float v) { return static_cast<float>(static_cast<T>(v)); }  // round to T and back

// One row: out = w * dtype(x * rsqrt(mean(x^2) + eps)), written as T.
template <typename T>
inline void norm_row(const T* x, const T* w, int64_t d, float eps, T* out) {
  float ss = 0.f;
  for (int64_t i = 0; i < d; ++i) {
    float v = static_cast<float>(x[i]);
    ss += v * v;
  }
  const float r = 1.f / std::sqrt(ss / static_cast<float>(d) + eps);
  for (int64_t i = 0; i < d; ++i) out[i] = static_cast<T>(static_cast<float>(w[i]) * rd<T>(static_cast<float>(x[i]) * r));
}

// residual = dtype(residual + delta) in place, then out = norm_row(residual)
template <typename T>
inline void add_norm_row(T* row, const T* delta, const T* w, int64_t d, float eps, T* out) {
  for (int64_t i = 0; i < d; ++i) row[i] = static_cast<T>(static_cast<float>(row[i]) + static_cast<float>(delta[i]));
  norm_row(row, w, d, eps, out);
}

// One token: every q and k head of its qkv row normed, then rotated at this token's position (c, s:
// that position's rows of the float32 cos and sin tables). n: dh values of scratch.
template <typename T>
inline void qk_norm_rope_row(const T* qkv_row, const T* q_w, const T* k_w, const float* c, const float* s, int64_t hq,
                             int64_t hk, int64_t dh, float eps, T* q_out, T* k_out, T* n) {
  const int64_t half = dh / 2;
  for (int64_t h = 0; h < hq + hk; ++h) {
    const bool is_q = h < hq;
    const T* head = qkv_row + h * dh;
    T* out = is_q ? q_out + h * dh : k_out + (h - hq) * dh;
    if (q_w == nullptr) {  // no q/k norm (Llama, Qwen2): rotate the head as it is
      for (int64_t j = 0; j < dh; ++j) n[j] = head[j];
    } else {
      norm_row(head, is_q ? q_w : k_w, dh, eps, n);
    }
    for (int64_t j = 0; j < dh; ++j) {
      const float v = static_cast<float>(n[j]);
      const float rot = j < half ? -static_cast<float>(n[j + half]) : static_cast<float>(n[j - half]);
      const float a = rd<T>(v * rd<T>(c[j]));
      const float b = rd<T>(rot * rd<T>(s[j]));
      out[j] = static_cast<T>(a + b);
    }
  }
}

// s[j] = silu(x[j]) = x / (1 + e^-x) in float32, n values
inline void silu_f32(const float* x, float* s, int64_t n) {
#if defined(__AVX512F__)  // the scalar loop's expf calls took ~18 us for the 3072 values of a decode row
  const __m512 one = _mm512_set1_ps(1.f);
  for (int64_t j = 0; j < n; j += 16) {  // the last pass takes the n % 16 values left, if any
    const __mmask16 lanes = swiftlm_cpu::first_lanes(n - j);
    const __m512 v = swiftlm_cpu::load16(x + j, lanes);
    const __m512 e = swiftlm_cpu::exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), v));
    swiftlm_cpu::store16(s + j, _mm512_div_ps(v, _mm512_add_ps(one, e)), lanes);
  }
#elif defined(__AVX2__) && defined(__FMA__)
  const __m256 one = _mm256_set1_ps(1.f);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 v = _mm256_loadu_ps(x + j);
    const __m256 e = swiftlm_cpu::exp_ps8(_mm256_sub_ps(_mm256_setzero_ps(), v));
    _mm256_storeu_ps(s + j, _mm256_div_ps(v, _mm256_add_ps(one, e)));
  }
  for (; j < n; ++j) s[j] = x[j] / (1.f + std::exp(-x[j]));  // the n % 8 values left
#else
  for (int64_t j = 0; j < n; ++j) s[j] = x[j] / (1.f + std::exp(-x[j]));
#endif
}

// One row: out[j] = dtype(dtype(silu(gate[j])) * up[j]), gate = gate_up[0, inter), up = gate_up[inter, 2 inter).
// g, silu: inter floats of scratch each.
template <typename T>
inline void silu_mul_row(const T* gate_up, int64_t inter, T* out, float* g, float* silu) {
  const T* u = gate_up + inter;
  for (int64_t j = 0; j < inter; ++j) g[j] = static_cast<float>(gate_up[j]);
  silu_f32(g, silu, inter);
  for (int64_t j = 0; j < inter; ++j) out[j] = static_cast<T>(rd<T>(silu[j]) * static_cast<float>(u[j]));
}

}  // namespace swiftlm_rows
