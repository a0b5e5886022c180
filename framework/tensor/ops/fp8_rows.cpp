#include "framework/tensor/ops/fp8_rows.h"

#include "framework/tensor/device_ops.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/join.h"
#include "framework/tensor/ops/views.h"
#include "framework/tensor/shape_utils.h"

namespace cpf::raw {
namespace {

// A weight's parts: defined, 2-D, contiguous, of one width, dtype (f32 or bf16) and device.
void check_parts(const std::vector<Tensor>& parts, size_t index, const char* op) {
  CPF_CHECK(!parts.empty(), op, ": weight ", index, " has no parts (give a weight as one or more (N_i, K) blocks)");
  const Tensor& first = parts[0];
  for (const Tensor& p : parts) {
    check_defined(p, op, "a weight's part");
    CPF_CHECK(p.dim() == 2 && p.is_contiguous(), op, ": weight ", index,
              "'s parts must be contiguous 2-D (N_i, K) blocks, got shape ", p.shape(), " strides ", p.strides());
    CPF_CHECK(p.dtype() == DType::f32 || p.dtype() == DType::bf16, op, ": weight ", index,
              "'s parts must be f32 or bf16, got ", dtype_name(p.dtype()));
    CPF_CHECK(p.size(1) == first.size(1) && p.dtype() == first.dtype() && p.device() == first.device(), op, ": weight ",
              index, "'s parts must share one width, dtype and device, got ", p.shape(), " ", dtype_name(p.dtype()),
              " on ", p.device(), " beside ", first.shape(), " ", dtype_name(first.dtype()), " on ", first.device());
  }
}

Tensor whole(const std::vector<Tensor>& parts) { return parts.size() == 1 ? parts[0] : cat(parts, 0); }

int64_t total_rows(const std::vector<Tensor>& parts) {
  int64_t rows = 0;
  for (const Tensor& p : parts) rows += p.size(0);
  return rows;
}

const DeviceOps* device_ops_for(const std::vector<std::vector<Tensor>>& weights) {
  if (weights.empty() || weights[0][0].device().is_cpu()) return nullptr;
  return find_device_ops(weights[0][0].device().type);
}

}  // namespace

std::vector<Tensor> abs_max_rows(const std::vector<std::vector<Tensor>>& weights) {
  for (size_t i = 0; i < weights.size(); ++i) check_parts(weights[i], i, "abs_max_rows");
  std::vector<Tensor> out;
  if (weights.empty()) return out;
  const Device device = weights[0][0].device();
  for (size_t i = 0; i < weights.size(); ++i) {
    CPF_CHECK(weights[i][0].device() == device, "abs_max_rows: weight ", i, " is on ", weights[i][0].device(),
              " but weight 0 on ", device, " (one call casts on one device)");
  }
  const Tensor buffer = zeros({static_cast<int64_t>(weights.size())}, {.dtype = DType::f32, .device = device});
  for (size_t i = 0; i < weights.size(); ++i) out.push_back(select(buffer, 0, static_cast<int64_t>(i)));
  const DeviceOps* ops = device_ops_for(weights);
  std::vector<bool> done(weights.size(), false);
  if (ops != nullptr && ops->fp8_amax_rows != nullptr) done = ops->fp8_amax_rows(out, weights);
  for (size_t i = 0; i < weights.size(); ++i) {
    if (!done[i]) copy_(out[i], abs_max(whole(weights[i])));
  }
  return out;
}

std::vector<Fp8Transposed> quantize_fp8_transposed_rows(const std::vector<Fp8RowsCast>& casts, DType fp8) {
  constexpr const char* kOp = "quantize_fp8_transposed_rows";
  CPF_CHECK(is_fp8(fp8), kOp, ": the target dtype must be f8e4m3 or f8e5m2, got ", dtype_name(fp8));
  std::vector<std::vector<Tensor>> weights;
  std::vector<Tensor> q, qt, scale, amax_out;
  for (size_t i = 0; i < casts.size(); ++i) {
    const Fp8RowsCast& c = casts[i];
    check_parts(c.parts, i, kOp);
    const Tensor& first = c.parts[0];
    CPF_CHECK(first.device() == casts[0].parts[0].device(), kOp, ": weight ", i, " is on ", first.device(),
              " but weight 0 on ", casts[0].parts[0].device(), " (one call casts on one device)");
    const auto scalar_here = [&](const Tensor& t) {
      return t.dtype() == DType::f32 && t.numel() == 1 && t.dim() <= 1 && t.device() == first.device();
    };
    CPF_CHECK(c.scale.defined() && scalar_here(c.scale), kOp, ": weight ", i, "'s scale must be a () f32 tensor on ",
              first.device());
    CPF_CHECK(!c.amax_out.defined() || scalar_here(c.amax_out), kOp, ": weight ", i,
              "'s amax_out must be undefined or a () f32 tensor on ", first.device());
    const int64_t n = total_rows(c.parts), k = first.size(1);
    weights.push_back(c.parts);
    q.push_back(empty({n, k}, {.dtype = fp8, .device = first.device()}));
    qt.push_back(empty({k, n}, {.dtype = fp8, .device = first.device()}));
    scale.push_back(c.scale);
    amax_out.push_back(c.amax_out);
  }
  const DeviceOps* ops = device_ops_for(weights);
  std::vector<bool> done(casts.size(), false);
  if (ops != nullptr && ops->quantize_fp8_rows != nullptr)
    done = ops->quantize_fp8_rows(q, qt, weights, scale, amax_out);
  std::vector<Fp8Transposed> out;
  for (size_t i = 0; i < casts.size(); ++i) {
    out.push_back(done[i] ? Fp8Transposed{q[i], qt[i], Tensor()}
                          : quantize_fp8_transposed(whole(weights[i]), scale[i], fp8, amax_out[i], true));
  }
  return out;
}

}  // namespace cpf::raw
