#include "framework/distributed/zero_shards.h"

#include <algorithm>
#include <map>

#include "framework/autograd/grad_mode.h"
#include "framework/optim/grad_clip.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/views.h"

namespace cpf::dist {
namespace {

// The flattened elements [begin, begin + n) of `t` (contiguous): a view.
Tensor flat_range(const Tensor& t, int64_t begin, int64_t n) {
  return raw::narrow(raw::view(t, {t.numel()}), 0, begin, n);  // (n,)
}

}  // namespace

std::string shard_stage_name(ShardStage stage) {
  switch (stage) {
    case ShardStage::none: return "none";
    case ShardStage::optimizer: return "optimizer";
    case ShardStage::gradients: return "gradients";
    case ShardStage::parameters: return "parameters";
  }
  return "none";
}

std::vector<ShardPiece> plan_shard_pieces(const std::vector<GradientBucketPlan>& plan,
                                          const std::vector<int64_t>& param_numels, int rank, int world) {
  CPF_CHECK(world >= 1 && rank >= 0 && rank < world, "plan_shard_pieces: rank ", rank, " of ", world);
  std::vector<ShardPiece> pieces;
  for (size_t b = 0; b < plan.size(); ++b) {
    const int64_t share = padded_bucket_numel(plan[b].numel, world) / world;
    const int64_t lo = rank * share, hi = lo + share;  // this rank's elements of the bucket
    for (size_t k = 0; k < plan[b].params.size(); ++k) {
      const int64_t first = plan[b].offsets[k], last = first + param_numels.at(plan[b].params[k]);
      const int64_t begin = std::max(first, lo), end = std::min(last, hi);
      if (begin < end) pieces.push_back({plan[b].params[k], b, begin - first, begin - lo, end - begin});
    }
  }
  return pieces;
}

ZeroShards::ZeroShards(optim::NamedTensors params, std::vector<GradientBucketPlan> plan, ProcessGroupPtr group,
                       ShardStage stage, std::vector<size_t> unit_buckets)
    : params_(std::move(params)),
      plan_(std::move(plan)),
      group_(std::move(group)),
      stage_(stage),
      unit_buckets_(std::move(unit_buckets)) {
  CPF_CHECK(group_ != nullptr, "ZeroShards: the process group is null");
  CPF_CHECK(stage_ != ShardStage::none, "ZeroShards: stage none shards nothing; build no ZeroShards");
  check_unit_buckets();
  std::vector<int64_t> numels;
  for (const auto& [name, p] : params_) {
    CPF_CHECK(p.defined() && p.is_contiguous(), "ZeroShards: parameter '", name,
              "' must be a defined contiguous tensor");
    numels.push_back(p.numel());
  }
  layout_ = plan_shard_pieces(plan_, numels, group_->rank(), group_->size());
  CPF_CHECK(!layout_.empty(), "ZeroShards on ", group_->describe(), ": rank ", group_->rank(),
            " owns no element of any parameter (the model has fewer elements than ranks); use parallel.shard: none");
  for (const ShardPiece& piece : layout_) {
    const auto& [name, p] = params_[piece.param];
    // Stages optimizer and gradients: a view of the parameter's storage; parameters: this rank's own copy
    // (the parameter's storage is released below).
    Tensor leaf = flat_range(p, piece.param_begin, piece.numel).detach();
    if (stage_ == ShardStage::parameters) leaf = raw::contiguous(leaf).detach();
    leaf.set_requires_grad(true);
    pieces_.emplace_back(
        name + "[" + std::to_string(piece.param_begin) + ":" + std::to_string(piece.param_begin + piece.numel) + "]",
        leaf);
  }
  if (stage_ == ShardStage::parameters) {
    gathers_.resize(plan_.size());
    for (size_t b = 0; b < plan_.size(); ++b) release_bucket(b);
  }
}

void ZeroShards::check_unit_buckets() const {
  if (stage_ != ShardStage::parameters) {
    CPF_CHECK(unit_buckets_.empty(), "ZeroShards: units are for stage parameters, not ", shard_stage_name(stage_));
    return;
  }
  CPF_CHECK(unit_buckets_.size() == plan_.size(),
            "ZeroShards: stage parameters needs one unit per bucket: ", unit_buckets_.size(), " units for ",
            plan_.size(), " buckets");
  std::vector<bool> seen(plan_.size(), false);
  for (size_t u = 0; u < unit_buckets_.size(); ++u) {
    const size_t b = unit_buckets_[u];
    CPF_CHECK(b < plan_.size() && !seen[b], "ZeroShards: unit ", u, " names bucket ", b,
              b < plan_.size() ? ", which another unit has" : " of ", plan_.size());
    seen[b] = true;
  }
}

std::vector<optim::ParamGroup> ZeroShards::piece_groups(const std::vector<optim::ParamGroup>& groups) const {
  std::map<std::string, size_t> group_of;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const auto& [name, p] : groups[g].params) group_of[name] = g;
  }
  std::vector<optim::ParamGroup> out(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) out[g] = {groups[g].name, {}, groups[g].weight_decay};
  for (size_t i = 0; i < layout_.size(); ++i) {
    const std::string& param = params_[layout_[i].param].first;
    const auto it = group_of.find(param);
    CPF_CHECK(it != group_of.end(), "ZeroShards: parameter '", param, "' is in no optimizer group");
    out[it->second].params.push_back(pieces_[i]);
  }
  std::erase_if(out, [](const optim::ParamGroup& g) { return g.params.empty(); });
  return out;
}

void ZeroShards::take_gradients(const GradientReducer& reducer) {
  for (size_t i = 0; i < layout_.size(); ++i) {
    const ShardPiece& piece = layout_[i];
    if (stage_ != ShardStage::optimizer) {
      pieces_[i].second.set_grad(raw::narrow(reducer.shard(piece.bucket), 0, piece.shard_offset, piece.numel));
      continue;
    }
    const auto& [name, p] = params_[piece.param];
    const Tensor grad = p.grad();
    CPF_CHECK(grad.defined(), "ZeroShards: parameter '", name,
              "' has no gradient after the reducer's finish(); call take_gradients after finish()");
    pieces_[i].second.set_grad(flat_range(grad, piece.param_begin, piece.numel));
  }
}

Tensor ZeroShards::grad_sum_squares() const {
  return group_->all_reduce(optim::grad_sum_squares(pieces_), ReduceOp::sum);  // (1) f64
}

Tensor ZeroShards::pack_shard(size_t bucket, const std::vector<Tensor>& piece_values) const {
  const int64_t padded = padded_bucket_numel(plan_[bucket].numel, group_->size());
  const Tensor& like = piece_values.front();
  Tensor shard = zeros({padded / group_->size()}, {.dtype = like.dtype(), .device = like.device()});  // (s,)
  for (size_t i = 0; i < layout_.size(); ++i) {
    if (layout_[i].bucket != bucket) continue;
    raw::copy_(raw::narrow(shard, 0, layout_[i].shard_offset, layout_[i].numel), piece_values[i]);
  }
  return shard;
}

Tensor ZeroShards::gather_bucket(size_t bucket, const std::vector<Tensor>& piece_values) const {
  return group_->all_gather(pack_shard(bucket, piece_values), 0);  // (padded,) in the bucket's layout
}

void ZeroShards::gather_parameters() {
  if (stage_ == ShardStage::parameters) return;  // gathered per unit, when acquired
  NoGradGuard no_grad;
  std::vector<Tensor> values;
  for (const auto& [name, piece] : pieces_) values.push_back(piece);
  for (size_t b = 0; b < plan_.size(); ++b) {
    const Tensor all = gather_bucket(b, values);
    for (size_t k = 0; k < plan_[b].params.size(); ++k) {
      const Tensor& p = params_[plan_[b].params[k]].second;
      raw::copy_(raw::view(p, {p.numel()}), raw::narrow(all, 0, plan_[b].offsets[k], p.numel()));
    }
  }
}

void ZeroShards::zero_grad() {
  for (const auto& [name, piece] : pieces_) piece.set_grad(Tensor());
  for (const auto& [name, p] : params_) p.set_grad(Tensor());
}

optim::NamedTensors ZeroShards::full_state(const optim::Optimizer& optimizer) const {
  std::map<std::string, Tensor> state;
  for (auto& [name, t] : optimizer.state_tensors()) state[name] = t;
  optim::NamedTensors full;
  for (const std::string& slot : optimizer.state_slots()) {
    std::vector<Tensor> values;
    for (const auto& [piece_name, piece] : pieces_) values.push_back(state.at(slot + "." + piece_name));
    std::vector<Tensor> whole(params_.size());
    for (size_t b = 0; b < plan_.size(); ++b) {
      const Tensor all = gather_bucket(b, values);
      for (size_t k = 0; k < plan_[b].params.size(); ++k) {
        const Tensor& p = params_[plan_[b].params[k]].second;
        whole[plan_[b].params[k]] =
            raw::view(raw::contiguous(raw::narrow(all, 0, plan_[b].offsets[k], p.numel())), p.shape());
      }
    }
    for (size_t i = 0; i < params_.size(); ++i) full.emplace_back(slot + "." + params_[i].first, whole[i]);
  }
  return full;
}

void ZeroShards::load_full_state(optim::Optimizer& optimizer, const optim::NamedTensors& full,
                                 int64_t step_count) const {
  std::map<std::string, Tensor> by_name(full.begin(), full.end());
  optim::NamedTensors mine;
  for (const std::string& slot : optimizer.state_slots()) {
    for (size_t i = 0; i < layout_.size(); ++i) {
      const auto& [name, p] = params_[layout_[i].param];
      const auto it = by_name.find(slot + "." + name);
      CPF_CHECK(it != by_name.end(), "ZeroShards: the state holds no '", slot, ".", name, "'");
      CPF_CHECK(it->second.shape() == p.shape(), "ZeroShards: state '", slot, ".", name, "' has shape ",
                it->second.shape(), " but the parameter has ", p.shape());
      mine.emplace_back(
          slot + "." + pieces_[i].first,
          raw::contiguous(flat_range(raw::contiguous(it->second), layout_[i].param_begin, layout_[i].numel)));
    }
  }
  optimizer.load_state(mine, step_count);
}

}  // namespace cpf::dist
