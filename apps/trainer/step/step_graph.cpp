#include "apps/trainer/step/step_graph.h"

#include <algorithm>

#include "framework/autograd/ops.h"
#include "framework/tensor/ops/copy.h"
#include "models/data/cp_shard.h"

namespace cpf::trainer {
namespace {

// The micro-batches as model input on the host (one rank: the whole batch is its shard).
std::vector<models::GPTBatch> host_batches(const std::vector<models::data::Batch>& micro_batches) {
  std::vector<models::GPTBatch> out;
  out.reserve(micro_batches.size());
  for (const models::data::Batch& b : micro_batches)
    out.push_back(models::make_gpt_batch(models::data::shard_for_rank(b, 1, 0)));
  return out;
}

bool same_sequences(const SequenceInfo& a, const SequenceInfo& b) {
  return a.cu_seqlens_q == b.cu_seqlens_q && a.cu_seqlens_kv == b.cu_seqlens_kv &&
         a.cu_seqlens_q_padded == b.cu_seqlens_q_padded && a.cu_seqlens_kv_padded == b.cu_seqlens_kv_padded &&
         a.max_seqlen_q == b.max_seqlen_q && a.max_seqlen_kv == b.max_seqlen_kv && a.q_positions == b.q_positions &&
         a.kv_positions == b.kv_positions;
}

// What a batch changes of the captured one's frozen values, or "". count_frozen: the valid-label count is
// a kernel argument (the unfused loss), not read from the graph's divisor buffer.
std::string change_of(const std::vector<models::GPTBatch>& now, const std::vector<models::GPTBatch>& captured,
                      bool count_frozen) {
  if (now.size() != captured.size()) {
    return "its micro-batches went from " + std::to_string(captured.size()) + " to " + std::to_string(now.size());
  }
  for (size_t i = 0; i < now.size(); ++i) {
    const models::GPTBatch& a = now[i];
    const models::GPTBatch& b = captured[i];
    const std::string which = now.size() > 1 ? " (micro-batch " + std::to_string(i) + ")" : "";
    if (a.input.tokens.numel() != b.input.tokens.numel()) {
      return "its tokens went from " + std::to_string(b.input.tokens.numel()) + " to " +
             std::to_string(a.input.tokens.numel()) + which;
    }
    if (count_frozen && a.num_valid_labels != b.num_valid_labels) {
      return "its valid labels (the loss's divisor) went from " + std::to_string(b.num_valid_labels) + " to " +
             std::to_string(a.num_valid_labels) + which;
    }
    if (!same_sequences(a.input.seq, b.input.seq)) return "its sequence layout (where documents start) changed" + which;
  }
  return "";
}

// The captured work: accumulate_gradients' forwards and backwards on one rank, over device batches that
// stay in place. Returns the step's summed loss, () on the device.
// divisor: undefined, or the normalizer as a () f64 device tensor the loss reads (refilled before each replay).
Tensor forward_backward(const models::GPT& model, const std::vector<models::GPTBatch>& batches, int64_t normalizer,
                        const Tensor& divisor) {
  Tensor step_loss;
  for (const models::GPTBatch& b : batches) {
    const Tensor loss = model.forward_loss(b.input, b.labels, normalizer, b.num_valid_labels, nullptr, divisor);
    backward(loss);
    step_loss = step_loss.defined() ? add(step_loss, loss.detach()) : loss.detach();
  }
  return step_loss;
}

int64_t valid_labels_of(const std::vector<models::GPTBatch>& batches) {
  int64_t n = 0;
  for (const models::GPTBatch& b : batches) n += b.num_valid_labels;
  return n;
}

}  // namespace

std::optional<std::string> StepGraph::unsupported_reason(const TrainConfig& c, Device device) {
  if (!c.run.cuda_graph) return "run.cuda_graph=false";
  if (c.parallel.dp * c.parallel.cp > 1) {
    return "parallel.dp=" + std::to_string(c.parallel.dp) + " x parallel.cp=" + std::to_string(c.parallel.cp) +
           " ranks: steps of several ranks run eagerly (their collectives and label counts are not captured)";
  }
  if (c.run.profile > 0) {
    return "run.profile=" + std::to_string(c.run.profile) + ": the profiler times every op with events of its own";
  }
  if (!DeviceGraph::supported(device)) return "the device is " + device.str() + " (CUDA graphs need a GPU)";
  return std::nullopt;
}

AccumulatedLoss StepGraph::accumulate(const models::GPT& model, const std::vector<models::data::Batch>& micro_batches,
                                      const RankGroups& groups, const optim::NamedTensors& params, int64_t step) {
  CPF_CHECK(!groups.world || groups.world->size() == 1, "StepGraph: a step of ", groups.world->size(),
            " ranks cannot be captured");
  if (!ended_reason_.empty()) return accumulate_gradients(model, micro_batches, groups, nullptr, false);
  const std::vector<models::GPTBatch> host = host_batches(micro_batches);
  if (!graph_.defined()) {
    // The first step fills the caches and plans and learns which weights get compute copies.
    if (eager_steps_++ == 0) return accumulate_gradients(model, micro_batches, groups, nullptr, false);
    if (auto launched = capture_and_launch(model, host, params, step)) return *launched;
    return accumulate_gradients(model, micro_batches, groups, nullptr, false);  // the capture failed
  }
  if (const std::string change = change_of(host, captured_, count_frozen_); !change.empty()) {
    end("step " + std::to_string(step + 1) + "'s batch differs from the captured one: " + change, step);
    return accumulate_gradients(model, micro_batches, groups, nullptr, false);
  }
  return replay(host, params);
}

std::optional<AccumulatedLoss> StepGraph::capture_and_launch(const models::GPT& model,
                                                             const std::vector<models::GPTBatch>& host,
                                                             const optim::NamedTensors& params, int64_t step) {
  // A gradient held now would be added to in place (AccumulateGrad) by every replay, on top of what the
  // previous replays left there: the trainer drops them after each step (Optimizer::zero_grad).
  for (const auto& [name, p] : params) {
    if (p.grad().defined()) {
      end("parameter " + name + " holds a gradient before the capture (every replay would add to it; " +
              "Optimizer::zero_grad drops it)",
          step);
      return std::nullopt;
    }
  }
  // The inputs are allocated before the capture, so they stay in place for every replay.
  inputs_.clear();
  for (const models::GPTBatch& b : host) inputs_.push_back(models::to_device(b, model.device()));
  captured_ = host;
  valid_labels_ = valid_labels_of(host);
  // The loss's divisor lives in device memory the replays refill, unless the unfused loss takes it as a value.
  count_frozen_ = model.options().classifier_chunk_rows < 0;
  divisor_ = count_frozen_ ? Tensor()
                           : full({}, static_cast<double>(std::max<int64_t>(valid_labels_, 1)),
                                  {.dtype = DType::f64, .device = model.device()});
  // Every compute copy is made inside the capture (a copy made before it could be freed and reused).
  for (const auto& [name, p] : params) p.bump_version();
  Tensor loss;
  try {
    graph_ = DeviceGraph::capture(model.device(), [&] {
      loss = forward_backward(model, inputs_, std::max<int64_t>(valid_labels_, 1), divisor_);
    });
  } catch (const std::exception& e) {
    // Nothing captured ran: the gradients and compute copies it made hold no values.
    for (const auto& [name, p] : params) {
      p.set_grad(Tensor());
      p.bump_version();
    }
    end(e.what(), step);
    return std::nullopt;
  }
  grads_.clear();
  for (const auto& [name, p] : params) grads_.push_back(p.grad());
  loss_ = loss;
  graph_.replay();
  ++replays_;
  note_("cuda graph: step " + std::to_string(step + 1) + "'s forward and backward captured (" +
        std::to_string(host.size()) + " micro-batch" + (host.size() > 1 ? "es" : "") +
        "); later steps replay it (run.cuda_graph=false runs them eagerly)");
  return AccumulatedLoss{.loss = 0, .valid_labels = valid_labels_, .loss_tensor = loss_};
}

AccumulatedLoss StepGraph::replay(const std::vector<models::GPTBatch>& host, const optim::NamedTensors& params) {
  for (size_t i = 0; i < host.size(); ++i) {
    raw::copy_(inputs_[i].input.tokens, host[i].input.tokens);
    raw::copy_(inputs_[i].input.positions, host[i].input.positions);
    raw::copy_(inputs_[i].labels, host[i].labels);
  }
  valid_labels_ = valid_labels_of(host);
  if (divisor_.defined()) raw::fill_(divisor_, static_cast<double>(std::max<int64_t>(valid_labels_, 1)));
  graph_.replay();
  ++replays_;
  // The replay rewrote the captured gradient buffers: they are this step's .grad, as an eager step's.
  for (size_t k = 0; k < params.size(); ++k) params[k].second.set_grad(grads_[k]);
  return AccumulatedLoss{.loss = 0, .valid_labels = valid_labels_, .loss_tensor = loss_};
}

StepGraph::~StepGraph() {
  // The graph's own outputs go back into its pool, which the graph's destruction then returns to the
  // driver (after waiting for the replays); the inputs and the divisor, ordinary allocations the replays
  // read, are freed only after that wait.
  grads_.clear();
  loss_ = Tensor();
  graph_ = DeviceGraph();
}

void StepGraph::end(const std::string& reason, int64_t step) {
  ended_reason_ = reason;
  grads_.clear();
  loss_ = Tensor();
  graph_ = DeviceGraph();  // waits for the replays: then the inputs they read may go
  inputs_.clear();
  captured_.clear();
  divisor_ = Tensor();
  note_("cuda graph: off from step " + std::to_string(step + 1) + ": " + reason);
}

}  // namespace cpf::trainer
