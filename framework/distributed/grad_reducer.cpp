#include "framework/distributed/grad_reducer.h"

#include <algorithm>
#include <bit>
#include <map>
#include <unordered_map>

#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/views.h"

namespace cpf::dist {
namespace {

// FNV-1a over 64-bit words: a fingerprint of the layout, compared across ranks.
struct Fingerprint {
  uint64_t value = 1469598103934665603ull;
  void add(int64_t word) {
    const auto bits = static_cast<uint64_t>(word);
    for (int byte = 0; byte < 8; ++byte) {
      value ^= (bits >> (8 * byte)) & 0xff;
      value *= 1099511628211ull;
    }
  }
};

// What every rank must agree on, in the order the message names it.
enum Field { kParams, kBuckets, kElements, kLayout, kOp, kFields };

}  // namespace

std::vector<GradientBucketPlan> plan_gradient_buckets(const std::vector<Tensor>& params, int64_t bucket_bytes) {
  CPF_CHECK(bucket_bytes > 0, "GradientReducer: bucket_bytes must be positive, got ", bucket_bytes);
  std::vector<GradientBucketPlan> plan;
  std::map<DType, size_t> open;  // the bucket still taking parameters of each dtype
  for (size_t i = params.size(); i-- > 0;) {
    const DType dtype = params[i].dtype();
    auto it = open.find(dtype);
    if (it == open.end()) {
      GradientBucketPlan fresh;
      fresh.dtype = dtype;
      plan.push_back(std::move(fresh));
      it = open.emplace(dtype, plan.size() - 1).first;
    }
    GradientBucketPlan& bucket = plan[it->second];
    bucket.params.push_back(i);
    bucket.offsets.push_back(bucket.numel);
    bucket.numel += params[i].numel();
    if (bucket.numel * static_cast<int64_t>(dtype_size(dtype)) >= bucket_bytes) open.erase(it);
  }
  return plan;
}

std::vector<GradientBucketPlan> plan_explicit_buckets(const std::vector<Tensor>& params,
                                                      const std::vector<std::vector<size_t>>& buckets) {
  std::vector<int> listed(params.size(), -1);  // the bucket holding each parameter
  std::vector<GradientBucketPlan> plan;
  for (size_t b = 0; b < buckets.size(); ++b) {
    CPF_CHECK(!buckets[b].empty(), "GradientReducer: explicit bucket ", b, " is empty");
    GradientBucketPlan bucket;
    bucket.dtype = params.at(buckets[b].front()).dtype();
    for (const size_t i : buckets[b]) {
      CPF_CHECK(i < params.size(), "GradientReducer: explicit bucket ", b, " names parameter ", i, " of ",
                params.size());
      CPF_CHECK(listed[i] < 0, "GradientReducer: parameter ", i, " is in explicit buckets ", listed[i], " and ", b,
                "; list each parameter once");
      CPF_CHECK(params[i].dtype() == bucket.dtype, "GradientReducer: explicit bucket ", b, " mixes ", bucket.dtype,
                " and ", params[i].dtype(), " (parameter ", i, "); a bucket holds one dtype");
      listed[i] = static_cast<int>(b);
      bucket.params.push_back(i);
      bucket.offsets.push_back(bucket.numel);
      bucket.numel += params[i].numel();
    }
    plan.push_back(std::move(bucket));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    CPF_CHECK(listed[i] >= 0, "GradientReducer: parameter ", i, " of shape ", params[i].shape(),
              " is in no explicit bucket; every parameter needs one");
  }
  return plan;
}

int64_t padded_bucket_numel(int64_t numel, int world) {
  CPF_CHECK(numel >= 0 && world >= 1, "padded_bucket_numel: numel=", numel, " world=", world);
  return (numel + world - 1) / world * world;
}

GradientReducer::GradientReducer(std::vector<Tensor> params, ProcessGroupPtr group, GradientReducerOptions options)
    : params_(std::move(params)), group_(std::move(group)), options_(options) {
  CPF_CHECK(group_ != nullptr,
            "GradientReducer: the process group is null (a rank outside the data-parallel "
            "group has no reducer)");
  const std::string where = "GradientReducer on " + group_->describe();
  CPF_CHECK(!params_.empty(), where, ": the parameter list is empty");
  CPF_CHECK(options_.op == ReduceOp::sum || options_.op == ReduceOp::avg, where, ": op must be sum or avg, got ",
            reduce_op_name(options_.op));
  CPF_CHECK(options_.bucket_bytes > 0, where, ": bucket_bytes must be positive, got ", options_.bucket_bytes);
  std::unordered_map<TensorImpl*, size_t> seen;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    CPF_CHECK(p.defined(), where, ": parameter ", i, " is an undefined tensor");
    CPF_CHECK(p.is_leaf() && p.requires_grad(), where, ": parameter ", i, " of shape ", p.shape(),
              " must be a leaf that requires grad (only leaves get gradients)");
    CPF_CHECK(is_floating(p.dtype()), where, ": parameter ", i, " is ", p.dtype(), "; gradients are f32, f64 or bf16");
    CPF_CHECK(p.device() == params_[0].device(), where, ": parameter ", i, " is on ", p.device(),
              " but parameter 0 is on ", params_[0].device(), "; every parameter must be on this rank's device");
    const auto [it, inserted] = seen.emplace(p.impl(), i);
    CPF_CHECK(inserted, where, ": parameters ", it->second, " and ", i, " are the same tensor; pass each once");
  }
  plan_ = options_.buckets.empty() ? plan_gradient_buckets(params_, options_.bucket_bytes)
                                   : plan_explicit_buckets(params_, options_.buckets);
  slots_.resize(params_.size());
  state_.resize(plan_.size());
  for (size_t b = 0; b < plan_.size(); ++b) {
    const GradientBucketPlan& bucket = plan_[b];
    for (size_t k = 0; k < bucket.params.size(); ++k) slots_[bucket.params[k]] = Slot{b, bucket.offsets[k]};
    const Device device = params_[0].device();
    if (options_.shard_gradients) {
      // The flat buffer exists only from the bucket's first gradient to its reduce-scatter (ensure_buffer):
      // a rank keeps its reduced shards, 1/W of the gradients, between steps.
      const int64_t padded = padded_bucket_numel(bucket.numel, group_->size());
      state_[b].shard = empty({padded / group_->size()}, {.dtype = bucket.dtype, .device = device});  // (padded / W,)
    } else {
      state_[b].buffer = empty({bucket.numel}, {.dtype = bucket.dtype, .device = device});  // (numel,)
    }
  }
  ready_.assign(params_.size(), false);
  reset_step();
  check_same_layout_on_every_rank();
  hooks_.reserve(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    hooks_.push_back(autograd::add_grad_ready_hook(params_[i], [this, i](const Tensor&) { on_gradient_ready(i); }));
  }
}

GradientReducer::~GradientReducer() = default;

void GradientReducer::check_same_layout_on_every_rank() const {
  Fingerprint layout;
  int64_t elements = 0;
  for (const GradientBucketPlan& bucket : plan_) {
    layout.add(static_cast<int64_t>(bucket.dtype));
    layout.add(bucket.numel);
    for (size_t i : bucket.params) {
      layout.add(static_cast<int64_t>(i));
      for (int64_t size : params_[i].shape()) layout.add(size);
      layout.add(-1);  // ends the shape
    }
    elements += bucket.numel;
  }
  const std::vector<int64_t> mine = {static_cast<int64_t>(params_.size()), static_cast<int64_t>(plan_.size()), elements,
                                     std::bit_cast<int64_t>(layout.value), static_cast<int64_t>(options_.op)};
  const Tensor local = raw::to(from_vector<int64_t>(mine, {kFields}), params_[0].device());  // (kFields,)
  const std::vector<int64_t> all = group_->all_gather(local, 0).to_vector<int64_t>();        // (n * kFields,)
  for (int r = 0; r < group_->size(); ++r) {
    const int64_t* theirs = all.data() + static_cast<size_t>(r) * kFields;
    if (std::equal(mine.begin(), mine.end(), theirs)) continue;
    CPF_CHECK(false, "GradientReducer on ", group_->describe(), ": ranks disagree on the parameters: rank ",
              group_->rank(), " has ", mine[kParams], " parameters in ", mine[kBuckets], " buckets (", mine[kElements],
              " elements, op ", reduce_op_name(ReduceOp(mine[kOp])), ") but rank ", r, " has ", theirs[kParams],
              " parameters in ", theirs[kBuckets], " buckets (", theirs[kElements], " elements, op ",
              reduce_op_name(ReduceOp(theirs[kOp])), ")",
              mine[kLayout] != theirs[kLayout] ? ", and their shapes, dtypes or bucket layout differ" : "",
              "; every rank must pass the same parameters (same order, shapes and dtypes) with the same options");
  }
}

Tensor GradientReducer::slice(size_t index) const {
  const Slot& slot = slots_[index];
  const Tensor& p = params_[index];
  return raw::view(raw::narrow(state_[slot.bucket].buffer, 0, slot.offset, p.numel()), p.shape());
}

std::string GradientReducer::describe_bucket(size_t bucket) const {
  const GradientBucketPlan& plan = plan_[bucket];
  std::vector<int64_t> members(plan.params.begin(), plan.params.end());
  return str_cat("GradientReducer: bucket ", bucket, " of ", plan_.size(), " (", plan.dtype, ", ", plan.numel,
                 " elements, parameters ", members, ") on ", group_->describe());
}

void GradientReducer::ensure_buffer(size_t bucket) {
  BucketState& s = state_[bucket];
  if (s.buffer.defined()) return;
  // Zeros: the padding is never written and must add nothing to the last rank's shard.
  const int64_t padded = padded_bucket_numel(plan_[bucket].numel, group_->size());
  s.buffer = zeros({padded}, {.dtype = plan_[bucket].dtype, .device = params_[0].device()});  // (padded,)
}

void GradientReducer::copy_into_bucket(size_t index) {
  const Tensor& p = params_[index];
  ensure_buffer(slots_[index].bucket);
  const Tensor grad = p.grad();
  const Tensor dst = slice(index);
  if (!grad.defined()) {
    raw::zero_(dst);  // no gradient on this rank: contributes zeros
    return;
  }
  CPF_CHECK(grad.shape() == p.shape() && grad.dtype() == p.dtype() && grad.device() == p.device(),
            "GradientReducer on ", group_->describe(), ": parameter ", index, " (", p.shape(), " ", p.dtype(), " on ",
            p.device(), ") has a gradient of ", grad.shape(), " ", grad.dtype(), " on ", grad.device(),
            "; a gradient must match its parameter");
  raw::copy_(dst, grad);
  // Sharded: the bucket holds it now, and only its reduced shard is kept (finish() writes nothing back).
  if (options_.shard_gradients) p.set_grad(Tensor());
}

void GradientReducer::on_gradient_ready(size_t index) {
  if (!sync_) return;  // a micro-batch before the last: the gradient just accumulates
  CPF_CHECK(!ready_[index], "GradientReducer on ", group_->describe(), ": parameter ", index, " of shape ",
            params_[index].shape(),
            " received a second gradient before finish() (two backward calls in one step?); call finish() after "
            "every backward");
  copy_into_bucket(index);
  ready_[index] = true;
  ++num_ready_;
  if (--state_[slots_[index].bucket].pending == 0 && options_.start_in_backward) start_ready_buckets();
}

void GradientReducer::start_ready_buckets() {
  while (next_to_start_ < plan_.size() && state_[next_to_start_].pending == 0) start(next_to_start_++);
}

void GradientReducer::start(size_t bucket) {
  BucketState& s = state_[bucket];
  s.work = options_.shard_gradients ? group_->reduce_scatter_async(s.buffer, 0, options_.op, s.shard)
                                    : group_->all_reduce_async(s.buffer, options_.op, s.buffer);
  // Sharded: the operation holds its input until it is done; the whole bucket is not needed after it.
  if (options_.shard_gradients) s.buffer = Tensor();
}

void GradientReducer::finish() {
  CPF_CHECK(num_ready_ > 0, "GradientReducer::finish on ", group_->describe(),
            ": no parameter received a gradient since the last finish(); call backward(loss) first (on every rank, "
            "with the parameters in its graph)");
  started_in_backward_ = next_to_start_;
  // What backward did not start: parameters it never reached contribute their current gradient
  // (zeros when they have none), so every rank still runs every bucket in the same order.
  for (size_t b = next_to_start_; b < plan_.size(); ++b) {
    for (size_t i : plan_[b].params) {
      if (ready_[i]) continue;
      try {
        copy_into_bucket(i);
      } catch (...) {
        reset_step();
        throw;
      }
    }
    start(b);
  }
  next_to_start_ = plan_.size();
  for (size_t b = 0; b < plan_.size(); ++b) {
    try {
      state_[b].work->wait();
    } catch (const Error& e) {
      reset_step();
      throw Error(e.file(), e.line(), e.condition(), describe_bucket(b) + ": " + e.message());
    }
    if (options_.shard_gradients) continue;  // the shard is the result (shard(b))
    for (size_t i : plan_[b].params) {
      const Tensor reduced = slice(i);
      const Tensor grad = params_[i].grad();
      if (grad.defined()) {
        raw::copy_(grad, reduced);
      } else {
        params_[i].set_grad(raw::clone(reduced));
      }
    }
  }
  reset_step();
}

const Tensor& GradientReducer::shard(size_t bucket) const {
  CPF_CHECK(options_.shard_gradients, "GradientReducer::shard: the reducer all-reduces (shard_gradients is off)");
  CPF_CHECK(bucket < plan_.size(), "GradientReducer::shard: bucket ", bucket, " of ", plan_.size());
  return state_[bucket].shard;
}

void GradientReducer::reset_step() {
  std::fill(ready_.begin(), ready_.end(), false);
  num_ready_ = 0;
  next_to_start_ = 0;
  for (size_t b = 0; b < plan_.size(); ++b) {
    state_[b].pending = plan_[b].params.size();
    state_[b].work = nullptr;
    if (options_.shard_gradients) state_[b].buffer = Tensor();
  }
}

}  // namespace cpf::dist
