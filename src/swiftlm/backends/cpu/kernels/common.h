// What the CPU kernels share: the rounding of float32 to bf16 (one rule), e^x and 2^x on 16 lanes
// (one approximation), 16-lane loads and stores of float32 and bf16 rows, op registration, and the
// check of a paged attention's block tables.
//
// build.py hashes the local headers that a .cpp includes, one level deep, so every .cpp that uses
// this header, directly or through another header of this folder, includes it itself.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include <cstdint>
#include <cstring>

namespace swiftlm_cpu {

// ---- bf16 rounding: to nearest even, as c10::BFloat16(float) rounds (denormals kept); every NaN
// becomes the quiet NaN 0x7FC0 ----

inline uint16_t bf16_bits(float f) {
  uint32_t i;
  std::memcpy(&i, &f, 4);
  if ((i & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
  return static_cast<uint16_t>((i + 0x7FFFu + ((i >> 16) & 1u)) >> 16);
}

// bf16 bits as a float: exact
inline float bf16_to_float(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

#if defined(__AVX512F__)
// 16 lanes, the same rule; the bf16 bits in the low half of each 32-bit lane
inline __m512i bf16_bits(__m512 v) {
  const __m512i i = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(i, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(i, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  return _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
}

// ---- 16 values of a row as float32 lanes, and back (the lanes of `mask` only) ----

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const float* p, __mmask16 mask) { return _mm512_maskz_loadu_ps(mask, p); }
inline __m512 load16(const uint16_t* p) {  // bf16 bits: exact, a shift into the high half
  const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
}
inline __m512 load16(const c10::BFloat16* p) { return load16(reinterpret_cast<const uint16_t*>(p)); }

inline void store16(float* p, __m512 v, __mmask16 mask = 0xFFFF) { _mm512_mask_storeu_ps(p, mask, v); }
inline void store16(uint16_t* p, __m512 v, __mmask16 mask = 0xFFFF) {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
  _mm256_mask_storeu_epi16(p, mask, _mm512_cvtepi32_epi16(bf16_bits(v)));
#else
  _mm512_mask_cvtepi32_storeu_epi16(p, mask, bf16_bits(v));
#endif
}
inline void store16(c10::BFloat16* p, __m512 v, __mmask16 mask = 0xFFFF) {
  store16(reinterpret_cast<uint16_t*>(p), v, mask);
}

// the first n lanes, 0 <= n <= 16
inline __mmask16 first_lanes(int64_t n) { return n >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << n) - 1u); }

// ---- e^x and 2^x: x = n ln2 + r with n an integer and |r| <= ln2 / 2, e^r by its Taylor series to
// degree 8 (truncation error < 2e-10, far below float32's 6e-8), times 2^n. exp reduces with ln2 in
// two parts (Cody-Waite), exp2 with r = (x - n) ln2. Measured against double on 3.2M random
// arguments each, both are within 0.87 ulp of the exact value (mean 0.26 ulp). ----

// e^r 2^n for the lanes of `keep`, exactly 0 elsewhere. Callers clear the lanes whose result would
// be below 2^-125, so that every result is 0 or a normal number (a denormal result, or one computed
// through a denormal, costs a microcode assist); n above 128 gives inf.
inline __m512 exp_reduced(__m512 r, __m512 n, __mmask16 keep) {
  __m512 p = _mm512_set1_ps(2.48015873015873e-05f);  // 1/8!
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.984126984126984e-04f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.388888888888889e-03f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.333333333333333e-03f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.166666666666667e-02f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.666666666666667e-01f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(keep, p, n);
}

// 2^x for x <= 128 (the softmax's x <= 0; larger x is not clamped, which saves an instruction on
// the attention's hot path); 0 for x below -125, -inf and NaN.
inline __m512 exp2_ps(__m512 x) {
  const __m512 lowest = _mm512_set1_ps(-125.0f);
  const __mmask16 keep = _mm512_cmp_ps_mask(x, lowest, _CMP_GE_OQ);
  x = _mm512_max_ps(x, lowest);
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_mul_ps(_mm512_sub_ps(x, n), _mm512_set1_ps(0.6931471805599453f));  // (x - n) exact
  return exp_reduced(r, n, keep);
}

// e^x; 0 for x below -125 ln2 = -86.6 (and for -inf and NaN), inf above 88.7.
inline __m512 exp_ps(__m512 x) {
  const __m512 lowest = _mm512_set1_ps(-125.0f);
  const __m512 x_log2e = _mm512_mul_ps(x, _mm512_set1_ps(1.4426950408889634f));
  const __mmask16 keep = _mm512_cmp_ps_mask(x_log2e, lowest, _CMP_GE_OQ);
  const __m512 n = _mm512_roundscale_ps(_mm512_min_ps(_mm512_max_ps(x_log2e, lowest), _mm512_set1_ps(129.0f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);  // ln2's high bits: n * them is exact
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);     // and the rest of ln2
  return exp_reduced(r, n, keep);
}

inline float exp2_one(float x) { return _mm512_cvtss_f32(exp2_ps(_mm512_set1_ps(x))); }
#endif

#if defined(__AVX2__) && defined(__FMA__)
// ---- 8 lanes (CPUs with AVX2 but not AVX-512): the same bf16 rounding, and 2^x by the same
// reduction and polynomial as exp2_ps, 2^n built in the exponent bits ----

// 8 float32 lanes rounded to bf16 into dst[0 .. 8)
inline void store8_bf16(uint16_t* dst, __m256 v) {
  const __m256i i = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(i, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(i, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
  // 32-bit lanes -> 16 bits: [r0..r3 r0..r3 | r4..r7 r4..r7], then the low 64 bits of each half
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0b1000);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm256_castsi256_si128(packed));
}

// e^r 2^n for the lanes of `keep`, 0 elsewhere; n integral in [-125, 127] (2^n built in the exponent
// bits), |r| <= ln2 / 2: exp_reduced's polynomial.
inline __m256 exp_reduced8(__m256 r, __m256 n, __m256 keep) {
  __m256 p = _mm256_set1_ps(2.48015873015873e-05f);  // 1/8!
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.984126984126984e-04f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.388888888888889e-03f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.333333333333333e-03f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.166666666666667e-02f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.666666666666667e-01f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);  // 2^n
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), keep);
}

// 2^x for x <= 127; 0 for x below -125, -inf and NaN.
inline __m256 exp2_ps8(__m256 x) {
  const __m256 lowest = _mm256_set1_ps(-125.0f);
  const __m256 keep = _mm256_cmp_ps(x, lowest, _CMP_GE_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, lowest), _mm256_set1_ps(127.0f));
  const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 r = _mm256_mul_ps(_mm256_sub_ps(x, n), _mm256_set1_ps(0.6931471805599453f));  // (x - n) exact
  return exp_reduced8(r, n, keep);
}

// e^x; 0 for x below -125 ln2 = -86.6 (and for -inf and NaN); above 88.0 the result stops growing
// (2^127 times at most e^(ln2 / 2)) instead of reaching inf.
inline __m256 exp_ps8(__m256 x) {
  const __m256 lowest = _mm256_set1_ps(-125.0f);
  const __m256 x_log2e = _mm256_mul_ps(x, _mm256_set1_ps(1.4426950408889634f));
  const __m256 keep = _mm256_cmp_ps(x_log2e, lowest, _CMP_GE_OQ);
  const __m256 n = _mm256_round_ps(_mm256_min_ps(_mm256_max_ps(x_log2e, lowest), _mm256_set1_ps(127.0f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);  // ln2's high bits: n * them is exact
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);     // and the rest of ln2
  r = _mm256_min_ps(r, _mm256_set1_ps(0.34657359f));  // x past 127 ln2: r = ln2 / 2 at most
  return exp_reduced8(r, n, keep);
}

inline float exp2_one8(float x) { return _mm256_cvtss_f32(exp2_ps8(_mm256_set1_ps(x))); }

// 8 bf16 values as float32 lanes: exact, a shift into the high half
inline __m256 load8(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}

// 8 x 8 floats transposed in place: r[i] becomes lane i of each of r[0 .. 8)
inline void transpose8(__m256* r) {
  __m256 t[8];
  for (int j = 0; j < 8; j += 2) {  // t[j]: rows j, j + 1 interleaved (lanes 0, 1 | 4, 5); t[j + 1]: (2, 3 | 6, 7)
    t[j] = _mm256_unpacklo_ps(r[j], r[j + 1]);
    t[j + 1] = _mm256_unpackhi_ps(r[j], r[j + 1]);
  }
  __m256 u[8];
  for (int j = 0; j < 8; j += 4) {  // u[j + i]: lane i (| i + 4) of rows j .. j + 3
    u[j] = _mm256_shuffle_ps(t[j], t[j + 2], 0x44);
    u[j + 1] = _mm256_shuffle_ps(t[j], t[j + 2], 0xEE);
    u[j + 2] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0x44);
    u[j + 3] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {  // lane i from the low halves, lane i + 4 from the high ones
    r[i] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x31);
  }
}

// lane j of the result: the sum of the 8 lanes of a[j]
inline __m256 hsum8(const __m256* a) {
  const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);  // [a0..a3 low halves | high halves]
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}
#endif

// ---- op registration: an op's schema and its CPU kernel in one call, inside TORCH_LIBRARY. The
// kernel serves CPU tensors only: others get the dispatcher's "no kernel for CUDA" error, not a
// read of device memory. ----

template <typename Fn>
inline void def_cpu(torch::Library& lib, const char* schema, Fn* kernel) {
  lib.def(schema, torch::dispatch(c10::DispatchKey::CPU, kernel));
}

// a bf16 tensor's data as bits, to read and to write (the caller has checked the dtype)
inline const uint16_t* bf16_in(const at::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.const_data_ptr()); }
inline uint16_t* bf16_out(const at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr()); }

// ---- a paged attention's block tables [B, max_blocks] and seq_lens [B] (int64), against a pool of
// n_blocks blocks of bs tokens: each length fits its table, and each block it reaches is in the
// pool. `who` prefixes the errors. ----
inline void check_block_tables(const int64_t* tab, int64_t max_blocks, const int64_t* lens, int64_t batch, int64_t bs,
                               int64_t n_blocks, const char* who) {
  for (int64_t b = 0; b < batch; ++b) {
    TORCH_CHECK(lens[b] >= 0 && lens[b] <= max_blocks * bs, who, "seq_lens[", b, "] = ", lens[b],
                " does not fit in ", max_blocks, " blocks of ", bs);
    for (int64_t i = 0, nb = (lens[b] + bs - 1) / bs; i < nb; ++i)
      TORCH_CHECK(tab[b * max_blocks + i] >= 0 && tab[b * max_blocks + i] < n_blocks, who, "block_tables[", b, ", ", i,
                  "] = ", tab[b * max_blocks + i], " is outside the pool of ", n_blocks, " blocks");
  }
}

}  // namespace swiftlm_cpu
