// Prefill attention over a paged KV cache: one request's chunk of query rows (the last T of its context
// of L tokens, causal, bottom-right aligned) attending to its context, read from the pools through its
// block table. prefill_attention_cpu.py has the op's contract.
//
//   out[r, h] = softmax(q[r, h] . K[0 .. pos(r)]^T * scale) . V[0 .. pos(r)],   pos(r) = L - T + r
//
// Two passes. First the context's K and V rows are packed per kv head, once a call, in the layout the
// second pass multiplies; then tasks of (kv head, 32 query rows: the GQA group's heads of 32 / G
// consecutive positions) walk the keys up to their last position in steps of 64, as a flash attention
// does: a register block of query rows x two vectors of keys of scores, the causal mask, an online
// softmax per row in the log2 domain (scale * log2(e) folded in) with float32 sums, and P.V a register
// block of rows x two vectors of dims. Two arithmetics share the passes:
//
// * bf16 q (CPUs with AVX512-BF16): K and V (bf16, or 8-bit values times their scales rounded to bf16
//   as the torch path's dequantisation rounds them) are packed in the pairs vdpbf16ps multiplies: K as
//   [key group of 16][dim pair][16 keys] (a zmm holds one dim pair of 16 keys), V as [key pair][dim] (a
//   zmm holds 16 dims of two keys). Scores of 8 rows x 2 groups of 16 keys (each q dim pair broadcast
//   from memory against two K vectors: 10 loads for 16 dot products, where the core loads one zmm a
//   cycle); the weights rounded to bf16 in pairs (as torch's CPU flash attention rounds them for bf16
//   inputs); P.V 8 rows x 32 dims. Products of bf16 values are exact in float32; only the order of the
//   sums and the weights' rounding differ from the torch path's SDPA.
// * float32 arithmetic (CPUs with AVX-512F, or AVX2 + FMA + F16C) for float32 q (the models that run in
//   float32) and for bf16 q on CPUs without AVX512-BF16 (its values widened exactly; the output
//   rounded to bf16): K and V (q's dtype widened, or 8-bit values times their scales in float32, as
//   dequantize_kv computes them, rounded to bf16 for a bf16 q as it rounds them) packed as K [key group
//   of W][dim][W keys] and V [key][dim], W the floats of a vector (16 or 8); scores of R rows x 2
//   vectors of keys, the weights kept in float32, P.V R rows x 2 vectors of dims, all on FMAs. R = 8
//   with 32 vector registers; 6 with 16 (a task's rows padded to 36), where 4 (8 accumulators, FMA
//   latency x throughput) ran 0.65-0.8x as fast and 12 with 32 registers spilled. Products of bf16
//   values are exact in float32; only the order of the sums (and, for a bf16 q, the weights left
//   unrounded) differ from the torch path's.
//
// Tasks are taken head by head, the longest first within a head (the last positions see the most
// keys), from a shared counter, so the threads of torch's intra-op pool finish together and read one
// head's packed context at a time (L * D * 4 bytes in bf16, twice that in float32: 1 MB for 2,048
// tokens of Qwen3-0.6B in bf16).
//
// On a 2-core Zen4 VM (BENCHMARKS.md) a 512-row chunk's attention ran 4.1x / 2.7x / 1.8x faster in bf16
// than gather + SDPA at 512 / 2,048 / 8,192 tokens of context, at ~300 GFLOP/s (the cores' vdpbf16ps
// peak: ~440).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#include "common.h"
#include "kv_quant.h"

// The op library's namespace: swiftlm_prefill_attention, or another name for a second build of this
// source in one process (the tests build the AVX2 variant on AVX-512 CPUs under its own name).
#ifndef SWIFTLM_PREFILL_NS
#define SWIFTLM_PREFILL_NS swiftlm_prefill_attention
#endif

namespace {

constexpr int kKeys = 16;        // keys of one bf16 score vector (a zmm of float32)
constexpr int kStepKeys = 64;    // keys per online-softmax step
constexpr int kRows = 16;        // query rows of one bf16 tile (the softmax's unit)
constexpr int kHalf = 8;         // query rows of one bf16 register block (half a tile)
constexpr int kTaskRows = 32;    // query rows of one task
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

using u16 = uint16_t;
using u32 = uint32_t;

#if defined(__AVX512F__)
// 16 x 16 words: out[i] = word i of each of the 16 rows (row j at rows[j], 16 words from there).
inline void transpose16(const u32* const* rows, int64_t w0, __m512i* out) {
  __m512i a[16], b[16];
  for (int j = 0; j < 16; ++j) a[j] = _mm512_loadu_si512(rows[j] + w0);
  for (int j = 0; j < 16; j += 2) {  // 32-bit pairs of rows j, j + 1
    b[j] = _mm512_unpacklo_epi32(a[j], a[j + 1]);
    b[j + 1] = _mm512_unpackhi_epi32(a[j], a[j + 1]);
  }
  for (int j = 0; j < 16; j += 4) {  // 64-bit quads of rows j .. j + 3
    a[j] = _mm512_unpacklo_epi64(b[j], b[j + 2]);
    a[j + 1] = _mm512_unpackhi_epi64(b[j], b[j + 2]);
    a[j + 2] = _mm512_unpacklo_epi64(b[j + 1], b[j + 3]);
    a[j + 3] = _mm512_unpackhi_epi64(b[j + 1], b[j + 3]);
  }
  // a[4 q + k], 128-bit lane m: words 4 m + (k's order: 0, 1, 2, 3 of the lane) of rows 4 q .. 4 q + 3
  for (int k = 0; k < 4; ++k) {
    const __m512i x0 = _mm512_shuffle_i32x4(a[k], a[4 + k], 0x88), x1 = _mm512_shuffle_i32x4(a[k], a[4 + k], 0xDD);
    const __m512i y0 = _mm512_shuffle_i32x4(a[8 + k], a[12 + k], 0x88), y1 = _mm512_shuffle_i32x4(a[8 + k], a[12 + k], 0xDD);
    b[k] = _mm512_shuffle_i32x4(x0, y0, 0x88);       // lane 0: rows 0-3, 4-7, 8-11, 12-15
    b[8 + k] = _mm512_shuffle_i32x4(x0, y0, 0xDD);   // lane 2
    b[4 + k] = _mm512_shuffle_i32x4(x1, y1, 0x88);   // lane 1
    b[12 + k] = _mm512_shuffle_i32x4(x1, y1, 0xDD);  // lane 3
  }
  for (int i = 0; i < 16; ++i) out[i] = b[i];
}

#endif

struct Pools {
  const void* k;
  const void* v;
  const float* ks;  // scale pools [N, bs, Hkv] (8-bit pools), else null
  const float* vs;
  int64_t k_sn, k_st, k_sh, v_sn, v_st, v_sh;  // pool strides (elements): block, token, kv head
  const int64_t* table;
  int64_t bs, hkv, d;
};

struct Task {
  int64_t h, p0, np;  // kv head, first chunk row, rows (positions) of the chunk it covers
};

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
constexpr bool kHaveBf16 = true;

// ---- bf16: packing one kv head's context rows, converted to bf16 bits ----

// An 8-bit pool row's d values (d a multiple of 16) times its scale as bf16 bits into dst: each value
// widened to float exactly (kv_quant.h's format F; e4m3 reads as value * 2^-8, undone by kMul), times
// the scale in float32, then rounded, as dequantize_kv computes it.
template <typename F>
inline void row_bits(const uint8_t* row, float scale, int64_t d, u16* dst) {
  const __m512 mul = _mm512_set1_ps(F::kMul), s = _mm512_set1_ps(scale);
  for (int64_t i = 0; i < d; i += 16) {
    const __m512 x = _mm512_mul_ps(_mm512_mul_ps(F::widen16(row + i), mul), s);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(swiftlm_cpu::bf16_bits(x)));
  }
}

// Keys [16 g, 16 g + 16) of kv head h: Kp[dp][j] = (K_j[2 dp], K_j[2 dp + 1]) for the group's 16 keys,
// Vp[p][x] = (V_{2p}[x], V_{2p+1}[x]) for its 8 key pairs; keys at or past len are zeros. F: u16 for
// bf16 pools, else the 8-bit format (kv_quant.h); tk, tv: scratch of 16 rows (8-bit rows as bf16, zeros).
template <typename F>
void pack_group(const Pools& P, int64_t h, int64_t g, int64_t len, u32* kp, u32* vp, u16* tk, u16* tv) {
  using S = std::conditional_t<std::is_same_v<F, u16>, u16, uint8_t>;  // the pool's element
  const int64_t d = P.d;
  const S* kpool = static_cast<const S*>(P.k);
  const S* vpool = static_cast<const S*>(P.v);
  const u16* kr[kKeys];
  const u16* vr[kKeys];
  for (int j = 0; j < kKeys; ++j) {
    const int64_t key = g * kKeys + j;
    if (key >= len) {
      std::fill(tk + j * d, tk + (j + 1) * d, u16(0));
      std::fill(tv + j * d, tv + (j + 1) * d, u16(0));
      kr[j] = tk + j * d, vr[j] = tv + j * d;
      continue;
    }
    const int64_t blk = P.table[key / P.bs], off = key % P.bs;
    const S* krow = kpool + blk * P.k_sn + off * P.k_st + h * P.k_sh;
    const S* vrow = vpool + blk * P.v_sn + off * P.v_st + h * P.v_sh;
    if constexpr (std::is_same_v<S, u16>) {
      kr[j] = krow, vr[j] = vrow;
    } else {
      const int64_t srow = (blk * P.bs + off) * P.hkv + h;
      row_bits<F>(krow, P.ks[srow], d, tk + j * d);
      row_bits<F>(vrow, P.vs[srow], d, tv + j * d);
      kr[j] = tk + j * d, vr[j] = tv + j * d;
    }
  }
  const u32* kw[kKeys];
  for (int j = 0; j < kKeys; ++j) kw[j] = reinterpret_cast<const u32*>(kr[j]);
  __m512i t[16];
  for (int64_t w0 = 0; w0 < d / 2; w0 += 16) {  // d / 2 words a row, a multiple of 16
    transpose16(kw, w0, t);
    for (int i = 0; i < 16; ++i) _mm512_storeu_si512(kp + (w0 + i) * kKeys, t[i]);
  }
  for (int p = 0; p < kKeys / 2; ++p)
    for (int64_t x = 0; x < d; x += 16) {
      const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(vr[2 * p] + x)));
      const __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(vr[2 * p + 1] + x)));
      _mm512_storeu_si512(vp + p * d + x, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
}

// ---- bf16: the attention of one task ----

// Scratch of one worker in 4-byte words (q pairs, scores, weight pairs, accumulators, m, l, alpha), D dims.
inline int64_t scratch_words(int64_t d) {
  return kTaskRows * (d / 2) + kTaskRows * kStepKeys + kTaskRows * (kStepKeys / 2) + kTaskRows * d + 3 * kTaskRows;
}

// DP = D / 2 dim pairs (32, 64 or 128).
template <int DP>
void run_task(const Task& t, const u16* q, int64_t hq, int64_t G, int64_t past, const u32* kp_all, const u32* vp_all,
              int64_t groups, float scale_log2, u32* ws, u16* out) {
  constexpr int D = 2 * DP;
  const int64_t rows = t.np * G;  // row rho: position t.p0 + rho / G, query head t.h * G + rho % G
  u32* qw = ws;                                          // [kTaskRows][DP]
  float* sc = reinterpret_cast<float*>(qw + kTaskRows * DP);  // [kTaskRows][kStepKeys]
  u32* pw = reinterpret_cast<u32*>(sc + kTaskRows * kStepKeys);  // [kTaskRows][kStepKeys / 2]
  float* acc = reinterpret_cast<float*>(pw + kTaskRows * (kStepKeys / 2));  // [kTaskRows][D]
  float* m = acc + kTaskRows * D;
  float* l = m + kTaskRows;
  float* alpha = l + kTaskRows;
  for (int64_t r = 0; r < kTaskRows; ++r) {  // rows past `rows` repeat the last (computed, never written)
    const int64_t rr = std::min(r, rows - 1);
    std::memcpy(qw + r * DP, q + ((t.p0 + rr / G) * hq + t.h * G + rr % G) * D, D * sizeof(u16));
    m[r] = -std::numeric_limits<float>::infinity();
    l[r] = 0.0f;
  }
  std::fill(acc, acc + kTaskRows * D, 0.0f);
  const u32* kp_h = kp_all + t.h * groups * DP * kKeys;
  const u32* vp_h = vp_all + t.h * groups * (kKeys / 2) * D;
  const int64_t last = past + t.p0 + t.np - 1;  // the last key any row of the task sees
  const int tiles = int((rows + kRows - 1) / kRows);
  const __m512 scale = _mm512_set1_ps(scale_log2);
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t k0 = 0; k0 <= last; k0 += kStepKeys) {
    const int ng = int(std::min<int64_t>(kStepKeys, last + 1 - k0) + kKeys - 1) / kKeys;  // key groups this step
    // scores: sc[r][16 kg + j] = q_r . K_{k0 + 16 kg + j} * scale * log2(e), -inf past the row's position
    for (int half = 0; half < 2 * tiles; ++half) {  // 8 rows x 2 key groups a pass: 10 loads for 16 dot products
      const u32* qt = qw + half * kHalf * DP;
      for (int kg = 0; kg < ng; kg += 2) {  // a key group past ng is read (packed past the context) and masked
        const u32* kp = kp_h + ((k0 / kKeys) + kg) * DP * kKeys;
        __m512 a[kHalf][2];
#pragma GCC unroll 8
        for (int r = 0; r < kHalf; ++r) a[r][0] = a[r][1] = _mm512_setzero_ps();
        for (int dp = 0; dp < DP; ++dp) {
          const __m512bh k0v = (__m512bh)_mm512_loadu_si512(kp + dp * kKeys);
          const __m512bh k1v = (__m512bh)_mm512_loadu_si512(kp + (DP + dp) * kKeys);
#pragma GCC unroll 8
          for (int r = 0; r < kHalf; ++r) {
            const __m512bh b = (__m512bh)_mm512_set1_epi32(int(qt[r * DP + dp]));
            a[r][0] = _mm512_dpbf16_ps(a[r][0], b, k0v);
            a[r][1] = _mm512_dpbf16_ps(a[r][1], b, k1v);
          }
        }
#pragma GCC unroll 8
        for (int r = 0; r < kHalf; ++r) {
          const int64_t rho = half * kHalf + r;
          const int64_t pos = past + t.p0 + std::min(rho, rows - 1) / G;
          for (int u = 0; u < 2 && kg + u < ng; ++u) {  // keys key0 + j <= pos stay
            const int64_t key0 = k0 + (kg + u) * kKeys;
            const __mmask16 keep =
                _mm512_cmple_epi32_mask(lane, _mm512_set1_epi32(int(std::min<int64_t>(pos - key0, 16))));
            _mm512_storeu_ps(sc + rho * kStepKeys + (kg + u) * kKeys,
                             _mm512_mask_blend_ps(keep, _mm512_set1_ps(-std::numeric_limits<float>::infinity()),
                                                  _mm512_mul_ps(a[r][u], scale)));
          }
        }
      }
    }
    // the online softmax, row by row; the weights rounded to bf16 in pairs of keys
    for (int64_t rho = 0; rho < tiles * kRows; ++rho) {
      float* s = sc + rho * kStepKeys;
      __m512 mx = _mm512_loadu_ps(s);
      for (int kg = 1; kg < ng; ++kg) mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + kg * kKeys));
      const float m_new = std::max(m[rho], _mm512_reduce_max_ps(mx));  // finite: key 0 is in every row's view
      alpha[rho] = swiftlm_cpu::exp2_one(m[rho] - m_new);
      const __m512 mn = _mm512_set1_ps(m_new);
      __m512 sum = _mm512_setzero_ps();
      u16* pb = reinterpret_cast<u16*>(pw + rho * (kStepKeys / 2));
      for (int kg = 0; kg < ng; ++kg) {
        const __m512 p = swiftlm_cpu::exp2_ps(_mm512_sub_ps(_mm512_loadu_ps(s + kg * kKeys), mn));
        sum = _mm512_add_ps(sum, p);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(pb + kg * kKeys),
                            _mm512_cvtepi32_epi16(swiftlm_cpu::bf16_bits(p)));
      }
      l[rho] = l[rho] * alpha[rho] + _mm512_reduce_add_ps(sum);
      m[rho] = m_new;
    }
    // P.V: acc[r][16 c ..] = alpha_r acc[r][..] + sum over key pairs of (p pair) . (V pair)
    const int pairs = ng * (kKeys / 2);
    const u32* vp = vp_h + (k0 / 2) * D;
    for (int half = 0; half < 2 * tiles; ++half) {  // 8 rows x 32 dims a pass: 10 loads for 16 dot products
      const u32* pt = pw + half * kHalf * (kStepKeys / 2);
      float* at = acc + half * kHalf * D;
      const float* al = alpha + half * kHalf;
      for (int c = 0; c < D; c += 32) {
        __m512 a[kHalf][2];
#pragma GCC unroll 8
        for (int r = 0; r < kHalf; ++r) {
          const __m512 s = _mm512_set1_ps(al[r]);
          a[r][0] = _mm512_mul_ps(_mm512_loadu_ps(at + r * D + c), s);
          a[r][1] = _mm512_mul_ps(_mm512_loadu_ps(at + r * D + c + 16), s);
        }
        for (int p = 0; p < pairs; ++p) {
          const __m512bh v0 = (__m512bh)_mm512_loadu_si512(vp + p * D + c);
          const __m512bh v1 = (__m512bh)_mm512_loadu_si512(vp + p * D + c + 16);
#pragma GCC unroll 8
          for (int r = 0; r < kHalf; ++r) {
            const __m512bh b = (__m512bh)_mm512_set1_epi32(int(pt[r * (kStepKeys / 2) + p]));
            a[r][0] = _mm512_dpbf16_ps(a[r][0], b, v0);
            a[r][1] = _mm512_dpbf16_ps(a[r][1], b, v1);
          }
        }
#pragma GCC unroll 8
        for (int r = 0; r < kHalf; ++r) {
          _mm512_storeu_ps(at + r * D + c, a[r][0]);
          _mm512_storeu_ps(at + r * D + c + 16, a[r][1]);
        }
      }
    }
  }
  for (int64_t rho = 0; rho < rows; ++rho) {
    const __m512 inv = _mm512_set1_ps(1.0f / l[rho]);
    u16* o = out + ((t.p0 + rho / G) * hq + t.h * G + rho % G) * D;
    for (int c = 0; c < D; c += 16) swiftlm_cpu::store16(o + c, _mm512_mul_ps(_mm512_loadu_ps(acc + rho * D + c), inv));
  }
}

#else
constexpr bool kHaveBf16 = false;
#endif

// ---- float32: vectors of W floats, AVX-512F or AVX2 + FMA (+ F16C for the float8 pools) ----

#if defined(__AVX512F__)
constexpr bool kHaveF32 = true;
struct Vf {
  using V = __m512;
  static constexpr int W = 16;  // floats a vector: keys of a score vector, dims of a P.V vector
  static constexpr int R = 8;   // query rows of a register block: 16 accumulators, 2 vectors of K or V
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V x) { _mm512_storeu_ps(p, x); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V zero() { return _mm512_setzero_ps(); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  static float hmax(V x) { return _mm512_reduce_max_ps(x); }
  static float hsum(V x) { return _mm512_reduce_add_ps(x); }
  static V exp2(V x) { return swiftlm_cpu::exp2_ps(x); }
  static float exp2_one(float x) { return swiftlm_cpu::exp2_one(x); }
  // lanes j < n keep x, the others -inf
  static V first(V x, int64_t n) {
    return _mm512_mask_blend_ps(swiftlm_cpu::first_lanes(std::max<int64_t>(n, 0)), _mm512_set1_ps(kNegInf), x);
  }
  template <typename F>
  static V widen(const uint8_t* p) { return F::widen16(p); }
  static V widen_bf16(const u16* p) { return swiftlm_cpu::load16(p); }  // exact
  // x rounded to bf16 (common.h's rule), as a float
  static V round_bf16(V x) { return _mm512_castsi512_ps(_mm512_slli_epi32(swiftlm_cpu::bf16_bits(x), 16)); }
  static void store_bf16(u16* p, V x) { swiftlm_cpu::store16(p, x); }
  // dst[i * W + j] = rows[j][c + i] for i, j < W
  static void transpose(const float* const* rows, int64_t c, float* dst) {
    __m512i t[16];
    transpose16(reinterpret_cast<const u32* const*>(rows), c, t);
    for (int i = 0; i < 16; ++i) _mm512_storeu_si512(dst + i * 16, t[i]);
  }
};
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
constexpr bool kHaveF32 = true;
struct Vf {
  using V = __m256;
  static constexpr int W = 8;
  static constexpr int R = 6;  // 12 accumulators, 2 vectors of K or V, the broadcast: 15 of 16 registers
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V x) { _mm256_storeu_ps(p, x); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V zero() { return _mm256_setzero_ps(); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
  static float hmax(V x) {
    __m128 a = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    a = _mm_max_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_max_ss(a, _mm_movehdup_ps(a)));
  }
  static float hsum(V x) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_add_ss(a, _mm_movehdup_ps(a)));
  }
  static V exp2(V x) { return swiftlm_cpu::exp2_ps8(x); }
  static float exp2_one(float x) { return swiftlm_cpu::exp2_one8(x); }
  static V first(V x, int64_t n) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i cut = _mm256_set1_epi32(int(std::clamp<int64_t>(n, 0, 8)));
    return _mm256_blendv_ps(x, _mm256_set1_ps(kNegInf), _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_add_epi32(lane, _mm256_set1_epi32(1)), cut)));
  }
  template <typename F>
  static V widen(const uint8_t* p) { return F::widen8(p); }
  static V widen_bf16(const u16* p) { return swiftlm_cpu::load8(p); }  // exact
  static V round_bf16(V x) {  // common.h's rule on 8 lanes, as a float
    const __m256i i = _mm256_castps_si256(x);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(i, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_and_si256(_mm256_add_epi32(i, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))),
                                       _mm256_set1_epi32(int(0xFFFF0000u)));
    return _mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)),
                            _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  }
  static void store_bf16(u16* p, V x) { swiftlm_cpu::store8_bf16(p, x); }
  static void transpose(const float* const* rows, int64_t c, float* dst) {
    __m256 r[8];
    for (int j = 0; j < 8; ++j) r[j] = _mm256_loadu_ps(rows[j] + c);
    swiftlm_cpu::transpose8(r);
    for (int i = 0; i < 8; ++i) _mm256_storeu_ps(dst + i * 8, r[i]);
  }
};
#else
constexpr bool kHaveF32 = false;
#endif

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
// Keys [W g, W g + W) of kv head h: Kp[i][j] = K_{W g + j}[i] (a vector holds dim i of W keys), Vp[j] =
// V_{W g + j} (rows of d floats); keys at or past len are zeros. F: the pool's element for pools of q's
// dtype (float, or u16: bf16 bits, widened exactly), else the 8-bit format (kv_quant.h), each value
// times its scale in float32 as dequantize_kv computes it (then rounded to bf16 for a bf16 q, Q = u16,
// as dequantize_kv to bf16 rounds it); tk, tv: scratch of W rows.
template <typename F, typename Q>
void pack_group_f32(const Pools& P, int64_t h, int64_t g, int64_t len, u32* kw, u32* vw, float* tk, float* tv) {
  constexpr int W = Vf::W;
  constexpr bool kPlain = std::is_same_v<F, float> || std::is_same_v<F, u16>;
  using S = std::conditional_t<kPlain, F, uint8_t>;  // the pool's element
  const int64_t d = P.d;
  const S* kpool = static_cast<const S*>(P.k);
  const S* vpool = static_cast<const S*>(P.v);
  float* kp = reinterpret_cast<float*>(kw);
  float* vp = reinterpret_cast<float*>(vw);
  const float* kr[W];
  const float* vr[W];
  for (int j = 0; j < W; ++j) {
    const int64_t key = g * W + j;
    float* tkj = tk + j * d;
    float* tvj = tv + j * d;
    kr[j] = tkj, vr[j] = tvj;
    if (key >= len) {
      std::fill(tkj, tkj + d, 0.0f);
      std::fill(tvj, tvj + d, 0.0f);
      continue;
    }
    const int64_t blk = P.table[key / P.bs], off = key % P.bs;
    const S* krow = kpool + blk * P.k_sn + off * P.k_st + h * P.k_sh;
    const S* vrow = vpool + blk * P.v_sn + off * P.v_st + h * P.v_sh;
    if constexpr (std::is_same_v<S, float>) {
      kr[j] = krow, vr[j] = vrow;
    } else if constexpr (std::is_same_v<S, u16>) {
      for (int64_t i = 0; i < d; i += W) {
        Vf::store(tkj + i, Vf::widen_bf16(krow + i));
        Vf::store(tvj + i, Vf::widen_bf16(vrow + i));
      }
    } else {
      const int64_t srow = (blk * P.bs + off) * P.hkv + h;
      const typename Vf::V mul = Vf::set1(F::kMul), ks = Vf::set1(P.ks[srow]), vs = Vf::set1(P.vs[srow]);
      for (int64_t i = 0; i < d; i += W) {
        typename Vf::V x = Vf::mul(Vf::mul(Vf::template widen<F>(krow + i), mul), ks);
        typename Vf::V y = Vf::mul(Vf::mul(Vf::template widen<F>(vrow + i), mul), vs);
        if constexpr (std::is_same_v<Q, u16>) x = Vf::round_bf16(x), y = Vf::round_bf16(y);
        Vf::store(tkj + i, x);
        Vf::store(tvj + i, y);
      }
    }
  }
  for (int64_t c = 0; c < d; c += W) Vf::transpose(kr, c, kp + c * W);
  for (int j = 0; j < W; ++j) std::memcpy(vp + j * d, vr[j], d * sizeof(float));
}

// A task's rows rounded up to whole register blocks (the rows past the task's repeat its last).
constexpr int kPadRows = (kTaskRows + Vf::R - 1) / Vf::R * Vf::R;

// Scratch of one worker in floats (q rows, scores then weights, accumulators, m, l, alpha), D dims.
inline int64_t scratch_words_f32(int64_t d) { return 2 * kPadRows * d + kPadRows * kStepKeys + 3 * kPadRows; }

// D dims (64, 128 or 256); Q: float, or u16 (bf16 bits: q widened exactly, the output rounded to bf16).
// Row rho of the task: position t.p0 + rho / G, query head t.h * G + rho % G.
template <typename Q, int D>
void run_task_f32(const Task& t, const Q* q, int64_t hq, int64_t G, int64_t past, const u32* kw_all,
                  const u32* vw_all, int64_t groups, float scale_log2, u32* ws, Q* out) {
  using V = Vf::V;
  constexpr int W = Vf::W, R = Vf::R;
  const int64_t rows = t.np * G;
  float* qf = reinterpret_cast<float*>(ws);   // [kPadRows][D]
  float* sc = qf + kPadRows * D;              // [kPadRows][kStepKeys]: scores, then weights
  float* acc = sc + kPadRows * kStepKeys;     // [kPadRows][D]
  float* m = acc + kPadRows * D;
  float* l = m + kPadRows;
  float* alpha = l + kPadRows;
  for (int64_t r = 0; r < kPadRows; ++r) {  // rows past `rows` repeat the last (computed, never written)
    const int64_t rr = std::min(r, rows - 1);
    const Q* qr = q + ((t.p0 + rr / G) * hq + t.h * G + rr % G) * D;
    if constexpr (std::is_same_v<Q, float>)
      std::memcpy(qf + r * D, qr, D * sizeof(float));
    else
      for (int c = 0; c < D; c += W) Vf::store(qf + r * D + c, Vf::widen_bf16(qr + c));
    m[r] = kNegInf;
    l[r] = 0.0f;
  }
  std::fill(acc, acc + kPadRows * D, 0.0f);
  const float* kp_h = reinterpret_cast<const float*>(kw_all) + t.h * groups * D * W;
  const float* vp_h = reinterpret_cast<const float*>(vw_all) + t.h * groups * W * D;
  const int64_t last = past + t.p0 + t.np - 1;  // the last key any row of the task sees
  const int blocks = int((rows + R - 1) / R);
  const V scale = Vf::set1(scale_log2);
  for (int64_t k0 = 0; k0 <= last; k0 += kStepKeys) {
    const int nv = int((std::min<int64_t>(kStepKeys, last + 1 - k0) + W - 1) / W);  // key vectors this step
    // scores: sc[rho][W kv + j] = q_rho . K_{k0 + W kv + j} * scale * log2(e), -inf past the row's position
    for (int b = 0; b < blocks; ++b) {
      const float* qb = qf + b * R * D;
      for (int kv = 0; kv < nv; kv += 2) {  // a vector past nv is read (packed past the context) and dropped
        const float* kp = kp_h + (k0 / W + kv) * D * W;
        V a[R][2];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) a[r][0] = a[r][1] = Vf::zero();
        for (int i = 0; i < D; ++i) {
          const V x0 = Vf::load(kp + i * W), x1 = Vf::load(kp + (D + i) * W);
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) {
            const V s = Vf::set1(qb[r * D + i]);
            a[r][0] = Vf::fma(s, x0, a[r][0]);
            a[r][1] = Vf::fma(s, x1, a[r][1]);
          }
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const int64_t rho = b * R + r;
          const int64_t pos = past + t.p0 + std::min(rho, rows - 1) / G;
          for (int u = 0; u < 2 && kv + u < nv; ++u)  // keys key0 + j <= pos stay
            Vf::store(sc + rho * kStepKeys + (kv + u) * W, Vf::first(Vf::mul(a[r][u], scale), pos - (k0 + (kv + u) * W) + 1));
        }
      }
    }
    // the online softmax, row by row; the weights stay float32
    for (int64_t rho = 0; rho < blocks * R; ++rho) {
      float* s = sc + rho * kStepKeys;
      V mx = Vf::load(s);
      for (int v = 1; v < nv; ++v) mx = Vf::max(mx, Vf::load(s + v * W));
      const float m_new = std::max(m[rho], Vf::hmax(mx));  // finite: key 0 is in every row's view
      alpha[rho] = Vf::exp2_one(m[rho] - m_new);
      const V mn = Vf::set1(m_new);
      V sum = Vf::zero();
      for (int v = 0; v < nv; ++v) {
        const V p = Vf::exp2(Vf::sub(Vf::load(s + v * W), mn));
        sum = Vf::add(sum, p);
        Vf::store(s + v * W, p);
      }
      l[rho] = l[rho] * alpha[rho] + Vf::hsum(sum);
      m[rho] = m_new;
    }
    // P.V: acc[rho][c ..] = alpha_rho acc[rho][..] + sum over the step's keys of p . V
    const int nk = nv * W;
    const float* vp = vp_h + k0 * D;
    for (int b = 0; b < blocks; ++b) {
      const float* pt = sc + b * R * kStepKeys;
      float* at = acc + b * R * D;
      const float* al = alpha + b * R;
      for (int c = 0; c < D; c += 2 * W) {
        V a[R][2];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const V s = Vf::set1(al[r]);
          a[r][0] = Vf::mul(Vf::load(at + r * D + c), s);
          a[r][1] = Vf::mul(Vf::load(at + r * D + c + W), s);
        }
        for (int key = 0; key < nk; ++key) {
          const V v0 = Vf::load(vp + key * D + c), v1 = Vf::load(vp + key * D + c + W);
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) {
            const V p = Vf::set1(pt[r * kStepKeys + key]);
            a[r][0] = Vf::fma(p, v0, a[r][0]);
            a[r][1] = Vf::fma(p, v1, a[r][1]);
          }
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          Vf::store(at + r * D + c, a[r][0]);
          Vf::store(at + r * D + c + W, a[r][1]);
        }
      }
    }
  }
  for (int64_t rho = 0; rho < rows; ++rho) {
    const V inv = Vf::set1(1.0f / l[rho]);
    Q* o = out + ((t.p0 + rho / G) * hq + t.h * G + rho % G) * D;
    for (int c = 0; c < D; c += W) {
      const V x = Vf::mul(Vf::load(acc + rho * D + c), inv);
      if constexpr (std::is_same_v<Q, float>)
        Vf::store(o + c, x);
      else
        Vf::store_bf16(o + c, x);
    }
  }
}
#endif

// ---- the op: pack, then the tasks ----

// One arithmetic's functions and packed layout. Q: q's and the output's elements; Sc: the packing's scratch.
template <typename Q, typename Sc>
struct Kernel {
  void (*pack)(const Pools&, int64_t, int64_t, int64_t, u32*, u32*, Sc*, Sc*);
  void (*task)(const Task&, const Q*, int64_t, int64_t, int64_t, const u32*, const u32*, int64_t, float, u32*, Q*);
  int64_t group_keys;   // keys of a packed group
  int64_t group_words;  // 4-byte words of a group's packed K, and of its V
  int64_t scratch;      // 4-byte words of a worker's scratch
};

template <typename Q, typename Sc>
void prefill(const Kernel<Q, Sc>& K, const Pools& P, const Q* q, Q* out, int64_t T, int64_t Hq, int64_t seq_len,
             float scale_log2) {
  const int64_t Hkv = P.hkv, D = P.d, G = Hq / Hkv, past = seq_len - T;
  const int64_t groups = (seq_len + K.group_keys - 1) / K.group_keys;
  // packed context: per kv head, groups x group_words K words and as many V words (one K group more
  // than the context, zeros: an odd last key vector is read in pairs, its scores dropped).
  // The packed context goes into buffers the calling thread keeps (they only grow): a fresh allocation
  // of this size is faulted in page by page on every call, which took a third of the packing's time
  // at 8,192 tokens (Zen4 VM). They hold 4 bytes a (token, kv head, dim pair) x 2 in bf16, a (token,
  // kv head, dim) x 2 in float32: for Qwen3-0.6B 1/28 of the KV cache of the longest context prefilled.
  thread_local std::vector<u32> k_buf, v_buf;
  const size_t k_words = size_t((Hkv * groups + 1) * K.group_words), v_words = size_t(Hkv * groups * K.group_words);
  if (k_buf.size() < k_words) k_buf.resize(k_words);
  if (v_buf.size() < v_words) v_buf.resize(v_words);
  u32* const kp = k_buf.data();
  u32* const vp = v_buf.data();
  std::fill_n(kp + Hkv * groups * K.group_words, K.group_words, u32(0));
  at::parallel_for(0, Hkv * groups, 16, [&](int64_t lo, int64_t hi) {
    std::vector<Sc> tk(K.group_keys * D), tv(K.group_keys * D);
    for (int64_t x = lo; x < hi; ++x) {
      const int64_t h = x / groups, g = x % groups;
      K.pack(P, h, g, seq_len, kp + (h * groups + g) * K.group_words, vp + (h * groups + g) * K.group_words,
             tk.data(), tv.data());
    }
  });

  // tasks: (kv head, kTaskRows / G positions), head by head, in each head the ones seeing the most keys
  // first: the threads work on one head's packed context at a time, which one reads from memory and
  // the other from the shared L3 (at 8,192 tokens a head's is 4 MB in bf16, the context's 32 MB): 1.43x
  // faster there than position-major order, the same at 2,048 (Zen4 VM)
  const int64_t per_task = std::max<int64_t>(1, kTaskRows / G);
  TORCH_CHECK(per_task * G <= kTaskRows, "a GQA group of ", G, " query heads is larger than ", kTaskRows);
  std::vector<Task> tasks;
  for (int64_t h = 0; h < Hkv; ++h)
    for (int64_t p0 = ((T - 1) / per_task) * per_task; p0 >= 0; p0 -= per_task)
      tasks.push_back(Task{h, p0, std::min(per_task, T - p0)});
  std::atomic<int64_t> next{0};
  const int64_t n_tasks = static_cast<int64_t>(tasks.size());
  const int64_t workers = std::min<int64_t>(at::in_parallel_region() ? 1 : at::get_num_threads(), n_tasks);
  auto worker = [&](int64_t, int64_t) {
    std::vector<u32> ws(K.scratch + 16);
    for (int64_t i = next.fetch_add(1); i < n_tasks; i = next.fetch_add(1))
      K.task(tasks[i], q, Hq, G, past, kp, vp, groups, scale_log2, ws.data(), out);
  };
  if (workers <= 1)
    worker(0, 1);
  else
    at::parallel_for(0, workers, 1, worker);
}

at::Tensor paged_prefill_attention(const at::Tensor& q_in, const at::Tensor& k_pool, const at::Tensor& v_pool,
                                   const at::Tensor& block_table_in, int64_t seq_len, double scale,
                                   const std::optional<at::Tensor>& k_scales, const std::optional<at::Tensor>& v_scales) {
  const auto q_t = q_in.scalar_type();
  TORCH_CHECK(q_in.dim() == 3 && (q_t == at::kBFloat16 || q_t == at::kFloat),
              "q must be bfloat16 or float32 [T, Hq, D], got ", q_t, " ", q_in.sizes());
  TORCH_CHECK(kHaveBf16 || kHaveF32, "the prefill kernel needs a CPU with AVX-512F, or AVX2 with FMA and F16C");
  TORCH_CHECK(k_pool.dim() == 4 && k_pool.sizes() == v_pool.sizes() && k_pool.scalar_type() == v_pool.scalar_type(),
              "k_pool and v_pool must both be [num_blocks, block_size, Hkv, D] of one dtype, got ", k_pool.sizes(),
              " and ", v_pool.sizes());
  TORCH_CHECK(q_in.device().is_cpu() && k_pool.device().is_cpu() && v_pool.device().is_cpu(),
              "q, k_pool and v_pool must be CPU tensors");
  TORCH_CHECK(k_pool.stride(3) == 1 && v_pool.stride(3) == 1, "pools must be contiguous in head_dim");
  const int64_t T = q_in.size(0), Hq = q_in.size(1), D = q_in.size(2);
  const int64_t N = k_pool.size(0), bs = k_pool.size(1), Hkv = k_pool.size(2);
  TORCH_CHECK(k_pool.size(3) == D, "pools' head_dim ", k_pool.size(3), " differs from q's ", D);
  TORCH_CHECK(Hkv > 0 && Hq % Hkv == 0, Hq, " query heads are not a multiple of ", Hkv, " kv heads");
  TORCH_CHECK(D == 64 || D == 128 || D == 256, "head_dim ", D, " is not 64, 128 or 256");
  const auto pool_t = k_pool.scalar_type();
  const bool scaled = pool_t == at::kChar || pool_t == at::kFloat8_e4m3fn || pool_t == at::kFloat8_e5m2;
  TORCH_CHECK(scaled || pool_t == q_t, "pools must be q's dtype (", q_t, "), int8, float8_e4m3fn or float8_e5m2, got ",
              pool_t);
  TORCH_CHECK(scaled == (k_scales.has_value() && v_scales.has_value()),
              scaled ? "8-bit pools need k_scales and v_scales" : "pools of q's dtype take no scales");
  if (scaled)
    for (const auto* sc : {&*k_scales, &*v_scales})
      TORCH_CHECK(sc->scalar_type() == at::kFloat && sc->is_contiguous() && sc->dim() == 3 && sc->size(0) == N &&
                      sc->size(1) == bs && sc->size(2) == Hkv,
                  "scale pools must be contiguous float32 [num_blocks, block_size, Hkv], got ", sc->sizes());
  TORCH_CHECK(block_table_in.dim() == 1, "block_table must be [max_blocks], got ", block_table_in.sizes());
  TORCH_CHECK(seq_len >= T && T >= 0, "seq_len ", seq_len, " is shorter than the chunk's ", T, " rows");
  const at::Tensor table = block_table_in.to(at::kLong).contiguous();
  const int64_t max_blocks = table.size(0);
  swiftlm_cpu::check_block_tables(table.data_ptr<int64_t>(), max_blocks, &seq_len, 1, bs, N, "");

  const at::Tensor q = q_in.contiguous();
  at::Tensor out = at::empty({T, Hq, D}, q.options());
  if (T == 0) return out;
  const Pools P{k_pool.data_ptr(), v_pool.data_ptr(), scaled ? k_scales->const_data_ptr<float>() : nullptr,
                scaled ? v_scales->const_data_ptr<float>() : nullptr, k_pool.stride(0), k_pool.stride(1), k_pool.stride(2),
                v_pool.stride(0), v_pool.stride(1), v_pool.stride(2), table.data_ptr<int64_t>(), bs, Hkv, D};
  const float scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  if (q_t == at::kBFloat16 && kHaveBf16) {
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
    Kernel<u16, u16> K{nullptr, nullptr, kKeys, D / 2 * kKeys, scratch_words(D)};
    switch (pool_t) {
      case at::kBFloat16: K.pack = pack_group<u16>; break;
      case at::kChar: K.pack = pack_group<swiftlm_kvq::I8>; break;
      case at::kFloat8_e4m3fn: K.pack = pack_group<swiftlm_kvq::E4M3>; break;
      default: K.pack = pack_group<swiftlm_kvq::E5M2>; break;
    }
    K.task = D == 64 ? run_task<32> : D == 128 ? run_task<64> : run_task<128>;
    prefill(K, P, swiftlm_cpu::bf16_in(q), swiftlm_cpu::bf16_out(out), T, Hq, seq_len, scale_log2);
#endif
  } else {
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
    // float32 arithmetic: a float32 q, or a bf16 one on a CPU without AVX512-BF16 (widened exactly)
    auto run = [&](auto q_elem) {  // Q: q's element, and the pools' when they are q's dtype
      using Q = decltype(q_elem);
      Kernel<Q, float> K{nullptr, nullptr, Vf::W, D * Vf::W, scratch_words_f32(D)};
      switch (pool_t) {
        case at::kChar: K.pack = pack_group_f32<swiftlm_kvq::I8, Q>; break;
        case at::kFloat8_e4m3fn: K.pack = pack_group_f32<swiftlm_kvq::E4M3, Q>; break;
        case at::kFloat8_e5m2: K.pack = pack_group_f32<swiftlm_kvq::E5M2, Q>; break;
        default: K.pack = pack_group_f32<Q, Q>; break;
      }
      K.task = D == 64 ? run_task_f32<Q, 64> : D == 128 ? run_task_f32<Q, 128> : run_task_f32<Q, 256>;
      prefill(K, P, static_cast<const Q*>(q.const_data_ptr()), static_cast<Q*>(out.data_ptr()), T, Hq, seq_len,
              scale_log2);
    };
    if (q_t == at::kFloat)
      run(float{});
    else
      run(u16{});
#endif
  }
  return out;
}

}  // namespace

// TORCH_LIBRARY pastes its first argument: SWIFTLM_PREFILL_NS is expanded one macro level up.
#define SWIFTLM_DEFINE_LIBRARY(ns, lib) TORCH_LIBRARY(ns, lib)
SWIFTLM_DEFINE_LIBRARY(SWIFTLM_PREFILL_NS, lib) {
  swiftlm_cpu::def_cpu(lib, "paged_prefill_attention(Tensor q, Tensor k_pool, Tensor v_pool, Tensor block_table, "
                            "int seq_len, float scale, Tensor? k_scales=None, Tensor? v_scales=None) -> Tensor",
                       &paged_prefill_attention);
}
