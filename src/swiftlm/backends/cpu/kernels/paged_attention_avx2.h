// Decode attention items on CPUs with AVX2, FMA and F16C but not AVX-512 (AMD Zen 1-3, Intel client
// cores): paged_attention_cpu.cpp includes this header in place of its AVX-512 item runners; the
// plan, the merge of split requests and the op itself are shared (paged_attention_plan.h).
//
// One runner for every pool dtype (float32, bf16, and the small KV cache's int8 / float8 with their
// scales), in the reading order of the AVX-512 kernel's run_item_rows: the virtual heads go in lane
// groups of NKV = 8 / G (up to 8 query heads, a ymm lane each); per tile of kTile tokens and lane
// group, the scores go in passes of NKV tokens over one virtual head (NKV x G <= 8 accumulators,
// each K value widened once for the G heads, one hsum8 a pass); the online softmax runs lane-wise
// over heads; then P.V four tokens at a time, each V row widened once for the G query heads of its
// kv head, into float32 accumulators in scratch. Each line of K or V read pulls the same line of the
// next tile's row into L2 (kStreamHint), as on AVX-512. On a 2-core Zen3 VM, against a first
// version that read K one token at a time for all 8 lanes and widened bf16 8 values at a time:
// 1.04-1.2x at 2048-8192 tokens (benchmarks/cpu/ab_attention_kernel.py, two runs).
//
// Values are widened to float32: bf16 16 at a time from one load (even dims by a shift, odd dims by
// a mask: q and the accumulators are kept in that order, undone when results are written), 8-bit
// rows by kv_quant.h's widen8, in head-dim order. q is widened once per item. 8-bit rows: each
// token's K scale multiplies its scores, its V scale its softmax weight (the normaliser sums the
// unscaled weights), as in the AVX-512 run_item. Dots, softmax and the weighted sums are float32,
// so results match the AVX-512 kernel and the torch path up to the order of float32 sums.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "common.h"
#include "kv_quant.h"
#include "paged_attention_plan.h"

namespace {

using namespace swiftlm_attn;

constexpr int kLanes8 = 8;  // query heads in one lane group: a ymm lane each

// Rows of pool elements as float32, 8 values at a time: kScaled rows carry a scale per (token,
// head) that stands for kMul times the value's unit (kv_quant.h).
template <typename S>
struct Rows8;

// widen16(p, v): 16 values from p as two ymm, in head-dim order, or (kEvenOdd) the 8 even dims then
// the 8 odd ones; q and the accumulators are kept in the same order.
template <>
struct Rows8<float> {
  using Elem = float;
  static constexpr bool kScaled = false, kEvenOdd = false;
  static constexpr float kMul = 1.0f;
  static inline __m256 widen8(const float* p) { return _mm256_loadu_ps(p); }
  static inline void widen16(const float* p, __m256* v) {
    v[0] = _mm256_loadu_ps(p);
    v[1] = _mm256_loadu_ps(p + 8);
  }
};

template <>
struct Rows8<bf16> {
  using Elem = bf16;
  static constexpr bool kScaled = false, kEvenOdd = true;
  static constexpr float kMul = 1.0f;
  static inline __m256 widen8(const bf16* p) {  // exact: the bits into the high half
    const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
  }
  static inline void widen16(const bf16* p, __m256* v) {  // one load: even dims by a shift, odd by a mask
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    v[0] = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
    v[1] = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
  }
};

template <typename F>  // an 8-bit format of kv_quant.h
struct Rows8Quant {
  using Elem = uint8_t;
  static constexpr bool kScaled = true, kEvenOdd = false;
  static constexpr float kMul = F::kMul;
  static inline void widen16(const uint8_t* p, __m256* v) {
    v[0] = F::widen8(p);
    v[1] = F::widen8(p + 8);
  }
};

// 16 floats in head-dim order <-> [8 even dims, 8 odd dims]
inline void to_even_odd(const float* src, float* dst) {
  for (int j = 0; j < 8; ++j) {
    dst[j] = src[2 * j];
    dst[8 + j] = src[2 * j + 1];
  }
}
inline void from_even_odd(const float* src, float* dst, __m256 mul) {
  const __m256 e = _mm256_mul_ps(_mm256_loadu_ps(src), mul), o = _mm256_mul_ps(_mm256_loadu_ps(src + 8), mul);
  const __m256 lo = _mm256_unpacklo_ps(e, o), hi = _mm256_unpackhi_ps(e, o);  // [e0 o0 e1 o1 | e4 o4 e5 o5], [e2 ..]
  _mm256_storeu_ps(dst, _mm256_permute2f128_ps(lo, hi, 0x20));
  _mm256_storeu_ps(dst + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
}

// Scratch per worker (floats): m, l [groups][8] each; acc [H][d]; scores, then weights, [kTile][8];
// row [d]; q as float32 [H][d]; H = hv * group query heads in groups of 8 / group virtual heads.
inline int64_t scratch_floats_max(int64_t hv, int64_t group, int64_t d) {
  const int64_t nkv = kLanes8 / group, groups = (hv + nkv - 1) / nkv;
  return 2 * kLanes8 * groups + 2 * hv * group * d + kTile * kLanes8 + d;
}

// One item (tokens [t0, t1) of request b, every head). T: q's dtype; R: Rows8 of the pools.
template <typename T, typename R, int G>
void run_item_avx2(const Problem& P, const Item& it, float* ws, T* out, float* part) {
  using S = typename R::Elem;
  constexpr int NKV = kLanes8 / G;  // virtual heads per lane group
  constexpr int NQ = NKV * G;       // query heads per lane group (lanes past NQ unused)
  constexpr int64_t kLine = 64 / int64_t(sizeof(S));  // values per cache line of a row
  const int64_t d = P.d, hv = P.hv, nh = hv * G;
  const int64_t groups = (hv + NKV - 1) / NKV;
  float* m = ws;                        // [groups][8]
  float* l = m + groups * kLanes8;      // [groups][8]
  float* acc = l + groups * kLanes8;    // [nh][d]
  float* sc = acc + nh * d;             // [kTile][8]: scores, then weights
  float* row = sc + kTile * kLanes8;    // [d]
  float* qf = row + d;                  // [nh][d]
  std::fill(m, m + groups * kLanes8, -std::numeric_limits<float>::infinity());
  std::fill(l, l + groups * kLanes8, 0.0f);
  std::fill(acc, acc + nh * d, 0.0f);
  const T* q_in = static_cast<const T*>(P.q) + it.b * P.q_sb;
  for (int64_t h = 0; h < nh; ++h)  // q as float32, in the rows' order
    for (int64_t c = 0; c < d; c += 16) {
      alignas(32) float x[16];
      _mm256_store_ps(x, Rows8<T>::widen8(q_in + h * P.q_sh + c));
      _mm256_store_ps(x + 8, Rows8<T>::widen8(q_in + h * P.q_sh + c + 8));
      if constexpr (R::kEvenOdd) to_even_odd(x, qf + h * d + c);
      else std::memcpy(qf + h * d + c, x, sizeof(x));
    }

  const S* kbase = static_cast<const S*>(P.k);
  const S* vbase = static_cast<const S*>(P.v);
  const int64_t* table = P.tables + it.b * P.tables_sb;
  const int64_t ntiles = (it.t1 - it.t0 + kTile - 1) / kTile;
  auto tile_len = [&](int64_t ti) { return int(std::min<int64_t>(kTile, it.t1 - it.t0 - ti * kTile)); };
  const __m256 scale = _mm256_set1_ps(P.scale_log2);
  auto prefetch = [](const S* p) { _mm_prefetch(reinterpret_cast<const char*>(p), kStreamHint); };
  TileOffsets offs[2];  // tiles ti and ti + 1
  tile_offsets(P, table, it.t0, tile_len(0), offs[0]);
  prefetch_first_tile(P, offs[0], tile_len(0), sizeof(S));
  if constexpr (R::kScaled) prefetch_scale_rows(P, offs[0], tile_len(0));
  for (int64_t ti = 0; ti < ntiles; ++ti) {
    const int n = tile_len(ti);
    const int n_next = ti + 1 < ntiles ? tile_len(ti + 1) : 0;
    const TileOffsets& o = offs[ti & 1];
    const TileOffsets& on = offs[(ti + 1) & 1];
    if (n_next > 0) {
      tile_offsets(P, table, it.t0 + (ti + 1) * kTile, n_next, offs[(ti + 1) & 1]);
      if constexpr (R::kScaled) prefetch_scale_rows(P, on, n_next);
    }
    for (int64_t grp = 0; grp < groups; ++grp) {
      const int64_t vh0 = grp * NKV;  // the group's first virtual head
      const int nv = int(std::min<int64_t>(NKV, hv - vh0));
      int64_t koff[NKV], voff[NKV], kvh[kLanes8];  // per virtual head: its kv head in a row; per lane: kv head
      const float* qh[kLanes8];                    // each lane's query head (lanes past the group: the last)
      for (int x = 0; x < NKV; ++x) {
        const int64_t h = (vh0 + std::min(x, nv - 1)) / P.ratio;
        koff[x] = h * P.k_sh;
        voff[x] = h * P.v_sh;
      }
      for (int x = 0; x < kLanes8; ++x) {
        kvh[x] = (vh0 + std::min(x / G, nv - 1)) / P.ratio;
        qh[x] = qf + std::min<int64_t>(vh0 * G + x, nh - 1) * d;
      }

      // scores: sc[i][lane] = q_lane . k_i * scale * log2(e) (* K scale). Passes of TT = NKV tokens
      // over one virtual head: TT x G <= 8 accumulators, each K value widened once for the G heads,
      // summed by one hsum8 (lane u * G + g: token u, head g). Rows past n repeat a valid token.
      constexpr int TT = NKV;
      for (int i = 0; i < n; i += TT) {
        for (int v = 0; v < NKV; ++v) {
          __m256 a[kLanes8];
#pragma GCC unroll 8
          for (int x = 0; x < kLanes8; ++x) a[x] = _mm256_setzero_ps();
          const S* kr[TT];
          const S* kn[TT];
#pragma GCC unroll 8
          for (int u = 0; u < TT; ++u) {
            kr[u] = kbase + o.k[i + u] + koff[v];
            kn[u] = kbase + (i + u < n_next ? on.k[i + u] : o.k[i + u]) + koff[v];
          }
          // the G heads of virtual head v: each lane's own row of qf, clamped to the last head (lanes of a
          // partial group past nv must not read past qf, which ends the worker's scratch)
          const float* qv[G];
#pragma GCC unroll 8
          for (int g = 0; g < G; ++g) qv[g] = qh[v * G + g];
          for (int64_t c = 0; c < d; c += 16) {  // d % 16 == 0
            if (c % kLine == 0)
#pragma GCC unroll 8
              for (int u = 0; u < TT; ++u) prefetch(kn[u] + c);
#pragma GCC unroll 8
            for (int u = 0; u < TT; ++u) {
              __m256 k[2];
              R::widen16(kr[u] + c, k);
#pragma GCC unroll 8
              for (int g = 0; g < G; ++g) {
                const float* q = qv[g] + c;
                a[u * G + g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8), k[1], _mm256_fmadd_ps(_mm256_loadu_ps(q), k[0], a[u * G + g]));
              }
            }
          }
          alignas(32) float sums[kLanes8];
          _mm256_store_ps(sums, swiftlm_cpu::hsum8(a));
          for (int u = 0; u < TT; ++u)
            for (int g = 0; g < G; ++g) sc[(i + u) * kLanes8 + v * G + g] = sums[u * G + g];
        }
      }
      for (int i = 0; i < n; ++i) {
        __m256 s = _mm256_mul_ps(_mm256_loadu_ps(sc + i * kLanes8), scale);
        if constexpr (R::kScaled) {
          alignas(32) float ks[kLanes8];
          for (int x = 0; x < kLanes8; ++x) ks[x] = P.ks[o.s[i] + kvh[x]] * R::kMul;
          s = _mm256_mul_ps(s, _mm256_load_ps(ks));
        }
        _mm256_storeu_ps(sc + i * kLanes8, s);
      }

      // the online softmax, lane-wise, in the log2 domain; weights past n are 0
      float* mg = m + grp * kLanes8;
      float* lg = l + grp * kLanes8;
      __m256 mx = _mm256_loadu_ps(sc);
      for (int i = 1; i < n; ++i) mx = _mm256_max_ps(mx, _mm256_loadu_ps(sc + i * kLanes8));
      const __m256 m_old = _mm256_loadu_ps(mg), m_new = _mm256_max_ps(m_old, mx);  // finite: n >= 1
      const __m256 alpha = swiftlm_cpu::exp2_ps8(_mm256_sub_ps(m_old, m_new));     // 0 on the first tile
      __m256 sum = _mm256_setzero_ps();
      for (int i = 0; i < n; ++i) {
        const __m256 e = swiftlm_cpu::exp2_ps8(_mm256_sub_ps(_mm256_loadu_ps(sc + i * kLanes8), m_new));
        sum = _mm256_add_ps(sum, e);
        __m256 w = e;
        if constexpr (R::kScaled) {  // each token's V scale into its weight (l has the unscaled sum)
          alignas(32) float vs[kLanes8];
          for (int x = 0; x < kLanes8; ++x) vs[x] = P.vs[o.s[i] + kvh[x]] * R::kMul;
          w = _mm256_mul_ps(w, _mm256_load_ps(vs));
        }
        _mm256_storeu_ps(sc + i * kLanes8, w);
      }
      _mm256_storeu_ps(lg, _mm256_fmadd_ps(_mm256_loadu_ps(lg), alpha, sum));
      _mm256_storeu_ps(mg, m_new);
      alignas(32) float al[kLanes8];
      _mm256_store_ps(al, alpha);
      for (int x = 0; x < nv * G; ++x) {  // acc *= alpha, per head
        float* a = acc + (vh0 * G + x) * d;
        const __m256 f = _mm256_set1_ps(al[x]);
        for (int64_t c = 0; c < d; c += 8) _mm256_storeu_ps(a + c, _mm256_mul_ps(_mm256_loadu_ps(a + c), f));
      }

      // P.V, four tokens at a time (rows past n repeat a valid token, with weight 0)
      const int n4 = (n + 3) & ~3;
      for (int i = n; i < n4; ++i) _mm256_storeu_ps(sc + i * kLanes8, _mm256_setzero_ps());
      for (int i = 0; i < n4; i += 4) {
        const S* r[4] = {vbase + o.v[i], vbase + o.v[i + 1], vbase + o.v[i + 2], vbase + o.v[i + 3]};
        const S* rn[4];  // the next tile's rows i .. i + 3 (this tile's where it has none)
        for (int u = 0; u < 4; ++u) rn[u] = vbase + (i + u < n_next ? on.v[i + u] : o.v[i + u]);
        for (int v = 0; v < nv; ++v)
          for (int64_t c = 0; c < d; c += 16) {
            __m256 x[4][2];
#pragma GCC unroll 4
            for (int u = 0; u < 4; ++u) {
              if (c % kLine == 0) prefetch(rn[u] + voff[v] + c);
              R::widen16(r[u] + voff[v] + c, x[u]);
            }
#pragma GCC unroll 8
            for (int g = 0; g < G; ++g) {
              const int lane = v * G + g;
              float* a = acc + ((vh0 + v) * G + g) * d + c;
              __m256 s0 = _mm256_loadu_ps(a), s1 = _mm256_loadu_ps(a + 8);
#pragma GCC unroll 4
              for (int u = 0; u < 4; ++u) {
                const __m256 w = _mm256_broadcast_ss(sc + (i + u) * kLanes8 + lane);
                s0 = _mm256_fmadd_ps(x[u][0], w, s0);
                s1 = _mm256_fmadd_ps(x[u][1], w, s1);
              }
              _mm256_storeu_ps(a, s0);
              _mm256_storeu_ps(a + 8, s1);
            }
          }
      }
    }
  }

  write_item(P, it, nh, m, l, [](int64_t h) { return h / NQ * kLanes8 + h % NQ; },
             [&](int64_t h, float* dst, float mul) {  // the rows' order back to head-dim order
               const __m256 f = _mm256_set1_ps(mul);
               for (int64_t c = 0; c < d; c += 16) {
                 if constexpr (R::kEvenOdd) {
                   from_even_odd(acc + h * d + c, dst + c, f);
                 } else {
                   _mm256_storeu_ps(dst + c, _mm256_mul_ps(_mm256_loadu_ps(acc + h * d + c), f));
                   _mm256_storeu_ps(dst + c + 8, _mm256_mul_ps(_mm256_loadu_ps(acc + h * d + c + 8), f));
                 }
               }
             },
             row, out, part);
}

template <typename T, typename R, int G>
void run_item_erased(const Problem& P, const Item& it, float* ws, void* out, float* part) {
  run_item_avx2<T, R, G>(P, it, ws, static_cast<T*>(out), part);
}

template <typename T, typename R>
ItemFn pick_item_fn(int64_t group) {
  switch (group) {
    case 1: return run_item_erased<T, R, 1>;
    case 2: return run_item_erased<T, R, 2>;
    case 3: return run_item_erased<T, R, 3>;
    case 4: return run_item_erased<T, R, 4>;
    case 5: return run_item_erased<T, R, 5>;
    case 6: return run_item_erased<T, R, 6>;
    case 7: return run_item_erased<T, R, 7>;
    case 8: return run_item_erased<T, R, 8>;
    default: return nullptr;
  }
}

// The runner for q of dtype T, `group` query heads per virtual head and pools of `format` (kNone:
// T's own dtype).
template <typename T>
ItemFn pick_item_fn(int64_t group, int64_t format, int64_t /* d */) {
  switch (format) {
    case swiftlm_kvq::kInt8: return pick_item_fn<T, Rows8Quant<swiftlm_kvq::I8>>(group);
    case swiftlm_kvq::kE4M3: return pick_item_fn<T, Rows8Quant<swiftlm_kvq::E4M3>>(group);
    case swiftlm_kvq::kE5M2: return pick_item_fn<T, Rows8Quant<swiftlm_kvq::E5M2>>(group);
    default: return pick_item_fn<T, Rows8<T>>(group);
  }
}

}  // namespace

void swiftlm_attn::store_row(const float* src, float* dst, int64_t d) { std::memcpy(dst, src, d * sizeof(float)); }
void swiftlm_attn::store_row(const float* src, bf16* dst, int64_t d) {
  for (int64_t c = 0; c < d; c += 8) swiftlm_cpu::store8_bf16(dst + c, _mm256_loadu_ps(src + c));  // d % 16 == 0
}
float swiftlm_attn::exp2_scalar(float x) { return swiftlm_cpu::exp2_one8(x); }
