#include "attention/decode_attention.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/attention_sink.h"
#include "framework/autograd/grad_mode.h"
#include "framework/tensor/device_ops.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/views.h"

namespace cpf {
namespace {

constexpr const char* kOp = "decode_attention";

// One slot per DeviceType (cpu, cuda); the cpu slot stays empty (the host loop below).
std::array<std::atomic<raw::DeviceDecodeAttention>, 2>& decode_registry() {
  static std::array<std::atomic<raw::DeviceDecodeAttention>, 2> registry{};
  return registry;
}

struct Dims {
  int64_t seqs = 0, heads = 0, kv_heads = 0, dim_qk = 0, dim_v = 0, capacity = 0;
};

Dims check_inputs(const Tensor& q, const Tensor& keys, const Tensor& values, const Tensor& lengths,
                  const AttentionSpec& spec) {
  CPF_CHECK(q.defined() && keys.defined() && values.defined() && lengths.defined(), kOp,
            ": q, keys, values and lengths must all be defined");
  CPF_CHECK(q.dim() == 3 && keys.dim() == 3 && values.dim() == 3, kOp,
            ": q (S, H, D_qk), keys (S * capacity, H_kv, D_qk) and values (S * capacity, H_kv, D_v) are 3-D; got q=",
            q.shape(), " keys=", keys.shape(), " values=", values.shape());
  const Dims d{q.size(0), q.size(1), keys.size(1), q.size(2), values.size(2), 0};
  CPF_CHECK(d.seqs >= 1 && keys.size(0) % d.seqs == 0 && keys.size(0) == values.size(0) && keys.size(2) == d.dim_qk &&
                values.size(1) == d.kv_heads && d.kv_heads >= 1 && d.heads % d.kv_heads == 0,
            kOp, ": shapes do not fit: q=", q.shape(), " keys=", keys.shape(), " values=", values.shape(),
            " (keys and values need S * capacity rows, D_qk as q, and H a multiple of H_kv)");
  CPF_CHECK(lengths.dim() == 1 && lengths.size(0) == d.seqs &&
                (lengths.dtype() == DType::i32 || lengths.dtype() == DType::i64),
            kOp, ": lengths must be (S) = (", d.seqs, ") i32 or i64, got ", lengths.shape(), " ",
            dtype_name(lengths.dtype()));
  CPF_CHECK(keys.dtype() == q.dtype() && values.dtype() == q.dtype() && is_floating(q.dtype()), kOp,
            ": q, keys and values must share one floating dtype, got ", dtype_name(q.dtype()), ", ",
            dtype_name(keys.dtype()), ", ", dtype_name(values.dtype()));
  CPF_CHECK(keys.device() == q.device() && values.device() == q.device() && lengths.device() == q.device(), kOp,
            ": every input must be on q's device ", q.device());
  CPF_CHECK(spec.qkv_format == QkvFormat::thd && is_causal(spec.mask), kOp,
            ": decoding needs the thd format with a causal mask, got ", spec.str());
  CPF_CHECK(
      (spec.num_heads == 0 || spec.num_heads == d.heads) && (spec.num_kv_heads == 0 || spec.num_kv_heads == d.kv_heads),
      kOp, ": the spec names ", spec.num_heads, " / ", spec.num_kv_heads, " heads, the tensors have ", d.heads, " / ",
      d.kv_heads);
  CPF_CHECK(!grad_enabled() || (!q.requires_grad() && !keys.requires_grad() && !values.requires_grad()), kOp,
            " is not differentiable: run it under NoGradGuard (decoding needs no gradients)");
  if (spec.sink.defined()) check_attention_sink(spec.sink, d.heads, q.dtype(), q.device(), kOp);
  Dims out = d;
  out.capacity = keys.size(0) / d.seqs;
  return out;
}

// The host loop: every (sequence, head) row in double, rounded once into out's dtype.
void decode_on_host(const Tensor& out, const Tensor& q, const Tensor& keys, const Tensor& values,
                    const std::vector<int64_t>& lengths, const Dims& d, const raw::DecodeAttentionParams& p) {
  const std::vector<double> qv = raw::to(q, DType::f64).to_vector<double>();
  const std::vector<double> kv = raw::to(raw::contiguous(keys), DType::f64).to_vector<double>();
  const std::vector<double> vv = raw::to(raw::contiguous(values), DType::f64).to_vector<double>();
  const std::vector<double> sink =
      p.sink.defined() ? raw::to(p.sink, DType::f64).to_vector<double>() : std::vector<double>();
  std::vector<double> result(static_cast<size_t>(d.seqs * d.heads * d.dim_v), 0.0);
  const int64_t group = d.heads / d.kv_heads;
  for (int64_t n = 0; n < d.seqs; ++n) {
    const int64_t len = lengths[static_cast<size_t>(n)];
    const int64_t first = p.window_left >= 0 ? std::max<int64_t>(0, len - 1 - p.window_left) : 0;
    for (int64_t h = 0; h < d.heads && len > 0; ++h) {
      const double* qh = qv.data() + (n * d.heads + h) * d.dim_qk;
      std::vector<double> score;
      double top = -std::numeric_limits<double>::infinity();
      for (int64_t j = first; j < len; ++j) {
        const double* kj = kv.data() + ((n * d.capacity + j) * d.kv_heads + h / group) * d.dim_qk;
        double s = 0;
        for (int64_t c = 0; c < d.dim_qk; ++c) s += qh[c] * kj[c];
        score.push_back(s * p.scale);
        top = std::max(top, score.back());
      }
      double denom = sink.empty() ? 0.0 : std::exp(sink[static_cast<size_t>(h)] - top);
      for (double& s : score) denom += (s = std::exp(s - top));
      double* o = result.data() + (n * d.heads + h) * d.dim_v;
      for (int64_t j = first; j < len; ++j) {
        const double* vj = vv.data() + ((n * d.capacity + j) * d.kv_heads + h / group) * d.dim_v;
        const double w = score[static_cast<size_t>(j - first)] / denom;
        for (int64_t c = 0; c < d.dim_v; ++c) o[c] += w * vj[c];
      }
    }
  }
  raw::copy_(out, from_vector(result, out.shape()));
}

}  // namespace

namespace {

// A view whose last dim is contiguous (what the device kernel indexes with row strides), else a copy.
Tensor last_dim_contiguous(const Tensor& t) { return t.stride(-1) == 1 ? t : raw::contiguous(t); }

void check_new_rows(const Tensor& k_new, const Tensor& v_new, const Dims& d, const Tensor& q) {
  CPF_CHECK(k_new.defined() && v_new.defined() && k_new.shape() == Shape({d.seqs, d.kv_heads, d.dim_qk}) &&
                v_new.shape() == Shape({d.seqs, d.kv_heads, d.dim_v}),
            kOp, "_append: k_new (S, H_kv, D_qk) = (", d.seqs, ", ", d.kv_heads, ", ", d.dim_qk,
            ") and v_new (S, H_kv, D_v) expected, got ", k_new.defined() ? k_new.shape() : Shape{}, " and ",
            v_new.defined() ? v_new.shape() : Shape{});
  CPF_CHECK(k_new.dtype() == q.dtype() && v_new.dtype() == q.dtype() && k_new.device() == q.device() &&
                v_new.device() == q.device(),
            kOp, "_append: k_new and v_new must have q's dtype ", dtype_name(q.dtype()), " and device ", q.device());
}

Tensor run(const Tensor& q, const Tensor& k_new, const Tensor& v_new, const Tensor& keys, const Tensor& values,
           const Tensor& lengths, const AttentionSpec& spec, bool check_lengths) {
  const Dims d = check_inputs(q, keys, values, lengths, spec);
  if (k_new.defined() || v_new.defined()) check_new_rows(k_new, v_new, d, q);
  const AttentionWindow window = effective_window(spec);
  raw::DecodeAttentionParams params{
      .capacity = d.capacity, .scale = softmax_scale(spec, d.dim_qk), .window_left = window.left, .sink = spec.sink};
  Tensor out = empty({d.seqs, d.heads, d.dim_v}, {.dtype = q.dtype(), .device = q.device()});
  if (q.device().is_cpu()) {
    const std::vector<int64_t> lens = lengths.to_vector<int64_t>();
    for (size_t n = 0; n < lens.size(); ++n) {
      CPF_CHECK(lens[n] >= 0 && lens[n] <= d.capacity, kOp, ": lengths[", n, "] = ", lens[n],
                " is outside the slot's 0 .. capacity=", d.capacity, " tokens");
    }
    for (int64_t n = 0; n < d.seqs && k_new.defined(); ++n) {
      const int64_t len = lens[static_cast<size_t>(n)];
      if (len == 0) continue;
      raw::copy_(raw::narrow(keys, 0, n * d.capacity + len - 1, 1), raw::narrow(k_new, 0, n, 1));
      raw::copy_(raw::narrow(values, 0, n * d.capacity + len - 1, 1), raw::narrow(v_new, 0, n, 1));
    }
    decode_on_host(out, q, keys, values, lens, d, params);
    return out;
  }
  const raw::DeviceDecodeAttention kernel = decode_registry()[static_cast<size_t>(q.device().type)].load();
  CPF_CHECK(kernel != nullptr, kOp, ": no kernel for device ", q.device(), " in this build");
  CPF_CHECK(keys.is_contiguous() && values.is_contiguous(), kOp, ": keys and values must be contiguous on ", q.device(),
            " (a KV cache is)");
  const Tensor lens = raw::contiguous(lengths);
  if (check_lengths && has_kernel(q.device(), &DeviceOps::check_indices)) {
    // Valid lengths are 0 .. capacity: an index check with bound capacity + 1, reported at the next sync.
    device_kernel(q.device(), &DeviceOps::check_indices, kOp)(
        {.kind = DeviceIndexKind::index, .op = "decode_attention (lengths)", .index = lens, .bound = d.capacity + 1});
  }
  if (k_new.defined()) {
    params.k_new = last_dim_contiguous(k_new);
    params.v_new = last_dim_contiguous(v_new);
  }
  kernel(out, last_dim_contiguous(q), keys, values, lens, params);
  if (k_new.defined()) {
    keys.bump_version();
    values.bump_version();
  }
  return out;
}

}  // namespace

Tensor decode_attention(const Tensor& q, const Tensor& keys, const Tensor& values, const Tensor& lengths,
                        const AttentionSpec& spec) {
  return run(q, Tensor(), Tensor(), keys, values, lengths, spec, /*check_lengths=*/true);
}

Tensor decode_attention_append(const Tensor& q, const Tensor& k_new, const Tensor& v_new, const Tensor& keys,
                               const Tensor& values, const Tensor& lengths, const AttentionSpec& spec,
                               bool check_lengths) {
  CPF_CHECK(k_new.defined() && v_new.defined(), kOp, "_append: k_new and v_new must be defined");
  return run(q, k_new, v_new, keys, values, lengths, spec, check_lengths);
}

namespace raw {

void register_device_decode_attention(DeviceType type, DeviceDecodeAttention kernel) {
  CPF_CHECK(type != DeviceType::cpu, "register_device_decode_attention: the CPU decodes in its host loop");
  decode_registry()[static_cast<size_t>(type)].store(kernel);
}

}  // namespace raw
}  // namespace cpf
