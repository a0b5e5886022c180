#include "framework/nn/compute_copies.h"

#include "framework/tensor/ops/cast_many.h"

namespace cpf::nn {
namespace {

thread_local const ComputeCopies* active_copies = nullptr;

}  // namespace

void ComputeCopies::refresh(const std::vector<Tensor>& params, DType dtype) {
  CPF_CHECK(is_floating(dtype), "ComputeCopies: the compute dtype must be floating, got ", dtype);
  const std::lock_guard<std::mutex> lock(mutex_);
  std::unordered_map<const void*, Entry> next;
  std::vector<Tensor> stale;
  for (const Tensor& p : params) {
    if (!p.defined() || !is_floating(p.dtype()) || p.dtype() == dtype || p.numel() == 0) continue;
    const void* key = p.raw_data();
    if (wanted_.count(key) == 0) continue;
    auto it = entries_.find(key);
    if (it != entries_.end() && it->second.param.is_same(p) && it->second.version == p.version() &&
        it->second.copy.dtype() == dtype && it->second.copy.shape() == p.shape() &&
        it->second.copy.device() == p.device()) {
      next.emplace(key, std::move(it->second));
      continue;
    }
    if (next.count(key) == 0) {
      next.emplace(key, Entry{p, p.version(), Tensor()});
      stale.push_back(p);
    }
  }
  const std::vector<Tensor> copies = raw::to_many(stale, dtype);  // (one launch per 64 on a device)
  for (size_t i = 0; i < stale.size(); ++i) next.at(stale[i].raw_data()).copy = copies[i];
  conversions_ += static_cast<int64_t>(stale.size());
  entries_ = std::move(next);
}

Tensor ComputeCopies::find(const Tensor& param, DType dtype) const {
  if (!param.defined() || param.numel() == 0 || param.dtype() == dtype) return Tensor();
  const std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(param.raw_data());
  const bool valid = it != entries_.end() && it->second.param.is_same(param) && it->second.version == param.version() &&
                     it->second.copy.dtype() == dtype && it->second.copy.shape() == param.shape() &&
                     it->second.copy.device() == param.device();
  if (valid) return it->second.copy;
  wanted_.insert(param.raw_data());
  return Tensor();
}

int64_t ComputeCopies::conversions() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return conversions_;
}

ComputeCopiesScope::ComputeCopiesScope(const ComputeCopies* copies) : previous_(active_copies) {
  active_copies = copies;
}

ComputeCopiesScope::~ComputeCopiesScope() { active_copies = previous_; }

const ComputeCopies* active_compute_copies() { return active_copies; }

Tensor active_compute_copy(const Tensor& param, DType dtype) {
  return active_copies != nullptr ? active_copies->find(param, dtype) : Tensor();
}

}  // namespace cpf::nn
