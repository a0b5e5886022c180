#include "framework/nn/compute_copies.h"

#include "framework/autograd/grad_mode.h"
#include "framework/tensor/ops/cast_many.h"
#include "framework/tensor/ops/join.h"

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
  // Concatenations of changed parts, or of parts no longer listed, go (a later lookup makes them anew).
  std::erase_if(stacked_, [&](const auto& item) {
    if (!stacked_valid(item.second)) return true;
    for (const void* key : item.first) {
      if (entries_.count(key) == 0) return true;
    }
    return false;
  });
}

bool ComputeCopies::stacked_valid(const Stacked& s) const {
  for (size_t i = 0; i < s.params.size(); ++i) {
    if (s.params[i].version() != s.versions[i]) return false;
  }
  return true;
}

Tensor ComputeCopies::find_stacked(const std::vector<Tensor>& params, DType dtype) const {
  std::vector<Tensor> copies;
  std::vector<const void*> key;
  bool all = !params.empty();
  for (const Tensor& p : params) {  // every part looked up, so every missing one is marked wanted
    copies.push_back(find(p, dtype));
    key.push_back(p.raw_data());
    all = all && copies.back().defined();
  }
  if (!all) return Tensor();
  const std::lock_guard<std::mutex> lock(mutex_);
  auto it = stacked_.find(key);
  if (it != stacked_.end() && stacked_valid(it->second) && it->second.copy.dtype() == dtype) {
    bool same = true;
    for (size_t i = 0; i < params.size(); ++i) same = same && it->second.params[i].is_same(params[i]);
    if (same) return it->second.copy;
  }
  Stacked s{params, {}, copies.size() == 1 ? copies[0] : raw::cat(copies, 0)};  // (sum N, K) or (sum N)
  for (const Tensor& p : params) s.versions.push_back(p.version());
  ++stackings_;
  const Tensor copy = s.copy;
  stacked_[key] = std::move(s);
  return copy;
}

int64_t ComputeCopies::stackings() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return stackings_;
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

LinearCatStacked active_stacked_copies(const Tensor& x, const std::vector<LinearWeights>& parts) {
  if (active_copies == nullptr || grad_enabled() || !x.defined() || x.dim() < 1 || x.size(-1) == 0 ||
      x.numel() / x.size(-1) >= kLinearCatMinFusedRows || parts.empty()) {
    return {};
  }
  std::vector<Tensor> weights, biases;
  for (const LinearWeights& p : parts) {
    weights.push_back(p.weight);
    if (p.bias.defined()) biases.push_back(p.bias);
  }
  LinearCatStacked out{active_copies->find_stacked(weights, x.dtype()), Tensor()};
  if (out.weight.defined() && !biases.empty()) {
    out.bias = active_copies->find_stacked(biases, x.dtype());
    if (!out.bias.defined()) return {};
  }
  return out;
}

}  // namespace cpf::nn
