// bf16 linear layer for up to max_rows() rows on CPUs with AMX (op torch.ops.swiftlm_amx.linear);
// the kernel, its design and its measurements are in amx_linear.h.
//
//   linear(x [M, K] bf16, weight [N, K] bf16) -> [M, N] bf16,   1 <= M <= max_rows(), K % 32 == 0
//   max_rows() -> int: the most rows one call takes (kMaxRows in amx_linear.h), which callers read
//       instead of writing the number again
//
// Products of bf16 values are exact in float32 and the tile unit sums them in float32, in another
// order than a dense matmul, so results agree with F.linear to float32 rounding before the final
// rounding to bf16.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <cstdint>

#include "amx_linear.h"
#include "common.h"

namespace {

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kBFloat16,
              "swiftlm_amx.linear takes bfloat16 activations and weights");
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1),
              "swiftlm_amx.linear: x [M, K] and weight [N, K] expected");
  TORCH_CHECK(x.is_contiguous() && weight.is_contiguous(), "swiftlm_amx.linear needs contiguous tensors");
  const int64_t m = x.size(0), k = x.size(1), n = weight.size(0);
  TORCH_CHECK(k % swiftlm_amx::kDepth == 0, "swiftlm_amx.linear: K must be a multiple of 32, got ", k);
  TORCH_CHECK(m <= swiftlm_amx::kMaxRows, "swiftlm_amx.linear takes at most ", swiftlm_amx::kMaxRows, " rows, got ", m);
  TORCH_CHECK(swiftlm_amx::enable_amx(), "swiftlm_amx.linear: the OS did not grant this process AMX tile data");
  at::Tensor out = at::empty({m, n}, x.options());
  swiftlm_amx::linear_into(swiftlm_cpu::bf16_in(x), m, k, swiftlm_cpu::bf16_in(weight), n, swiftlm_cpu::bf16_out(out));
  return out;
}

int64_t max_rows() { return swiftlm_amx::kMaxRows; }

}  // namespace

TORCH_LIBRARY(swiftlm_amx, lib) {
  swiftlm_cpu::def_cpu(lib, "linear(Tensor x, Tensor weight) -> Tensor", &linear);
  lib.def("max_rows() -> int", &max_rows);  // no tensor to dispatch on: one kernel for every backend
}
