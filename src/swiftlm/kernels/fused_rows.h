// One token row of each of the Qwen3 layer's elementwise steps, on raw pointers: the code that both
// the fused ops (fused_cpu.cpp) and the decode layers op (decode_cpu.cpp) run, so that the two give
// the same values bit for bit. The rounding rules are in fused_cpu.cpp's header comment.
#pragma once

#include <c10/util/BFloat16.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <cmath>
#include <cstdint>

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
    norm_row(head, is_q ? q_w : k_w, dh, eps, n);
    for (int64_t j = 0; j < dh; ++j) {
      const float v = static_cast<float>(n[j]);
      const float rot = j < half ? -static_cast<float>(n[j + half]) : static_cast<float>(n[j - half]);
      const float a = rd<T>(v * rd<T>(c[j]));
      const float b = rd<T>(rot * rd<T>(s[j]));
      out[j] = static_cast<T>(a + b);
    }
  }
}

#if defined(__AVX512F__)
// e^x for 16 lanes: x = n ln2 + r (ln2 split in two, |r| <= ln2 / 2), e^r by its Taylor series to
// degree 8 (relative error < 1e-8), then scaled by 2^n; x beyond +-88 gives inf / 0 as expf does.
inline __m512 exp_ps(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(100.f)), _mm512_set1_ps(-100.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.4426950408889634f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 p = _mm512_set1_ps(2.48015873015873e-05f);  // 1/8!
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.984126984126984e-04f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.388888888888889e-03f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.333333333333333e-03f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.166666666666667e-02f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.666666666666667e-01f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}
#endif

// s[j] = silu(x[j]) = x / (1 + e^-x) in float32, n values
inline void silu_f32(const float* x, float* s, int64_t n) {
  int64_t j = 0;
#if defined(__AVX512F__)  // the scalar loop's expf calls took ~18 us for the 3072 values of a decode row
  const __m512 one = _mm512_set1_ps(1.f);
  for (; j + 16 <= n; j += 16) {
    const __m512 v = _mm512_loadu_ps(x + j);
    _mm512_storeu_ps(s + j, _mm512_div_ps(v, _mm512_add_ps(one, exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), v)))));
  }
#endif
  for (; j < n; ++j) s[j] = x[j] / (1.f + std::exp(-x[j]));
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
