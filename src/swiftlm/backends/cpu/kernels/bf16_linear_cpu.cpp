// bf16 x bf16 -> bf16 linear layer for a few rows (decode), on x86 CPUs with AVX512-BF16, or with
// AVX2 + FMA (op torch.ops.swiftlm_bf16.gemv; there also a float32 GEMM for calls of 40 rows or more,
// prefill chunks among them). The kernel itself is in bf16_gemv.h, which has both.
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
// group's RN * K weights stay in L1/L2, so the weights come from memory once for all rows. On
// AVX512-BF16 CPUs without AMX, calls of 1 or 2 rows read every weight row whole instead, one after
// the other, with no software prefetch (bf16_gemv.h: WHOLE_ROWS_UP_TO; batch-1 decode 1.29x on a
// Zen4 VM), the sums in the same order.
//
// Meant for decode (a few rows). Measured on a 2-core AVX512-BF16/AMX Xeon VM, the 112 layer
// linears of the Qwen3-0.6B shape with the weights on huge pages (model/weight_arena.py): 1 row
// 32-34 ms called back to back from C++ (a plain read of the same bytes in C takes 31-32 ms), 37 ms
// called one op at a time from Python (each call starts cold), vs 71 ms for F.linear; the
// two meet at ~8 rows, above which oneDNN (AMX) wins and callers switch to the dense matmul
// (see model/cpu_linear.py). Prefetching in memory order instead of per row stream: 13% faster;
// groups of 2 rows instead of 4: 5-7% faster (both builds loaded in one process, interleaved);
// prefetching 8 KiB ahead instead of 4: slower. On a Zen4 VM the prefetches go 32 KiB ahead into
// L2 instead (bf16_gemv.h): decode 1.14x.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <cstdint>

#include "bf16_gemv.h"
#include "common.h"

namespace {

at::Tensor gemv(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kBFloat16,
              "swiftlm_bf16.gemv takes bfloat16 activations and weights");
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1),
              "swiftlm_bf16.gemv: x [M, K] and weight [N, K] expected");
  TORCH_CHECK(x.is_contiguous() && weight.is_contiguous(), "swiftlm_bf16.gemv needs contiguous tensors");
  const int64_t m = x.size(0), k = x.size(1), n = weight.size(0);
  TORCH_CHECK(k % swiftlm_gemv::KB == 0, "swiftlm_bf16.gemv: K must be a multiple of 32, got ", k);
  at::Tensor out = at::empty({m, n}, x.options());
  swiftlm_gemv::gemv_into(swiftlm_cpu::bf16_in(x), m, k, swiftlm_cpu::bf16_in(weight), n, swiftlm_cpu::bf16_out(out));
  return out;
}

}  // namespace

// The op library's namespace: swiftlm_bf16, or another name for a second build of this source in one
// process (the tests build the AVX2 variant on AVX-512 CPUs under its own name). TORCH_LIBRARY pastes
// its first argument: the macro is expanded one level up.
#ifndef SWIFTLM_BF16_NS
#define SWIFTLM_BF16_NS swiftlm_bf16
#endif
#define SWIFTLM_DEFINE_LIBRARY(ns, lib) TORCH_LIBRARY(ns, lib)
SWIFTLM_DEFINE_LIBRARY(SWIFTLM_BF16_NS, lib) {
  swiftlm_cpu::def_cpu(lib, "gemv(Tensor x, Tensor weight) -> Tensor", &gemv);
}
