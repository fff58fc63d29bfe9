// The bf16 GEMM of bf16_gemm.h as torch ops (torch.ops.swiftlm_gemm): gemm(x, weight, arith) and the
// arithmetics this build holds. The design and the layouts are in bf16_gemm.h; the choice between the
// arithmetics is made by timing both at load (gemm_cpu.py).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cstdint>
#include <vector>

#include "bf16_gemm.h"
#include "common.h"

namespace {

at::Tensor gemm(const at::Tensor& x, const at::Tensor& weight, int64_t arith) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kBFloat16,
              "swiftlm_gemm.gemm takes bfloat16 activations and weights");
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1),
              "swiftlm_gemm.gemm: x [M, K] and weight [N, K] expected");
  TORCH_CHECK(x.is_contiguous() && weight.is_contiguous(), "swiftlm_gemm.gemm needs contiguous tensors");
  const int64_t m = x.size(0), k = x.size(1), n = weight.size(0);
  TORCH_CHECK(k % 32 == 0, "swiftlm_gemm.gemm: K must be a multiple of 32, got ", k);
  TORCH_CHECK(arith == swiftlm_gemm::FMA32 || (arith == swiftlm_gemm::DPBF16 && swiftlm_gemm::has_dpbf16()),
              "swiftlm_gemm.gemm: arithmetic ", arith, " is not in this build");
  at::Tensor out = at::empty({m, n}, x.options());
  swiftlm_gemm::gemm_into(swiftlm_cpu::bf16_in(x), m, k, swiftlm_cpu::bf16_in(weight), n,
                          swiftlm_cpu::bf16_out(out), static_cast<swiftlm_gemm::Arith>(arith));
  return out;
}

// the arithmetics gemm() takes in this build: FMA32 always, DPBF16 where the CPU has AVX512-BF16
std::vector<int64_t> arithmetics() {
  std::vector<int64_t> out{swiftlm_gemm::FMA32};
  if (swiftlm_gemm::has_dpbf16()) out.insert(out.begin(), swiftlm_gemm::DPBF16);
  return out;
}

// calls of up to this many rows run on vdpbf16ps with vectors over k, whichever arithmetic is asked
// (bf16_gemm.h: micro_klanes); 0 in a build without AVX512-BF16
int64_t small_call_rows() { return swiftlm_gemm::has_dpbf16() ? swiftlm_gemm::KLANES_UP_TO : 0; }

}  // namespace

#ifndef SWIFTLM_GEMM_NS
#define SWIFTLM_GEMM_NS swiftlm_gemm
#endif
#define SWIFTLM_DEFINE_LIBRARY(ns, lib) TORCH_LIBRARY(ns, lib)
SWIFTLM_DEFINE_LIBRARY(SWIFTLM_GEMM_NS, lib) {
  swiftlm_cpu::def_cpu(lib, "gemm(Tensor x, Tensor weight, int arith) -> Tensor", &gemm);
  lib.def("arithmetics() -> int[]", &arithmetics);
  lib.def("small_call_rows() -> int", &small_call_rows);
}
