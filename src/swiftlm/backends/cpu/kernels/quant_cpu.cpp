// Weight-only int8 / int4 linear layers on x86 CPUs with AVX512-VNNI (ops in torch.ops.swiftlm_quant).
//
// The math, shared with the plain-torch oracle in quant_cpu.py:
//   activations: every row is quantised dynamically in blocks of QK = 32 along K:
//       amax = max |x|, a_scale = amax / 127, qa = round(x * (127 / amax)) in [-127, 127],
//       a_sum = sum(qa)                                   (a block with amax < 1e-30 is all zero)
//   int8 weights: per output channel n:               w = d[n] * (u - 128),      u in [1, 255]
//   int4 weights: per output channel n, group g of G:  w = d[n, g] * u + m[n, g], u in [0, 15]
//   y[r, n] = sum_k (a_scale * qa[r, k]) * w[n, k]
// vpdpbusd multiplies unsigned bytes by signed bytes. The weights are the unsigned operand (int4
// nibbles need no sign fix; int8 carries an offset of 128) and the activations the signed one,
// broadcast four at a time, so one instruction adds 4 products into each of 16 output channels.
// The int8 offset is removed exactly, per block, as 128 * a_sum; the int4 minimum is added per
// group as m * sum_b(a_scale * a_sum). Integer sums are exact; float work is in float32.
//
// Packed weights, one tile = 16 output channels, stored so that the kernel streams them linearly:
//   int8 qweight [N16, K / 4, 64] uint8: [tile][k / 4][channel][k % 4]
//   int4 qweight [N16, K / 32, 4, 64] uint8: [tile][block][v][channel][k % 4], where the low
//        nibble holds k = 32 * block + 4 * v + k % 4 and the high nibble the same k plus 16
//   int8 scales [N] float32; int4 scales, mins [N16, K / G, 16] float16
// N16 = ceil(N / 16); channels past N are zero padding.
//
// The GEMVs split the tiles into one contiguous range per thread (at::parallel_for), so each thread
// reads one linear stream; rows go over a tile in passes of up to 8 while it stays in L1/L2. The
// dequantise ops (for the dense matmul path) write [n, K] rows through 4 x 4 lane transposes.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common.h"

namespace {

constexpr int64_t QK = 32;      // activation block along K
constexpr int64_t TILE = 16;    // output channels per tile (one zmm of lanes)
constexpr int MAX_ROWS = 8;     // activation rows per pass over a tile
constexpr float TINY = 1e-30f;  // below this a block quantises to zeros (127 / amax would overflow)

using at::BFloat16;

using swiftlm_cpu::load16;
using swiftlm_cpu::store16;  // bf16: rounded to nearest even, as c10::BFloat16(float)

inline __m512i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// One block of 32 values -> two vectors of 16 quantised int32; returns a_scale.
template <typename T>
inline float quantize_block(const T* x, __m512i& q0, __m512i& q1) {
  __m512 v0 = load16(x), v1 = load16(x + 16);
  float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
  bool zero = !(amax >= TINY);
  __m512 inv = _mm512_set1_ps(zero ? 0.f : 127.f / amax);
  q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, inv));  // rounds half to even (default MXCSR)
  q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, inv));
  return zero ? 0.f : amax / 127.f;
}

struct QuantizedRows {
  int64_t rows, k, nb;
  std::vector<int8_t> q;       // [rows][k]
  std::vector<float> scale;    // [rows][nb]
  std::vector<int32_t> sum;    // [rows][nb]
};

template <typename T>
void quantize_rows(const T* x, int64_t rows, int64_t k, QuantizedRows& a) {
  a.rows = rows, a.k = k, a.nb = k / QK;
  a.q.resize(rows * k), a.scale.resize(rows * a.nb), a.sum.resize(rows * a.nb);
  for (int64_t i = 0; i < rows * a.nb; ++i) {
    __m512i q0, q1;
    a.scale[i] = quantize_block(x + i * QK, q0, q1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(&a.q[i * QK]), _mm512_cvtsepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(&a.q[i * QK + 16]), _mm512_cvtsepi32_epi8(q1));
    a.sum[i] = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
  }
}

// Split accumulators per row so that a short row count still has independent dependency chains.
template <int R>
constexpr int kSplit = R == 1 ? 4 : (R == 2 ? 2 : 1);

// R activation rows x one int8 tile. comp[r][b] = 128 * a_sum; out points at (row 0, channel 0).
template <int R, typename T>
void int8_tile(const uint8_t* w, const float* d, int64_t nvalid, const QuantizedRows& a, int64_t r0,
               const int32_t* comp, T* out, int64_t ldo) {
  constexpr int S = kSplit<R>;
  const int64_t k = a.k, nb = a.nb;
  const int8_t* qa = a.q.data() + r0 * k;
  const float* sa = a.scale.data() + r0 * nb;
  comp += r0 * nb;
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m512i dot[R][S];
    for (int r = 0; r < R; ++r)
      for (int s = 0; s < S; ++s) dot[r][s] = _mm512_setzero_si512();
    const uint8_t* wb = w + b * QK * TILE;
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      __m512i wv = _mm512_loadu_si512(wb + j * 64);
      for (int r = 0; r < R; ++r)
        dot[r][j % S] = _mm512_dpbusd_epi32(dot[r][j % S], wv, broadcast4(qa + r * k + b * QK + j * 4));
    }
    for (int r = 0; r < R; ++r) {
      __m512i s = dot[r][0];
      for (int i = 1; i < S; ++i) s = _mm512_add_epi32(s, dot[r][i]);
      s = _mm512_sub_epi32(s, _mm512_set1_epi32(comp[r * nb + b]));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(sa[r * nb + b]), acc[r]);
    }
  }
  __mmask16 mask = swiftlm_cpu::first_lanes(nvalid);
  __m512 dv = _mm512_maskz_loadu_ps(mask, d);
  for (int r = 0; r < R; ++r) store16(out + r * ldo, _mm512_mul_ps(acc[r], dv), mask);
}

// R activation rows x one int4 tile. gsum[r][g] = sum over the group's blocks of a_scale * a_sum.
template <int R, typename T>
void int4_tile(const uint8_t* w, const c10::Half* dsc, const c10::Half* mins, int64_t blocks_per_group,
               int64_t nvalid, const QuantizedRows& a, int64_t r0, const float* gsum, T* out, int64_t ldo) {
  constexpr int S = kSplit<R>;
  const int64_t k = a.k, nb = a.nb, ng = nb / blocks_per_group;
  const int8_t* qa = a.q.data() + r0 * k;
  const float* sa = a.scale.data() + r0 * nb;
  gsum += r0 * ng;
  const __m512i low = _mm512_set1_epi8(0x0F);
  __m512 acc[R], part[R];
  for (int r = 0; r < R; ++r) acc[r] = part[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m512i dot[R][S];
    for (int r = 0; r < R; ++r)
      for (int s = 0; s < S; ++s) dot[r][s] = _mm512_setzero_si512();
    const uint8_t* wb = w + b * QK * TILE / 2;
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      __m512i p = _mm512_loadu_si512(wb + v * 64);
      __m512i lo = _mm512_and_si512(p, low);
      __m512i hi = _mm512_and_si512(_mm512_srli_epi16(p, 4), low);
      for (int r = 0; r < R; ++r) {
        const int8_t* x = qa + r * k + b * QK + v * 4;
        dot[r][(2 * v) % S] = _mm512_dpbusd_epi32(dot[r][(2 * v) % S], lo, broadcast4(x));
        dot[r][(2 * v + 1) % S] = _mm512_dpbusd_epi32(dot[r][(2 * v + 1) % S], hi, broadcast4(x + 16));
      }
    }
    for (int r = 0; r < R; ++r) {
      __m512i s = dot[r][0];
      for (int i = 1; i < S; ++i) s = _mm512_add_epi32(s, dot[r][i]);
      part[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(sa[r * nb + b]), part[r]);
    }
    if ((b + 1) % blocks_per_group == 0) {
      const int64_t g = b / blocks_per_group;
      __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dsc + g * TILE)));
      __m512 mv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(mins + g * TILE)));
      for (int r = 0; r < R; ++r) {
        acc[r] = _mm512_fmadd_ps(part[r], dv, acc[r]);
        acc[r] = _mm512_fmadd_ps(mv, _mm512_set1_ps(gsum[r * ng + g]), acc[r]);
        part[r] = _mm512_setzero_ps();
      }
    }
  }
  __mmask16 mask = swiftlm_cpu::first_lanes(nvalid);
  for (int r = 0; r < R; ++r) store16(out + r * ldo, acc[r], mask);
}

// Calls f(std::integral_constant<int, R>) for 1 <= rows <= MAX_ROWS.
template <typename F>
void with_rows(int64_t rows, F&& f) {
  switch (rows) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 7: return f(std::integral_constant<int, 7>{});
    default: return f(std::integral_constant<int, 8>{});
  }
}

// Row passes over each tile: M rows in ceil(M / MAX_ROWS) passes of near-equal size.
template <typename F>
void for_row_passes(int64_t m, F&& f) {
  const int64_t passes = (m + MAX_ROWS - 1) / MAX_ROWS;
  for (int64_t p = 0, r0 = 0; p < passes; ++p) {
    const int64_t rows = m / passes + (p < m % passes ? 1 : 0);
    f(r0, rows);
    r0 += rows;
  }
}

void check_activations(const at::Tensor& x, int64_t k) {
  TORCH_CHECK(x.dim() == 2, "activations must be 2-D [M, K], got ", x.sizes());
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "activations must be float32 or bfloat16, got ", x.scalar_type());
  TORCH_CHECK(x.size(1) == k, "activations have K = ", x.size(1), " but the weights expect ", k);
  TORCH_CHECK(k % QK == 0, "K = ", k, " is not a multiple of ", QK);
}

// Calls f(T{}) with T = float or BFloat16, the activation dtypes the kernels take.
template <typename F>
void dispatch_float(at::ScalarType dtype, F&& f) {
  if (dtype == at::kFloat) {
    f(float{});
  } else {
    TORCH_CHECK(dtype == at::kBFloat16, "expected float32 or bfloat16, got ", dtype);
    f(BFloat16{});
  }
}

template <typename T>
void quantize_input(const at::Tensor& x, QuantizedRows& a) {
  quantize_rows(x.data_ptr<T>(), x.size(0), x.size(1), a);
}

// Parallel over tiles; each thread streams one contiguous range. Small layers stay on one thread.
template <typename F>
void for_tiles(int64_t tiles, int64_t tile_bytes, F&& f) {
  const int64_t grain = std::max<int64_t>(1, (64 << 10) / tile_bytes);
  at::parallel_for(0, tiles, grain, f);
}

at::Tensor int8_gemv(const at::Tensor& x_, const at::Tensor& qweight, const at::Tensor& scales, int64_t n) {
  TORCH_CHECK(qweight.scalar_type() == at::kByte && qweight.dim() == 3 && qweight.size(2) == 64 &&
              qweight.is_contiguous(), "int8 qweight must be contiguous uint8 [N16, K/4, 64]");
  const int64_t tiles = qweight.size(0), k = qweight.size(1) * 4;
  TORCH_CHECK(tiles * TILE >= n && (tiles - 1) * TILE < n, "qweight holds ", tiles, " tiles, not N = ", n);
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.numel() == n && scales.is_contiguous(),
              "int8 scales must be contiguous float32 [N]");
  at::Tensor x = x_.contiguous();
  check_activations(x, k);
  const int64_t m = x.size(0);
  at::Tensor out = at::empty({m, n}, x.options());
  if (m == 0) return out;
  QuantizedRows a;
  std::vector<int32_t> comp;
  dispatch_float(x.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    quantize_input<scalar_t>(x, a);
    comp.resize(a.sum.size());
    for (size_t i = 0; i < comp.size(); ++i) comp[i] = 128 * a.sum[i];
    const uint8_t* w = qweight.data_ptr<uint8_t>();
    const float* d = scales.data_ptr<float>();
    scalar_t* y = out.data_ptr<scalar_t>();
    for_tiles(tiles, k * TILE, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        for_row_passes(m, [&](int64_t r0, int64_t rows) {
          with_rows(rows, [&](auto R) {
            int8_tile<decltype(R)::value>(w + t * k * TILE, d + t * TILE, n - t * TILE, a, r0, comp.data(),
                               y + r0 * n + t * TILE, n);
          });
        });
      }
    });
  });
  return out;
}

at::Tensor int4_gemv(const at::Tensor& x_, const at::Tensor& qweight, const at::Tensor& scales,
                     const at::Tensor& mins, int64_t n) {
  TORCH_CHECK(qweight.scalar_type() == at::kByte && qweight.dim() == 4 && qweight.size(2) == 4 &&
              qweight.size(3) == 64 && qweight.is_contiguous(),
              "int4 qweight must be contiguous uint8 [N16, K/32, 4, 64]");
  const int64_t tiles = qweight.size(0), k = qweight.size(1) * QK;
  TORCH_CHECK(tiles * TILE >= n && (tiles - 1) * TILE < n, "qweight holds ", tiles, " tiles, not N = ", n);
  for (const at::Tensor* t : {&scales, &mins})
    TORCH_CHECK(t->scalar_type() == at::kHalf && t->dim() == 3 && t->size(0) == tiles && t->size(2) == TILE &&
                t->is_contiguous() && k % t->size(1) == 0 && (k / t->size(1)) % QK == 0,
                "int4 scales and mins must be contiguous float16 [N16, K/G, 16] with G a multiple of 32");
  TORCH_CHECK(mins.sizes() == scales.sizes(), "int4 scales and mins differ in shape");
  at::Tensor x = x_.contiguous();
  check_activations(x, k);
  const int64_t m = x.size(0), ng = scales.size(1), bpg = k / ng / QK;
  at::Tensor out = at::empty({m, n}, x.options());
  if (m == 0) return out;
  QuantizedRows a;
  std::vector<float> gsum;
  dispatch_float(x.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    quantize_input<scalar_t>(x, a);
    gsum.assign(m * ng, 0.f);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t b = 0; b < a.nb; ++b) gsum[r * ng + b / bpg] += a.scale[r * a.nb + b] * a.sum[r * a.nb + b];
    const uint8_t* w = qweight.data_ptr<uint8_t>();
    const c10::Half* dsc = scales.data_ptr<c10::Half>();
    const c10::Half* mn = mins.data_ptr<c10::Half>();
    scalar_t* y = out.data_ptr<scalar_t>();
    for_tiles(tiles, k * TILE / 2, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        for_row_passes(m, [&](int64_t r0, int64_t rows) {
          with_rows(rows, [&](auto R) {
            int4_tile<decltype(R)::value>(w + t * k * TILE / 2, dsc + t * ng * TILE, mn + t * ng * TILE, bpg,
                               n - t * TILE, a, r0, gsum.data(), y + r0 * n + t * TILE, n);
          });
        });
      }
    });
  });
  return out;
}

// Lane l of the result = v[4 * quarter + l / 4]: per-channel values spread over [channel][k % 4].
inline __m512 spread_quarter(__m512 v, int quarter) {
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  return _mm512_permutexvar_ps(_mm512_add_epi32(_mm512_srli_epi32(lane, 2), _mm512_set1_epi32(4 * quarter)), v);
}

// A quarter of a tile (4 channels) over 16 consecutive k: v[s] holds k4 step s with lanes
// [channel c][k % 4]. A 4 x 4 transpose of 128-bit lanes turns them into one row of 16 per channel.
template <typename T>
inline void store_quarter(const __m512 v[4], T* out, int64_t ldo, int64_t nvalid) {
  __m512 t0 = _mm512_shuffle_f32x4(v[0], v[1], 0x44), t1 = _mm512_shuffle_f32x4(v[0], v[1], 0xEE);
  __m512 t2 = _mm512_shuffle_f32x4(v[2], v[3], 0x44), t3 = _mm512_shuffle_f32x4(v[2], v[3], 0xEE);
  const __m512 rows[4] = {_mm512_shuffle_f32x4(t0, t2, 0x88), _mm512_shuffle_f32x4(t0, t2, 0xDD),
                          _mm512_shuffle_f32x4(t1, t3, 0x88), _mm512_shuffle_f32x4(t1, t3, 0xDD)};
  for (int c = 0; c < 4 && c < nvalid; ++c) store16(out + c * ldo, rows[c], 0xFFFF);
}

inline __m512 bytes_to_float(__m128i u8) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(u8)); }

inline __m128i load_quarter(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }

template <typename T>
void int8_dequantize_tile(const uint8_t* w, const float* d, int64_t nvalid, int64_t k, T* out) {
  __m512 dv = _mm512_maskz_loadu_ps(swiftlm_cpu::first_lanes(nvalid), d), dq[4];
  for (int q = 0; q < 4; ++q) dq[q] = spread_quarter(dv, q);
  const __m512 offset = _mm512_set1_ps(128.f);
  for (int64_t k0 = 0; k0 < k; k0 += 16) {
    const uint8_t* ws = w + k0 * TILE;  // four k4 steps of 64 bytes
    for (int q = 0; q < 4 && 4 * q < nvalid; ++q) {
      __m512 v[4];
      for (int s = 0; s < 4; ++s)
        v[s] = _mm512_mul_ps(_mm512_sub_ps(bytes_to_float(load_quarter(ws + s * 64 + q * 16)), offset), dq[q]);
      store_quarter(v, out + 4 * q * k + k0, k, nvalid - 4 * q);
    }
  }
}

template <typename T>
void int4_dequantize_tile(const uint8_t* w, const c10::Half* dsc, const c10::Half* mins, int64_t ng,
                          int64_t nvalid, int64_t k, T* out) {
  const int64_t bpg = k / ng / QK;
  const __m128i low = _mm_set1_epi8(0x0F);
  __m512 dq[4], mq[4];
  for (int64_t b = 0; b < k / QK; ++b) {
    if (b % bpg == 0) {
      const int64_t g = b / bpg;
      __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dsc + g * TILE)));
      __m512 mv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(mins + g * TILE)));
      for (int q = 0; q < 4; ++q) dq[q] = spread_quarter(dv, q), mq[q] = spread_quarter(mv, q);
    }
    const uint8_t* wb = w + b * QK * TILE / 2;  // low nibbles: k 0..15 of the block, high: 16..31
    for (int q = 0; q < 4 && 4 * q < nvalid; ++q) {
      __m512 lo[4], hi[4];
      for (int v = 0; v < 4; ++v) {
        __m128i p = load_quarter(wb + v * 64 + q * 16);
        lo[v] = _mm512_fmadd_ps(bytes_to_float(_mm_and_si128(p, low)), dq[q], mq[q]);
        hi[v] = _mm512_fmadd_ps(bytes_to_float(_mm_and_si128(_mm_srli_epi16(p, 4), low)), dq[q], mq[q]);
      }
      store_quarter(lo, out + 4 * q * k + b * QK, k, nvalid - 4 * q);
      store_quarter(hi, out + 4 * q * k + b * QK + 16, k, nvalid - 4 * q);
    }
  }
}

void check_range(int64_t n0, int64_t n1, int64_t tiles) {
  TORCH_CHECK(n0 >= 0 && n0 % TILE == 0 && n0 <= n1 && n1 <= tiles * TILE,
              "channel range [", n0, ", ", n1, ") must start at a multiple of 16 and lie within the weights");
}

at::Tensor int8_dequantize(const at::Tensor& qweight, const at::Tensor& scales, int64_t n0, int64_t n1,
                           at::ScalarType dtype) {
  TORCH_CHECK(qweight.scalar_type() == at::kByte && qweight.dim() == 3 && qweight.is_contiguous(),
              "int8 qweight must be contiguous uint8 [N16, K/4, 64]");
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.is_contiguous() && scales.numel() >= n1,
              "int8 scales must be contiguous float32 [N]");
  const int64_t tiles = qweight.size(0), k = qweight.size(1) * 4;
  check_range(n0, n1, tiles);
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "dequantise to float32 or bfloat16, not ", dtype);
  at::Tensor out = at::empty({n1 - n0, k}, qweight.options().dtype(dtype));
  dispatch_float(dtype, [&](auto tag) {
    using scalar_t = decltype(tag);
    const uint8_t* w = qweight.data_ptr<uint8_t>();
    const float* d = scales.data_ptr<float>();
    scalar_t* y = out.data_ptr<scalar_t>();
    for_tiles((n1 - n0 + TILE - 1) / TILE, k * TILE, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t c0 = n0 + t * TILE;
        int8_dequantize_tile(w + c0 * k, d + c0, std::min(TILE, n1 - c0), k, y + t * TILE * k);
      }
    });
  });
  return out;
}

at::Tensor int4_dequantize(const at::Tensor& qweight, const at::Tensor& scales, const at::Tensor& mins,
                           int64_t n0, int64_t n1, at::ScalarType dtype) {
  TORCH_CHECK(qweight.scalar_type() == at::kByte && qweight.dim() == 4 && qweight.is_contiguous(),
              "int4 qweight must be contiguous uint8 [N16, K/32, 4, 64]");
  TORCH_CHECK(scales.scalar_type() == at::kHalf && mins.scalar_type() == at::kHalf && scales.is_contiguous() &&
              mins.is_contiguous() && scales.sizes() == mins.sizes() && scales.size(0) == qweight.size(0),
              "int4 scales and mins must be contiguous float16 [N16, K/G, 16]");
  const int64_t tiles = qweight.size(0), k = qweight.size(1) * QK, ng = scales.size(1);
  check_range(n0, n1, tiles);
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "dequantise to float32 or bfloat16, not ", dtype);
  at::Tensor out = at::empty({n1 - n0, k}, qweight.options().dtype(dtype));
  dispatch_float(dtype, [&](auto tag) {
    using scalar_t = decltype(tag);
    const uint8_t* w = qweight.data_ptr<uint8_t>();
    const c10::Half* dsc = scales.data_ptr<c10::Half>();
    const c10::Half* mn = mins.data_ptr<c10::Half>();
    scalar_t* y = out.data_ptr<scalar_t>();
    for_tiles((n1 - n0 + TILE - 1) / TILE, k * TILE / 2, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t tile = n0 / TILE + t;
        int4_dequantize_tile(w + tile * k * TILE / 2, dsc + tile * ng * TILE, mn + tile * ng * TILE, ng,
                             std::min(TILE, n1 - tile * TILE), k, y + t * TILE * k);
      }
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_activations(const at::Tensor& x_) {
  at::Tensor x = x_.contiguous();
  check_activations(x, x.size(-1));
  const int64_t m = x.size(0), k = x.size(1), nb = k / QK;
  QuantizedRows a;
  dispatch_float(x.scalar_type(), [&](auto tag) { quantize_input<decltype(tag)>(x, a); });
  at::Tensor q = at::empty({m, k}, x.options().dtype(at::kChar));
  at::Tensor scale = at::empty({m, nb}, x.options().dtype(at::kFloat));
  at::Tensor sum = at::empty({m, nb}, x.options().dtype(at::kInt));
  std::memcpy(q.data_ptr(), a.q.data(), a.q.size());
  std::memcpy(scale.data_ptr(), a.scale.data(), a.scale.size() * sizeof(float));
  std::memcpy(sum.data_ptr(), a.sum.data(), a.sum.size() * sizeof(int32_t));
  return {q, scale, sum};
}

// x -> a_scale * qa, computed in float32 and rounded once to x's dtype (the dense path's input).
at::Tensor fake_quantize_activations(const at::Tensor& x_) {
  at::Tensor x = x_.contiguous();
  check_activations(x, x.size(-1));
  at::Tensor out = at::empty(x.sizes(), x.options());
  const int64_t blocks = x.numel() / QK;
  dispatch_float(x.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    const scalar_t* src = x.data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    at::parallel_for(0, blocks, 2048, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        __m512i q0, q1;
        __m512 s = _mm512_set1_ps(quantize_block(src + b * QK, q0, q1));
        store16(dst + b * QK, _mm512_mul_ps(_mm512_cvtepi32_ps(q0), s), 0xFFFF);
        store16(dst + b * QK + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(q1), s), 0xFFFF);
      }
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(swiftlm_quant, lib) {
  using swiftlm_cpu::def_cpu;
  def_cpu(lib, "quantize_activations(Tensor x) -> (Tensor, Tensor, Tensor)", &quantize_activations);
  def_cpu(lib, "fake_quantize_activations(Tensor x) -> Tensor", &fake_quantize_activations);
  def_cpu(lib, "int8_gemv(Tensor x, Tensor qweight, Tensor scales, int n) -> Tensor", &int8_gemv);
  def_cpu(lib, "int4_gemv(Tensor x, Tensor qweight, Tensor scales, Tensor mins, int n) -> Tensor", &int4_gemv);
  def_cpu(lib, "int8_dequantize(Tensor qweight, Tensor scales, int n0, int n1, ScalarType dtype) -> Tensor",
          &int8_dequantize);
  def_cpu(lib, "int4_dequantize(Tensor qweight, Tensor scales, Tensor mins, int n0, int n1, ScalarType dtype) -> Tensor",
          &int4_dequantize);
}
