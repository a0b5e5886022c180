// ZeroShards, stage parameters (ZeRO-3): the units' gathers and releases (zero_shards.h).
//
//   acquire(u, next)   bucket of u: start its all-gather unless in flight, wait for it, point the unit's
//                      parameters at the gathered buffer; then start next's all-gather (the prefetch)
//   release(u)         point the unit's parameters at an empty storage: the buffer is freed once no
//                      kernel or graph still holds it
//
// The gathered buffer's version is the sum of this rank's pieces' versions, which the optimizer's update
// bumps: a graph that saved a parameter in the forward (the recompute's version check) sees a change
// exactly when the weights changed, although every gather makes a new buffer.
#include "framework/autograd/grad_mode.h"
#include "framework/distributed/zero_shards.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/views.h"

namespace cpf::dist {

ZeroShards::~ZeroShards() {
  // In-flight gathers write into buffers this object owns: let them end before the buffers go.
  for (UnitGather& g : gathers_) {
    if (!g.work) continue;
    try {
      g.work->wait();
    } catch (...) {  // an aborted world: nothing is written any more
    }
  }
}

uint64_t ZeroShards::pieces_version() const {
  uint64_t version = 0;
  for (const auto& [name, piece] : pieces_) version += piece.version();
  return version;
}

size_t ZeroShards::unit_bucket(size_t unit) const {
  CPF_CHECK(stage_ == ShardStage::parameters, "ZeroShards: units are acquired under stage parameters only, not ",
            shard_stage_name(stage_));
  CPF_CHECK(unit < unit_buckets_.size(), "ZeroShards: unit ", unit, " out of ", unit_buckets_.size());
  return unit_buckets_[unit];
}

void ZeroShards::point_parameter(size_t i, const std::shared_ptr<Storage>& storage, int64_t offset) const {
  TensorImpl* impl = params_[i].second.impl();
  impl->storage = storage;
  impl->offset = offset;
}

void ZeroShards::start_gather(size_t bucket) const {
  UnitGather& g = gathers_[bucket];
  if (g.held || g.work) return;
  NoGradGuard no_grad;
  std::vector<Tensor> values;
  for (const auto& [name, piece] : pieces_) values.push_back(piece);
  g.shard = pack_shard(bucket, values);  // (s,)
  const int64_t padded = padded_bucket_numel(plan_[bucket].numel, group_->size());
  g.buffer = empty({padded}, {.dtype = g.shard.dtype(), .device = g.shard.device()});  // (padded,)
  g.work = group_->all_gather_async(g.shard, 0, g.buffer);
}

void ZeroShards::finish_gather(size_t bucket) const {
  UnitGather& g = gathers_[bucket];
  if (g.held) return;
  start_gather(bucket);
  g.work->wait();
  g.work.reset();
  g.shard = Tensor();
  const uint64_t version = pieces_version();
  g.buffer.storage()->set_version(version);
  const GradientBucketPlan& plan = plan_[bucket];
  for (size_t k = 0; k < plan.params.size(); ++k) {
    point_parameter(plan.params[k], g.buffer.storage(), g.buffer.offset() + plan.offsets[k]);
  }
  g.held = true;
}

void ZeroShards::release_bucket(size_t bucket) const {
  UnitGather& g = gathers_[bucket];
  if (g.work) g.work->wait();  // a prefetch nobody acquired: its buffer must outlive the transfer
  const uint64_t version = pieces_version();
  for (const size_t i : plan_[bucket].params) {
    auto released = std::make_shared<Storage>(0, params_[i].second.device());
    released->set_version(version);
    point_parameter(i, released, 0);
  }
  g = UnitGather{};
}

void ZeroShards::acquire(size_t unit, std::optional<size_t> next) const {
  finish_gather(unit_bucket(unit));
  if (next) start_gather(unit_bucket(*next));
}

void ZeroShards::release(size_t unit) const {
  const size_t bucket = unit_bucket(unit);
  if (!pinned_) release_bucket(bucket);
}

void ZeroShards::release_all() const {
  if (stage_ != ShardStage::parameters) return;
  pinned_ = false;
  for (size_t b = 0; b < plan_.size(); ++b) release_bucket(b);
}

void ZeroShards::acquire_all() const {
  if (stage_ != ShardStage::parameters) return;
  for (size_t b = 0; b < plan_.size(); ++b) finish_gather(b);
  pinned_ = true;
}

void ZeroShards::adopt_parameters() {
  if (stage_ != ShardStage::parameters) return;
  NoGradGuard no_grad;
  for (size_t i = 0; i < layout_.size(); ++i) {
    const ShardPiece& piece = layout_[i];
    const Tensor& p = params_[piece.param].second;
    raw::copy_(pieces_[i].second, raw::narrow(raw::view(p, {p.numel()}), 0, piece.param_begin, piece.numel));
  }
  release_all();
}

void ZeroShards::pieces_loaded() {
  if (stage_ == ShardStage::parameters) {
    release_all();
  } else {
    gather_parameters();
  }
}

}  // namespace cpf::dist
