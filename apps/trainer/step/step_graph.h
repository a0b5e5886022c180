#pragma once
// CUDA-graph capture of a training step's forward and backward (docs/training.md, "CUDA graphs").
//
// On one GPU the forward and backward of a step's micro-batches launch about a thousand kernels, each
// with its host work (autograd, plan look-ups, argument packing). With run.cuda_graph on (the default) the
// first step runs eagerly (it fills the caches, picks the cuDNN and cuBLASLt plans, learns which weights
// get bf16 copies), the second is captured into one graph (framework/tensor/device_graph.h) and launched,
// and every later step copies its batch into the graph's input buffers and replays it: one launch.
//
//   step 1: eager            step 2: capture + launch          step 3, 4, ...: refill inputs, replay
//   optimizer phase (norm, clip, AdamW, read-back): eager after each, as without graphs
//
// The optimizer phase stays outside: its learning rate and step count change every step and would be
// frozen in a graph, and it is a handful of launches. The gradients a replay writes are handed to the
// parameters' .grad, so the optimizer, clipping and checkpoints see what an eager step gives, bit for bit.
//
// A graph freezes the batch's shape and its sequence layout (the attention tables). The loss's divisor, the
// step's valid-label count, is read from a device scalar the replays refill (the fused classifier's
// normalizer_tensor), so batches with ignored labels replay too. A step whose batch differs in shape or
// layout runs eagerly, and the graph ends there with the reason logged; so does a capture that fails. Runs the graph
// cannot serve at all are named by unsupported_reason before the first step.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "apps/config/config.h"
#include "apps/trainer/step/grad_accumulation.h"
#include "apps/trainer/step/training_step.h"
#include "framework/tensor/device_graph.h"
#include "models/gpt_input.h"

namespace cpf::trainer {

class StepGraph {
 public:
  using Note = std::function<void(const std::string&)>;

  // Why the steps of this run cannot be captured (naming the config keys and values), or nullopt.
  static std::optional<std::string> unsupported_reason(const TrainConfig& config, Device device);

  // `note` receives the lines the run logs (the capture, and why the graph ended).
  explicit StepGraph(Note note) : note_(std::move(note)) {}
  // The graph goes first (it waits for its replays): the inputs and the divisor it reads are freed after it.
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Step `step`'s (0-based) forward and backward of `micro_batches` on one rank, with accumulate_gradients'
  // result and effects (gradients in the parameters' .grad, the loss left on the device).
  AccumulatedLoss accumulate(const models::GPT& model, const std::vector<models::data::Batch>& micro_batches,
                             const RankGroups& groups, const optim::NamedTensors& params, int64_t step);

  bool captured() const { return graph_.defined(); }
  int64_t replays() const { return replays_; }
  // Why the graph ended ("" while it serves, or before the capture).
  const std::string& ended_reason() const { return ended_reason_; }

 private:
  // nullopt when the capture failed (the graph has ended; the caller runs the step eagerly).
  std::optional<AccumulatedLoss> capture_and_launch(const models::GPT& model, const std::vector<models::GPTBatch>& host,
                                                    const optim::NamedTensors& params, int64_t step);
  AccumulatedLoss replay(const std::vector<models::GPTBatch>& host, const optim::NamedTensors& params);
  // Ends the graph (its memory goes back once the device is idle); later steps run eagerly.
  void end(const std::string& reason, int64_t step);

  Note note_;
  int64_t eager_steps_ = 0;
  DeviceGraph graph_;
  std::vector<models::GPTBatch> inputs_;    // the graph's inputs on the device, refilled before each replay
  std::vector<models::GPTBatch> captured_;  // the captured batches on the host: what a batch must match
  int64_t valid_labels_ = 0;                // of the step being run
  bool count_frozen_ = false;               // the unfused loss: the count is a kernel argument of the graph
  Tensor divisor_;                          // () f64: the loss's divisor, refilled before each replay
  Tensor loss_;                             // () the graph's loss output
  std::vector<Tensor> grads_;               // the graph's gradient outputs, one per parameter (or undefined)
  int64_t replays_ = 0;
  std::string ended_reason_;
};

}  // namespace cpf::trainer
