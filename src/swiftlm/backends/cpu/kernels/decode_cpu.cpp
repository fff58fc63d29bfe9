// Every decoder layer of a decode step in one call (op torch.ops.swiftlm_decode.decode_layers), for
// bf16 activations with bf16, int8 or int4 weights.
//
// The same sequence of steps as model/fused_forward.py runs from Python, in the same order and with
// the same code (bf16_gemv.h, amx_linear.h, fused_rows.h, the paged attention and quantised GEMV
// ops), so the results are bit for bit the same:
//
//   for each layer:  qkv = linear(h, W_qkv);  q, k = qk_norm_rope(qkv)
//                    k, v -> the layer's KV pools at slot_mapping (8-bit pools: quantised as
//                            kv_quant.h says, with their scales into the scale pools)
//                    a = paged_decode_attention(q, pools, block_tables, seq_lens)
//                    h = add_rms_norm_(residual, linear(a, W_o))
//                    h = add_rms_norm_(residual, linear(silu_mul(linear(h, W_gate_up)), W_down))
//
// linear: bf16 weights, the GEMV (bf16_gemv.h: AVX512-BF16 or AVX2) up to gemv_rows rows and the AMX kernel
// (amx_linear.h) above, up to amx_rows, as GemvLinear chooses; int8 / int4 weights, the quantised
// GEMV ops (quant_cpu.cpp), as QuantLinear does up to its kernel_max_rows. The caller states both
// limits; the op checks that a step fits them and that amx_rows fits the AMX kernel (kMaxRows).
//
// Why: a decode step streams ~1.2 GB of weights through the caches, which evicts everything else
// on the way, including the Python interpreter's own working set and torch's dispatcher and
// allocator state. Every op between two weight reads then starts cold: measured on a 2-core Xeon
// VM, a residual add + RMSNorm takes 3-4 us on its own and 30-40 us right after a GEMV from Python
// (the same after any large read, and with one thread), 18 us through the dispatcher from C++, and
// 6 us as the direct call below. Here the steps between the GEMVs are plain function calls into
// buffers allocated once per step; the attention is a direct call into its library too (its tables
// checked once a step), and only the quantised GEMVs go through the dispatcher.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "bf16_gemv.h"
#include "common.h"
#include "fused_rows.h"
#include "kv_quant.h"
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include "amx_linear.h"
#define SWIFTLM_HAS_AMX 1
#endif

namespace {

using at::Tensor;

using bf16 = c10::BFloat16;

// The op `name` of another of these libraries. Each op below is looked up once, at its first use:
// by then the loader (decode_cpu.py) has loaded that library.
template <typename Sig>
c10::TypedOperatorHandle<Sig> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

using Int8GemvSig = Tensor(const Tensor&, const Tensor&, const Tensor&, int64_t);
using Int4GemvSig = Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t);

// The paged attention library's decode_attention_into (paged_attention_cpu.cpp), called directly: the
// op through the dispatcher checked each layer's tables again and allocated its output, code and data
// cold after every layer's weights. Its address comes once from an op of that library.
using AttentionIntoFn = void(const Tensor&, const Tensor&, const Tensor&, const int64_t*, int64_t, const int64_t*,
                             double, const float*, const float*, void*);
AttentionIntoFn* attention_into() {
  static AttentionIntoFn* const fn = reinterpret_cast<AttentionIntoFn*>(
      find_op<int64_t(const Tensor&)>("swiftlm_attention::decode_attention_into_address").call(at::empty({0})));
  return fn;
}

const c10::TypedOperatorHandle<Int8GemvSig>& int8_gemv_op() {
  static const auto op = find_op<Int8GemvSig>("swiftlm_quant::int8_gemv");
  return op;
}

const c10::TypedOperatorHandle<Int4GemvSig>& int4_gemv_op() {
  static const auto op = find_op<Int4GemvSig>("swiftlm_quant::int4_gemv");
  return op;
}

enum Kind : int64_t { kBf16 = 0, kInt8 = 1, kInt4 = 2 };

// y [t, n] = x [t, k] . W^T, the kernel GemvLinear / QuantLinear (model/) picks for t rows:
//   bf16: the GEMV up to gemv_rows rows, else AMX (decode_layers checked t <= amx_rows),
//         written into `out`;
//   int8 / int4: the quantised GEMV op (quant_cpu.cpp) on q = (qweight, scales[, mins]), a new tensor.
struct Linear {
  int64_t kind, gemv_rows;
  Tensor operator()(const Tensor& x, int64_t t, const Tensor& w, const Tensor* q, int64_t n, const Tensor& out) const {
    if (kind == kInt8) return int8_gemv_op().call(x, q[0], q[1], n);
    if (kind == kInt4) return int4_gemv_op().call(x, q[0], q[1], q[2], n);
    const uint16_t* xp = swiftlm_cpu::bf16_in(x);
    const uint16_t* wp = swiftlm_cpu::bf16_in(w);
    uint16_t* yp = swiftlm_cpu::bf16_out(out);
    if (t <= gemv_rows) {
      swiftlm_gemv::gemv_into(xp, t, w.size(1), wp, w.size(0), yp);
    } else {
#ifdef SWIFTLM_HAS_AMX
      swiftlm_amx::linear_into(xp, t, w.size(1), wp, w.size(0), yp);
#endif
    }
    return out;
  }
};

// A bf16 row of d values into an 8-bit pool row and its scale (kv_quant.h).
void store_kv_row(int64_t format, const bf16* x, int64_t d, uint8_t* dst, float* scale) {
  const auto to_float = [](bf16 v) { return static_cast<float>(v); };
  if (format == swiftlm_kvq::kInt8) swiftlm_kvq::quantise_row<swiftlm_kvq::I8>(x, d, to_float, dst, scale);
  else if (format == swiftlm_kvq::kE4M3) swiftlm_kvq::quantise_row<swiftlm_kvq::E4M3>(x, d, to_float, dst, scale);
  else swiftlm_kvq::quantise_row<swiftlm_kvq::E5M2>(x, d, to_float, dst, scale);
}

constexpr int64_t kPerLayer = 8;  // weights: qkv, q_norm, k_norm, o, post_norm, gate_up, down, next_norm
constexpr int64_t kQuantPerLayer = 12;  // quantised: (qweight, scales, mins or empty) of qkv, o, gate_up, down
constexpr int64_t kEpsPerLayer = 3;  // eps: q/k norm, post-attention norm, next norm

Tensor decode_layers(Tensor& residual, const Tensor& h_in, const Tensor& positions, const Tensor& slot_mapping,
                     const Tensor& block_tables, const Tensor& seq_lens, at::TensorList weights,
                     at::TensorList k_pools, at::TensorList v_pools, const Tensor& cos, const Tensor& sin,
                     int64_t n_heads, int64_t n_kv_heads, c10::ArrayRef<double> eps, double scale,
                     int64_t gemv_rows, int64_t amx_rows, int64_t kind, at::TensorList quant,
                     int64_t intermediate, at::TensorList k_scales, at::TensorList v_scales) {
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
  TORCH_CHECK(kind == kBf16 || kind == kInt8 || kind == kInt4, "swiftlm_decode.decode_layers: unknown kind ", kind);
  TORCH_CHECK(kind == kBf16 || static_cast<int64_t>(quant.size()) == kQuantPerLayer * layers,
              "swiftlm_decode.decode_layers: ", kQuantPerLayer, " quantised tensors per layer expected");
  if (kind == kBf16 && t > gemv_rows) {  // rows gemv_rows + 1 .. amx_rows go through AMX
#ifdef SWIFTLM_HAS_AMX
    TORCH_CHECK(t <= amx_rows, "swiftlm_decode.decode_layers: ", t, " rows, more than the caller's limits: gemv_rows ",
                gemv_rows, " through the GEMV, amx_rows ", amx_rows, " through AMX");
    TORCH_CHECK(amx_rows <= swiftlm_amx::kMaxRows, "swiftlm_decode.decode_layers: amx_rows ", amx_rows,
                " exceeds the AMX kernel's ", swiftlm_amx::kMaxRows, " rows (swiftlm_amx.max_rows())");
    TORCH_CHECK(swiftlm_amx::enable_amx(), "swiftlm_decode.decode_layers: more than gemv_rows ", gemv_rows,
                " rows need AMX, and the OS did not grant this process AMX tile data");
#else
    TORCH_CHECK(false, "swiftlm_decode.decode_layers: built without AMX: at most gemv_rows ", gemv_rows, " rows, got ", t);
#endif
  }
  TORCH_CHECK(h_in.scalar_type() == at::kBFloat16 && residual.scalar_type() == at::kBFloat16 && h_in.is_contiguous(),
              "swiftlm_decode.decode_layers: bf16 activations expected");
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.is_contiguous() && positions.numel() == t,
              "swiftlm_decode.decode_layers: positions must be int64 [T]");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.is_contiguous() &&
                  sin.is_contiguous() && cos.dim() == 2 && sin.sizes() == cos.sizes(),
              "swiftlm_decode.decode_layers: cos and sin must be float32 [P, Dh]");
  const int64_t* pos = positions.data_ptr<int64_t>();
  for (int64_t i = 0; i < t; ++i)
    TORCH_CHECK(pos[i] >= 0 && pos[i] < cos.size(0), "swiftlm_decode.decode_layers: position ", pos[i], " outside [0, ",
                cos.size(0), ")");
  const int64_t hidden = h_in.size(1);
  // 8-bit pools: a scale pool per pool, the format from the pools' dtype
  TORCH_CHECK(k_scales.size() == v_scales.size() && (k_scales.empty() || static_cast<int64_t>(k_scales.size()) == layers),
              "swiftlm_decode.decode_layers: k_scales and v_scales: none, or one per layer each");
  const at::ScalarType pool_dtype = k_pools[0].scalar_type();
  int64_t kv_format = swiftlm_kvq::kNone;
  if (!k_scales.empty()) {
    kv_format = pool_dtype == at::kChar ? swiftlm_kvq::kInt8 : pool_dtype == at::kFloat8_e4m3fn ? swiftlm_kvq::kE4M3
              : pool_dtype == at::kFloat8_e5m2 ? swiftlm_kvq::kE5M2 : swiftlm_kvq::kNone;
    TORCH_CHECK(kv_format != swiftlm_kvq::kNone, "swiftlm_decode.decode_layers: scale pools go with int8 or float8 pools");
  }
  // shapes, checked once for every layer
  // head_dim from the rope tables: the q/k norm weights are empty for models without q/k norm
  const bool qk_norm = weights[1].numel() > 0;
  const int64_t d = cos.size(1), qkv_n = (n_heads + 2 * n_kv_heads) * d, kv_width = n_kv_heads * d;
  const int64_t inter = intermediate, gate_up_n = 2 * intermediate;
  TORCH_CHECK(cos.size(1) == d && d % 2 == 0, "swiftlm_decode.decode_layers: rope tables must be [P, head_dim]");
  for (int64_t l = 0; l < layers; ++l) {
    const Tensor* w = weights.data() + kPerLayer * l;
    const int64_t qk_w = qk_norm ? d : 0;
    const bool norms_ok = w[1].numel() == qk_w && w[2].numel() == qk_w && w[4].numel() == hidden &&
                          w[7].numel() == hidden;
    const bool linears_ok = kind != kBf16 ||
                            (w[0].dim() == 2 && w[0].size(0) == qkv_n && w[0].size(1) == hidden && w[3].dim() == 2 &&
                             w[3].size(0) == hidden && w[3].size(1) == n_heads * d && w[5].dim() == 2 &&
                             w[5].size(0) == gate_up_n && w[5].size(1) == hidden && w[6].dim() == 2 &&
                             w[6].size(0) == hidden && w[6].size(1) == inter);
    TORCH_CHECK(norms_ok && linears_ok, "swiftlm_decode.decode_layers: layer ", l, " has weights of unexpected shapes");
    for (int64_t i : {1, 2, 4, 7})  // the norms; and the linears' weights on the bf16 kernels
      TORCH_CHECK(w[i].numel() == 0 || (w[i].scalar_type() == at::kBFloat16 && w[i].is_contiguous()),
                  "swiftlm_decode.decode_layers: norm weights must be contiguous bf16");
    if (kind == kBf16)
      for (int64_t i : {0, 3, 5, 6})
        TORCH_CHECK(w[i].scalar_type() == at::kBFloat16 && w[i].is_contiguous(),
                    "swiftlm_decode.decode_layers: weights must be contiguous bf16");
    TORCH_CHECK(hidden % swiftlm_gemv::KB == 0 && (n_heads * d) % swiftlm_gemv::KB == 0 && inter % swiftlm_gemv::KB == 0,
                "swiftlm_decode.decode_layers: GEMV inputs must be multiples of 32 wide");
    const Tensor& k_pool = k_pools[l];
    const Tensor& v_pool = v_pools[l];
    TORCH_CHECK(k_pool.is_contiguous() && v_pool.is_contiguous() && k_pool.dim() == 4 &&
                    k_pool.size(2) * k_pool.size(3) == kv_width && v_pool.sizes() == k_pool.sizes() &&
                    k_pool.scalar_type() == (kv_format == swiftlm_kvq::kNone ? at::kBFloat16 : pool_dtype) &&
                    v_pool.scalar_type() == k_pool.scalar_type(),
                "swiftlm_decode.decode_layers: pools must be contiguous [N, bs, Hkv, D], bf16 or one 8-bit dtype "
                "with scale pools");
    if (kv_format != swiftlm_kvq::kNone)
      for (const Tensor* sc : {&k_scales[l], &v_scales[l]})
        TORCH_CHECK(sc->scalar_type() == at::kFloat && sc->is_contiguous() && sc->numel() == k_pool.numel() / d,
                    "swiftlm_decode.decode_layers: scale pools must be contiguous float32 [N, bs, Hkv]");
    TORCH_CHECK(k_pool.size(0) == k_pools[0].size(0) && k_pool.size(1) == k_pools[0].size(1),
                "swiftlm_decode.decode_layers: every layer's pools must have the same blocks");
    const int64_t num_slots = k_pool.size(0) * k_pool.size(1);
    for (int64_t i = 0; i < t; ++i)
      TORCH_CHECK(slot[i] >= 0 && slot[i] < num_slots, "swiftlm_decode.decode_layers: slot ", slot[i],
                  " outside the pool of ", num_slots);
  }
  // the attention's tables, checked once for every layer (the same blocks in each layer's pools)
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == t && seq_lens.dim() == 1 && seq_lens.size(0) == t,
              "swiftlm_decode.decode_layers: block_tables must be [T, max_blocks] and seq_lens [T]");
  const Tensor tables = block_tables.to(at::kLong).contiguous();
  const Tensor lens_t = seq_lens.to(at::kLong).contiguous();
  const int64_t* tab = tables.data_ptr<int64_t>();
  const int64_t* lens = lens_t.data_ptr<int64_t>();
  const int64_t max_blocks = tables.size(1), n_blocks = k_pools[0].size(0), bs = k_pools[0].size(1);
  swiftlm_cpu::check_block_tables(tab, max_blocks, lens, t, bs, n_blocks, "swiftlm_decode.decode_layers: ");

  // the step's buffers, reused by every layer
  const auto opts = h_in.options();
  Tensor qkv = at::empty({t, qkv_n}, opts), q = at::empty({t, n_heads, d}, opts), k = at::empty({t, n_kv_heads, d}, opts);
  Tensor o_out = at::empty({t, hidden}, opts), gate_up = at::empty({t, gate_up_n}, opts), act = at::empty({t, inter}, opts);
  Tensor h = at::empty({t, hidden}, opts), a = at::empty({t, n_heads, d}, opts);
  std::vector<bf16> norm_scratch(d);
  std::vector<float> silu_scratch(2 * inter);
  bf16* res = residual.data_ptr<bf16>();
  bf16* hp = h.data_ptr<bf16>();
  bf16* qp = q.data_ptr<bf16>();
  bf16* kp = k.data_ptr<bf16>();
  bf16* act_p = act.data_ptr<bf16>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  std::memcpy(hp, h_in.const_data_ptr(), t * hidden * sizeof(bf16));
  const int64_t row_bytes = kv_width * static_cast<int64_t>(sizeof(bf16));
  AttentionIntoFn* const attention = attention_into();
  const Linear linear{kind, gemv_rows};

  for (int64_t l = 0; l < layers; ++l) {
    const Tensor* w = weights.data() + kPerLayer * l;
    const Tensor* qz = kind == kBf16 ? nullptr : quant.data() + kQuantPerLayer * l;  // qkv, o, gate_up, down
    const double* e = eps.data() + kEpsPerLayer * l;
    const Tensor& k_pool = k_pools[l];
    const Tensor& v_pool = v_pools[l];
    // each linear's result held while it is read: the quantised kernels return fresh tensors
    const Tensor qkv_r = linear(h, t, w[0], qz, qkv_n, qkv);  // [T, (Hq + 2 Hk) * D]
    const bf16* qkv_p = qkv_r.const_data_ptr<bf16>();
    for (int64_t i = 0; i < t; ++i)
      swiftlm_rows::qk_norm_rope_row(qkv_p + i * qkv_n, qk_norm ? w[1].const_data_ptr<bf16>() : nullptr,
                                     qk_norm ? w[2].const_data_ptr<bf16>() : nullptr,
                                     cp + pos[i] * d, sp + pos[i] * d, n_heads, n_kv_heads, d,
                                     static_cast<float>(e[0]), qp + i * n_heads * d, kp + i * kv_width,
                                     norm_scratch.data());
    // k rows, and v: the last Hk * D columns of each qkv row, into the pools
    char* kbase = static_cast<char*>(k_pool.data_ptr());
    char* vbase = static_cast<char*>(v_pool.data_ptr());
    const float* ksp = nullptr;
    const float* vsp = nullptr;
    if (kv_format == swiftlm_kvq::kNone) {
      for (int64_t i = 0; i < t; ++i) {
        std::memcpy(kbase + slot[i] * row_bytes, kp + i * kv_width, row_bytes);
        std::memcpy(vbase + slot[i] * row_bytes, qkv_p + i * qkv_n + (n_heads + n_kv_heads) * d, row_bytes);
      }
    } else {
      float* ks = k_scales[l].data_ptr<float>();
      float* vs = v_scales[l].data_ptr<float>();
      for (int64_t i = 0; i < t; ++i)
        for (int64_t h = 0; h < n_kv_heads; ++h) {
          const int64_t row = slot[i] * n_kv_heads + h;  // (token, head) row of the pools
          store_kv_row(kv_format, kp + i * kv_width + h * d, d, reinterpret_cast<uint8_t*>(kbase) + row * d, ks + row);
          store_kv_row(kv_format, qkv_p + i * qkv_n + (n_heads + n_kv_heads + h) * d, d,
                       reinterpret_cast<uint8_t*>(vbase) + row * d, vs + row);
        }
      ksp = ks;
      vsp = vs;
    }
    attention(q, k_pool, v_pool, tab, max_blocks, lens, scale, ksp, vsp, a.data_ptr());  // a: [T, Hq, D]
    const Tensor o_r = linear(a.reshape({t, n_heads * d}), t, w[3], qz ? qz + 3 : nullptr, hidden, o_out);
    const bf16* o_p = o_r.const_data_ptr<bf16>();
    for (int64_t i = 0; i < t; ++i)
      swiftlm_rows::add_norm_row(res + i * hidden, o_p + i * hidden, w[4].const_data_ptr<bf16>(), hidden,
                                 static_cast<float>(e[1]), hp + i * hidden);
    const Tensor gu_r = linear(h, t, w[5], qz ? qz + 6 : nullptr, gate_up_n, gate_up);
    const bf16* gu_p = gu_r.const_data_ptr<bf16>();
    for (int64_t i = 0; i < t; ++i)
      swiftlm_rows::silu_mul_row(gu_p + i * gate_up_n, inter, act_p + i * inter, silu_scratch.data(),
                                 silu_scratch.data() + inter);
    const Tensor m_r = linear(act, t, w[6], qz ? qz + 9 : nullptr, hidden, o_out);
    const bf16* m_p = m_r.const_data_ptr<bf16>();
    for (int64_t i = 0; i < t; ++i)
      swiftlm_rows::add_norm_row(res + i * hidden, m_p + i * hidden, w[7].const_data_ptr<bf16>(), hidden,
                                 static_cast<float>(e[2]), hp + i * hidden);
  }
  return h;
}

}  // namespace

TORCH_LIBRARY(swiftlm_decode, lib) {
  swiftlm_cpu::def_cpu(lib,
                       "decode_layers(Tensor(a!) residual, Tensor h, Tensor positions, Tensor slot_mapping, "
                       "Tensor block_tables, Tensor seq_lens, Tensor[] weights, Tensor[] k_pools, Tensor[] v_pools, "
                       "Tensor cos, Tensor sin, int n_heads, int n_kv_heads, float[] eps, float scale, int gemv_rows, "
                       "int amx_rows, int kind, Tensor[] quant, int intermediate, Tensor[] k_scales, "
                       "Tensor[] v_scales) -> Tensor",
                       &decode_layers);
}
