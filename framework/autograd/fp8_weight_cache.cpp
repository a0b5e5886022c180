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

constexpr auto kWeight = static_cast<size_t>(Fp8Role::weight);

// The slot a cast belongs to (its weight scale: a settled slot casts with it, a fresh one writes the scale
// it cast with into it), or null for current scaling without a slot, where the weight's values decide.
const void* scale_source_of(const Fp8LinearOptions& o) { return o.slot ? o.slot->scale[kWeight].raw_data() : nullptr; }

// Where the call must fold the weight's amax (delayed scaling in training), or null.
const void* amax_target_of(const Fp8LinearOptions& o) {
  return o.slot && o.slot->amax[kWeight].defined() ? o.slot->amax[kWeight].raw_data() : nullptr;
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
    const Tensor& held = e.weights[i];
    // Another view at the same address, or the same one changed in place since the cast: cast again.
    if (held.shape() != weights[i].shape() || held.dtype() != weights[i].dtype()) return {};
    if (e.versions[i] != weights[i].version()) return {};
  }
  if (e.scale_source != scale_source_of(options) || e.fresh != (options.slot && options.slot->fresh) ||
      e.margin != options.margin) {
    return {};
  }
  // This call must fold the weight's amax into its slot: only a cast that folded it into that very slot did.
  const void* target = amax_target_of(options);
  if (target != nullptr && e.recorded_into != target) return {};
  ++reused_;
  return e.copy;
}

void Fp8WeightCache::store(const std::vector<Tensor>& weights, const Fp8LinearOptions& options, Fp8WeightCopy copy) {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (!open_) return;
  Entry e{.weights = weights,
          .versions = {},
          .scale_source = scale_source_of(options),
          .fresh = options.slot && options.slot->fresh,
          .margin = options.margin,
          .recorded_into = amax_target_of(options),
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
