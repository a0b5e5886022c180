#pragma once
// Data parallel: the gradient all-reduce in buckets, started during backward (as PyTorch DDP).
//
//   dist::GradientReducer reducer(params, dp_group);   // once, after the model is built
//   for (each step) {
//     backward(loss);       // a bucket's all_reduce starts as soon as its last gradient is complete
//     reducer.finish();     // waits for every bucket, writes the reduced gradients back
//     optimizer.step();
//     optimizer.zero_grad();
//   }
//
// Buckets: the parameters, taken in reverse registration order (the last layers' gradients are
// complete first in backward), are packed into flat buckets of one dtype each, closed once they hold
// at least bucket_bytes (a larger parameter fills a bucket alone). Each parameter has a
// gradient-ready hook (framework/autograd/grad_ready_hook.h): it copies the gradient into its slice
// of the bucket; when the bucket's last slice is filled, the bucket is all-reduced asynchronously
// (all_reduce_async in place). Buckets start strictly in bucket order, so every rank issues the same
// collectives in the same order even if gradients complete in a different order; a bucket that is
// complete waits for the buckets before it.
//
// finish() starts what backward did not (buckets holding a parameter that got no gradient), waits
// for every bucket in order and copies the results into param.grad(): into the existing gradient
// tensor when there is one, else into a new one. A parameter that got no gradient on a rank in this
// step (backward never reached it, or reached it without a gradient) contributes its current .grad
// to the reduction, zeros when it has none (the case after zero_grad). So after finish() every
// parameter has a defined gradient, the same on every rank: zeros when no rank produced one (unlike
// all_reduce_gradients, which leaves such gradients undefined, an optimizer then sees a zero
// gradient: AdamW still decays the weight and moves it by its momentum). A bucket holding a
// parameter that backward never reached only starts in finish(), together with every later bucket.
//
// Results: the same as all_reduce_gradients(params, group, op) for every parameter that has a
// gradient; on the thread backend bit for bit (its all-reduce combines each element over the ranks
// in rank order, whatever the bucket layout). On NCCL the work is ordered with streams only:
// the copies into a bucket run on the current stream, the all-reduce waits for them on the group's
// communication stream, and finish() makes the current stream wait for it (no host block); the
// reduced sum can differ from one all-reduce of everything in the last bits (NCCL's reduction order
// depends on the message size).
//
// Rules: every rank builds its reducer from the same parameter list (checked at construction with
// a small all_gather: a different list is an error on every rank, not a hang), calls backward and
// finish() once per step at the same point, and runs the same model, so buckets start at the same
// point relative to other collectives (context-parallel attention's backward ones). backward and
// finish() run on the same thread (the hooks touch the reducer without locks). A parameter that
// receives a gradient twice before finish() (two backward calls) is an error: call finish() after
// each backward (or turn sync off for the micro-batches before the last: set_sync). Destroying the
// reducer removes its hooks (later backward calls reduce nothing).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "framework/autograd/grad_ready_hook.h"
#include "framework/distributed/process_group.h"
#include "framework/tensor/tensor.h"

namespace cpf::dist {

struct GradientReducerOptions {
  // A bucket is closed once it holds at least this many bytes; PyTorch DDP's default.
  int64_t bucket_bytes = int64_t{25} << 20;
  // sum or avg (avg: the mean over the group's ranks).
  ReduceOp op = ReduceOp::avg;
  // false: buckets start in finish() only (no overlap; for a model whose ranks cannot guarantee the
  // same order of gradient completion relative to other collectives in backward).
  bool start_in_backward = true;
  // Sharded gradients (ZeRO-2, zero_shards.h): each bucket, padded to a multiple of the group's size, is
  // reduce-scattered instead of all-reduced, so rank r receives only elements [r s, (r + 1) s) of it
  // (shard()); a parameter's gradient is dropped once it is in its bucket, and finish() writes none back.
  // The flat bucket lives from its first gradient to its reduce-scatter only, so between steps a rank
  // holds 1/W of the gradients.
  bool shard_gradients = false;
  // Explicit buckets (ZeRO-3: one per unit of parameters gathered together, zero_shards.h): indices into
  // the parameter list, each listed once, one dtype per bucket, in the order the backward completes them.
  // Empty: the size-capped layout of plan_gradient_buckets.
  std::vector<std::vector<size_t>> buckets;
};

// One bucket: parameters (indices into the reducer's list) of one dtype laid out back to back.
struct GradientBucketPlan {
  DType dtype = DType::f32;
  std::vector<size_t> params;    // in bucket order (reverse registration order)
  std::vector<int64_t> offsets;  // element offset of each parameter in the bucket
  int64_t numel = 0;
};

// The bucket layout GradientReducer uses: parameters in reverse order, one open bucket per dtype,
// closed when it reaches bucket_bytes; buckets ordered by when they were opened.
std::vector<GradientBucketPlan> plan_gradient_buckets(const std::vector<Tensor>& params, int64_t bucket_bytes);
// The layout of explicit buckets (GradientReducerOptions::buckets): each parameter in exactly one, one dtype
// per bucket; throws naming a parameter listed twice or never, or a bucket mixing dtypes.
std::vector<GradientBucketPlan> plan_explicit_buckets(const std::vector<Tensor>& params,
                                                      const std::vector<std::vector<size_t>>& buckets);

// A bucket of `numel` elements padded to a multiple of `world` (what a sharded bucket's buffer holds).
int64_t padded_bucket_numel(int64_t numel, int world);

class GradientReducer {
 public:
  // params: leaves that require grad, all on one device (the group's), floating dtypes, no
  // duplicates. Collective over `group` (the layout check).
  GradientReducer(std::vector<Tensor> params, ProcessGroupPtr group, GradientReducerOptions options = {});
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Waits for every bucket and writes the reduced gradients into the parameters' .grad. Call after
  // backward, before clipping and the optimizer step. Errors (a timed-out or aborted all_reduce)
  // name the bucket, its parameters and the group.
  void finish();

  // Gradient accumulation: with sync off, backward only accumulates into .grad (no hook work, no
  // communication; for the micro-batches before the last). Turn it back on before the last
  // micro-batch's backward: its hooks then send the accumulated gradients. Same value on every rank.
  void set_sync(bool sync) { sync_ = sync; }
  bool sync() const { return sync_; }

  const std::vector<GradientBucketPlan>& buckets() const { return plan_; }
  // shard_gradients: this rank's reduced shard of bucket b after finish(), (padded numel / group size,).
  const Tensor& shard(size_t bucket) const;
  // Buckets of the current step started so far (during backward, before finish()).
  size_t buckets_started() const { return next_to_start_; }
  // Of the last finish(): how many buckets had started before it was called (from backward).
  size_t buckets_started_in_backward() const { return started_in_backward_; }

 private:
  struct Slot {
    size_t bucket = 0;
    int64_t offset = 0;
  };
  struct BucketState {
    Tensor buffer;  // (numel,) of the bucket's dtype, on the parameters' device; sharded: (padded,), per step
    Tensor shard;   // shard_gradients: (padded numel / group size,), this rank's reduced part
    size_t pending = 0;
    WorkPtr work;
  };

  void on_gradient_ready(size_t index);
  void ensure_buffer(size_t bucket);    // shard_gradients: the bucket's flat buffer, allocated per step
  void copy_into_bucket(size_t index);  // the current .grad, or zeros
  void start_ready_buckets();
  void start(size_t bucket);
  Tensor slice(size_t index) const;  // the parameter's slice of its bucket, in its shape
  std::string describe_bucket(size_t bucket) const;
  void check_same_layout_on_every_rank() const;
  void reset_step();

  std::vector<Tensor> params_;
  ProcessGroupPtr group_;
  GradientReducerOptions options_;
  std::vector<GradientBucketPlan> plan_;
  std::vector<Slot> slots_;  // per parameter
  std::vector<BucketState> state_;
  std::vector<bool> ready_;  // per parameter, this step
  size_t num_ready_ = 0;
  size_t next_to_start_ = 0;
  size_t started_in_backward_ = 0;
  bool sync_ = true;
  // Last: removed first on destruction, before the state the hooks touch.
  std::vector<autograd::GradHookHandle> hooks_;
};

}  // namespace cpf::dist
