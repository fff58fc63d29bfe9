// Decode attention over a paged KV cache (one query token per request), AVX-512. CPUs without
// AVX-512 (F and BW) build paged_attention_avx2.h's item runners in place of the ones below; the plan,
// the merge and the op are shared (paged_attention_plan.h).
//
//   out[b, h] = softmax(q[b, h] . K_b^T * scale) . V_b      over the first seq_lens[b] tokens
//   token t of request b lives at pool[block_tables[b, t / bs], t % bs]   (pool: [N, bs, Hkv, D])
//
// Work items are (request, token chunk) over all heads, so a thread streams whole blocks. An item
// reads each K and V row once, for all query heads of its GQA group together, keeping an online
// softmax (max m, sum l, fp32 accumulator) per query head. Tokens go in tiles of kTile = 32: two
// sub-tiles of 16 whose scores fill one zmm each. A long request is cut into chunks (flash-decoding
// split-K): each chunk leaves (m, l, acc) in a scratch buffer and a final pass merges them, so one
// request uses every thread. Scores are kept in the log2 domain (scale * log2(e) folded in), so the
// softmax exponentials are common.h's exp2_ps.
//
// Reading order: the pools are read a whole token row (every kv head of a lane group) at a time, in
// address order, and each row read pulls the same row of the next tile into L2 (kStreamHint), one
// line per line read. On a Zen4 VM the hardware prefetchers streamed per-head reads (a head's 256
// bytes of each of 32 rows 2 KB apart) at half the rate of whole-row reads, and prefetches into L1,
// or in bursts, slowed the kernel: the two changes took bf16 from 10 to 23-33 GB/s (28 layers, 2048
// to 8192 tokens) and int8 from 7 to 15-24.
//
// Pools of q's dtype (run_item_rows): up to 16 query heads go together, one zmm lane each (as in the
// int8 path below): a token's scores for all of them from its K row, the online softmax lane-wise
// over heads, then P.V four tokens at a time, each V row read whole into fp32 accumulators in
// scratch. bf16 q.k uses vdpbf16ps on the raw bf16 q (exact products, fp32 sums; CPUs without
// AVX512-BF16 widen q and k to fp32 instead, same numbers up to summation order); V rows are widened
// to fp32 with a shift (even dims) and a mask (odd dims), so within every 32-dim chunk the
// accumulator holds the 16 even dims then the 16 odd dims; the permutation is undone when results
// are written. On CPUs with AMX (and blocks of a multiple of 16 tokens) bf16 q.k runs on tiles
// instead (Bf16ScoreTiles: 16 K rows of one block as A, a virtual head's q as B): the same exact
// products, summed in another order; 1.0-1.08x per call at 256-32768 tokens on a Xeon VM. There
// (keyed on the same test) P.V then goes per virtual head, a token at a time, with the head's
// accumulators in registers and alpha folded into their load (pv_head_pass): a third fewer
// instructions a token than four tokens at a time through accumulators in memory; 1.26x in L2,
// 1.05-1.10x from memory.
//
// Other 8-bit pools (the small KV cache, kv_quant.h; run_item): int8 or float8 values with a float32
// scale per (token, head) in scale pools [N, bs, Hkv]. Steps go (tile, virtual head), reading one
// head's rows at a time. q is widened to fp32 once per item; K rows are widened
// 16 values at a time into fp32 dots, and the K scale of each token multiplies its score; the V scale
// of each token multiplies its softmax weight (the normaliser sums the unscaled weights), and V rows
// are widened into the fp32 accumulator in head-dim order.
//
// int8 pools with bf16 q on CPUs with AVX512-VNNI take integer dot products instead (I8Dot,
// run_item_i8): widening every 8-bit value to fp32 made the kernel bound by instructions, not memory.
// q is rounded once per item to int16 against its head's max (|q| / 32767 steps, below bf16's own
// 8-bit mantissa), and vpdpwssd sums int16 q times int8 K widened to int16, 32 products an
// instruction. Up to 16 query heads go together, one zmm lane each: every K row (all their kv heads)
// is read once in address order, and the online softmax runs lane-wise over heads. (q.k on AMX tiles,
// tdpbssd / tdpbsud on q's high and low bytes, summed the same integers; on a Xeon VM, in the engine,
// vpdpwssd read the pools 1.03-1.15x faster at 32-8192 tokens, its prefetches spread through its
// work where the tiles' came in bursts, so the tiles were dropped.) The softmax
// weights of a tile, V scales folded in, are rounded to 16 bits against the tile's max and split into
// two bytes; V rows of 4 tokens are byte-interleaved so that vpdpbusd multiplies each weight byte
// (unsigned) with its token's values (signed) and sums the 4 tokens per dim, 64 products an
// instruction. Each tile's integer sums go into the fp32 accumulators with the tile's scale; the
// accumulators then hold dims in the interleave's order, undone when results are written.
//
// Code generation: the kernels are bound by their instructions when K/V streams fast (from L3 they
// read no faster than from memory on a Zen4 VM), and GCC 12 compiled the general q.k loops (per-head
// offsets from tables, q at runtime strides) with the sums copied between registers and spilled, and
// the addresses reloaded from the stack. Full lane groups with head_dim 64 or 128 take q.k rows
// written for the compiler (qk_row: the same sums in the same order; int8 pools two rows at a time,
// qk_pair), and whole tiles take a fully unrolled int8 P.V: 1.23x (bf16) and 1.33x (int8) from L3,
// 1.05-1.17x in the engine at 2048 tokens.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#include "common.h"
#include "kv_quant.h"
#include "paged_attention_plan.h"

#if defined(__AVX512F__) && defined(__AVX512BW__)
#if defined(__AMX_TILE__)
#include "amx_linear.h"  // enable_amx, TileConfig
#endif

namespace {

using namespace swiftlm_attn;

constexpr int kLanes = 16;         // query heads in one lane group (run_item_rows, run_item_i8): a zmm lane each
// The int8 integer path sums a head's q.k in int32: |q . k| <= 32767 * 128 * d stays exact up to this
// head_dim; longer heads take the float path.
constexpr int64_t kMaxI8DotDim = 512;

// Transposed horizontal sum: lane i of the result is the sum of the 16 lanes of a[i], summed with add
// (float or int32 lanes: the shuffles only move bits).
template <typename Add>
inline __m512i hsum16_lanes(const __m512i* a, Add add) {
  __m512i s1[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i)  // per 128-bit lane: [x0+x2, y0+y2, x1+x3, y1+y3]
    s1[i] = add(_mm512_unpacklo_epi32(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_epi32(a[2 * i], a[2 * i + 1]));
  __m512i s2[4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i)  // per 128-bit lane: partial sums of a[4i .. 4i+3]
    s2[i] = add(_mm512_unpacklo_epi64(s1[2 * i], s1[2 * i + 1]), _mm512_unpackhi_epi64(s1[2 * i], s1[2 * i + 1]));
  const __m512i w01 = add(_mm512_shuffle_i32x4(s2[0], s2[1], _MM_SHUFFLE(2, 0, 2, 0)),
                          _mm512_shuffle_i32x4(s2[0], s2[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i w23 = add(_mm512_shuffle_i32x4(s2[2], s2[3], _MM_SHUFFLE(2, 0, 2, 0)),
                          _mm512_shuffle_i32x4(s2[2], s2[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return add(_mm512_shuffle_i32x4(w01, w23, _MM_SHUFFLE(2, 0, 2, 0)),
             _mm512_shuffle_i32x4(w01, w23, _MM_SHUFFLE(3, 1, 3, 1)));
}

inline __m512 hsum16(const __m512* a) {
  __m512i b[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) b[i] = _mm512_castps_si512(a[i]);
  return _mm512_castsi512_ps(hsum16_lanes(b, [](__m512i x, __m512i y) {
    return _mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(x), _mm512_castsi512_ps(y)));
  }));
}

inline __m512i hsum16_epi32(const __m512i* a) {  // exact
  return hsum16_lanes(a, [](__m512i x, __m512i y) { return _mm512_add_epi32(x, y); });
}

// The q.k sums of one token's K row with every lane of a lane group, for groups whose virtual heads
// are kv heads (GQA ratio 1), all present, with head_dim = 32 * ND: lane v * G + g = q_{v,g} . K_v,
// summed over 32-dim chunks in order (Dot: I8RowDot, Bf16RowDot). K_v at krow + v * k_sh; q
// chunk-major (qc + (j * kLanes + lane) * 32: fixed offsets from one pointer). Each 64 bytes of K
// read prefetch the same line of the next tile's K row (kn) into L2 (its V rows come with P.V).
// Written so that the compiler keeps the 16 sums in registers and addresses everything from three
// pointers: GCC 12 compiled the general loops (per-head offsets from a table, q at runtime strides)
// to ~100 instructions a 32-dim chunk, with the sums copied between registers and spilled, the
// addresses reloaded from the stack, and (bf16) every q chunk passed through it.
template <typename Dot, int G, int ND>
inline auto qk_row(const typename Dot::Q* qc, const typename Dot::S* krow, int64_t k_sh, const typename Dot::S* kn) {
  constexpr int NKV = kLanes / G;
  typename Dot::Acc a[kLanes];
#pragma GCC unroll 16
  for (int x = 0; x < kLanes; ++x) a[x] = Dot::zero();
#pragma GCC unroll 16
  for (int v = 0; v < NKV; ++v) {
#pragma GCC unroll 8
    for (int j = 0; j < ND; ++j) {
      if ((j * Dot::kChunkBytes) % 64 == 0) _mm_prefetch(reinterpret_cast<const char*>(kn + 32 * j), kStreamHint);
      const auto k = Dot::load(krow + 32 * j);
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) a[v * G + g] = Dot::mac(a[v * G + g], k, Dot::loadq(qc + (j * kLanes + v * G + g) * 32));
    }
    krow += k_sh;
    kn += k_sh;
    // keeps each head's prefetches among its reads: GCC hoisted all 16 ahead of the row, and
    // prefetches in bursts streamed slower than spread ones (0.90-0.97x from memory)
    __asm__ volatile("" ::: "memory");
  }
  return Dot::sum(a);
}

// qk_row's chunks of 32 dims for a lane group (0: the general loop): groups whose virtual heads are
// kv heads (GQA ratio 1), all present (full), with head_dim 64 or 128.
inline int qk_row_chunks(const Problem& P, bool full) {
  return P.ratio == 1 && full && (P.d == 64 || P.d == 128) ? int(P.d / 32) : 0;
}

// qk_row for nd = qk_row_chunks(..) > 0 chunks.
template <typename Dot, int G>
inline auto qk_row_nd(int nd, const typename Dot::Q* qc, const typename Dot::S* krow, int64_t k_sh,
                      const typename Dot::S* kn) {
  return nd == 4 ? qk_row<Dot, G, 4>(qc, krow, k_sh, kn) : qk_row<Dot, G, 2>(qc, krow, k_sh, kn);
}

// qk_row's integer sums (int8 pools) for two tokens (K rows ka, kb; the next tile's rows na, nb
// prefetched alike), each q chunk loaded once for both: a (kv head, chunk) takes 2 K loads and G q
// loads for 2G dot products, where qk_row takes 1 + G loads for G. On a Zen4 VM (one 512-bit load a
// cycle) qk_row's int8 q.k was bound by its loads: 37.8 ns a token in L2 (1 thread), where its 64
// vpdpwssd take 18; two tokens at a time read the pools 1.07-1.09x as fast from L2 and L3. From
// memory it measured 0.91-1.06x (six interleaved A/Bs, slow minutes): within the noise. The lanes go
// in two halves of 8 (8 / G kv heads each), a half's 16 sums [a's 8 lanes, b's 8 lanes] reduced by
// one hsum16; every lane sums the same integers as in qk_row. Needs G | 8. out_a, out_b: the 16
// lanes' sums of each token. kDense: the kv heads are adjacent in a row (k_sh = head_dim), so every
// address is a constant offset from the four row pointers (with k_sh at runtime GCC kept the 32
// addresses in vector registers and moved them back one by one).
template <typename Dot, int G, int ND, bool kDense>
inline void qk_pair(const typename Dot::Q* qc, const typename Dot::S* ka, const typename Dot::S* kb, int64_t k_sh,
                    const typename Dot::S* na, const typename Dot::S* nb, __m512i& out_a, __m512i& out_b) {
  if constexpr (kDense) k_sh = 32 * ND;
  constexpr int HL = kLanes / 2;  // lanes per half
  constexpr int NKVH = HL / G;    // kv heads per half
  static_assert(HL % G == 0, "qk_pair takes GQA groups that divide 8");
  __m512i half[2];
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    typename Dot::Acc a[kLanes];  // a[x]: token a's lane h * HL + x; a[HL + x]: token b's
#pragma GCC unroll 16
    for (int x = 0; x < kLanes; ++x) a[x] = Dot::zero();
#pragma GCC unroll 8
    for (int v = 0; v < NKVH; ++v) {  // the pointers move on a kv head a step, as in qk_row
#pragma GCC unroll 8
      for (int j = 0; j < ND; ++j) {
        if ((j * Dot::kChunkBytes) % 64 == 0) {
          _mm_prefetch(reinterpret_cast<const char*>(na + 32 * j), kStreamHint);
          _mm_prefetch(reinterpret_cast<const char*>(nb + 32 * j), kStreamHint);
        }
        const auto xa = Dot::load(ka + 32 * j), xb = Dot::load(kb + 32 * j);
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g) {
          auto qv = Dot::loadq(qc + (j * kLanes + h * HL + v * G + g) * 32);
          __asm__("" : "+v"(qv));  // one load for both tokens: GCC would fold it into each dot product
          a[v * G + g] = Dot::mac(a[v * G + g], xa, qv);
          a[HL + v * G + g] = Dot::mac(a[HL + v * G + g], xb, qv);
        }
      }
      ka += k_sh, kb += k_sh, na += k_sh, nb += k_sh;
      __asm__ volatile("" ::: "memory");  // as in qk_row: the prefetches stay among the head's reads
    }
    half[h] = Dot::sum(a);
  }
  // 128-bit lanes 0-1 of each half are token a's, 2-3 token b's
  out_a = _mm512_shuffle_i64x2(half[0], half[1], _MM_SHUFFLE(1, 0, 1, 0));
  out_b = _mm512_shuffle_i64x2(half[0], half[1], _MM_SHUFFLE(3, 2, 3, 2));
}

// qk_pair for nd = qk_row_chunks(..) > 0 chunks.
template <typename Dot, int G>
inline void qk_pair_nd(int nd, const typename Dot::Q* qc, const typename Dot::S* ka, const typename Dot::S* kb,
                       int64_t k_sh, const typename Dot::S* na, const typename Dot::S* nb, __m512i& out_a,
                       __m512i& out_b) {
  if (nd == 4 && k_sh == 128) qk_pair<Dot, G, 4, true>(qc, ka, kb, k_sh, na, nb, out_a, out_b);
  else if (nd == 4) qk_pair<Dot, G, 4, false>(qc, ka, kb, k_sh, na, nb, out_a, out_b);
  else if (k_sh == 64) qk_pair<Dot, G, 2, true>(qc, ka, kb, k_sh, na, nb, out_a, out_b);
  else qk_pair<Dot, G, 2, false>(qc, ka, kb, k_sh, na, nb, out_a, out_b);
}

template <typename T>
struct Ops;

template <>
struct Ops<float> {
  // NV zmm of V (16 * NV dims starting at c), in accumulator order.
  template <int NV>
  static inline void load_v(const float* row, __m512* v) {
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) v[j] = _mm512_loadu_ps(row + 16 * j);
  }

  // acc (accumulator order) * mul -> dst in head-dim order.
  static inline void unpermute(const float* acc, float* dst, int64_t d, float mul) {
    const __m512 vm = _mm512_set1_ps(mul);
    for (int64_t c = 0; c < d; c += 16) _mm512_storeu_ps(dst + c, _mm512_mul_ps(_mm512_loadu_ps(acc + c), vm));
  }

  static inline void store(const float* src, float* dst, int64_t d) { std::memcpy(dst, src, d * sizeof(float)); }
};

template <>
struct Ops<bf16> {
  // 32 bf16 as fp32: even dims (shift into the high half) and odd dims (mask the high half).
  static inline void widen(__m512i x, __m512& even, __m512& odd) {
    even = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
    odd = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
  }

  template <bool kTail>  // a 16-dim tail zero-fills the upper half
  static inline __m512i load32(const bf16* p) {
    return kTail ? _mm512_maskz_loadu_epi16(0xFFFF, p) : _mm512_loadu_si512(p);
  }

  // Full 32-dim chunks come out as [16 even dims, 16 odd dims]; a 16-dim tail (NV == 1) in order.
  template <int NV>
  static inline void load_v(const bf16* row, __m512* v) {
    if constexpr (NV == 1) {
      v[0] = swiftlm_cpu::load16(row);
    } else {
#pragma GCC unroll 2
      for (int j = 0; j < NV / 2; ++j) widen(_mm512_loadu_si512(row + 32 * j), v[2 * j], v[2 * j + 1]);
    }
  }

  static inline void unpermute(const float* acc, float* dst, int64_t d, float mul) {
    const __m512 vm = _mm512_set1_ps(mul);
    const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    int64_t c = 0;
    for (; c + 32 <= d; c += 32) {
      const __m512 even = _mm512_mul_ps(_mm512_loadu_ps(acc + c), vm);
      const __m512 odd = _mm512_mul_ps(_mm512_loadu_ps(acc + c + 16), vm);
      _mm512_storeu_ps(dst + c, _mm512_permutex2var_ps(even, lo, odd));
      _mm512_storeu_ps(dst + c + 16, _mm512_permutex2var_ps(even, hi, odd));
    }
    if (c < d) _mm512_storeu_ps(dst + c, _mm512_mul_ps(_mm512_loadu_ps(acc + c), vm));
  }

  // rounded as c10::BFloat16(float) rounds (vcvtneps2bf16 would flush denormals and keep NaN payloads)
  static inline void store(const float* src, bf16* dst, int64_t d) {
    for (int64_t c = 0; c < d; c += 16) swiftlm_cpu::store16(dst + c, swiftlm_cpu::load16(src + c));
  }
};

// 8-bit rows of format F (kv_quant.h); q is fp32, accumulators in head-dim order.
template <typename F>
struct QOps {
  static inline __m512 qk_tile(const float* q, const uint8_t* base, const int64_t* off, int64_t d) {
    __m512 acc[kSub];
#pragma GCC unroll 16
    for (int i = 0; i < kSub; ++i) acc[i] = _mm512_setzero_ps();
    for (int64_t c = 0; c < d; c += 16) {
      const __m512 qc = _mm512_loadu_ps(q + c);
#pragma GCC unroll 16
      for (int i = 0; i < kSub; ++i) acc[i] = _mm512_fmadd_ps(qc, F::widen16(base + off[i] + c), acc[i]);
    }
    return hsum16(acc);
  }

  // The scores of 16 tokens for all G (2 or 4) query heads of a kv head, each K value widened once
  // for all of them: G passes of 16 / G tokens, each with G x 16 / G = 16 accumulators (q_g at
  // q + g * d). out[g] lane i: q_g . row_i.
  template <int G>
  static inline void qk_group(const float* q, const uint8_t* base, const int64_t* off, int64_t d, __m512* out) {
    static_assert(G == 2 || G == 4, "qk_group takes 2 or 4 heads");
    constexpr int T = kSub / G;  // tokens per pass
    __m512 r[G];
    for (int pass = 0; pass < G; ++pass) {
      __m512 acc[G * T];
#pragma GCC unroll 16
      for (int i = 0; i < G * T; ++i) acc[i] = _mm512_setzero_ps();
      const int64_t* o = off + pass * T;
      for (int64_t c = 0; c < d; c += 16) {
        __m512 k[T];
#pragma GCC unroll 8
        for (int i = 0; i < T; ++i) k[i] = F::widen16(base + o[i] + c);
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) {
          const __m512 qc = _mm512_loadu_ps(q + g * d + c);
#pragma GCC unroll 8
          for (int i = 0; i < T; ++i) acc[g * T + i] = _mm512_fmadd_ps(qc, k[i], acc[g * T + i]);
        }
      }
      r[pass] = hsum16(acc);  // lane g * T + i: head g, token pass * T + i
    }
    if constexpr (G == 2) {  // [g0 | g1] halves of tokens 0-7, then 8-15
      out[0] = _mm512_shuffle_f32x4(r[0], r[1], _MM_SHUFFLE(1, 0, 1, 0));
      out[1] = _mm512_shuffle_f32x4(r[0], r[1], _MM_SHUFFLE(3, 2, 3, 2));
    } else {  // 128-bit lane g of r[pass]: head g, tokens 4 pass .. 4 pass + 3: a 4 x 4 transpose of lanes
      const __m512 t0 = _mm512_shuffle_f32x4(r[0], r[1], _MM_SHUFFLE(1, 0, 1, 0));
      const __m512 t1 = _mm512_shuffle_f32x4(r[2], r[3], _MM_SHUFFLE(1, 0, 1, 0));
      const __m512 t2 = _mm512_shuffle_f32x4(r[0], r[1], _MM_SHUFFLE(3, 2, 3, 2));
      const __m512 t3 = _mm512_shuffle_f32x4(r[2], r[3], _MM_SHUFFLE(3, 2, 3, 2));
      out[0] = _mm512_shuffle_f32x4(t0, t1, _MM_SHUFFLE(2, 0, 2, 0));
      out[1] = _mm512_shuffle_f32x4(t0, t1, _MM_SHUFFLE(3, 1, 3, 1));
      out[2] = _mm512_shuffle_f32x4(t2, t3, _MM_SHUFFLE(2, 0, 2, 0));
      out[3] = _mm512_shuffle_f32x4(t2, t3, _MM_SHUFFLE(3, 1, 3, 1));
    }
  }

  template <int NV>
  static inline void load_v(const uint8_t* row, __m512* v) {
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) v[j] = F::widen16(row + 16 * j);
  }
};


// acc[g][c .. c + 16 NV) = alpha[g] * acc[g][..] + sum_i p[g][i] * V_i[c ..], over the n valid tokens.
// The K and V rows of the next tile that a P.V pass pulls into cache as it goes, one token row per
// token it accumulates. Issued in one burst at the start of a step instead, the same prefetches
// were 2-4% slower at 2048 tokens (interleaved A/B, 28 layers on huge pages).
struct Prefetch {
  const char* k = nullptr;
  const char* v = nullptr;
  const int64_t* ok = nullptr;
  const int64_t* ov = nullptr;
  int n = 0;
  int64_t row_bytes = 0;
  int64_t esize = 0;
};

// VOps: Ops<T> or QOps<F> for pool elements S.
template <typename VOps, typename S, int G, int NV>
inline void pv_chunk(float* acc, int64_t d, const float* p, const float* alpha, const S* base,
                     const int64_t* off, int n, int64_t c, const Prefetch& pf) {
  __m512 a[G][NV];
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) {
    const __m512 sc = _mm512_set1_ps(alpha[g]);
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) a[g][j] = _mm512_mul_ps(_mm512_loadu_ps(acc + g * d + c + 16 * j), sc);
  }
  for (int i = 0; i < n; ++i) {
    if (i < pf.n)
      for (int64_t x = 0; x < pf.row_bytes; x += 64) {
        _mm_prefetch(pf.k + pf.ok[i] * pf.esize + x, kStreamHint);
        _mm_prefetch(pf.v + pf.ov[i] * pf.esize + x, kStreamHint);
      }
    __m512 v[NV];
    VOps::template load_v<NV>(base + off[i] + c, v);
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      const __m512 pg = _mm512_set1_ps(p[g * kTile + i]);
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) a[g][j] = _mm512_fmadd_ps(v[j], pg, a[g][j]);
    }
  }
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) _mm512_storeu_ps(acc + g * d + c + 16 * j, a[g][j]);
}

template <typename VOps, typename S, int G>
inline void pv_tile(float* acc, int64_t d, const float* p, const float* alpha, const S* base, const int64_t* off,
                    int n, const Prefetch& pf) {
  constexpr int NV = G <= 4 ? 4 : 2;  // accumulators in registers: G * NV <= 16
  const Prefetch none;
  int64_t c = 0;
  for (; c + 16 * NV <= d; c += 16 * NV)
    pv_chunk<VOps, S, G, NV>(acc, d, p, alpha, base, off, n, c, c == 0 ? pf : none);
  if (NV == 4 && c + 32 <= d) {
    pv_chunk<VOps, S, G, 2>(acc, d, p, alpha, base, off, n, c, c == 0 ? pf : none);
    c += 32;
  }
  if (c < d) pv_chunk<VOps, S, G, 1>(acc, d, p, alpha, base, off, n, c, c == 0 ? pf : none);
}

// int8 pools read with integer dot products (bf16 q, AVX512-VNNI); the values and scales are I8's.
struct I8Dot : swiftlm_kvq::I8 {};

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
constexpr bool kHaveVnni = true;

// 32 int8 values (16 with kTail, the rest zero) as int16.
template <bool kTail>
inline __m512i widen_i16(const uint8_t* p) {
  return _mm512_cvtepi8_epi16(kTail ? _mm256_maskz_loadu_epi8(0xFFFF, p)
                                    : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// The byte interleave of 4 tokens' rows a, b, c, e over 64 dims: int32 lane m of x[j] holds the 4
// tokens' values of dim 16 (m / 4) + 4 j + m % 4 (unpacks work within 128-bit lanes).
inline void interleave4(__m512i a, __m512i b, __m512i c, __m512i e, __m512i* x) {
  const __m512i ab_lo = _mm512_unpacklo_epi8(a, b), ab_hi = _mm512_unpackhi_epi8(a, b);
  const __m512i ce_lo = _mm512_unpacklo_epi8(c, e), ce_hi = _mm512_unpackhi_epi8(c, e);
  x[0] = _mm512_unpacklo_epi16(ab_lo, ce_lo);
  x[1] = _mm512_unpackhi_epi16(ab_lo, ce_lo);
  x[2] = _mm512_unpacklo_epi16(ab_hi, ce_hi);
  x[3] = _mm512_unpackhi_epi16(ab_hi, ce_hi);
}

// For GP (1 or 2) query heads of one kv head, acc[g] (rows of da floats, interleave order) =
// alpha[g] * acc[g] + sp[g] * sum_i (256 hi(g, i) + lo(g, i)) * V_i over tokens [0, n4) (n4 a multiple
// of 4; weights past the tile's tokens are 0), the integer sums in registers. hi(g, i .. i + 3),
// lo(..): the weight bytes of 4 tokens, one int32 word at hi + g + i / 4 * kLanes (lo alike). base:
// the kv head's V rows; V_i at base + off[i], in cache by now (prefetched during the previous tile's
// P.V). off_next (or null): the next tile's rows of the head, prefetched into L2 over the same dims,
// one line per line read.
// kN4 > 0: n4 is kN4 (a whole tile), and the token loop unrolls fully: as a loop, GCC 12 kept the 16
// sums in other registers than the ones it adds into, with two register copies per vpdpbusd and two
// sums spilled to the stack.
template <int GP, int kN4 = 0>
inline void pv_i8(float* acc, int64_t da, const int32_t* hi, const int32_t* lo, const float* sp, const float* alpha,
                  const uint8_t* base, const int64_t* off, int n4, int64_t d, const int64_t* off_next = nullptr) {
  if constexpr (kN4 > 0) n4 = kN4;
  for (int64_t c = 0; c < d; c += 64) {
    const __mmask64 m = d - c >= 64 ? ~__mmask64(0) : (__mmask64(1) << (d - c)) - 1;
    __m512i sh[GP][4], sl[GP][4];
#pragma GCC unroll 2
    for (int g = 0; g < GP; ++g)
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) sh[g][j] = sl[g][j] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int i = 0; i < n4; i += 4) {
      if (off_next != nullptr)
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r)
          _mm_prefetch(reinterpret_cast<const char*>(base + off_next[i + r] + c), kStreamHint);
      __m512i x[4];
      interleave4(_mm512_maskz_loadu_epi8(m, base + off[i] + c), _mm512_maskz_loadu_epi8(m, base + off[i + 1] + c),
                  _mm512_maskz_loadu_epi8(m, base + off[i + 2] + c), _mm512_maskz_loadu_epi8(m, base + off[i + 3] + c), x);
#pragma GCC unroll 2
      for (int g = 0; g < GP; ++g) {
        const __m512i bh = _mm512_set1_epi32(hi[g + i / 4 * kLanes]), bl = _mm512_set1_epi32(lo[g + i / 4 * kLanes]);
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
          sh[g][j] = _mm512_dpbusd_epi32(sh[g][j], bh, x[j]);
          sl[g][j] = _mm512_dpbusd_epi32(sl[g][j], bl, x[j]);
        }
      }
    }
#pragma GCC unroll 2
    for (int g = 0; g < GP; ++g)
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {  // <= 32 tokens x 255 x 127 per byte: 256 sh + sl stays in int32
        float* a = acc + g * da + c + 16 * j;
        const __m512 sum = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(sh[g][j], 8), sl[g][j]));
        _mm512_storeu_ps(a, _mm512_fmadd_ps(sum, _mm512_set1_ps(sp[g]), _mm512_mul_ps(_mm512_loadu_ps(a), _mm512_set1_ps(alpha[g]))));
      }
  }
}

// qk_row's arithmetic on int8 pools (bf16 q rounded to int16, AVX512-VNNI): exact int32 sums.
struct I8RowDot {
  using S = uint8_t;  // pool elements
  using Q = int16_t;  // q elements
  using Acc = __m512i;
  static constexpr int kChunkBytes = 32;  // K bytes of 32 dims
  static Acc zero() { return _mm512_setzero_si512(); }
  static __m512i load(const S* k) { return widen_i16<false>(k); }
  static __m512i loadq(const Q* q) { return _mm512_loadu_si512(q); }
  static Acc mac(Acc a, __m512i k, __m512i q) { return _mm512_dpwssd_epi32(a, k, q); }
  static __m512i sum(const Acc* a) { return hsum16_epi32(a); }
};
#else
constexpr bool kHaveVnni = false;
#endif

// The interleave order (pv_i8) back to head-dim order, times mul; acc has rows padded to 64 dims.
inline void unpermute_i8(const float* acc, float* dst, int64_t d, float mul) {
  for (int64_t c = 0; c < d; c += 64)
    for (int j = 0; j < 4; ++j)
      for (int L = 0; L < 4; ++L)
        for (int i = 0; i < 4; ++i)
          if (const int64_t dim = c + 16 * L + 4 * j + i; dim < d) dst[dim] = acc[c + 16 * j + 4 * L + i] * mul;
}


// Scratch per item (floats): m[H], l[H], acc[H][d], p[G][kTile], scores[2][G][kTile], row[d], q[H][d]
// (fp32 q for 8-bit pools); H = hv * G query heads.
inline int64_t scratch_floats(int64_t hv, int64_t group, int64_t d) {
  const int64_t nh = hv * group;
  return nh * (2 * d + 2) + 3 * group * kTile + d;
}


// run_item_i8's scratch (floats), for hv virtual heads of G query heads: per lane group m, l and q's
// scales [kLanes] each; acc[H][da]; scores (then weights) [kTile][kLanes]; the weight words, high and
// low bytes, [2][kTile / 4][kLanes]; alpha and the weights' scales [2][kLanes]; row[da]; int16 q
// [groups][dq / 32][kLanes][32] (chunk-major: a chunk's 16 lanes at fixed offsets from one pointer).
// da: d rounded up to 64 (pv_i8's chunks), dq: to 32 (the q.k chunks).
inline int64_t scratch_floats_i8(int64_t hv, int64_t group, int64_t d) {
  const int64_t groups = (hv + kLanes / group - 1) / (kLanes / group);
  const int64_t da = (d + 63) / 64 * 64, dq = (d + 31) / 32 * 32;
  return 3 * kLanes * groups + hv * group * da + kTile * kLanes + kTile / 2 * kLanes + 2 * kLanes + da +
         groups * kLanes * dq / 2;
}

// One item. It walks steps (tile, virtual head) in that nesting; the scores of step st + 1 are
// computed between the softmax and the P.V of step st, so the latency of the softmax reductions
// hides behind independent dot products. Virtual head vh owns query heads vh*G .. vh*G + G - 1 and
// reads kv head vh / ratio. KV: T for pools of q's dtype, else the 8-bit format (kv_quant.h).
template <typename T, typename KV, int G>
void run_item(const Problem& P, const Item& it, float* ws, T* out, float* part) {
  static_assert(!std::is_same_v<KV, T>, "pools of q's dtype go to run_item_rows");
  using S = uint8_t;       // pool elements
  using KOps = QOps<KV>;   // dots and V rows
  const int64_t d = P.d, hv = P.hv;
  const int64_t nh = hv * G;
  float* m = ws;
  float* l = m + nh;
  float* acc = l + nh;
  float* p = acc + nh * d;
  float* scores = p + G * kTile;
  float* row = scores + 2 * G * kTile;
  float* qf = row + d;
  std::fill(m, m + nh, -std::numeric_limits<float>::infinity());
  std::fill(l, l + nh, 0.0f);
  std::fill(acc, acc + nh * d, 0.0f);

  const T* q_in = static_cast<const T*>(P.q) + it.b * P.q_sb;
  for (int64_t h = 0; h < nh; ++h)  // every head's q widened once: [nh, d] fp32
    for (int64_t c = 0; c < d; c += 16) _mm512_storeu_ps(qf + h * d + c, swiftlm_cpu::load16(q_in + h * P.q_sh + c));
  const float* q = qf;
  const int64_t q_sh = d;
  const S* kbase = static_cast<const S*>(P.k);
  const S* vbase = static_cast<const S*>(P.v);
  const int64_t* table = P.tables + it.b * P.tables_sb;
  const int64_t ntiles = (it.t1 - it.t0 + kTile - 1) / kTile;
  const int64_t nsteps = ntiles * hv;
  auto tile_len = [&](int64_t ti) { return int(std::min<int64_t>(kTile, it.t1 - it.t0 - ti * kTile)); };
  TileOffsets offs[2];  // tiles ti and ti + 1
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __m512 scale = _mm512_set1_ps(P.scale_log2);

  auto qk_step = [&](int64_t st) {  // scores[st & 1][g][i] = q_g . k_i * scale * log2(e), -inf past the end
    const int64_t ti = st / hv, vh = st % hv;
    const int n = tile_len(ti);
    const TileOffsets& o = offs[ti & 1];
    const S* kb = kbase + (vh / P.ratio) * P.k_sh;
    float* sc = scores + (st & 1) * G * kTile;
    __m512 tok_scale[kTile / kSub];  // the scores' multipliers: scale * log2(e) * each token's K scale
    for (int s = 0; s < kTile; s += kSub) {
      float ks[kSub];
      const float* kh = P.ks + vh / P.ratio;
      for (int i = 0; i < kSub; ++i) ks[i] = kh[o.s[s + i]] * KV::kMul;
      tok_scale[s / kSub] = _mm512_mul_ps(scale, _mm512_loadu_ps(ks));
    }
    if constexpr (G == 2 || G == 4) {  // every K value widened once for the G heads
      for (int s = 0; s < kTile; s += kSub) {
        __m512 x[G];
        if (s < n) {
          const __mmask16 valid = n - s >= kSub ? __mmask16(0xFFFF) : __mmask16((1u << (n - s)) - 1u);
          KOps::template qk_group<G>(q + vh * G * q_sh, kb, o.k + s, d, x);
#pragma GCC unroll 4
          for (int g = 0; g < G; ++g) x[g] = _mm512_mask_mul_ps(neg_inf, valid, x[g], tok_scale[s / kSub]);
        } else {
#pragma GCC unroll 4
          for (int g = 0; g < G; ++g) x[g] = neg_inf;
        }
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) _mm512_storeu_ps(sc + g * kTile + s, x[g]);
      }
    } else {
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) {
        const float* qg = q + (vh * G + g) * q_sh;
        for (int s = 0; s < kTile; s += kSub) {
          __m512 x = neg_inf;
          if (s < n) {
            const __mmask16 valid = n - s >= kSub ? __mmask16(0xFFFF) : __mmask16((1u << (n - s)) - 1u);
            x = _mm512_mask_mul_ps(neg_inf, valid, KOps::qk_tile(qg, kb, o.k + s, d), tok_scale[s / kSub]);
          }
          _mm512_storeu_ps(sc + g * kTile + s, x);
        }
      }
    }
  };

  tile_offsets(P, table, it.t0, tile_len(0), offs[0]);
  qk_step(0);
  for (int64_t st = 0; st < nsteps; ++st) {
    const int64_t ti = st / hv, vh = st % hv;
    const int n = tile_len(ti);
    const int n_next = ti + 1 < ntiles ? tile_len(ti + 1) : 0;
    const int64_t kvh = vh / P.ratio;
    Prefetch pf;
    if (n_next > 0) {
      TileOffsets& o = offs[(ti + 1) & 1];
      if (vh == 0) {
        tile_offsets(P, table, it.t0 + (ti + 1) * kTile, n_next, o);
        prefetch_scale_rows(P, o, n_next);
      }
      // this head's K and V rows of the next tile, prefetched during this step's P.V: +20-30% DRAM
      // throughput over no prefetching (Xeon VM, L1 hints; kStreamHint since)
      pf = Prefetch{reinterpret_cast<const char*>(kbase + kvh * P.k_sh), reinterpret_cast<const char*>(vbase + kvh * P.v_sh),
                    o.k, o.v, n_next, d * int64_t(sizeof(S)), int64_t(sizeof(S))};
    }
    const float* sc = scores + (st & 1) * G * kTile;
    float alpha[G];
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {  // online softmax over this tile, in the log2 domain
      const int64_t h = vh * G + g;
      __m512 mx = _mm512_loadu_ps(sc + g * kTile);
      for (int s = kSub; s < kTile; s += kSub) mx = _mm512_max_ps(mx, _mm512_loadu_ps(sc + g * kTile + s));
      const float m_new = std::max(m[h], _mm512_reduce_max_ps(mx));  // finite: the tile has a token
      const __m512 vm = _mm512_set1_ps(m_new);
      __m512 sum = _mm512_setzero_ps();
      for (int s = 0; s < kTile; s += kSub) {
        const __m512 e = swiftlm_cpu::exp2_ps(_mm512_sub_ps(_mm512_loadu_ps(sc + g * kTile + s), vm));
        _mm512_storeu_ps(p + g * kTile + s, e);
        sum = _mm512_add_ps(sum, e);
      }
      alpha[g] = swiftlm_cpu::exp2_one(m[h] - m_new);  // 0 on the first tile
      l[h] = l[h] * alpha[g] + _mm512_reduce_add_ps(sum);
      m[h] = m_new;
    }
    {  // each token's V scale into its weight (l has the unscaled sum)
      const TileOffsets& o = offs[ti & 1];
      const float* vsh = P.vs + kvh;
      for (int s = 0; s < kTile; s += kSub) {
        float vs[kSub];
        for (int i = 0; i < kSub; ++i) vs[i] = vsh[o.s[s + i]] * KV::kMul;
        const __m512 w = _mm512_loadu_ps(vs);
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g)
          _mm512_storeu_ps(p + g * kTile + s, _mm512_mul_ps(_mm512_loadu_ps(p + g * kTile + s), w));
      }
    }
    if (st + 1 < nsteps) qk_step(st + 1);
    pv_tile<KOps, S, G>(acc + vh * G * d, d, p, alpha, vbase + kvh * P.v_sh, offs[ti & 1].v, n, pf);
  }

  write_item(P, it, nh, m, l, [](int64_t h) { return h; },
             [&](int64_t h, float* dst, float mul) { Ops<float>::unpermute(acc + h * d, dst, d, mul); }, row, out, part);
}

// The online softmax of one tile, lane-wise (a query head a lane), in the log2 domain: sc[i] (i < n,
// kLanes floats each) holds token i's scores; m and l (kLanes each) move on to include the tile, l
// summing e_i = 2^(sc[i] - m_new); sc[i] becomes weight(i, e_i). Returns alpha = 2^(m_old - m_new),
// the factor for what was accumulated before (0 on the first tile).
template <typename Weight>
inline __m512 softmax_lanes(float* sc, int n, float* m, float* l, Weight weight) {
  __m512 mx = _mm512_loadu_ps(sc);
  for (int i = 1; i < n; ++i) mx = _mm512_max_ps(mx, _mm512_loadu_ps(sc + i * kLanes));
  const __m512 m_old = _mm512_loadu_ps(m), m_new = _mm512_max_ps(m_old, mx);
  const __m512 alpha = swiftlm_cpu::exp2_ps(_mm512_sub_ps(m_old, m_new));
  __m512 sum = _mm512_setzero_ps();
  for (int i = 0; i < n; ++i) {
    const __m512 e = swiftlm_cpu::exp2_ps(_mm512_sub_ps(_mm512_loadu_ps(sc + i * kLanes), m_new));
    sum = _mm512_add_ps(sum, e);
    _mm512_storeu_ps(sc + i * kLanes, weight(i, e));
  }
  _mm512_storeu_ps(l, _mm512_fmadd_ps(_mm512_loadu_ps(l), alpha, sum));
  _mm512_storeu_ps(m, m_new);
  return alpha;
}

// One item on pools of q's dtype (float32 or bf16), read in address order: the virtual heads go in
// lane groups of NKV = kLanes / G (NKV * G <= 16 query heads, a zmm lane each). Per tile and lane
// group: the scores of each token for all of the group's heads from its K row (all their kv heads:
// one contiguous read); the online softmax lane-wise over heads; then P.V four tokens at a time,
// each of the four V rows read whole (four sequential streams), into the fp32 accumulators in
// scratch. Each 32 dims read, K or V, prefetch the same 32 dims of the next tile's row into L2. On a
// Zen4 VM a read-only probe of the per-head order (2 threads, shuffled 16-token blocks) read 15 GB/s
// where whole rows read 27-31; in the kernel, spread L2 prefetches read 1.6-1.7x faster than the
// same prefetches into L1 (28 layers, 2048 tokens).
template <typename T>
struct RowOps;

template <>
struct RowOps<bf16> {
  template <bool kTail>  // acc += q[0 .. 32) . k[0 .. 32) (16 dims with kTail)
  static inline __m512 dot32(__m512 acc, const bf16* q, const bf16* k) {
#ifdef __AVX512BF16__
    return _mm512_dpbf16_ps(acc, (__m512bh)Ops<bf16>::load32<kTail>(q), (__m512bh)Ops<bf16>::load32<kTail>(k));
#else
    __m512 qe, qo, ke, ko;
    Ops<bf16>::widen(Ops<bf16>::load32<kTail>(q), qe, qo);
    Ops<bf16>::widen(Ops<bf16>::load32<kTail>(k), ke, ko);
    return _mm512_fmadd_ps(qo, ko, _mm512_fmadd_ps(qe, ke, acc));
#endif
  }
};

template <>
struct RowOps<float> {
  template <bool kTail>
  static inline __m512 dot32(__m512 acc, const float* q, const float* k) {
    acc = _mm512_fmadd_ps(_mm512_loadu_ps(q), _mm512_loadu_ps(k), acc);
    return kTail ? acc : _mm512_fmadd_ps(_mm512_loadu_ps(q + 16), _mm512_loadu_ps(k + 16), acc);
  }
};

#ifdef __AVX512BF16__
// qk_row's arithmetic on bf16 pools: vdpbf16ps, fp32 sums, chunks in order as the general loop sums them.
struct Bf16RowDot {
  using S = bf16;
  using Q = bf16;
  using Acc = __m512;
  static constexpr int kChunkBytes = 64;
  static Acc zero() { return _mm512_setzero_ps(); }
  static __m512bh load(const S* k) { return (__m512bh)_mm512_loadu_si512(k); }
  static __m512bh loadq(const Q* q) { return (__m512bh)_mm512_loadu_si512(q); }
  static Acc mac(Acc a, __m512bh k, __m512bh q) { return _mm512_dpbf16_ps(a, q, k); }
  static __m512 sum(const Acc* a) { return hsum16(a); }
};
#endif

// P.V of one virtual head's G query heads over a tile's n tokens, dims [c0, c0 + 16 DC) (c0 a multiple of
// 32; DC even, or 1 for a 16-dim tail), one token at a time with the accumulators in registers:
// acc[g] (accumulator order, Ops<T>) = alpha[g] * acc[g] + sum_i w[i * kLanes + g] * V_i. V row i at
// vbase + ov[i]; the next tile's rows (at vbase + ovn[i], i < n_next) are prefetched over the same dims.
template <typename T, int G, int DC, typename Prefetch>
inline void pv_head_pass(float* acc, int64_t d, int64_t c0, const float* w, const float* alpha, const T* vbase,
                         const int64_t* ov, const int64_t* ovn, int n, int n_next, Prefetch prefetch) {
  __m512 a[G][DC];
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 8
    for (int j = 0; j < DC; ++j) a[g][j] = _mm512_mul_ps(_mm512_loadu_ps(acc + g * d + c0 + 16 * j), _mm512_set1_ps(alpha[g]));
  for (int i = 0; i < n; ++i) {
    const T* r = vbase + ov[i] + c0;
    if (i < n_next)
      for (int x = 0; x < 16 * DC; x += 32) prefetch(vbase + ovn[i] + c0 + x);
    __m512 v[DC];
    if constexpr (DC == 1) {
      Ops<T>::template load_v<1>(r, v);
    } else {
#pragma GCC unroll 4
      for (int j = 0; j < DC; j += 2) Ops<T>::template load_v<2>(r + 16 * j, v + j);
    }
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      const __m512 p = _mm512_set1_ps(w[i * kLanes + g]);
#pragma GCC unroll 8
      for (int j = 0; j < DC; ++j) a[g][j] = _mm512_fmadd_ps(v[j], p, a[g][j]);
    }
  }
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 8
    for (int j = 0; j < DC; ++j) _mm512_storeu_ps(acc + g * d + c0 + 16 * j, a[g][j]);
}

// run_item_rows' scratch (floats): m, l [groups][kLanes] each; acc [H][d]; weights [kTile][kLanes]; row [d];
// with AMX, q as B tiles: [H][d rounded up to 32] bf16.
inline int64_t scratch_floats_rows(int64_t hv, int64_t group, int64_t d) {
  const int64_t groups = (hv + kLanes / group - 1) / (kLanes / group);
  return 2 * kLanes * groups + hv * group * d + kTile * kLanes + d + groups * kLanes * ((d + 31) / 32 * 32) / 2;
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
// bf16 q.k on AMX tiles (run_item_rows): per virtual head and 32-dim chunk, its G query heads as a B
// tile (row r, column g: the pair of dims 2r, 2r + 1 of head g), 16 K rows of one block as A; C holds
// 16 tokens x G scores. The same exact bf16 products as vdpbf16ps, summed in another order.
struct Bf16ScoreTiles {
  const bf16* qb;  // [hv][nch][16][G][2]
  int64_t nch;     // 32-dim chunks of a row (the last one may hold 16 dims)
  int rem;         // dims of the last chunk when it is short (16), else 0

  // q of every virtual head into qb (zeros past d), and the tile configuration.
  template <int G>
  static Bf16ScoreTiles prepare(const Problem& P, const bf16* q_in, bf16* qb) {
    const int64_t d = P.d, nch = (d + 31) / 32;
    uint32_t* qw = reinterpret_cast<uint32_t*>(qb);  // a pair of dims a word (d and q's rows are even)
    for (int64_t vh = 0; vh < P.hv; ++vh)
      for (int g = 0; g < G; ++g) {
        const bf16* qh = q_in + (vh * G + g) * P.q_sh;
        for (int64_t w = 0; w < nch * 16; ++w) {  // word w: dims 2w, 2w + 1 (chunk w / 16, row w % 16)
          uint32_t pair = 0;
          if (2 * w < d) std::memcpy(&pair, qh + 2 * w, sizeof(pair));
          qw[(vh * nch * 16 + w) * G + g] = pair;
        }
      }
    const int rem = int(d % 32);
    swiftlm_amx::TileConfig cfg;
    cfg.rows[0] = 16, cfg.colsb[0] = G * 4;  // C: 16 tokens x G floats
    cfg.rows[1] = 16, cfg.colsb[1] = 64;     // A: 16 K rows x 32 dims
    cfg.rows[2] = 16, cfg.colsb[2] = G * 4;  // B: 16 pairs of dims x G heads
    if (rem) {                               // the short chunk's A and B
      cfg.rows[3] = 16, cfg.colsb[3] = uint16_t(rem * 2);
      cfg.rows[4] = uint8_t(rem / 2), cfg.colsb[4] = G * 4;
    }
    _tile_loadconfig(&cfg);
    return Bf16ScoreTiles{qb, nch, rem};
  }

  // C of virtual head vh over the 16 K rows from krow (k_st elements apart) into dst (row stride
  // kLanes floats), unscaled.
  template <int G>
  inline void scores(int64_t vh, const bf16* krow, int64_t k_st, float* dst) const {
    const bf16* qv = qb + vh * nch * 16 * G * 2;
    const int64_t full = rem ? nch - 1 : nch;
    _tile_zero(0);
    for (int64_t ch = 0; ch < full; ++ch) {
      _tile_loadd(1, krow + ch * 32, k_st * 2);
      _tile_loadd(2, qv + ch * 16 * G * 2, G * 4);
      _tile_dpbf16ps(0, 1, 2);
    }
    if (rem) {
      _tile_loadd(3, krow + full * 32, k_st * 2);
      _tile_loadd(4, qv + full * 16 * G * 2, G * 4);
      _tile_dpbf16ps(0, 3, 4);
    }
    _tile_stored(0, dst, kLanes * 4);
  }
};
#endif

template <typename T, int G>
void run_item_rows(const Problem& P, const Item& it, float* ws, T* out, float* part) {
  constexpr int NKV = kLanes / G;  // virtual heads per lane group
  constexpr int NQ = NKV * G;      // query heads per lane group (lanes past NQ unused)
  const int64_t d = P.d, hv = P.hv, nh = hv * G;
  const int64_t groups = (hv + NKV - 1) / NKV;
  float* m = ws;                   // [groups][kLanes]
  float* l = m + groups * kLanes;  // [groups][kLanes]
  float* acc = l + groups * kLanes;  // [nh][d], accumulator order (Ops<T>)
  float* sc = acc + nh * d;          // [kTile][kLanes]: scores, then weights
  float* row = sc + kTile * kLanes;  // [d]
  std::fill(m, m + groups * kLanes, -std::numeric_limits<float>::infinity());
  std::fill(l, l + groups * kLanes, 0.0f);
  std::fill(acc, acc + nh * d, 0.0f);
  std::fill(sc, sc + kTile * kLanes, 0.0f);  // lanes past a group's heads stay finite

  const T* q_in = static_cast<const T*>(P.q) + it.b * P.q_sb;
  const T* kbase = static_cast<const T*>(P.k);
  const T* vbase = static_cast<const T*>(P.v);
  const int64_t* table = P.tables + it.b * P.tables_sb;
  const int64_t ntiles = (it.t1 - it.t0 + kTile - 1) / kTile;
  auto tile_len = [&](int64_t ti) { return int(std::min<int64_t>(kTile, it.t1 - it.t0 - ti * kTile)); };
  const __m512 scale = _mm512_set1_ps(P.scale_log2);
  const int64_t d32 = d / 32 * 32;  // dims in whole 32-dim chunks; a 16-dim tail past them
  // the same 32 dims of the next tile's row i (K or V), pulled in as this tile's are read
  auto prefetch32 = [](const T* p) {
    _mm_prefetch(reinterpret_cast<const char*>(p), kStreamHint);
    if constexpr (sizeof(T) == 4) _mm_prefetch(reinterpret_cast<const char*>(p + 16), kStreamHint);
  };
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  const bool amx = std::is_same_v<T, bf16> && P.amx && P.bs % kSub == 0;
  Bf16ScoreTiles tiles{};
  if constexpr (std::is_same_v<T, bf16>)
    if (amx) tiles = Bf16ScoreTiles::prepare<G>(P, q_in, reinterpret_cast<bf16*>(row + d));
#else
  constexpr bool amx = false;
#endif
  // qk_row for full groups where its layout holds (row_nd chunks of 32 dims): each group's q chunk-major,
  // [groups][ND][kLanes][32], in the scratch past row (AMX's q takes it otherwise)
  int row_nd = 0;
  bf16* qc = nullptr;
#ifdef __AVX512BF16__
  if constexpr (std::is_same_v<T, bf16>)
    if (!amx && qk_row_chunks(P, true) > 0) {
      row_nd = qk_row_chunks(P, true);
      qc = reinterpret_cast<bf16*>(row + d);
      for (int64_t grp = 0; grp < groups; ++grp)
        for (int j = 0; j < row_nd; ++j)
          for (int x = 0; x < kLanes; ++x)
            std::memcpy(qc + ((grp * row_nd + j) * kLanes + x) * 32,
                        q_in + std::min<int64_t>(grp * NKV * G + x, nh - 1) * P.q_sh + 32 * j, 32 * sizeof(bf16));
    }
#endif
  TileOffsets offs[2];  // tiles ti and ti + 1
  tile_offsets(P, table, it.t0, tile_len(0), offs[0]);
  prefetch_first_tile(P, offs[0], tile_len(0), sizeof(T));
  for (int64_t ti = 0; ti < ntiles; ++ti) {
    const int n = tile_len(ti), n4 = (n + 3) & ~3;
    const int n_next = ti + 1 < ntiles ? tile_len(ti + 1) : 0;
    const TileOffsets& o = offs[ti & 1];
    const TileOffsets& on = offs[(ti + 1) & 1];
    if (n_next > 0) tile_offsets(P, table, it.t0 + (ti + 1) * kTile, n_next, offs[(ti + 1) & 1]);
    for (int64_t grp = 0; grp < groups; ++grp) {
      const int64_t vh0 = grp * NKV;  // the group's first virtual head
      const int nv = int(std::min<int64_t>(NKV, hv - vh0));
      int64_t koff[NKV], voff[NKV];  // each virtual head's kv head in a K / V row (lanes past nv: the last)
      const T* qh[kLanes];           // each lane's query head
      for (int x = 0; x < NKV; ++x) {
        const int64_t kvh = (vh0 + std::min(x, nv - 1)) / P.ratio;
        koff[x] = kvh * P.k_sh;
        voff[x] = kvh * P.v_sh;
      }
      for (int x = 0; x < kLanes; ++x) qh[x] = q_in + std::min<int64_t>(vh0 * G + x, nh - 1) * P.q_sh;

      bool scored = false;
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
      if constexpr (std::is_same_v<T, bf16>)
        if (amx) {  // 16 tokens of one block a pass, a C tile of 16 x G scores per virtual head
          scored = true;
          for (int s0 = 0; s0 < n; s0 += kSub) {
            for (int v = 0; v < nv; ++v) {
              for (int i = s0; i < std::min(n_next, s0 + kSub); ++i)  // the next tile's rows of this head
                for (int64_t c = 0; c < d; c += 32) prefetch32(kbase + on.k[i] + koff[v] + c);
              tiles.scores<G>(vh0 + v, kbase + o.k[s0] + koff[v], P.k_st, sc + s0 * kLanes + v * G);
            }
            for (int i = s0; i < std::min(n, s0 + kSub); ++i)
              _mm512_storeu_ps(sc + i * kLanes, _mm512_mul_ps(_mm512_loadu_ps(sc + i * kLanes), scale));
          }
        }
#endif
#ifdef __AVX512BF16__
      if constexpr (std::is_same_v<T, bf16>)
        if (row_nd > 0 && nv == NKV) {  // a part-filled last group takes the general loop
          scored = true;
          const bf16* qg = qc + grp * row_nd * kLanes * 32;
          for (int i = 0; i < n; ++i) {
            const bf16* krow = kbase + o.k[i] + koff[0];
            const bf16* knext = kbase + (i < n_next ? on.k[i] : o.k[i]) + koff[0];
            const __m512 dots = qk_row_nd<Bf16RowDot, G>(row_nd, qg, krow, P.k_sh, knext);
            _mm512_storeu_ps(sc + i * kLanes, _mm512_mul_ps(dots, scale));
          }
        }
#endif
      if (!scored)
      for (int i = 0; i < n; ++i) {  // scores: sc[i][lane] = q_lane . k_i * scale * log2(e)
        const T* krow = kbase + o.k[i];
        const T* knext = kbase + (i < n_next ? on.k[i] : o.k[i]);
        __m512 a[kLanes];
#pragma GCC unroll 16
        for (int x = 0; x < kLanes; ++x) a[x] = _mm512_setzero_ps();
        int64_t c = 0;
        for (; c < d32; c += 32)
#pragma GCC unroll 16
          for (int v = 0; v < NKV; ++v) {
            prefetch32(knext + koff[v] + c);
#pragma GCC unroll 8
            for (int g = 0; g < G; ++g) a[v * G + g] = RowOps<T>::template dot32<false>(a[v * G + g], qh[v * G + g] + c, krow + koff[v] + c);
          }
        if (c < d)
#pragma GCC unroll 16
          for (int v = 0; v < NKV; ++v)
#pragma GCC unroll 8
            for (int g = 0; g < G; ++g) a[v * G + g] = RowOps<T>::template dot32<true>(a[v * G + g], qh[v * G + g] + c, krow + koff[v] + c);
        _mm512_storeu_ps(sc + i * kLanes, _mm512_mul_ps(hsum16(a), scale));
      }

      // the online softmax; weights past n are 0
      const __m512 alpha = softmax_lanes(sc, n, m + grp * kLanes, l + grp * kLanes, [](int, __m512 e) { return e; });
      alignas(64) float al[kLanes];
      _mm512_store_ps(al, alpha);
      if (amx) {  // per virtual head, a token at a time, alpha folded in (DC zmm a head in registers)
        constexpr int DC = G <= 2 ? 8 : G <= 4 ? 4 : 2;
        for (int v = 0; v < nv; ++v) {
          float* a = acc + (vh0 + v) * G * d;
          const float* w = sc + v * G;
          const float* av = al + v * G;
          const T* vb = vbase + voff[v];
          int64_t c = 0;
          for (; c + 16 * DC <= d; c += 16 * DC)
            pv_head_pass<T, G, DC>(a, d, c, w, av, vb, o.v, on.v, n, n_next, prefetch32);
          for (; c + 32 <= d; c += 32) pv_head_pass<T, G, 2>(a, d, c, w, av, vb, o.v, on.v, n, n_next, prefetch32);
          if (c < d) pv_head_pass<T, G, 1>(a, d, c, w, av, vb, o.v, on.v, n, n_next, prefetch32);
        }
        continue;
      }
      for (int i = n; i < n4; ++i) _mm512_storeu_ps(sc + i * kLanes, _mm512_setzero_ps());
      for (int x = 0; x < nv * G; ++x) {  // acc *= alpha, per head
        float* a = acc + (vh0 * G + x) * d;
        const __m512 s = _mm512_set1_ps(al[x]);
        for (int64_t c = 0; c < d; c += 16) _mm512_storeu_ps(a + c, _mm512_mul_ps(_mm512_loadu_ps(a + c), s));
      }

      // P.V, four tokens at a time (rows past n repeat a valid token, with weight 0)
      for (int i = 0; i < n4; i += 4) {
        const T* r[4] = {vbase + o.v[i], vbase + o.v[i + 1], vbase + o.v[i + 2], vbase + o.v[i + 3]};
        const T* rn[4];  // the next tile's rows i .. i + 3 (this tile's where it has none)
        for (int u = 0; u < 4; ++u) rn[u] = vbase + (i + u < n_next ? on.v[i + u] : o.v[i + u]);
        for (int v = 0; v < nv; ++v) {
          auto chunk = [&](int64_t c, auto nvec) {  // nvec zmm (16 dims each) from c, accumulator order
            constexpr int NV = decltype(nvec)::value;
            __m512 x[4][NV];
#pragma GCC unroll 4
            for (int u = 0; u < 4; ++u) {
              Ops<T>::template load_v<NV>(r[u] + voff[v] + c, x[u]);
              if constexpr (NV == 2) prefetch32(rn[u] + voff[v] + c);
            }
#pragma GCC unroll 8
            for (int g = 0; g < G; ++g) {
              const int lane = v * G + g;
              float* a = acc + ((vh0 + v) * G + g) * d + c;
#pragma GCC unroll 2
              for (int j = 0; j < NV; ++j) {
                __m512 s = _mm512_loadu_ps(a + 16 * j);
#pragma GCC unroll 4
                for (int u = 0; u < 4; ++u) s = _mm512_fmadd_ps(x[u][j], _mm512_set1_ps(sc[(i + u) * kLanes + lane]), s);
                _mm512_storeu_ps(a + 16 * j, s);
              }
            }
          };
          int64_t c = 0;
          for (; c < d32; c += 32) chunk(c, std::integral_constant<int, 2>{});
          if (c < d) chunk(c, std::integral_constant<int, 1>{});
        }
      }
    }
  }

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  if (amx) _tile_release();
#endif
  write_item(P, it, nh, m, l, [](int64_t h) { return h / NQ * kLanes + h % NQ; },
             [&](int64_t h, float* dst, float mul) { Ops<T>::unpermute(acc + h * d, dst, d, mul); }, row, out, part);
}

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
// One item on int8 pools with bf16 q (I8Dot). The virtual heads go in lane groups of NKV = kLanes / G
// (NKV * G <= 16 query heads, a zmm lane each). Per tile and lane group: the scores of each token for
// all of the group's heads, from its K row read in address order (vpdpwssd into one int32 sum per
// lane, one hsum16 per token); the online softmax lane-wise over heads (no reductions across lanes);
// the weights rounded to 16 bits of each head's tile max and packed, 4 tokens a word; then P.V per
// kv head (pv_i8). Each pool's next tile streams into L2 while this one is worked on from cache, one
// line per line read: as each K row is read, the same lines of the next tile's K row (in address
// order); as each kv head's V rows are read, the same head's V rows of the next tile. On a Zen4 VM,
// 28 layers at 2048 tokens: 2.0x over per-head bursts of L1 prefetches issued during P.V; two tiles
// ahead: 0.93-0.97x. Both pools' prefetches issued during q.k (as an earlier version did) read them
// 0.86-0.96x as fast from memory: a probe of two pools read in turns (benchmarks/probes/kv_prefetch_phase.c)
// streamed at 0.58-0.79x of each pool prefetched in its own phase, one thread.
template <int G>
void run_item_i8(const Problem& P, const Item& it, float* ws, bf16* out, float* part) {
  constexpr int NKV = kLanes / G;  // virtual heads per lane group
  constexpr int NQ = NKV * G;      // query heads per lane group (lanes past NQ unused)
  const int64_t d = P.d, hv = P.hv, nh = hv * G;
  const int64_t da = (d + 63) / 64 * 64, dq = (d + 31) / 32 * 32;
  const int64_t groups = (hv + NKV - 1) / NKV;
  float* m = ws;                          // [groups][kLanes]
  float* l = m + groups * kLanes;         // [groups][kLanes]
  float* qs = l + groups * kLanes;        // [groups][kLanes]: q's scale * scale * log2(e)
  float* acc = qs + groups * kLanes;      // [nh][da], interleave order (pv_i8)
  float* sc = acc + nh * da;              // [kTile][kLanes]: scores, then weights
  int32_t* hi = reinterpret_cast<int32_t*>(sc + kTile * kLanes);  // [kTile / 4][kLanes]
  int32_t* lo = hi + kTile / 4 * kLanes;
  float* lanes = reinterpret_cast<float*>(lo + kTile / 4 * kLanes);  // alpha [kLanes], weight scales [kLanes]
  float* row = lanes + 2 * kLanes;                                   // [da]
  int16_t* q16 = reinterpret_cast<int16_t*>(row + da);               // [groups][dq / 32][kLanes][32]
  std::fill(m, m + groups * kLanes, -std::numeric_limits<float>::infinity());
  std::fill(l, l + groups * kLanes, 0.0f);
  std::fill(qs, qs + groups * kLanes, 0.0f);
  std::fill(acc, acc + nh * da, 0.0f);
  std::fill(q16, q16 + groups * kLanes * dq, int16_t(0));

  // every head's q rounded once to int16 against its max (|q| / 32767 steps), zeros past d
  const bf16* q_in = static_cast<const bf16*>(P.q) + it.b * P.q_sb;
  for (int64_t h = 0; h < nh; ++h) {  // head h: lane group h / NQ, lane h % NQ
    const bf16* qh = q_in + h * P.q_sh;
    __m512 amax = _mm512_setzero_ps();
    for (int64_t c = 0; c < d; c += 16) amax = _mm512_max_ps(amax, _mm512_abs_ps(swiftlm_cpu::load16(qh + c)));
    const float mx = _mm512_reduce_max_ps(amax), sq = mx > 0.0f ? mx / 32767.0f : 1.0f;
    qs[h / NQ * kLanes + h % NQ] = sq * P.scale_log2;
    const __m512 inv = _mm512_set1_ps(1.0f / sq);
    int16_t* dst = q16 + h / NQ * kLanes * dq + (h % NQ) * 32;  // chunk c of the lane at dst + c / 32 * kLanes * 32
    for (int64_t c = 0; c < d; c += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + c / 32 * kLanes * 32 + c % 32),
                          _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(swiftlm_cpu::load16(qh + c), inv))));
  }

  const uint8_t* kbase = static_cast<const uint8_t*>(P.k);
  const uint8_t* vbase = static_cast<const uint8_t*>(P.v);
  const int64_t* table = P.tables + it.b * P.tables_sb;
  const int64_t ntiles = (it.t1 - it.t0 + kTile - 1) / kTile;
  auto tile_len = [&](int64_t ti) { return int(std::min<int64_t>(kTile, it.t1 - it.t0 - ti * kTile)); };
  const int64_t n_kv = hv / P.ratio;
  TileOffsets offs[2];  // tiles ti and ti + 1
  tile_offsets(P, table, it.t0, tile_len(0), offs[0]);
  prefetch_first_tile(P, offs[0], tile_len(0), 1);
  for (int64_t ti = 0; ti < ntiles; ++ti) {
    const int n = tile_len(ti), n4 = (n + 3) & ~3;  // P.V takes whole groups of 4 tokens (weight 0 past n)
    const int n_next = ti + 1 < ntiles ? tile_len(ti + 1) : 0;
    const TileOffsets& o = offs[ti & 1];
    const TileOffsets& on = offs[(ti + 1) & 1];
    if (n_next > 0) {  // the next tile's offsets, and its scale rows
      tile_offsets(P, table, it.t0 + (ti + 1) * kTile, n_next, offs[(ti + 1) & 1]);
      prefetch_scale_rows(P, on, n_next);
    }
    for (int64_t grp = 0; grp < groups; ++grp) {
      const int64_t vh0 = grp * NKV;  // the group's first virtual head
      const int nv = int(std::min<int64_t>(NKV, hv - vh0));
      const int64_t kv0 = vh0 / P.ratio;  // its kv head
      const int16_t* qg = q16 + grp * kLanes * dq;
      alignas(64) int32_t lane_kv[kLanes];  // lane -> its kv head - kv0 (lanes past the group: its last head)
      int64_t hoff[NKV], voff[NKV];         // K and V row offsets of each virtual head's kv head
      for (int x = 0; x < kLanes; ++x) lane_kv[x] = int((vh0 + std::min(x / G, nv - 1)) / P.ratio - kv0);
      for (int x = 0; x < NKV; ++x) {
        hoff[x] = ((vh0 + std::min(x, nv - 1)) / P.ratio) * P.k_sh;
        voff[x] = ((vh0 + std::min(x, nv - 1)) / P.ratio) * P.v_sh;
      }
      const __m512i kv_idx = _mm512_load_si512(lane_kv);
      const __mmask16 kv_mask = swiftlm_cpu::first_lanes(n_kv - kv0);
      const __m512 qscale = _mm512_loadu_ps(qs + grp * kLanes);
      const int row_nd = qk_row_chunks(P, nv == NKV);  // qk_row's chunks, or 0: the general loop
      // a token's K or V scales, one per lane: its scale row from kv0 on, each head's to its lanes
      auto lane_scales = [&](const float* pool, int i) {
        return _mm512_mul_ps(_mm512_permutexvar_ps(kv_idx, _mm512_maskz_loadu_ps(kv_mask, pool + o.s[i] + kv0)),
                             _mm512_set1_ps(I8Dot::kMul));
      };

      // scores: sc[i][lane] = q_lane . k_i * K scale * scale * log2(e)
      auto store_scores = [&](int i, __m512i sums) {  // exact in int32 for d <= kMaxI8DotDim
        const __m512 dots = _mm512_cvtepi32_ps(sums);
        _mm512_storeu_ps(sc + i * kLanes, _mm512_mul_ps(dots, _mm512_mul_ps(qscale, lane_scales(P.ks, i))));
      };
      int i0 = 0;  // tokens before i0 scored in pairs
      if constexpr ((kLanes / 2) % G == 0)
        if (row_nd > 0)
          for (; i0 + 1 < n; i0 += 2) {
            const uint8_t* kn0 = kbase + (i0 < n_next ? on.k[i0] : o.k[i0]);  // the next tile's rows
            const uint8_t* kn1 = kbase + (i0 + 1 < n_next ? on.k[i0 + 1] : o.k[i0 + 1]);
            __m512i sa, sb;
            qk_pair_nd<I8RowDot, G>(row_nd, qg, kbase + o.k[i0] + hoff[0], kbase + o.k[i0 + 1] + hoff[0], P.k_sh,
                                    kn0 + hoff[0], kn1 + hoff[0], sa, sb);
            store_scores(i0, sa);
            store_scores(i0 + 1, sb);
          }
      for (int i = i0; i < n; ++i) {
        const uint8_t* krow = kbase + o.k[i];
        const uint8_t* knext = kbase + (i < n_next ? on.k[i] : o.k[i]);  // the next tile's rows i
        __m512i a[kLanes];
#pragma GCC unroll 16
        for (int x = 0; x < kLanes; ++x) a[x] = _mm512_setzero_si512();
        auto chunk = [&](int64_t c, auto tail) {  // 32 dims of every head of the group
#pragma GCC unroll 16
          for (int v = 0; v < NKV; ++v) {
            if (c % 64 == 0) _mm_prefetch(reinterpret_cast<const char*>(knext + hoff[v] + c), kStreamHint);
            const __m512i k = widen_i16<decltype(tail)::value>(krow + hoff[v] + c);
#pragma GCC unroll 8
            for (int g = 0; g < G; ++g)
              a[v * G + g] = _mm512_dpwssd_epi32(a[v * G + g], k, _mm512_loadu_si512(qg + c / 32 * kLanes * 32 + (v * G + g) * 32));
          }
        };
        __m512i sums;
        if (row_nd > 0) {
          sums = qk_row_nd<I8RowDot, G>(row_nd, qg, krow + hoff[0], P.k_sh, knext + hoff[0]);
        } else {
          int64_t c = 0;
          for (; c + 32 <= d; c += 32) chunk(c, std::false_type{});
          if (c < d) chunk(c, std::true_type{});
          sums = hsum16_epi32(a);
        }
        store_scores(i, sums);
      }

      // the online softmax; each token's V scale into its weight (l sums the unscaled weights)
      __m512 pmax = _mm512_setzero_ps();
      const __m512 alpha = softmax_lanes(sc, n, m + grp * kLanes, l + grp * kLanes, [&](int i, __m512 e) {
        const __m512 w = _mm512_mul_ps(e, lane_scales(P.vs, i));
        pmax = _mm512_max_ps(pmax, w);
        return w;
      });
      _mm512_storeu_ps(lanes, alpha);
      _mm512_storeu_ps(lanes + kLanes, _mm512_mul_ps(pmax, _mm512_set1_ps(1.0f / 65535.0f)));

      // the weights as 16-bit fractions of each head's tile max; word j of a lane: the high (low)
      // bytes of tokens 4j .. 4j + 3
      const __m512 inv = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(pmax, _mm512_setzero_ps(), _CMP_GT_OQ),
                                             _mm512_set1_ps(65535.0f), pmax);
      for (int j = 0; j < n4; j += 4) {
        __m512i wh = _mm512_setzero_si512(), wl = _mm512_setzero_si512();
        for (int r = 0; r < 4 && j + r < n; ++r) {
          const __m512i w = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(sc + (j + r) * kLanes), inv)),
                                             _mm512_set1_epi32(65535));
          wh = _mm512_or_si512(wh, _mm512_slli_epi32(_mm512_srli_epi32(w, 8), 8 * r));
          wl = _mm512_or_si512(wl, _mm512_slli_epi32(_mm512_and_si512(w, _mm512_set1_epi32(255)), 8 * r));
        }
        _mm512_storeu_si512(hi + j / 4 * kLanes, wh);
        _mm512_storeu_si512(lo + j / 4 * kLanes, wl);
      }

      for (int v = 0; v < nv; ++v)  // P.V per virtual head, the next tile's rows prefetched on the way
        for (int g0 = 0; g0 < G; g0 += 2) {
          const int lane = v * G + g0;
          float* a = acc + ((vh0 + v) * G + g0) * da;
          const uint8_t* vb = vbase + voff[v];
          // the next tile's rows of this head, once a head (the first pass of its query heads)
          const int64_t* pf = g0 == 0 && n_next > 0 ? on.v : nullptr;
          if (G - g0 >= 2 && n4 == kTile)
            pv_i8<2, kTile>(a, da, hi + lane, lo + lane, lanes + kLanes + lane, lanes + lane, vb, o.v, n4, d, pf);
          else if (G - g0 >= 2)
            pv_i8<2>(a, da, hi + lane, lo + lane, lanes + kLanes + lane, lanes + lane, vb, o.v, n4, d, pf);
          else
            pv_i8<1>(a, da, hi + lane, lo + lane, lanes + kLanes + lane, lanes + lane, vb, o.v, n4, d, pf);
        }
    }
  }

  write_item(P, it, nh, m, l, [](int64_t h) { return h / NQ * kLanes + h % NQ; },
             [&](int64_t h, float* dst, float mul) { unpermute_i8(acc + h * da, dst, d, mul); }, row, out, part);
}
#endif

// Combine the split-K partials of one (request, query head) with weights 2^(m_c - M).
// acc: d floats of scratch.
template <typename T, typename KV, int G>
void run_item_erased(const Problem& P, const Item& it, float* ws, void* out, float* part) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  if constexpr (std::is_same_v<KV, I8Dot>) {
    run_item_i8<G>(P, it, ws, static_cast<bf16*>(out), part);
    return;
  }
#endif
  if constexpr (std::is_same_v<KV, T>)
    run_item_rows<T, G>(P, it, ws, static_cast<T*>(out), part);
  else if constexpr (!std::is_same_v<KV, I8Dot>)
    run_item<T, KV, G>(P, it, ws, static_cast<T*>(out), part);
}

template <typename T, typename KV>
ItemFn pick_item_fn(int64_t group) {
  switch (group) {
    case 1: return run_item_erased<T, KV, 1>;
    case 2: return run_item_erased<T, KV, 2>;
    case 3: return run_item_erased<T, KV, 3>;
    case 4: return run_item_erased<T, KV, 4>;
    case 5: return run_item_erased<T, KV, 5>;
    case 6: return run_item_erased<T, KV, 6>;
    case 7: return run_item_erased<T, KV, 7>;
    case 8: return run_item_erased<T, KV, 8>;
    default: return nullptr;
  }
}

template <typename T>
ItemFn pick_item_fn(int64_t group, int64_t format, int64_t d) {
  switch (format) {
    case swiftlm_kvq::kInt8:
      if constexpr (std::is_same_v<T, bf16>)
        if (kHaveVnni && d <= kMaxI8DotDim) return pick_item_fn<T, I8Dot>(group);
      return pick_item_fn<T, swiftlm_kvq::I8>(group);
    case swiftlm_kvq::kE4M3: return pick_item_fn<T, swiftlm_kvq::E4M3>(group);
    case swiftlm_kvq::kE5M2: return pick_item_fn<T, swiftlm_kvq::E5M2>(group);
    default: return pick_item_fn<T, T>(group);
  }
}

// Scratch floats per worker: the largest any item runner needs.
inline int64_t scratch_floats_max(int64_t hv, int64_t group, int64_t d) {
  return std::max({scratch_floats(hv, group, d), scratch_floats_i8(hv, group, d), scratch_floats_rows(hv, group, d)});
}

}  // namespace

void swiftlm_attn::store_row(const float* src, float* dst, int64_t d) { Ops<float>::store(src, dst, d); }
void swiftlm_attn::store_row(const float* src, bf16* dst, int64_t d) { Ops<bf16>::store(src, dst, d); }
float swiftlm_attn::exp2_scalar(float x) { return swiftlm_cpu::exp2_one(x); }
#else
#include "paged_attention_avx2.h"
#endif

namespace {

using namespace swiftlm_attn;

void decode_attention_into(const at::Tensor& q, const at::Tensor& k_pool, const at::Tensor& v_pool, const int64_t* tab,
                           int64_t max_blocks, const int64_t* lens, double scale, const float* k_scales,
                           const float* v_scales, void* out_ptr);

at::Tensor paged_decode_attention(const at::Tensor& q_in, const at::Tensor& k_pool, const at::Tensor& v_pool,
                                  const at::Tensor& block_tables_in, const at::Tensor& seq_lens_in,
                                  double scale, const std::optional<at::Tensor>& k_scales,
                                  const std::optional<at::Tensor>& v_scales) {
  TORCH_CHECK(q_in.dim() == 3, "q must be [B, Hq, D], got ", q_in.sizes());
  TORCH_CHECK(k_pool.dim() == 4 && k_pool.sizes() == v_pool.sizes(),
              "k_pool and v_pool must both be [num_blocks, block_size, Hkv, D], got ", k_pool.sizes(), " and ",
              v_pool.sizes());
  TORCH_CHECK(q_in.device().is_cpu() && k_pool.device().is_cpu() && v_pool.device().is_cpu(),
              "q, k_pool and v_pool must be CPU tensors");
  const auto dtype = q_in.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "q must be float32 or bfloat16, got ", dtype);
  const int64_t format = pool_format(k_pool.scalar_type());
  TORCH_CHECK((k_pool.scalar_type() == dtype || format != swiftlm_kvq::kNone) &&
                  v_pool.scalar_type() == k_pool.scalar_type(),
              "k_pool and v_pool must share q's dtype, or one 8-bit dtype (int8, float8_e4m3fn, float8_e5m2), got ",
              k_pool.scalar_type(), " and ", v_pool.scalar_type());
  TORCH_CHECK((format != swiftlm_kvq::kNone) == (k_scales.has_value() && v_scales.has_value()),
              "k_scales and v_scales go with 8-bit pools, and only with them");
  const int64_t B = q_in.size(0), Hq = q_in.size(1), D = q_in.size(2);
  const int64_t N = k_pool.size(0), bs = k_pool.size(1), Hkv = k_pool.size(2);
  TORCH_CHECK(k_pool.size(3) == D, "head_dim of q (", D, ") and of the pools (", k_pool.size(3), ") differ");
  TORCH_CHECK(D % 16 == 0 && D > 0, "head_dim must be a multiple of 16, got ", D);
  TORCH_CHECK(Hkv > 0 && Hq % Hkv == 0, "Hq (", Hq, ") must be a multiple of Hkv (", Hkv, ")");
  TORCH_CHECK(k_pool.stride(3) == 1 && v_pool.stride(3) == 1, "pools must be contiguous in head_dim");
  if (format != swiftlm_kvq::kNone)
    for (const at::Tensor* sc : {&*k_scales, &*v_scales})
      TORCH_CHECK(sc->scalar_type() == at::kFloat && sc->is_contiguous() && sc->dim() == 3 && sc->size(0) == N &&
                      sc->size(1) == bs && sc->size(2) == Hkv,
                  "scale pools must be contiguous float32 [num_blocks, block_size, Hkv], got ", sc->sizes());
  TORCH_CHECK(block_tables_in.dim() == 2 && block_tables_in.size(0) == B,
              "block_tables must be [B, max_blocks], got ", block_tables_in.sizes());
  TORCH_CHECK(seq_lens_in.dim() == 1 && seq_lens_in.size(0) == B, "seq_lens must be [B], got ",
              seq_lens_in.sizes());

  const at::Tensor q = q_in.contiguous();
  const at::Tensor tables = block_tables_in.to(at::kLong).contiguous();
  const at::Tensor lens_t = seq_lens_in.to(at::kLong).contiguous();
  const int64_t* lens = lens_t.data_ptr<int64_t>();
  const int64_t max_blocks = tables.size(1);
  const int64_t* tab = tables.data_ptr<int64_t>();
  swiftlm_cpu::check_block_tables(tab, max_blocks, lens, B, bs, N, "");

  at::Tensor out = at::empty({B, Hq, D}, q.options());
  decode_attention_into(q, k_pool, v_pool, tab, max_blocks, lens, scale,
                        format != swiftlm_kvq::kNone ? k_scales->const_data_ptr<float>() : nullptr,
                        format != swiftlm_kvq::kNone ? v_scales->const_data_ptr<float>() : nullptr, out.data_ptr());
  return out;
}

// The kernel on inputs the caller has checked as the op above does: q [B, Hq, D] contiguous, the
// pools [N, bs, Hkv, D] (8-bit ones with their scale pools' data), block tables [B, max_blocks] and
// seq_lens [B] as int64 with every length and block id in range; out: B * Hq * D values of q's dtype.
// The decode layers op (decode_cpu.cpp) calls it directly, the tables checked once a step: through
// the op, each layer's call paid for its checks, conversions, allocation and the dispatcher, all cold
// after the layer's weights streamed through the caches.
void decode_attention_into(const at::Tensor& q, const at::Tensor& k_pool, const at::Tensor& v_pool, const int64_t* tab,
                           int64_t max_blocks, const int64_t* lens, double scale, const float* k_scales,
                           const float* v_scales, void* out_ptr) {
  const auto dtype = q.scalar_type();
  const int64_t format = pool_format(k_pool.scalar_type());
  const int64_t B = q.size(0), Hq = q.size(1), D = q.size(2);
  const int64_t bs = k_pool.size(1), Hkv = k_pool.size(2);
  const int64_t G = Hq / Hkv;
  int64_t group = std::min<int64_t>(G, kMaxGroup);
  while (G % group != 0) --group;
  const int64_t ratio = G / group, Hv = Hkv * ratio;  // virtual heads: group query heads each

  const int64_t esize = q.element_size();
  const bool quant = format != swiftlm_kvq::kNone;
  Problem P{q.data_ptr(), k_pool.data_ptr(), v_pool.data_ptr(), q.stride(0), q.stride(1),
            k_pool.stride(0), k_pool.stride(1), k_pool.stride(2), v_pool.stride(0), v_pool.stride(1),
            v_pool.stride(2), tab, max_blocks, Hq, D, bs, Hv, ratio,
            static_cast<float>(scale * 1.4426950408889634),
            quant ? k_scales : nullptr, quant ? v_scales : nullptr, bs * Hkv, Hkv};
#if defined(__AMX_TILE__)
  P.amx = dtype == at::kBFloat16 && swiftlm_amx::enable_amx();
#endif

  // ---- plan: items of (request, token chunk), each over all heads, so that a thread streams whole
  // blocks; long requests are cut into chunks of >= kTile tokens for parallelism and balance ----
  const int64_t nthreads = at::in_parallel_region() ? 1 : at::get_num_threads();
  int64_t total_tokens = 0;
  for (int64_t b = 0; b < B; ++b) total_tokens += lens[b];
  const int64_t bytes_per_token = 2 * Hkv * (quant ? D + 4 : D * esize);  // its K and V rows (and scales), all heads
  const bool serial = nthreads <= 1 || total_tokens * bytes_per_token < kSerialBytes;
  int64_t chunk = std::numeric_limits<int64_t>::max() / 4;
  if (!serial) {
    const int64_t target = nthreads * kItemsPerThread;
    chunk = std::max<int64_t>({(total_tokens + target - 1) / target, kMinItemBytes / bytes_per_token, kTile});
    chunk = (chunk + kTile - 1) / kTile * kTile;
  }

  std::vector<Item> items;
  std::vector<int64_t> first_slot(B, -1), n_slots(B, 0);
  int64_t slots = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = lens[b];
    if (len == 0) continue;
    const int64_t nch = (len + chunk - 1) / chunk;
    if (nch > 1) {
      first_slot[b] = slots;
      n_slots[b] = nch;
      slots += nch;
    }
    for (int64_t c = 0; c < nch; ++c)
      items.push_back(Item{b, c * chunk, std::min(len, (c + 1) * chunk), nch > 1 ? first_slot[b] + c : -1});
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.t1 - a.t0 > b.t1 - b.t0; });  // longest first
  std::vector<float> part(slots * Hq * (D + 2));
  const ItemFn fn = dtype == at::kFloat ? pick_item_fn<float>(group, format, D) : pick_item_fn<bf16>(group, format, D);
  const int64_t ws_floats = scratch_floats_max(Hv, group, D);
  float* part_ptr = part.data();

  std::atomic<int64_t> next{0};
  const int64_t n_items = static_cast<int64_t>(items.size());
  auto worker = [&](int64_t, int64_t) {
    std::vector<float> ws(ws_floats);
    for (int64_t i = next.fetch_add(1); i < n_items; i = next.fetch_add(1))
      fn(P, items[i], ws.data(), out_ptr, part_ptr);
  };
  const int64_t workers = serial ? 1 : std::min(nthreads, n_items);
  if (workers <= 1)
    worker(0, 1);
  else
    at::parallel_for(0, workers, 1, worker);

  // ---- merge split requests; zero rows of empty requests ----
  std::vector<int64_t> merge_rows;
  int64_t merge_work = 0;
  for (int64_t b = 0; b < B; ++b) {
    if (lens[b] == 0) {
      std::fill_n(static_cast<char*>(out_ptr) + b * Hq * D * esize, Hq * D * esize, 0);
    } else if (n_slots[b] > 1) {
      for (int64_t h = 0; h < Hq; ++h) merge_rows.push_back(b * Hq + h);
      merge_work += Hq * n_slots[b] * D;
    }
  }
  auto merge = [&](int64_t lo, int64_t hi) {
    std::vector<float> acc(D);
    for (int64_t r = lo; r < hi; ++r) {
      const int64_t b = merge_rows[r] / Hq, h = merge_rows[r] % Hq, o = merge_rows[r] * D;
      if (dtype == at::kFloat)
        merge_head(part_ptr, first_slot[b], n_slots[b], h, Hq, D, acc.data(), static_cast<float*>(out_ptr) + o);
      else
        merge_head(part_ptr, first_slot[b], n_slots[b], h, Hq, D, acc.data(), static_cast<bf16*>(out_ptr) + o);
    }
  };
  const int64_t n_merge = static_cast<int64_t>(merge_rows.size());
  if (serial || merge_work < (1 << 15))
    merge(0, n_merge);
  else
    at::parallel_for(0, n_merge, 1, merge);
}

// For benchmarks: the decode attention of each layer of a step, back to back from C++ as the fused
// decode op (decode_cpu.cpp) calls it, with no Python between the layers: out[i] = the op on layer i's
// pools (and scale pools, when given). Called per layer from Python instead, each call paid 6-25 us
// more on a Zen4 VM (the interpreter's path, cold after the pools streamed through the caches).
std::vector<at::Tensor> paged_decode_attention_layers(const at::Tensor& q, at::TensorList k_pools,
                                                      at::TensorList v_pools, const at::Tensor& block_tables,
                                                      const at::Tensor& seq_lens, double scale,
                                                      at::TensorList k_scales, at::TensorList v_scales) {
  TORCH_CHECK(k_pools.size() == v_pools.size(), "k_pools and v_pools must list the same layers, got ",
              k_pools.size(), " and ", v_pools.size());
  TORCH_CHECK(k_scales.size() == v_scales.size() && (k_scales.empty() || k_scales.size() == k_pools.size()),
              "k_scales and v_scales must be empty or list every layer");
  std::vector<at::Tensor> outs;
  outs.reserve(k_pools.size());
  for (size_t i = 0; i < k_pools.size(); ++i) {
    std::optional<at::Tensor> ks, vs;
    if (!k_scales.empty()) ks = k_scales[i], vs = v_scales[i];
    outs.push_back(paged_decode_attention(q, k_pools[i], v_pools[i], block_tables, seq_lens, scale, ks, vs));
  }
  return outs;
}

// decode_attention_into's address, for the decode layers op in another library built from the same
// headers (an op has to be given a tensor; any will do).
int64_t decode_attention_into_address(const at::Tensor&) { return reinterpret_cast<int64_t>(&decode_attention_into); }

}  // namespace

TORCH_LIBRARY(swiftlm_attention, lib) {
  swiftlm_cpu::def_cpu(lib, "decode_attention_into_address(Tensor any) -> int", &decode_attention_into_address);
  swiftlm_cpu::def_cpu(lib, "paged_decode_attention(Tensor q, Tensor k_pool, Tensor v_pool, Tensor block_tables, "
                            "Tensor seq_lens, float scale, Tensor? k_scales=None, Tensor? v_scales=None) -> Tensor",
                       &paged_decode_attention);
  swiftlm_cpu::def_cpu(lib, "paged_decode_attention_layers(Tensor q, Tensor[] k_pools, Tensor[] v_pools, "
                            "Tensor block_tables, Tensor seq_lens, float scale, Tensor[] k_scales, "
                            "Tensor[] v_scales) -> Tensor[]",
                       &paged_decode_attention_layers);
}
