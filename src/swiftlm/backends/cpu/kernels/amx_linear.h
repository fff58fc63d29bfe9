// bf16 linear layer for small batches (decode of 7 to 32 sequences) on CPUs with AMX, on raw
// pointers: used by the op of amx_linear_cpu.cpp (and any op that includes this header).
//
//   y[m, n] = bf16( sum_k x[m, k] * w[n, k] )     x [M, K], w [N, K] row-major (nn.Linear's layout)
//
// AMX multiplies tiles: C [16 x 16] float32 += A [16 x 32] bf16 . B [32 x 16] bf16, with B stored as
// 16 rows of 16 pairs (the two values of a pair are consecutive k). The weight is used as A as it
// lies: a tile is 16 weight rows x 32 values, loaded with the weight's row stride, so the weight keeps
// nn.Linear's layout and is read once, in the order it sits in memory per pair of 16-row blocks.
// The activations become B: x transposed into pairs once per call (K/32 tiles of 1 KiB per 16 rows of
// x). C then holds 16 outputs x 16 batch rows, transposed back when written.
//
// At one tile product (16 x 16 x 32) per 1 KiB of weights, AMX does the arithmetic of 32 rows in a
// fraction of the time the weights take to arrive, so 7-32 rows run at the speed of streaming the
// weights once, where AVX512-BF16 dot products (bf16_gemv.h) slow down with every row and oneDNN's
// matmul reorders the weight on each call.
#pragma once

#include <ATen/Parallel.h>

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common.h"  // bf16_bits: the same rounding as the GEMV

namespace swiftlm_amx {

constexpr int64_t kBlock = 16;        // weight rows per A tile, batch rows per B tile
constexpr int64_t kDepth = 32;        // k values per tile product
constexpr int64_t kMaxRows = 2 * kBlock;  // batch rows per call: two B tiles (op max_rows() reports it)
constexpr int64_t kPrefetchAhead = 1;  // prefetch the weights this many block pairs ahead, into L2

// Linux keeps AMX tile data off until a process asks for it (arch_prctl ARCH_REQ_XCOMP_PERM).
inline bool enable_amx() {
  static const bool ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
  return ok;
}

struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0-3: C (weight block 0/1 x batch block 0/1); 4, 5: A (weight blocks 0, 1); 6, 7: B (batch blocks).
inline void configure_tiles() {
  TileConfig cfg;
  for (int i = 0; i < 8; ++i) {
    cfg.rows[i] = kBlock;
    cfg.colsb[i] = 64;
  }
  _tile_loadconfig(&cfg);
}

// x [m, k] -> B tiles: xt[(kb * mb + b) * 512 + r * 32 + c * 2 + j] = x[b * 16 + c, kb * 32 + 2 r + j]
// (zero past row m), for kb < k / 32 and b < mb. The 32 values of a row in one tile's k range are 16
// pairs, i.e. 16 dwords, that go down column c of the tile: one load and one scatter.
inline void pack_activations(const uint16_t* x, int64_t m, int64_t k, int64_t mb, uint16_t* xt) {
  std::memset(xt, 0, (k / kDepth) * mb * 512 * sizeof(uint16_t));
  const __m512i down = _mm512_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240);
  for (int64_t row = 0; row < m; ++row) {
    const int64_t b = row / kBlock, c = row % kBlock;
    for (int64_t kb = 0; kb < k / kDepth; ++kb) {
      const __m512i v = _mm512_loadu_si512(x + row * k + kb * kDepth);
      _mm512_i32scatter_epi32(reinterpret_cast<int32_t*>(xt + (kb * mb + b) * 512) + c, down, v, 4);
    }
  }
}

// C tiles (float [16 weight rows][16 batch rows]) -> out[row, n0 + i] for the valid rows and columns
inline void write_block(const float* c, int64_t batch0, int64_t m, int64_t n0, int64_t n_valid, int64_t n,
                        uint16_t* out) {
  for (int64_t bc = 0; bc < kBlock && batch0 + bc < m; ++bc)
    for (int64_t i = 0; i < n_valid; ++i) out[(batch0 + bc) * n + n0 + i] = swiftlm_cpu::bf16_bits(c[i * kBlock + bc]);
}

template <int MB>  // batch blocks of 16 rows: 1 or 2
inline void pair_of_blocks(const uint16_t* a0, const uint16_t* a1, int64_t lda_bytes, const uint16_t* xt, int64_t k,
                           const char** pf, const char* pf_end, float* c) {
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (MB == 2) {
    _tile_zero(2);
    _tile_zero(3);
  }
  const int64_t lines_per_step = 2 * kBlock;  // the pair's bytes per step of 32 k values, in 64-byte lines
  for (int64_t kb = 0; kb < k / kDepth; ++kb) {
    for (int64_t i = 0; i < lines_per_step && *pf < pf_end; ++i, *pf += 64) _mm_prefetch(*pf, _MM_HINT_T1);
    _tile_loadd(4, a0 + kb * kDepth, lda_bytes);
    _tile_loadd(5, a1 + kb * kDepth, lda_bytes);
    _tile_loadd(6, xt + (kb * MB) * 512, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 5, 6);
    if constexpr (MB == 2) {
      _tile_loadd(7, xt + (kb * MB + 1) * 512, 64);
      _tile_dpbf16ps(2, 4, 7);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c, 64);
  _tile_stored(1, c + 256, 64);
  if constexpr (MB == 2) {
    _tile_stored(2, c + 512, 64);
    _tile_stored(3, c + 768, 64);
  }
}

// out [m, n] = x [m, k] . w [n, k]^T (bf16 bits); 1 <= m <= kMaxRows, k % 32 == 0. enable_amx() must be true.
inline void linear_into(const uint16_t* x, int64_t m, int64_t k, const uint16_t* w, int64_t n, uint16_t* out) {
  if (m == 0 || n == 0) return;
  const int64_t mb = m > kBlock ? 2 : 1;
  std::vector<uint16_t> xt((k / kDepth) * mb * 512);
  pack_activations(x, m, k, mb, xt.data());
  const int64_t pairs = (n + 2 * kBlock - 1) / (2 * kBlock);
  const int64_t pair_bytes = 2 * kBlock * k * static_cast<int64_t>(sizeof(uint16_t));
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / pair_bytes);
  at::parallel_for(0, pairs, grain, [&](int64_t p0, int64_t p1) {
    configure_tiles();
    alignas(64) float c[4 * kBlock * kBlock];
    std::vector<uint16_t> tail;  // the last, partial pair of blocks, zero-padded to 32 rows
    const char* pf = reinterpret_cast<const char*>(w + p0 * 2 * kBlock * k) + kPrefetchAhead * pair_bytes;
    const char* pf_end = reinterpret_cast<const char*>(w + std::min(p1 * 2 * kBlock, n) * k);
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t n0 = p * 2 * kBlock, rows = std::min<int64_t>(2 * kBlock, n - n0);
      const uint16_t* a = w + n0 * k;
      if (rows < 2 * kBlock) {
        tail.assign(2 * kBlock * k, 0);
        std::memcpy(tail.data(), a, rows * k * sizeof(uint16_t));
        a = tail.data();
      }
      const int64_t lda = k * static_cast<int64_t>(sizeof(uint16_t));
      if (mb == 2)
        pair_of_blocks<2>(a, a + kBlock * k, lda, xt.data(), k, &pf, pf_end, c);
      else
        pair_of_blocks<1>(a, a + kBlock * k, lda, xt.data(), k, &pf, pf_end, c);
      for (int64_t b = 0; b < mb; ++b) {
        const float* cb = c + b * 2 * kBlock * kBlock;  // tiles 2b (weight block 0), 2b + 1 (block 1)
        write_block(cb, b * kBlock, m, n0, std::min<int64_t>(kBlock, rows), n, out);
        if (rows > kBlock) write_block(cb + kBlock * kBlock, b * kBlock, m, n0 + kBlock, rows - kBlock, n, out);
      }
    }
    _tile_release();
  });
}

}  // namespace swiftlm_amx
