// One token per row of a step's logits on the CPU, in one op: greedy rows take the argmax, sampled
// rows (temperature, min-p) one draw by inverse transform, as swiftlm.runner.token_draw.draw does it.
//
//   draw_tokens(logits [B, V] float32, temperature [B] float32, log_min_p [B] float32,
//               uniform [B] float32) -> (ids [B] int64, finite [B] bool)
//
// Row r with temperature[r] == 0: the id of its largest logit, the lowest of tied ones (NaN never
// wins; a row of NaN: id 0). Else, with y = logits[r] / temperature[r] and m = max(y):
//   kept:  y_j >= m + log_min_p[r] (log_min_p = -inf keeps every column),
//   mass:  e_j = exp(y_j - m) for kept columns, 0 for the others (and for y_j = -inf),
//   id:    the first column j whose running mass e_0 + ... + e_j exceeds uniform[r] * (the total);
//          when rounding leaves none, the last column with mass; a row without mass: id 0.
// finite[r]: whether every logit of the row is finite (when not, the id means nothing).
//
// The running mass is summed in double, in blocks of 64 columns (each block's sum in float lanes,
// the block holding the target scanned column by column), so the chosen column differs from an
// exact inverse transform only where u * total lies within float rounding of a column's edge. The
// torch ops it replaces (divide, amax, subtract, exp, cumsum, searchsorted) read and wrote the
// [B, V] logits six times: ~4 ms a step for 256 rows of a 4,096-token vocabulary on a Zen3 VM.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "common.h"
#include "row_scan.h"  // scan_row, find_value

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>
#include <vector>

namespace {

constexpr int64_t kBlock = 64;  // columns per block of the running mass (a multiple of 8)

// e_j = exp(y_j - top) where y_j >= floor, else 0, written over y; each block's sum into `blocks`.
inline double masses(float* y, int64_t v, float top, float floor, double* blocks) {
  double total = 0.0;
  for (int64_t b0 = 0, b = 0; b0 < v; b0 += kBlock, ++b) {
    const int64_t b1 = std::min(v, b0 + kBlock);
    int64_t j = b0;
    float s = 0.0f;
#if defined(__AVX2__) && defined(__FMA__)
    const __m256 topv = _mm256_set1_ps(top), floorv = _mm256_set1_ps(floor);
    __m256 acc = _mm256_setzero_ps();
    for (; j + 8 <= b1; j += 8) {
      const __m256 yv = _mm256_loadu_ps(y + j);
      const __m256 keep = _mm256_cmp_ps(yv, floorv, _CMP_GE_OQ);  // false for NaN and below the floor
      const __m256 e = _mm256_and_ps(swiftlm_cpu::exp_ps8(_mm256_sub_ps(yv, topv)), keep);
      _mm256_storeu_ps(y + j, e);
      acc = _mm256_add_ps(acc, e);
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, acc);
    for (int k = 0; k < 8; ++k) s += lanes[k];
#endif
    for (; j < b1; ++j) {
      const float e = y[j] >= floor ? std::exp(y[j] - top) : 0.0f;
      y[j] = e;
      s += e;
    }
    blocks[b] = s;
    total += s;
  }
  return total;
}

// The drawn column of one row of masses e (see the header), `total` their sum.
inline int64_t pick_column(const float* e, int64_t v, const double* blocks, double total, float u) {
  if (!(total > 0.0)) return 0;
  const double target = static_cast<double>(u) * total;
  double before = 0.0;  // the mass of the blocks before b
  for (int64_t b0 = 0, b = 0; b0 < v; b0 += kBlock, ++b) {
    if (before + blocks[b] > target) {
      double run = before;
      for (int64_t j = b0, b1 = std::min(v, b0 + kBlock); j < b1; ++j) {
        run += e[j];
        if (e[j] > 0.0f && run > target) return j;
      }
    }
    before += blocks[b];  // the block's float sum, as the test above read it
  }
  for (int64_t j = v - 1; j >= 0; --j)  // u * total rounded to the total: the last column with mass
    if (e[j] > 0.0f) return j;
  return 0;
}

std::tuple<at::Tensor, at::Tensor> draw_tokens(const at::Tensor& logits_in, const at::Tensor& temperature_in,
                                               const at::Tensor& log_min_p_in, const at::Tensor& uniform_in) {
  TORCH_CHECK(logits_in.dim() == 2 && logits_in.scalar_type() == at::kFloat && logits_in.size(1) > 0,
              "swiftlm_draw.draw_tokens: logits must be float32 [B, V], V > 0, got ", logits_in.scalar_type(), " ",
              logits_in.sizes());
  const int64_t rows = logits_in.size(0), v = logits_in.size(1);
  for (const at::Tensor* t : {&temperature_in, &log_min_p_in, &uniform_in})
    TORCH_CHECK(t->dim() == 1 && t->size(0) == rows && t->scalar_type() == at::kFloat,
                "swiftlm_draw.draw_tokens: temperature, log_min_p and uniform must be float32 [", rows, "]");
  const at::Tensor x = logits_in.contiguous(), temperature = temperature_in.contiguous(),
                   log_min_p = log_min_p_in.contiguous(), uniform = uniform_in.contiguous();
  at::Tensor ids = at::empty({rows}, x.options().dtype(at::kLong));
  at::Tensor finite = at::empty({rows}, x.options().dtype(at::kBool));
  const float *xp = x.const_data_ptr<float>(), *tp = temperature.const_data_ptr<float>(),
              *lp = log_min_p.const_data_ptr<float>(), *up = uniform.const_data_ptr<float>();
  int64_t* ip = ids.data_ptr<int64_t>();
  bool* fp = finite.data_ptr<bool>();
  const int64_t grain = std::max<int64_t>(1, 16384 / v);
  at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    std::vector<float> scratch;  // [V]: a sampled row's y, then its masses
    std::vector<double> blocks((v + kBlock - 1) / kBlock);
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = xp + r * v;
      const float t = tp[r];
      if (!(t > 0.0f)) {  // greedy
        const float mx = swiftlm_rows_scan::scan_row(row, v, 1.0f, nullptr, fp + r);
        ip[r] = std::max<int64_t>(0, swiftlm_rows_scan::find_value(row, v, mx));
        continue;
      }
      scratch.resize(v);
      float* y = scratch.data();
      const float mx = swiftlm_rows_scan::scan_row(row, v, t, y, fp + r);
      const float top = std::isfinite(mx) ? mx : 0.0f;  // a row of -inf: no NaN below
      const double total = masses(y, v, top, mx + lp[r], blocks.data());
      ip[r] = pick_column(y, v, blocks.data(), total, up[r]);
    }
  });
  return {ids, finite};
}

}  // namespace

TORCH_LIBRARY(swiftlm_draw, lib) {
  swiftlm_cpu::def_cpu(lib, "draw_tokens(Tensor logits, Tensor temperature, Tensor log_min_p, Tensor uniform) -> (Tensor, Tensor)",
                       &draw_tokens);
}
