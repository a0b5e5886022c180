#include "framework/autograd/fp8_weight_cache.h"

#include <utility>

#include "framework/autograd/functions/fp8_linear.h"

namespace cpf {
namespace {

std::vector<const void*> key_of(const std::vector<Tensor>& weights) {
  std::vector<const void*> key;
  for (const Tensor& w : weights) key.push_back(w.raw_data());
  return key;
}

// Delayed scaling with a settled slot casts with the slot's weight scale; current scaling (and a fresh
// slot's first step) with one from the weight's own amax, which the weight's values decide.
const void* scale_source_of(const Fp8LinearOptions& o) {
  const auto r = static_cast<size_t>(Fp8Role::weight);
  return o.slot && !o.slot->fresh ? o.slot->scale[r].raw_data() : nullptr;
}

bool must_record(const Fp8LinearOptions& o) {
  return o.slot && o.slot->amax[static_cast<size_t>(Fp8Role::weight)].defined();
}

}  // namespace

Fp8WeightCache::StepScope::StepScope(Fp8WeightCache* cache) : cache_(cache) {
  if (cache_ != nullptr) cache_->open();
}

Fp8WeightCache::StepScope::~StepScope() {
  if (cache_ != nullptr) cache_->close();
}

void Fp8WeightCache::open() {
  const std::lock_guard<std::mutex> lock(mutex_);
  entries_.clear();
  open_ = true;
}

void Fp8WeightCache::close() {
  const std::lock_guard<std::mutex> lock(mutex_);
  entries_.clear();
  open_ = false;
}

Fp8WeightCopy Fp8WeightCache::find(const std::vector<Tensor>& weights, const Fp8LinearOptions& options) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (!open_) return {};
  const auto it = entries_.find(key_of(weights));
  if (it == entries_.end()) return {};
  const Entry& e = it->second;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (e.versions[i] != weights[i].version()) return {};  // changed in place since the cast
  }
  if (e.scale_source != scale_source_of(options) || e.margin != options.margin) return {};
  if (must_record(options) && !e.recorded) return {};  // this call's cast must fold in the weight's amax
  ++reused_;
  return e.copy;
}

void Fp8WeightCache::store(const std::vector<Tensor>& weights, const Fp8LinearOptions& options, Fp8WeightCopy copy) {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (!open_) return;
  Entry e{.weights = weights,
          .versions = {},
          .scale_source = scale_source_of(options),
          .margin = options.margin,
          .recorded = must_record(options),
          .copy = std::move(copy)};
  for (const Tensor& w : weights) e.versions.push_back(w.version());
  entries_[key_of(weights)] = std::move(e);
  ++stored_;
}

bool Fp8WeightCache::step_open() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return open_;
}

int64_t Fp8WeightCache::stored() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return stored_;
}

int64_t Fp8WeightCache::reused() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return reused_;
}

int64_t Fp8WeightCache::size() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(entries_.size());
}

}  // namespace cpf
