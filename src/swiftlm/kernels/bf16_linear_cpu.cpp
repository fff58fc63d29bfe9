// bf16 x bf16 -> bf16 linear layer for a few rows (decode), on x86 CPUs with AVX512-BF16
// (op torch.ops.swiftlm_bf16.gemv).
//
//   y[m, n] = bf16( sum_k x[m, k] * w[n, k] )     x [M, K], w [N, K] row-major (nn.Linear's layout)
//
// The weight keeps nn.Linear's own layout, so the dense matmul used for long prefills reads the same
// tensor and a model holds one copy. vdpbf16ps multiplies 32 bf16 pairs and adds them pairwise into
// 16 float32 lanes; one weight row is streamed 32 values (64 bytes) at a time against the same 32
// values of each activation row, and the 16 lanes are summed once at the end of the row.
// Products of bf16 values are exact in float32; the sums are float32, in a different order than a
// dense matmul's, so results agree with F.linear to float32 rounding before the final bf16 rounding.
//
// Work split: output channels in groups of RN rows; at::parallel_for gives each thread one
// contiguous range of groups, read as RN interleaved row streams, with software prefetches that
// walk the range in memory order. Activation rows go over a group in passes of up to MR while the
// group's RN * K weights stay in L1/L2, so the weights come from memory once for all rows.
//
// Meant for decode (a few rows). Measured on a 2-core AVX512-BF16/AMX Xeon VM, the 112 layer
// linears of the Qwen3-0.6B shape with the weights on huge pages (model/weight_arena.py): 1 row
// 40 ms (21.5 GB/s; a plain read of the same bytes takes 31-33 ms) vs 71 ms for F.linear; the
// two meet at ~8 rows, above which oneDNN (AMX) wins and callers switch to the dense matmul
// (see model/cpu_linear.py). Prefetching in memory order instead of per row stream: 13% faster;
// groups of 2 rows instead of 4: 5-7% faster (both builds loaded in one process, interleaved);
// prefetching 8 KiB ahead instead of 4: slower.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace {

using at::BFloat16;

constexpr int64_t KB = 32;        // bf16 values per vector
constexpr int RN = 2;             // weight rows (output channels) per group
constexpr int MR = 4;             // activation rows per pass over a group
constexpr int64_t PREFETCH = 4096;  // bytes ahead of the data being read, in memory order

inline uint16_t to_bf16_bits(float f) {
  // round to nearest even, as c10::BFloat16(float); NaN -> 0x7FC0
  uint32_t i;
  std::memcpy(&i, &f, 4);
  if ((i & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
  return static_cast<uint16_t>((i + 0x7FFFu + ((i >> 16) & 1u)) >> 16);
}

// R activation rows x C weight rows, full K (a multiple of 32). The group's C rows are C * K
// contiguous values, read as C interleaved streams; ``pf`` (when not null) walks the thread's
// range linearly PREFETCH bytes ahead of the data consumed, C lines per step of 32 columns, so
// the prefetches follow memory order whatever the row length (next rows, next group).
template <int R, int C>
inline void block(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t k, uint16_t* out, int64_t ldo,
                  const char** pf, const char* pf_end) {
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t kk = 0; kk < k; kk += KB) {
    if (pf != nullptr && *pf < pf_end) {
      for (int c = 0; c < C; ++c) _mm_prefetch(*pf + 64 * c, _MM_HINT_T0);
      *pf += 64 * C;
    }
    __m512bh wv[C];
    for (int c = 0; c < C; ++c) wv[c] = (__m512bh)_mm512_loadu_si512(w + c * k + kk);
    for (int r = 0; r < R; ++r) {
      __m512bh xv = (__m512bh)_mm512_loadu_si512(x + r * ldx + kk);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, wv[c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) out[r * ldo + c] = to_bf16_bits(_mm512_reduce_add_ps(acc[r][c]));
}

// Every activation row against one group: passes of MR rows; only the first pass prefetches.
template <int C>
inline void rows_over_group(const uint16_t* x, int64_t m, int64_t k, const uint16_t* w, uint16_t* out, int64_t n,
                            const char** pf, const char* pf_end) {
  int64_t r = 0;
  for (; r + MR <= m; r += MR) {
    block<MR, C>(x + r * k, k, w, k, out + r * n, n, r == 0 ? pf : nullptr, pf_end);
  }
  const char** first = r == 0 ? pf : nullptr;
  switch (m - r) {  // the last 0 .. MR - 1 rows in one pass
    case 3: block<3, C>(x + r * k, k, w, k, out + r * n, n, first, pf_end); break;
    case 2: block<2, C>(x + r * k, k, w, k, out + r * n, n, first, pf_end); break;
    case 1: block<1, C>(x + r * k, k, w, k, out + r * n, n, first, pf_end); break;
    default: break;
  }
}

at::Tensor gemv(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kBFloat16,
              "swiftlm_bf16.gemv takes bfloat16 activations and weights");
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1),
              "swiftlm_bf16.gemv: x [M, K] and weight [N, K] expected");
  TORCH_CHECK(x.is_contiguous() && weight.is_contiguous(), "swiftlm_bf16.gemv needs contiguous tensors");
  const int64_t m = x.size(0), k = x.size(1), n = weight.size(0);
  TORCH_CHECK(k % KB == 0, "swiftlm_bf16.gemv: K must be a multiple of 32, got ", k);
  at::Tensor out = at::empty({m, n}, x.options());
  if (m == 0 || n == 0) return out;
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<BFloat16>());
  const auto* wp = reinterpret_cast<const uint16_t*>(weight.data_ptr<BFloat16>());
  auto* op = reinterpret_cast<uint16_t*>(out.data_ptr<BFloat16>());
  const int64_t groups = (n + RN - 1) / RN;  // the last group may hold fewer than RN rows
  // grain: ~64 KB of weights per task at least, so that small layers do not pay for many threads
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / (RN * k));
  at::parallel_for(0, groups, grain, [&](int64_t g0, int64_t g1) {
    // this thread's weights: rows g0 * RN .. min(g1 * RN, n), one contiguous byte range
    const char* pf = reinterpret_cast<const char*>(wp + g0 * RN * k) + PREFETCH;
    const char* pf_end = reinterpret_cast<const char*>(wp + std::min(g1 * RN, n) * k);
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t n0 = g * RN, rows = std::min<int64_t>(RN, n - n0);
      const uint16_t* w = wp + n0 * k;
      uint16_t* o = op + n0;
      if (rows == RN) {
        rows_over_group<RN>(xp, m, k, w, o, n, &pf, pf_end);
      } else {
        for (int64_t i = 0; i < rows; ++i) rows_over_group<1>(xp, m, k, w + i * k, o + i, n, nullptr, pf_end);
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(swiftlm_bf16, lib) { lib.def("gemv(Tensor x, Tensor weight) -> Tensor"); }

TORCH_LIBRARY_IMPL(swiftlm_bf16, CPU, lib) { lib.impl("gemv", &gemv); }
