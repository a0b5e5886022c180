#include "attention/attention_sink.h"

#include <limits>

#include "framework/core/error.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/reduce.h"
#include "framework/tensor/ops/views.h"

namespace cpf {

void check_attention_sink(const Tensor& sink, int64_t num_heads, DType input_dtype, const Device& device,
                          const char* op) {
  CPF_CHECK(sink.dim() == 1 && sink.size(0) == num_heads, op, ": the attention sink must hold one logit per query ",
            "head, shape [", num_heads, "]: sink=", sink.shape());
  const bool dtype_ok = sink.dtype() == DType::f32 || (sink.dtype() == DType::f64 && input_dtype == DType::f64);
  CPF_CHECK(dtype_ok, op, ": the attention sink must be f32 (f64 only with f64 inputs): sink is ", sink.dtype(),
            " with ", input_dtype, " inputs");
  CPF_CHECK(sink.device() == device, op, ": the attention sink is on ", sink.device(), " but q is on ", device);
}

namespace raw {
namespace {

using raw::BinaryOp;
using raw::UnaryOp;

// The sink as a view that broadcasts against lse: (1, h, 1) for (b, h, s), (h, 1) for (h, t).
Tensor sink_like_lse(const Tensor& sink, const Tensor& lse) {
  const Tensor s = raw::to(sink, lse.dtype());
  return lse.dim() == 3 ? raw::reshape(s, {1, s.size(0), 1}) : raw::unsqueeze(s, 1);
}

// A per-row value in lse's layout -> a view broadcasting over out's head dim.
Tensor lse_rows_to_out(const Tensor& rows, QkvFormat format) {
  switch (format) {
    case QkvFormat::thd: return raw::unsqueeze(raw::transpose(rows, 0, 1), 2);      // (h, t) -> (t, h, 1)
    case QkvFormat::bshd: return raw::unsqueeze(raw::permute(rows, {0, 2, 1}), 3);  // -> (b, s, h, 1)
    case QkvFormat::sbhd: return raw::unsqueeze(raw::permute(rows, {2, 0, 1}), 3);  // -> (s, b, h, 1)
  }
  return rows;
}

// A per-row value in out's layout without the head dim -> lse's layout.
Tensor out_rows_to_lse(const Tensor& rows, QkvFormat format) {
  switch (format) {
    case QkvFormat::thd: return raw::transpose(rows, 0, 1);      // (t, h) -> (h, t)
    case QkvFormat::bshd: return raw::permute(rows, {0, 2, 1});  // (b, s, h) -> (b, h, s)
    case QkvFormat::sbhd: return raw::permute(rows, {1, 2, 0});  // (s, b, h) -> (b, h, s)
  }
  return rows;
}

Tensor exp_of_difference(const Tensor& a, const Tensor& b) {
  return raw::unary(UnaryOp::exp, raw::binary(BinaryOp::sub, a, b));
}

}  // namespace

SinkRescaled apply_attention_sink(const Tensor& out, const Tensor& lse, const Tensor& sink, QkvFormat format) {
  const Tensor s = sink_like_lse(sink, lse);
  // log(exp(lse) + exp(sink)) around the larger of the two; a row with lse = -inf gets sink here and
  // is put back to -inf below (it saw no key).
  const Tensor hi = raw::binary(BinaryOp::maximum, lse, s);
  const Tensor sum = raw::binary(BinaryOp::add, exp_of_difference(lse, hi), exp_of_difference(s, hi));
  const Tensor merged = raw::binary(BinaryOp::add, hi, raw::unary(UnaryOp::log, sum));
  const Tensor saw_key = raw::compare(raw::CompareOp::ne, lse, -std::numeric_limits<double>::infinity());
  // exp(lse - merged) is exactly 0 where lse = -inf (merged is finite there), so such rows stay 0.
  const Tensor factor = lse_rows_to_out(exp_of_difference(lse, merged), format);
  const Tensor rescaled = raw::binary(BinaryOp::mul, raw::to(out, lse.dtype()), factor);
  return {raw::contiguous(raw::to(rescaled, out.dtype())), raw::contiguous(raw::where(saw_key, merged, lse))};
}

Tensor attention_sink_grad(const Tensor& dout, const Tensor& dlse, const Tensor& out, const Tensor& lse,
                           const Tensor& sink, QkvFormat format) {
  const DType acc = lse.dtype();
  // D = rowsum(dO * out') - dlse, per row in lse's layout.
  const Tensor products = raw::binary(BinaryOp::mul, raw::to(dout, acc), raw::to(out, acc));
  Tensor d = out_rows_to_lse(raw::sum(products, {products.dim() - 1}), format);
  if (dlse.defined()) d = raw::binary(BinaryOp::sub, d, raw::to(dlse, acc));
  // The sink's probability per row: 0 where the row saw no key (lse' = -inf).
  const Tensor saw_key = raw::compare(raw::CompareOp::ne, lse, -std::numeric_limits<double>::infinity());
  const Tensor p_sink = raw::where(saw_key, exp_of_difference(sink_like_lse(sink, lse), lse), zeros_like(lse));
  const Tensor weighted = raw::binary(BinaryOp::mul, p_sink, d);
  const Tensor per_head = lse.dim() == 3 ? raw::sum(weighted, {0, 2}) : raw::sum(weighted, {1});
  return raw::contiguous(raw::to(raw::unary(UnaryOp::neg, per_head), sink.dtype()));
}

}  // namespace raw
}  // namespace cpf
