#include "framework/autograd/fp8_weight_cache.h"

#include <utility>

#include "framework/autograd/functions/fp8_linear.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/fp8_rows.h"

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
  refreshed_ = false;
}

void Fp8WeightCache::close() {
  const std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Planned> used;
  for (const auto& [key, e] : entries_) {
    if (e.used) used.push_back({e.weights, e.slot, e.margin});
  }
  if (!used.empty()) plan_ = std::move(used);  // a step that cast nothing (an evaluation) keeps the plan
  entries_.clear();
  open_ = false;
}

void Fp8WeightCache::refresh_locked(Device device) {
  refreshed_ = true;
  // The planned weights on the device of the step's first FP8 call (a model moved since keeps no others).
  std::vector<const Planned*> on_device;
  for (const Planned& p : plan_) {
    if (p.weights[0].device() == device) on_device.push_back(&p);
  }
  if (on_device.empty()) return;
  // Current scaling: every weight's amax in one pass, then its scale as fp8_linear's cast computes it.
  std::vector<std::vector<Tensor>> current;
  for (const Planned* p : on_device) {
    if (!p->slot) current.push_back(p->weights);
  }
  const std::vector<Tensor> amaxes = raw::abs_max_rows(current);
  std::vector<raw::Fp8RowsCast> casts;
  size_t next_amax = 0;
  for (const Planned* p : on_device) {
    if (p->slot) {  // settled since the step that used it: its scale, and this step's amax recorded
      casts.push_back({p->weights, p->slot->scale[kWeight], p->slot->amax[kWeight]});
    } else {
      casts.push_back({p->weights, raw::fp8_scale(amaxes[next_amax++], DType::f8e4m3, p->margin), Tensor()});
    }
  }
  const std::vector<raw::Fp8Transposed> codes = raw::quantize_fp8_transposed_rows(casts, DType::f8e4m3);
  for (size_t i = 0; i < on_device.size(); ++i) {
    const Planned& p = *on_device[i];
    Entry e{.weights = p.weights,
            .versions = {},
            .scale_source = p.slot ? p.slot->scale[kWeight].raw_data() : nullptr,
            .fresh = false,
            .margin = p.margin,
            .recorded_into = p.slot ? p.slot->amax[kWeight].raw_data() : nullptr,
            .copy = {codes[i].q, codes[i].qt, raw::unary(raw::UnaryOp::reciprocal, casts[i].scale)},
            .slot = p.slot,
            .used = false};
    for (const Tensor& w : p.weights) e.versions.push_back(w.version());
    entries_[key_of(p.weights)] = std::move(e);
  }
  stored_ += static_cast<int64_t>(on_device.size());
  refreshed_count_ += static_cast<int64_t>(on_device.size());
}

Fp8WeightCopy Fp8WeightCache::find(const std::vector<Tensor>& weights, const Fp8LinearOptions& options) {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (!open_) return {};
  if (!refreshed_ && !weights.empty() && weights[0].defined()) refresh_locked(weights[0].device());
  const auto it = entries_.find(key_of(weights));
  if (it == entries_.end()) return {};
  Entry& e = it->second;
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
  e.used = true;
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
          .copy = std::move(copy),
          .slot = options.slot,
          .used = true};
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

int64_t Fp8WeightCache::refreshed() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return refreshed_count_;
}

int64_t Fp8WeightCache::planned() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(plan_.size());
}

}  // namespace cpf
