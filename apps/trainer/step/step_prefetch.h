#pragma once
// A world of several ranks (DP and/or CP): what a step needs from the other ranks before its forward,
// agreed one step ahead, so the step's host waits only at its StepReadback event (docs/training.md, "Host
// synchronisation in a step").
//
// A step's loss is divided by the valid labels of the whole world (grad_accumulation.h), an all-reduce;
// and before each step the ranks agree whether a stop signal arrived (stop_signals.h), another one. Read
// with item() before the step, each drains the GPU: the host waits for the previous step's optimizer
// kernels and the device idles while the forward is launched. Instead step s, once its backward is
// enqueued, reads step s+1's micro-batches from the loader, enqueues the all-reduces of their label
// count and of this rank's stop flag, and the step's StepReadback returns both with its loss and norm.
//
// The loader's cursor is put back after the read-ahead, so between steps it still names the next
// unconsumed batch (what a checkpoint saves and a resume sets). The next step takes the read-ahead only
// while the cursor stands where the read-ahead began, and then moves it past those batches; otherwise (the
// first step of a session, a cursor set in between, a step that threw) it reads them again and counts
// them with a blocking all-reduce, as without the read-ahead. Losses, gradients and parameters are those
// of the step without it, bit for bit: the same batches and the same count (summed in f64, exact for
// integers below 2^53).
#include <cstdint>
#include <optional>
#include <vector>

#include "apps/trainer/step/training_step.h"
#include "models/data/data_loader.h"

namespace cpf::trainer {

class StepPrefetch {
 public:
  // This rank's stop flag (pending_stop_signal() in the trainer; tests give each rank its own).
  using SignalSource = int (*)();
  explicit StepPrefetch(SignalSource stop_signal);

  struct Taken {
    std::vector<models::data::Batch> micro_batches;  // this rank's, in loader order
    std::optional<int64_t> valid_labels;             // the world's labels of the step; nullopt: not read ahead
  };
  // The `accum_steps` micro-batches of this step, leaving the loader's cursor past them: the read-ahead
  // when it is still valid (its count known), otherwise read now.
  Taken take(models::data::DataLoader& loader, int64_t accum_steps);

  // In step s, after its backward is enqueued: reads step s+1's micro-batches, puts the cursor back, and
  // enqueues the all-reduces (every rank calls it). Returns two () f64 tensors on `device` for the step's
  // read-back: the world's sum of the next step's valid labels and the largest stop signal of any rank.
  std::vector<Tensor> read_ahead(models::data::DataLoader& loader, int64_t accum_steps, const RankGroups& g,
                                 Device device);
  // The two values of read_ahead's tensors, read at the step's event.
  void complete(double world_labels, double stop_signal);

  // The stop signal the ranks agreed on in the step completed last, once; nullopt when no step completed
  // since the previous call (the caller then agrees with a blocking all-reduce).
  std::optional<int> take_agreed_stop_signal();

 private:
  struct Ahead {
    models::data::DataCursor from, to;  // the loader's cursor before and after the read-ahead
    std::vector<models::data::Batch> micro_batches;
    int64_t cp_size = 1;  // every CP rank of a DP group counts its whole batch
    std::optional<int64_t> valid_labels;
  };
  SignalSource stop_signal_;
  std::optional<Ahead> ahead_;
  bool pending_ = false;  // read_ahead enqueued, complete not yet called
  std::optional<int> agreed_signal_;
};

}  // namespace cpf::trainer
