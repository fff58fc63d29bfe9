// Every decoder layer of a bf16 decode step in one call (op torch.ops.swiftlm_decode.decode_layers).
//
// The same sequence of ops as model/fused_forward.py runs from Python, in the same order and on the
// same kernels, so the results are bit for bit the same:
//
//   for each layer:  qkv = gemv(h, W_qkv);  q, k = qk_norm_rope(qkv)
//                    k, v -> the layer's KV pools at slot_mapping
//                    a = paged_decode_attention(q, pools, block_tables, seq_lens)
//                    h = add_rms_norm_(residual, gemv(a, W_o))
//                    h = add_rms_norm_(residual, gemv(silu_mul(gemv(h, W_gate_up)), W_down))
//
// Why: a decode step streams ~1.2 GB of weights through the caches, which evicts everything else
// on the way, including the Python interpreter's own working set. Every Python-level op between
// two weight reads then starts cold: measured on a 2-core Xeon VM, a residual add + RMSNorm takes
// 3-4 us on its own and 30-40 us right after a GEMV (the same after any large read, and with one
// thread), ~7 ms per token over the ~200 such ops of the 28 layers. From C++ the ops between the
// GEMVs touch only their own small data and a few dispatcher entries.
//
// The kernels are the other libraries' ops (swiftlm_bf16, swiftlm_fused, swiftlm_attention),
// called through the dispatcher; they must be loaded first (kernels/decode_cpu.py does that).
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/ArrayRef.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>
#include <tuple>

namespace {

using at::Tensor;

struct Ops {
  c10::TypedOperatorHandle<Tensor(const Tensor&, const Tensor&)> gemv;
  c10::TypedOperatorHandle<std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                                      const Tensor&, const Tensor&, int64_t, int64_t, double)>
      qk_norm_rope;
  c10::TypedOperatorHandle<Tensor(Tensor&, const Tensor&, const Tensor&, double)> add_rms_norm_;
  c10::TypedOperatorHandle<Tensor(const Tensor&)> silu_mul;
  c10::TypedOperatorHandle<Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, double)>
      attention;
};

const Ops& ops() {  // looked up at the first call, when the other libraries are loaded
  static const Ops o = [] {
    auto& d = c10::Dispatcher::singleton();
    return Ops{
        d.findSchemaOrThrow("swiftlm_bf16::gemv", "").typed<Tensor(const Tensor&, const Tensor&)>(),
        d.findSchemaOrThrow("swiftlm_fused::qk_norm_rope", "")
            .typed<std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                              const Tensor&, const Tensor&, int64_t, int64_t, double)>(),
        d.findSchemaOrThrow("swiftlm_fused::add_rms_norm_", "").typed<Tensor(Tensor&, const Tensor&, const Tensor&, double)>(),
        d.findSchemaOrThrow("swiftlm_fused::silu_mul", "").typed<Tensor(const Tensor&)>(),
        d.findSchemaOrThrow("swiftlm_attention::paged_decode_attention", "")
            .typed<Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, double)>(),
    };
  }();
  return o;
}

constexpr int64_t kPerLayer = 8;  // weights: qkv, q_norm, k_norm, o, post_norm, gate_up, down, next_norm
constexpr int64_t kEpsPerLayer = 3;  // eps: q/k norm, post-attention norm, next norm

// rows[i] (width bytes each, row stride ld bytes) -> pool row slot[i] (pool: [num_slots, width])
void write_rows(const char* rows, int64_t ld, int64_t t, const int64_t* slot, const Tensor& pool, int64_t width) {
  char* base = static_cast<char*>(pool.data_ptr());
  for (int64_t i = 0; i < t; ++i) std::memcpy(base + slot[i] * width, rows + i * ld, width);
}

Tensor decode_layers(Tensor& residual, const Tensor& h_in, const Tensor& positions, const Tensor& slot_mapping,
                     const Tensor& block_tables, const Tensor& seq_lens, at::TensorList weights,
                     at::TensorList k_pools, at::TensorList v_pools, const Tensor& cos, const Tensor& sin,
                     int64_t n_heads, int64_t n_kv_heads, c10::ArrayRef<double> eps, double scale) {
  const int64_t layers = static_cast<int64_t>(k_pools.size());
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == kPerLayer * layers &&
                  static_cast<int64_t>(v_pools.size()) == layers &&
                  static_cast<int64_t>(eps.size()) == kEpsPerLayer * layers,
              "swiftlm_decode.decode_layers: ", kPerLayer, " weights, 2 pools and ", kEpsPerLayer,
              " eps per layer expected");
  TORCH_CHECK(h_in.dim() == 2 && residual.sizes() == h_in.sizes() && residual.is_contiguous(),
              "swiftlm_decode.decode_layers: h and residual must be [T, hidden], residual contiguous");
  const int64_t t = h_in.size(0);
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous() && slot_mapping.numel() == t,
              "swiftlm_decode.decode_layers: slot_mapping must be int64 [T]");
  const int64_t* slot = slot_mapping.data_ptr<int64_t>();
  const auto& o = ops();
  Tensor h = h_in;
  for (int64_t l = 0; l < layers; ++l) {
    const Tensor* w = weights.data() + kPerLayer * l;
    const double* e = eps.data() + kEpsPerLayer * l;
    const Tensor& k_pool = k_pools[l];
    const Tensor& v_pool = v_pools[l];
    const int64_t d = w[1].numel();                      // head_dim
    const int64_t kv_width = n_kv_heads * d;             // values per token in one pool
    TORCH_CHECK(k_pool.is_contiguous() && v_pool.is_contiguous() && k_pool.dim() == 4 &&
                    k_pool.size(2) * k_pool.size(3) == kv_width && v_pool.sizes() == k_pool.sizes() &&
                    k_pool.scalar_type() == h.scalar_type() && v_pool.scalar_type() == h.scalar_type(),
                "swiftlm_decode.decode_layers: pools must be contiguous [N, bs, Hkv, D] of the activations' dtype");
    const int64_t num_slots = k_pool.size(0) * k_pool.size(1);
    for (int64_t i = 0; i < t; ++i)
      TORCH_CHECK(slot[i] >= 0 && slot[i] < num_slots, "swiftlm_decode.decode_layers: slot ", slot[i],
                  " outside the pool of ", num_slots);

    const Tensor qkv = o.gemv.call(h, w[0]);  // [T, (Hq + 2 Hk) * D]
    auto [q, k] = o.qk_norm_rope.call(qkv, w[1], w[2], cos, sin, positions, n_heads, n_kv_heads, e[0]);
    const int64_t esize = qkv.element_size();
    // k: [T, Hk, D] fresh and contiguous; v: the last Hk * D columns of each qkv row
    write_rows(static_cast<const char*>(k.data_ptr()), kv_width * esize, t, slot, k_pool, kv_width * esize);
    write_rows(static_cast<const char*>(qkv.data_ptr()) + (n_heads + n_kv_heads) * d * esize, qkv.stride(0) * esize,
               t, slot, v_pool, kv_width * esize);
    const Tensor a = o.attention.call(q, k_pool, v_pool, block_tables, seq_lens, scale);  // [T, Hq, D]
    h = o.add_rms_norm_.call(residual, o.gemv.call(a.reshape({t, n_heads * d}), w[3]), w[4], e[1]);
    const Tensor m = o.gemv.call(o.silu_mul.call(o.gemv.call(h, w[5])), w[6]);
    h = o.add_rms_norm_.call(residual, m, w[7], e[2]);
  }
  return h;
}

}  // namespace

TORCH_LIBRARY(swiftlm_decode, lib) {
  lib.def("decode_layers(Tensor(a!) residual, Tensor h, Tensor positions, Tensor slot_mapping, Tensor block_tables, "
          "Tensor seq_lens, Tensor[] weights, Tensor[] k_pools, Tensor[] v_pools, Tensor cos, Tensor sin, "
          "int n_heads, int n_kv_heads, float[] eps, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(swiftlm_decode, CPU, lib) { lib.impl("decode_layers", &decode_layers); }
