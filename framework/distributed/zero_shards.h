#pragma once
// Sharded training state over a group (ZeRO, "the distributed optimizer"): each rank keeps the optimizer
// state of 1/W of every parameter and updates only that part; the updated parts are then all-gathered so
// every rank holds the whole model again for the next forward.
//
//   ZeroShards shards(params, reducer.buckets(), world, ShardStage::optimizer);
//   AdamW optimizer(shards.piece_groups(weight_decay_groups(params, ...)), options);   // pieces only
//   each step:
//     backward(loss); reducer.finish();   // stage optimizer: all-reduce; stage gradients: reduce-scatter
//     shards.take_gradients(reducer);     // each piece's gradient: a view of the reduced values it owns
//     Tensor sum = shards.grad_sum_squares();        // the world's, for clipping and the skip decision
//     optimizer.step(sum);                 // updates the pieces, which are views of the parameters
//     shards.gather_parameters();          // every parameter whole again on every rank
//
// The layout follows the gradient reducer's buckets (grad_reducer.h): bucket b (padded to a multiple of
// W elements) is split evenly, rank r owning elements [r s_b, (r + 1) s_b). A piece is the part of one
// parameter inside this rank's range of one bucket: a 1-D leaf that views the parameter's storage (no
// copy of the weights), named "<parameter>[<begin>:<end>]" (flattened element range). The optimizer
// sees only pieces, so its moments take 8 N / W bytes instead of 8 N.
//
// Stages (parallel.shard): optimizer (ZeRO-1) keeps the all-reduce and slices the reduced gradients;
// gradients (ZeRO-2) reduce-scatters each bucket so a rank receives only its shard, and drops the
// parameters' full gradients once they are in their bucket. parameters (ZeRO-3, FSDP) also shards the
// weights: the pieces are this rank's own f32 copies (the master weights, 4 N / W bytes), every parameter's
// whole storage is released, and the buckets are units of parameters used together (a block; the model's
// root: embeddings, final norm, head). A unit is whole only between acquire and release
// (nn::ParameterUnits, which this class implements): acquire all-gathers its bucket from the pieces into
// one fresh buffer the unit's parameters then view, and starts the gather of the next unit the caller
// names (asynchronous: on NCCL it runs on the communication stream, overlapping the current unit's
// compute); release drops the buffer. The model calls them around each block's forward and its recompute
// in the backward (model.recompute must cover every block: a graph that saved a whole weight for the
// backward would keep it); the gradients are reduce-scattered per unit as in stage gradients.
//
// Exactness: the reduced gradients equal the replicated run's element by element on the thread backend
// (both reductions combine ranks in rank order), AdamW and SGD are element-wise, so the parameters equal
// the replicated run's bit for bit when nothing depends on the global norm; the norm is summed per piece
// and then over ranks (another order), so clipping agrees to rounding.
//
// Checkpoints stay logical: full_state() all-gathers the state into the parameters' shapes under the
// names a replicated optimizer uses, and load_full_state() takes such tensors, so a checkpoint resumes at
// another world size or stage (io/checkpoint.h is unchanged).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "framework/distributed/grad_reducer.h"
#include "framework/distributed/process_group.h"
#include "framework/nn/parameter_units.h"
#include "framework/optim/optimizer.h"

namespace cpf::dist {

enum class ShardStage { none, optimizer, gradients, parameters };

// "none", "optimizer", "gradients", "parameters"
std::string shard_stage_name(ShardStage stage);

// One piece: elements [param_begin, param_begin + numel) of parameter `param` (flattened), which sit at
// `shard_offset` of this rank's shard of bucket `bucket`.
struct ShardPiece {
  size_t param = 0;
  size_t bucket = 0;
  int64_t param_begin = 0;
  int64_t shard_offset = 0;
  int64_t numel = 0;
};

// This rank's pieces of `plan` over `params` (their element counts), in bucket order.
std::vector<ShardPiece> plan_shard_pieces(const std::vector<GradientBucketPlan>& plan,
                                          const std::vector<int64_t>& param_numels, int rank, int world);

class ZeroShards final : public nn::ParameterUnits {
 public:
  // params: the model's (name, parameter) list in the reducer's order; plan: reducer.buckets();
  // group: the reducer's group (the whole DP x CP world). Stage optimizer, gradients or parameters.
  // unit_buckets (stage parameters only): unit u of the model is bucket unit_buckets[u]; every bucket is
  // one unit. Stage parameters releases every parameter's storage before it returns.
  ZeroShards(optim::NamedTensors params, std::vector<GradientBucketPlan> plan, ProcessGroupPtr group, ShardStage stage,
             std::vector<size_t> unit_buckets = {});
  ~ZeroShards() override;

  ShardStage stage() const { return stage_; }
  // The pieces as (name, leaf) for the optimizer.
  const optim::NamedTensors& pieces() const { return pieces_; }
  // `groups` (over the parameters, weight_decay_groups) mapped to the pieces: a piece inherits its
  // parameter's group. Groups without a piece on this rank are kept empty-free (left out).
  std::vector<optim::ParamGroup> piece_groups(const std::vector<optim::ParamGroup>& groups) const;

  // After reducer.finish(): each piece's gradient. Stage optimizer: a view of its parameter's reduced
  // .grad; stage gradients: a view of the reducer's shard of its bucket (the parameters' gradients
  // were dropped).
  void take_gradients(const GradientReducer& reducer);
  // (1) f64 on the pieces' device: the sum of squares of every gradient of the world (each rank's pieces,
  // all-reduced over the group). Collective.
  Tensor grad_sum_squares() const;
  // Every parameter whole on every rank from the pieces' owners (an all-gather per bucket). Collective.
  // Stage parameters: nothing (a unit is gathered when acquired).
  void gather_parameters();

  // ---- stage parameters (nn::ParameterUnits; collectives, called in the same order on every rank) ----
  void acquire(size_t unit, std::optional<size_t> next) const override;
  void release(size_t unit) const override;
  // Every unit released (after a step's backward, after an evaluation). Any stage; a no-op but for parameters.
  void release_all() const;
  // Every unit whole and pinned until release_all (release(u) does nothing meanwhile, so code that acquires
  // and releases a different number of times per rank, as a per-rank evaluation does, issues no collective):
  // for what reads or writes whole parameters (checkpoints, init_from, generation).
  void acquire_all() const;
  // Stage parameters: the pieces take their values from the whole parameters (after a load wrote them while
  // acquire_all held them), then every unit is released.
  void adopt_parameters();
  // After the pieces were written in place (io::load_checkpoint_pieces: a resume that reads only this
  // rank's part): every parameter whole again from them. Stages optimizer and gradients: an all-gather
  // (gather_parameters); parameters: every unit released, so the next acquire gathers the new values.
  // Collective.
  void pieces_loaded();
  // Drops the pieces' and the parameters' gradients.
  void zero_grad();

  // The optimizer's state in the parameters' shapes, named as a replicated optimizer names it
  // ("exp_avg.<parameter>"), on every rank. `optimizer` is the one over pieces(). Collective.
  optim::NamedTensors full_state(const optim::Optimizer& optimizer) const;
  // Copies this rank's part of `full` (names and shapes as full_state returns) into `optimizer`'s state
  // and sets its step count (Optimizer::load_state). Throws naming a missing or misshapen tensor.
  void load_full_state(optim::Optimizer& optimizer, const optim::NamedTensors& full, int64_t step_count) const;

  // The number of ranks the state is sharded over.
  int world() const { return group_->size(); }

 private:
  // (s,) this rank's shard of bucket `bucket` packed from one value per piece (zeros in the padding).
  Tensor pack_shard(size_t bucket, const std::vector<Tensor>& piece_values) const;
  // (padded,) the whole bucket: every rank's pack_shard all-gathered. Collective.
  Tensor gather_bucket(size_t bucket, const std::vector<Tensor>& piece_values) const;

  // Stage parameters: a bucket's gather, in flight (work) or done (the parameters view `buffer`).
  struct UnitGather {
    Tensor shard;   // (s,) this rank's pieces packed: the all-gather's input, kept until it is done
    Tensor buffer;  // (padded,) the whole bucket
    WorkPtr work;   // set while in flight
    bool held = false;
  };
  void check_unit_buckets() const;
  size_t unit_bucket(size_t unit) const;
  // The sum of this rank's pieces' versions: what a gathered or released parameter's storage carries, so
  // it changes exactly when the optimizer (or a load) wrote the pieces.
  uint64_t pieces_version() const;
  void start_gather(size_t bucket) const;
  void finish_gather(size_t bucket) const;
  void release_bucket(size_t bucket) const;
  // Points parameter i at `storage` from element `offset` on (its shape and strides unchanged).
  void point_parameter(size_t i, const std::shared_ptr<Storage>& storage, int64_t offset) const;

  optim::NamedTensors params_;
  std::vector<GradientBucketPlan> plan_;
  ProcessGroupPtr group_;
  ShardStage stage_;
  std::vector<ShardPiece> layout_;
  optim::NamedTensors pieces_;
  std::vector<size_t> unit_buckets_;
  mutable std::vector<UnitGather> gathers_;  // per bucket (stage parameters)
  mutable bool pinned_ = false;              // acquire_all holds every unit
};

}  // namespace cpf::dist
