#include "attention/cp/lse_merge.h"

#include <array>
#include <atomic>
#include <cmath>
#include <limits>

#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/views.h"

namespace cpf::cp {
namespace {

// One slot per DeviceType (cpu, cuda); the cpu slot stays empty (the host loop below).
std::array<std::atomic<DeviceMergeFn>, 2>& merge_registry() {
  static std::array<std::atomic<DeviceMergeFn>, 2> registry{};
  return registry;
}

}  // namespace

void register_device_merge(DeviceType type, DeviceMergeFn fn) {
  CPF_CHECK(type != DeviceType::cpu, "register_device_merge: the CPU merges in its host loop; register a device type");
  merge_registry()[static_cast<size_t>(type)].store(fn);
}

DeviceMergeFn device_merge(DeviceType type) { return merge_registry()[static_cast<size_t>(type)].load(); }

PartialMerge::PartialMerge(int64_t tokens, int64_t heads, int64_t head_dim, DType input_dtype, Device device) {
  const DType acc = input_dtype == DType::f64 ? DType::f64 : DType::f32;
  out_ = zeros({tokens, heads, head_dim}, {.dtype = acc, .device = device});
  lse_ = full({heads, tokens}, -std::numeric_limits<double>::infinity(), {.dtype = acc, .device = device});
}

namespace {

// The merge for a device without a registered kernel, as element-wise raw ops with the same formulas
// (the host loop below skips rows whose part saw no key; here `where` keeps them unchanged). The
// results are copied back into the accumulators, which stay the same tensors.
void merge_with_raw_ops(const Tensor& acc_out, const Tensor& acc_lse, const Tensor& part_out, const Tensor& part_lse) {
  using raw::BinaryOp;
  using raw::UnaryOp;
  const double neg_inf = -std::numeric_limits<double>::infinity();
  const Tensor valid = raw::compare(raw::CompareOp::ne, part_lse, neg_inf);  // (H, T)
  // hi is finite wherever the part saw a key; elsewhere 0 keeps the (discarded) arithmetic finite.
  const Tensor hi = raw::where(valid, raw::binary(BinaryOp::maximum, acc_lse, part_lse), zeros_like(acc_lse));
  auto exp_minus = [](const Tensor& a, const Tensor& b) {
    return raw::unary(UnaryOp::exp, raw::binary(BinaryOp::sub, a, b));
  };
  const Tensor sum = raw::binary(BinaryOp::add, exp_minus(acc_lse, hi), exp_minus(part_lse, hi));
  const Tensor merged = raw::binary(BinaryOp::add, hi, raw::unary(UnaryOp::log, sum));
  const Tensor keep = exp_minus(acc_lse, merged);  // 0 while the accumulator is empty
  const Tensor take = exp_minus(part_lse, merged);
  // (H, T) -> (T, H, 1) views broadcast over the head dim.
  auto per_row = [](const Tensor& t) { return raw::unsqueeze(raw::transpose(t, 0, 1), 2); };
  const Tensor part = raw::to(part_out, acc_out.dtype());
  const Tensor mixed = raw::binary(BinaryOp::add, raw::binary(BinaryOp::mul, acc_out, per_row(keep)),
                                   raw::binary(BinaryOp::mul, part, per_row(take)));
  raw::copy_(acc_out, raw::where(per_row(valid), mixed, acc_out));
  raw::copy_(acc_lse, raw::where(valid, merged, acc_lse));
}

}  // namespace

void PartialMerge::add(const Tensor& out_i, const Tensor& lse_i) {
  CPF_CHECK(out_i.shape() == out_.shape() && lse_i.shape() == lse_.shape(), "cp merge: partial out ", out_i.shape(),
            " / lse ", lse_i.shape(), " do not match the accumulator ", out_.shape(), " / ", lse_.shape());
  CPF_CHECK(out_i.device() == out_.device() && lse_i.device() == out_.device(), "cp merge: partial out on ",
            out_i.device(), " and lse on ", lse_i.device(), " but the accumulator is on ", out_.device());
  CPF_CHECK(is_floating(out_i.dtype()) && is_floating(lse_i.dtype()), "cp merge: partial out (", out_i.dtype(),
            ") and lse (", lse_i.dtype(), ") must be floating");
  const Tensor l = raw::contiguous(raw::to(lse_i, lse_.dtype()));  // (H, T): small
  if (!out_.device().is_cpu()) {
    const Tensor o = raw::contiguous(out_i);  // read in its own dtype by the kernel
    if (DeviceMergeFn fn = device_merge(out_.device().type)) {
      fn(out_, lse_, o, l);
    } else {
      merge_with_raw_ops(out_, lse_, o, l);
    }
    return;
  }
  const Tensor o = raw::contiguous(raw::to(out_i, out_.dtype()));
  visit_compute_dtype(out_.dtype(), "cp merge", [&]<class T>() {
    const int64_t tokens = out_.size(0), heads = out_.size(1), dim = out_.size(2);
    T* acc_out = out_.data<T>();
    T* acc_lse = lse_.data<T>();
    const T* part_out = o.data<T>();
    const T* part_lse = l.data<T>();
    const T neg_inf = -std::numeric_limits<T>::infinity();
#if defined(CPF_WITH_OPENMP)
#pragma omp parallel for if (tokens * heads * dim > (1 << 16)) schedule(static)
#endif
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const T li = part_lse[h * tokens + t];
        if (li == neg_inf) continue;  // this part saw no key for the row
        T& la = acc_lse[h * tokens + t];
        const T hi = std::max(la, li);
        const T merged = hi + std::log(std::exp(la - hi) + std::exp(li - hi));
        const T keep = la == neg_inf ? T(0) : std::exp(la - merged);
        const T take = std::exp(li - merged);
        T* row = acc_out + (t * heads + h) * dim;
        const T* part = part_out + (t * heads + h) * dim;
        for (int64_t d = 0; d < dim; ++d) row[d] = keep * row[d] + take * part[d];
        la = merged;
      }
    }
  });
}

Tensor PartialMerge::out(DType dtype) const { return raw::to(out_, dtype); }

}  // namespace cpf::cp

namespace cpf::cp {
namespace {

std::array<std::atomic<DeviceAccumulateFn>, 2>& accumulate_registry() {
  static std::array<std::atomic<DeviceAccumulateFn>, 2> registry{};
  return registry;
}

}  // namespace

void register_device_accumulate(DeviceType type, DeviceAccumulateFn fn) {
  CPF_CHECK(type != DeviceType::cpu,
            "register_device_accumulate: the CPU accumulates with raw ops; register a device type");
  accumulate_registry()[static_cast<size_t>(type)].store(fn);
}

DeviceAccumulateFn device_accumulate(DeviceType type) {
  return accumulate_registry()[static_cast<size_t>(type)].load();
}

void accumulate(const Tensor& acc, const Tensor& part) {
  CPF_CHECK(acc.defined() && part.defined(), "cp accumulate: undefined ", acc.defined() ? "part" : "accumulator");
  CPF_CHECK(acc.dtype() == DType::f32 || acc.dtype() == DType::f64,
            "cp accumulate: the accumulator must be f32 or f64, got ", acc.dtype());
  CPF_CHECK(is_floating(part.dtype()), "cp accumulate: the part must be floating, got ", part.dtype());
  CPF_CHECK(part.shape() == acc.shape(), "cp accumulate: part ", part.shape(), " does not match the accumulator ",
            acc.shape());
  CPF_CHECK(part.device() == acc.device(), "cp accumulate: part on ", part.device(), " but the accumulator on ",
            acc.device());
  CPF_CHECK(acc.is_contiguous(), "cp accumulate: the accumulator must be contiguous");
  if (!acc.device().is_cpu()) {
    if (DeviceAccumulateFn fn = device_accumulate(acc.device().type)) {
      fn(acc, raw::contiguous(part));
      return;
    }
  }
  raw::add_(acc, raw::to(part, acc.dtype()));
}

}  // namespace cpf::cp
