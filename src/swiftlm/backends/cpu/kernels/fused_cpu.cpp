// The Qwen3 layer's small elementwise steps as single ops (torch.ops.swiftlm_fused), so that a decode
// step runs ~4 ops per layer between its matmuls instead of ~40. Each op repeats the rounding
// steps of the plain torch code in swiftlm/model/layers.py, value by value: float32 math, and a
// rounding to the activation dtype wherever torch would produce a tensor of that dtype. Only the
// order of the float32 sum in the norm statistics differs. Built with -ffp-contract=off so that no
// multiply-add is fused where torch rounds between the two.
//
//   rms_norm(x [T, D], w [D], eps) -> [T, D]:  y = w * dtype(x * rsqrt(mean(x^2) + eps))
//   add_rms_norm_(residual [T, D], delta [T, D], w, eps) -> [T, D]:
//       residual = dtype(residual + delta) (in place), then rms_norm(residual)
//   qk_norm_rope(qkv [T, (Hq + 2 Hk) * Dh], q_w [Dh], k_w [Dh], cos [P, Dh], sin [P, Dh] (float32
//       tables), positions [T] int64, Hq, Hk, eps) -> (q [T, Hq, Dh], k [T, Hk, Dh]):
//       per head: n = rms_norm(head, w); out = dtype(n * c) + dtype(rotate_half(n) * s) rounded,
//       with c = dtype(cos[pos]) and s = dtype(sin[pos]) (half-split rotary); empty q_w and k_w: no norm
//       (n = head), for models without q/k norm
//   silu_mul(gate_up [T, 2 I]) -> [T, I]:  dtype(dtype(silu(gate)) * up)
// Tensors are float32 or bfloat16 (all of one dtype), rows contiguous in their last dimension.
//
// And the greedy pick of a decode step, for rows that take the argmax of the model's logits:
//   greedy_pick(logits [B, V] float32) -> (ids [B] int64, finite [B] bool): each row's largest logit's
//       id, the lowest of tied ones (as torch.max(dim=-1)), and whether every logit of the row is
//       finite (when not, the id means nothing). torch's max over a 151936-token row took ~0.26 ms on a
//       Zen4 VM, and the finiteness check (a sum, isfinite) ~0.15 ms more, a step.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include "common.h"
#include "fused_rows.h"
#include "row_scan.h"  // scan_row, find_value

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>
#include <vector>

namespace {

using at::BFloat16;
using namespace swiftlm_rows;

inline int64_t grain_for(int64_t row_elements) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, row_elements)); }

void check_rows(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "swiftlm_fused: ", name, " must be float32 or bfloat16");
  TORCH_CHECK(x.stride(-1) == 1, "swiftlm_fused: ", name, " needs unit stride in its last dimension");
}

at::Tensor rms_norm(const at::Tensor& x_in, const at::Tensor& w, double eps) {
  check_rows(x_in, "x");
  const at::Tensor x = x_in.contiguous();
  const int64_t d = x.size(-1), rows = x.numel() / std::max<int64_t>(1, d);
  TORCH_CHECK(w.numel() == d && w.scalar_type() == x.scalar_type() && w.is_contiguous(),
              "swiftlm_fused.rms_norm: weight must be [", d, "] of x's dtype");
  at::Tensor out = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "rms_norm", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* wp = w.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows, grain_for(d), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) norm_row(xp + r * d, wp, d, static_cast<float>(eps), op + r * d);
    });
  });
  return out;
}

at::Tensor add_rms_norm_(at::Tensor& residual, const at::Tensor& delta_in, const at::Tensor& w, double eps) {
  check_rows(residual, "residual");
  TORCH_CHECK(residual.is_contiguous(), "swiftlm_fused.add_rms_norm_: residual must be contiguous");
  const at::Tensor delta = delta_in.contiguous();
  TORCH_CHECK(delta.sizes() == residual.sizes() && delta.scalar_type() == residual.scalar_type(),
              "swiftlm_fused.add_rms_norm_: delta must match residual");
  const int64_t d = residual.size(-1), rows = residual.numel() / std::max<int64_t>(1, d);
  TORCH_CHECK(w.numel() == d && w.scalar_type() == residual.scalar_type() && w.is_contiguous(),
              "swiftlm_fused.add_rms_norm_: weight must be [", d, "] of the residual's dtype");
  at::Tensor out = at::empty_like(residual);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, residual.scalar_type(), "add_rms_norm_", [&] {
    scalar_t* rp = residual.data_ptr<scalar_t>();
    const scalar_t* dp = delta.data_ptr<scalar_t>();
    const scalar_t* wp = w.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows, grain_for(d), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        add_norm_row(rp + r * d, dp + r * d, wp, d, static_cast<float>(eps), op + r * d);
      }
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> qk_norm_rope(const at::Tensor& qkv, const at::Tensor& q_w, const at::Tensor& k_w,
                                                const at::Tensor& cos, const at::Tensor& sin,
                                                const at::Tensor& positions, int64_t hq, int64_t hk, double eps) {
  check_rows(qkv, "qkv");
  TORCH_CHECK(qkv.dim() == 2, "swiftlm_fused.qk_norm_rope: qkv must be [T, (Hq + 2 Hk) * Dh]");
  TORCH_CHECK(cos.dim() == 2, "swiftlm_fused.qk_norm_rope: cos and sin must be float32 [P, Dh]");
  const int64_t t = qkv.size(0), dh = cos.size(1);
  const bool norm = q_w.numel() > 0;
  TORCH_CHECK(dh % 2 == 0 && qkv.size(1) == (hq + 2 * hk) * dh, "swiftlm_fused.qk_norm_rope: qkv width ",
              qkv.size(1), " is not (", hq, " + 2 * ", hk, ") * ", dh);
  TORCH_CHECK(!norm || (q_w.numel() == dh && k_w.numel() == dh && q_w.scalar_type() == qkv.scalar_type() &&
                        k_w.scalar_type() == qkv.scalar_type() && q_w.is_contiguous() && k_w.is_contiguous()),
              "swiftlm_fused.qk_norm_rope: norm weights must be [Dh] of qkv's dtype (or both empty: no norm)");
  TORCH_CHECK(norm || k_w.numel() == 0, "swiftlm_fused.qk_norm_rope: give both norm weights or neither");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.is_contiguous() &&
                  sin.is_contiguous() && cos.dim() == 2 && cos.size(1) == dh && sin.sizes() == cos.sizes(),
              "swiftlm_fused.qk_norm_rope: cos and sin must be float32 [P, Dh]");
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.numel() == t && positions.is_contiguous(),
              "swiftlm_fused.qk_norm_rope: positions must be int64 [T]");
  const int64_t max_pos = cos.size(0);
  const int64_t* pos = positions.data_ptr<int64_t>();
  for (int64_t i = 0; i < t; ++i)
    TORCH_CHECK(pos[i] >= 0 && pos[i] < max_pos, "swiftlm_fused.qk_norm_rope: position ", pos[i], " outside [0, ", max_pos, ")");
  at::Tensor q = at::empty({t, hq, dh}, qkv.options());
  at::Tensor k = at::empty({t, hk, dh}, qkv.options());
  const int64_t ld = qkv.stride(0);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, qkv.scalar_type(), "qk_norm_rope", [&] {
    const scalar_t* src = qkv.data_ptr<scalar_t>();
    scalar_t* qp = q.data_ptr<scalar_t>();
    scalar_t* kp = k.data_ptr<scalar_t>();
    const float* cp = cos.data_ptr<float>();
    const float* sp = sin.data_ptr<float>();
    at::parallel_for(0, t, grain_for((hq + hk) * dh), [&](int64_t t0, int64_t t1) {
      std::vector<scalar_t> n(dh);
      for (int64_t i = t0; i < t1; ++i)
        qk_norm_rope_row(src + i * ld, norm ? q_w.data_ptr<scalar_t>() : nullptr,
                         norm ? k_w.data_ptr<scalar_t>() : nullptr, cp + pos[i] * dh,
                         sp + pos[i] * dh, hq, hk, dh, static_cast<float>(eps), qp + i * hq * dh, kp + i * hk * dh,
                         n.data());
    });
  });
  return {q, k};
}

at::Tensor silu_mul(const at::Tensor& gate_up_in) {
  check_rows(gate_up_in, "gate_up");
  const at::Tensor gu = gate_up_in.contiguous();
  const int64_t w2 = gu.size(-1), rows = gu.numel() / std::max<int64_t>(1, w2), inter = w2 / 2;
  TORCH_CHECK(w2 % 2 == 0, "swiftlm_fused.silu_mul: the last dimension must be even");
  std::vector<int64_t> shape(gu.sizes().begin(), gu.sizes().end());
  shape.back() = inter;
  at::Tensor out = at::empty(shape, gu.options());
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, gu.scalar_type(), "silu_mul", [&] {
    const scalar_t* gp = gu.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows, grain_for(w2), [&](int64_t r0, int64_t r1) {
      std::vector<float> g(inter), silu(inter);
      for (int64_t r = r0; r < r1; ++r) silu_mul_row(gp + r * w2, inter, op + r * inter, g.data(), silu.data());
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> greedy_pick(const at::Tensor& logits_in) {
  TORCH_CHECK(logits_in.dim() == 2 && logits_in.scalar_type() == at::kFloat && logits_in.size(1) > 0,
              "swiftlm_fused.greedy_pick: logits must be float32 [B, V], V > 0, got ", logits_in.scalar_type(), " ",
              logits_in.sizes());
  const at::Tensor x = logits_in.contiguous();
  const int64_t rows = x.size(0), v = x.size(1);
  at::Tensor ids = at::empty({rows}, x.options().dtype(at::kLong));
  at::Tensor finite = at::empty({rows}, x.options().dtype(at::kBool));
  const float* xp = x.data_ptr<float>();
  int64_t* ip = ids.data_ptr<int64_t>();
  bool* fp = finite.data_ptr<bool>();
  at::parallel_for(0, rows, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = xp + r * v;
      const float mx = swiftlm_rows_scan::scan_row(row, v, 1.0f, nullptr, fp + r);
      const int64_t id = swiftlm_rows_scan::find_value(row, v, mx);  // the first holding the maximum
      ip[r] = id < 0 ? 0 : id;  // none when every value is NaN
    }
  });
  return {ids, finite};
}

}  // namespace

TORCH_LIBRARY(swiftlm_fused, lib) {
  using swiftlm_cpu::def_cpu;
  def_cpu(lib, "rms_norm(Tensor x, Tensor weight, float eps) -> Tensor", &rms_norm);
  def_cpu(lib, "add_rms_norm_(Tensor(a!) residual, Tensor delta, Tensor weight, float eps) -> Tensor", &add_rms_norm_);
  def_cpu(lib, "qk_norm_rope(Tensor qkv, Tensor q_weight, Tensor k_weight, Tensor cos, Tensor sin, Tensor positions, "
               "int n_heads, int n_kv_heads, float eps) -> (Tensor, Tensor)", &qk_norm_rope);
  def_cpu(lib, "silu_mul(Tensor gate_up) -> Tensor", &silu_mul);
  def_cpu(lib, "greedy_pick(Tensor logits) -> (Tensor, Tensor)", &greedy_pick);
}
