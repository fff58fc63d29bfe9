// The small KV cache's 8-bit rows (backends/kv_quant.py is the reference): one float32 scale per
// (token, head), values int8 (round(x / s), s = amax / 127), float8 e4m3 (s = amax / 448) or float8
// e5m2 (s = amax / 57344); a row of zeros has s = 1.
//
// Reading: 16 stored values -> 16 floats of value / s in one or two instructions (AVX-512; AVX2
// CPUs: 8 values -> 8 floats, widen8, the same operations on half the lanes, vcvtph2ps from F16C). e5m2 is the high
// byte of an IEEE half (shift, then vcvtph2ps). e4m3 moved into a half's bit layout (sign to bit 15,
// exponent and mantissa to bits 7..14) reads as value * 2^-8 exactly, denormals included (exponent
// bias 15 against 7): kMul = 256 undoes that where the scale is applied. int8: widen, convert.
//
// Writing: quantise_row computes in float32 with the reference's operations in its order (amax, one
// division for s, one division per value, round half to even / c10's float8 rounding), so the
// pools come out bit for bit as the reference's.
#pragma once

#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace swiftlm_kvq {

enum Format : int64_t { kNone = 0, kInt8 = 1, kE4M3 = 2, kE5M2 = 3 };

struct I8 {
  static constexpr float kMul = 1.0f;
  static constexpr float kQmax = 127.0f;
#if defined(__AVX512F__)
  static inline __m512 widen16(const uint8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
#endif
#if defined(__AVX2__)
  static inline __m256 widen8(const uint8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
#endif
  static inline uint8_t encode(float y) {  // y = x / s, |y| <= 127 up to rounding
    return static_cast<uint8_t>(static_cast<int8_t>(std::clamp(std::nearbyint(y), -127.0f, 127.0f)));
  }
};

struct E4M3 {
  static constexpr float kMul = 256.0f;
  static constexpr float kQmax = 448.0f;
#if defined(__AVX512F__)
  static inline __m512 widen16(const uint8_t* p) {
    const __m256i x = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(x, _mm256_set1_epi16(0x80)), 8);
    const __m256i mag = _mm256_slli_epi16(_mm256_and_si256(x, _mm256_set1_epi16(0x7F)), 7);
    return _mm512_cvtph_ps(_mm256_or_si256(sign, mag));
  }
#endif
#if defined(__AVX2__) && defined(__F16C__)
  static inline __m256 widen8(const uint8_t* p) {
    const __m128i x = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m128i sign = _mm_slli_epi16(_mm_and_si128(x, _mm_set1_epi16(0x80)), 8);
    const __m128i mag = _mm_slli_epi16(_mm_and_si128(x, _mm_set1_epi16(0x7F)), 7);
    return _mm256_cvtph_ps(_mm_or_si128(sign, mag));
  }
#endif
  static inline uint8_t encode(float y) { return c10::Float8_e4m3fn(std::clamp(y, -kQmax, kQmax)).x; }
};

struct E5M2 {
  static constexpr float kMul = 1.0f;
  static constexpr float kQmax = 57344.0f;
#if defined(__AVX512F__)
  static inline __m512 widen16(const uint8_t* p) {
    return _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 8));
  }
#endif
#if defined(__AVX2__) && defined(__F16C__)
  static inline __m256 widen8(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_slli_epi16(_mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))), 8));
  }
#endif
  static inline uint8_t encode(float y) { return c10::Float8_e5m2(std::clamp(y, -kQmax, kQmax)).x; }
};

// x[0 .. d) -> dst[0 .. d) and *scale, as backends/kv_quant.py's quantize_kv. X: float or bf16 bits
// widened by to_float.
template <typename F, typename X, typename ToFloat>
inline void quantise_row(const X* x, int64_t d, ToFloat to_float, uint8_t* dst, float* scale) {
  float amax = 0.0f;
  for (int64_t i = 0; i < d; ++i) amax = std::max(amax, std::fabs(to_float(x[i])));
  const float s = amax > 0.0f ? amax / F::kQmax : 1.0f;
  *scale = s;
  for (int64_t i = 0; i < d; ++i) dst[i] = F::encode(to_float(x[i]) / s);
}

}  // namespace swiftlm_kvq
