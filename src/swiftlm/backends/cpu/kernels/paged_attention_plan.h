// What the decode attention kernels of every instruction set share (paged_attention_cpu.cpp
// includes this header, then one instruction set's item runners: AVX-512 in the .cpp itself, AVX2 in
// paged_attention_avx2.h): the problem and its work items, the token offsets of a tile, the
// prefetches of an item's first tile, where an item's result goes, and the merge of split requests.
#pragma once

#include <c10/core/ScalarType.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "kv_quant.h"

namespace swiftlm_attn {

constexpr int kSub = 16;           // tokens per sub-tile (AVX-512: one zmm of scores)
// Tokens per online-softmax step. Longer tiles amortise the reductions (-4% time per tile of 64 in
// cache), shorter ones keep a thread's reads within fewer blocks at a time (+10% DRAM throughput
// with 16); 32 splits the difference.
constexpr int kTile = 2 * kSub;
constexpr int kMaxGroup = 8;       // query heads per kv head handled by one instantiation
// Planning: below kSerialBytes of K/V the call stays on the calling thread; otherwise requests are
// split into token chunks so that each thread gets about kItemsPerThread items of >= kMinItemBytes.
// Each item pays a start (its first tile read without prefetching, q prepared, a partial result
// merged): on a Zen4 VM, one request, 28 layers, one item a thread ran 1.07-1.13x faster than two
// at 512-2048 tokens (int8 and bf16 pools, two interleaved runs) and the same from 4096 on; four
// were 3-7% slower than two.
constexpr int64_t kSerialBytes = 192 << 10;
constexpr int64_t kItemsPerThread = 1;
constexpr int64_t kMinItemBytes = 64 << 10;
using bf16 = uint16_t;
// Where the kernels' software prefetches put the next tile's rows: the L2. Spread through the work
// (one line per line read) and into L2, they let the pools stream at the memory's rate on a Zen4 VM
// (whole-row reads, bf16: 2.2-2.7x over L1 prefetches in bursts, 1.6x over spread L1 prefetches).
constexpr _mm_hint kStreamHint = _MM_HINT_T1;

struct Problem {
  const void* q;
  const void* k;
  const void* v;
  int64_t q_sb, q_sh;        // q strides (elements): request, head; head_dim is contiguous
  int64_t k_sn, k_st, k_sh;  // pool strides: block, token in block, kv head
  int64_t v_sn, v_st, v_sh;
  const int64_t* tables;
  int64_t tables_sb;
  int64_t hq, d, bs;
  int64_t hv;                // virtual heads (Hkv * ratio), each owning G <= kMaxGroup query heads
  int64_t ratio;             // virtual heads per kv head (1 unless the GQA group exceeds kMaxGroup)
  float scale_log2;          // scale * log2(e)
  const float* ks;           // 8-bit pools: K and V scale pools [N, bs, Hkv] (contiguous), else null
  const float* vs;
  int64_t s_sn, s_st;        // scale pool strides: block, token in block (kv head: 1)
  bool amx = false;          // bf16 q: q.k may run on AMX tiles (the CPU has them and the OS grants them)
};

// One unit of work: tokens [t0, t1) of request b, all heads. slot: where its partial result goes
// when the request is split into several chunks, -1 when the item covers the whole request.
struct Item {
  int64_t b, t0, t1, slot;  // t0 a multiple of kTile
};

// Defined once per build by the instruction set's part of paged_attention_cpu.cpp: a float32 row
// rounded to the output's dtype (bf16 as c10::BFloat16(float) rounds), and 2^x for x <= 0.
void store_row(const float* src, float* dst, int64_t d);
void store_row(const float* src, bf16* dst, int64_t d);
float exp2_scalar(float x);

// Element offsets of the K and V rows of tokens [t, t + n) (n <= kTile), and of their rows in the
// scale pools (kv head 0); lanes past n repeat token t.
struct TileOffsets {
  int64_t k[kTile], v[kTile], s[kTile];
};

inline void tile_offsets(const Problem& P, const int64_t* table, int64_t t, int n, TileOffsets& o) {
  if (P.bs % kSub == 0) {  // t is a multiple of kSub, so a sub-tile never crosses a block
    for (int s = 0; s < kTile; s += kSub) {
      const int ns = s < n ? std::min(kSub, n - s) : 0;
      const int64_t ts = ns > 0 ? t + s : t;
      const int64_t blk = table[ts / P.bs], off = ts % P.bs;
      for (int i = 0; i < kSub; ++i) {
        const int64_t r = off + (i < ns ? i : 0);
        o.k[s + i] = blk * P.k_sn + r * P.k_st;
        o.v[s + i] = blk * P.v_sn + r * P.v_st;
        o.s[s + i] = blk * P.s_sn + r * P.s_st;
      }
    }
  } else {
    for (int i = 0; i < kTile; ++i) {
      const int64_t tok = t + (i < n ? i : 0);
      const int64_t blk = table[tok / P.bs], off = tok % P.bs;
      o.k[i] = blk * P.k_sn + off * P.k_st;
      o.v[i] = blk * P.v_sn + off * P.v_st;
      o.s[i] = blk * P.s_sn + off * P.s_st;
    }
  }
}

// The K and V scale rows of a tile's first n tokens (8-bit pools): all kv heads of a token share a
// line or two.
inline void prefetch_scale_rows(const Problem& P, const TileOffsets& o, int n) {
  const int step = std::max<int>(1, int(64 / (P.s_st * int64_t(sizeof(float)))));
  for (int i = 0; i < n; i += step) {
    _mm_prefetch(reinterpret_cast<const char*>(P.ks + o.s[i]), kStreamHint);
    _mm_prefetch(reinterpret_cast<const char*>(P.vs + o.s[i]), kStreamHint);
  }
}

// An item's first tile: its K and V rows (every kv head) requested at once, since no earlier tile's
// work can cover them.
inline void prefetch_first_tile(const Problem& P, const TileOffsets& o, int n, int64_t esize) {
  const int64_t row_bytes = ((P.hv / P.ratio - 1) * P.k_sh + P.d) * esize;
  for (int i = 0; i < n; ++i)
    for (int64_t x = 0; x < row_bytes; x += 64) {
      _mm_prefetch(static_cast<const char*>(P.k) + o.k[i] * esize + x, kStreamHint);
      _mm_prefetch(static_cast<const char*>(P.v) + o.v[i] * esize + x, kStreamHint);
    }
}

// An item's results for its nh query heads: head h's (m, l) at m[lane(h)], l[lane(h)];
// unpermute(h, dst, mul) writes its accumulator in head-dim order times mul. The whole request: the
// normalised row, rounded to T, into out; one chunk of a split request: (m, l, acc) into its slot.
template <typename T, typename Lane, typename Unpermute>
inline void write_item(const Problem& P, const Item& it, int64_t nh, const float* m, const float* l, Lane lane,
                       Unpermute unpermute, float* row, T* out, float* part) {
  for (int64_t h = 0; h < nh; ++h) {
    const int64_t x = lane(h);
    if (it.slot < 0) {
      unpermute(h, row, 1.0f / l[x]);
      store_row(row, out + (it.b * P.hq + h) * P.d, P.d);
    } else {
      float* slot = part + (it.slot * P.hq + h) * (P.d + 2);
      slot[0] = m[x];
      slot[1] = l[x];
      unpermute(h, slot + 2, 1.0f);
    }
  }
}

// The partial results (m, l, acc) of a split request's chunks, for query head hq, merged and
// normalised into o.
template <typename T>
void merge_head(const float* part, int64_t first_slot, int64_t n_slots, int64_t hq, int64_t Hq, int64_t d,
                float* acc, T* o) {
  float M = -std::numeric_limits<float>::infinity();
  for (int64_t c = 0; c < n_slots; ++c) M = std::max(M, part[((first_slot + c) * Hq + hq) * (d + 2)]);
  std::fill(acc, acc + d, 0.0f);
  float L = 0.0f;
  for (int64_t c = 0; c < n_slots; ++c) {
    const float* s = part + ((first_slot + c) * Hq + hq) * (d + 2);
    const float w = exp2_scalar(s[0] - M);
    L += s[1] * w;
    for (int64_t i = 0; i < d; ++i) acc[i] += s[2 + i] * w;
  }
  const float inv = 1.0f / L;
  for (int64_t i = 0; i < d; ++i) acc[i] *= inv;
  store_row(acc, o, d);
}

using ItemFn = void (*)(const Problem&, const Item&, float*, void*, float*);

// The 8-bit format of a pool dtype (kNone: not an 8-bit format).
inline int64_t pool_format(at::ScalarType t) {
  switch (t) {
    case at::kChar: return swiftlm_kvq::kInt8;
    case at::kFloat8_e4m3fn: return swiftlm_kvq::kE4M3;
    case at::kFloat8_e5m2: return swiftlm_kvq::kE5M2;
    default: return swiftlm_kvq::kNone;
  }
}

}  // namespace swiftlm_attn
