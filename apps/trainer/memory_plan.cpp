#include "apps/trainer/memory_plan.h"

#include <sstream>

#include "apps/report/device_memory.h"
#include "apps/report/metrics.h"
#include "framework/config/schema.h"
#include "models/data/data_options.h"

namespace cpf::trainer {
namespace {

const char* recompute_name(models::RecomputeMode mode) {
  switch (mode) {
    case models::RecomputeMode::none: return "none";
    case models::RecomputeMode::selective: return "selective";
    case models::RecomputeMode::full: return "full";
  }
  return "none";
}

// The capacity `device` names, or the visible GPU's, or an H100's; and how it was found.
std::pair<double, std::string> capacity_of(const TrainConfig& config, const std::string& device) {
  if (!device.empty()) return {models::device_capacity_bytes(device), device};
  if (config.run.device == RunDevice::cuda) {
    try {
      if (auto total = total_device_memory(Device::cuda(0))) return {static_cast<double>(*total), "the visible GPU"};
    } catch (const Error&) {  // no GPU here: fall through to the default
    }
  }
  return {models::device_capacity_bytes("h100"), "h100 (default; --device-memory names another)"};
}

// "seq_len 131072" or "nothing fits" for the longest context under `mode`.
std::string longest(models::MemoryPlanInput in, models::RecomputeMode mode, double capacity, int64_t multiple) {
  in.model.recompute = mode;
  if (mode == models::RecomputeMode::none) in.model.recompute_layers = 0;
  const std::optional<int64_t> n = models::largest_fitting_seq_len(in, capacity, multiple);
  return n ? "seq_len " + std::to_string(*n) : std::string("nothing fits");
}

}  // namespace

models::MemoryPlanInput memory_plan_input(const TrainConfig& c) {
  const bool bshd = c.data.layout == "bshd";
  return {.model = model_options(c),  // with fp8_linears from run.precision
          .seq_len = bshd ? c.data.seq_len : models::data::effective_tokens_per_batch(c.data),
          .rows = bshd ? c.data.batch_size : 1,
          .cp = c.parallel.cp,
          .ranks = c.parallel.dp * c.parallel.cp,
          .cp_comm_type = cp::comm_type_name(c.parallel.cp_comm_type),
          .bf16 = c.run.precision != PrecisionMode::fp32,
          .optimizer = c.optimizer.type == OptimizerType::adamw ? "adamw" : "sgd",
          .momentum = c.optimizer.momentum > 0,
          .shard = dist::shard_stage_name(c.parallel.shard)};
}

void print_memory_plan(const TrainConfig& c, const std::string& device, std::ostream& out) {
  const models::MemoryPlanInput in = memory_plan_input(c);
  const models::MemoryEstimate e = models::estimate_memory(in);
  const auto [capacity, source] = capacity_of(c, device);
  out << "  memory per rank (model of docs/long_context.md): " << format_count(static_cast<double>(e.parameters))
      << " parameters, " << e.tokens_per_rank << " tokens a micro-batch, recompute "
      << recompute_name(c.model.recompute) << "\n";
  for (const std::string& line : e.lines()) out << "  " << line << "\n";
  out << "    device: " << models::format_gib(capacity) << " (" << source
      << "): " << (e.total() <= capacity ? "fits" : "does NOT fit") << "\n";
  const int64_t multiple = std::max<int64_t>(c.data.pad_multiple, 2 * c.parallel.cp);
  out << "    longest context that fits: " << longest(in, c.model.recompute, capacity, multiple) << " (this recompute)";
  for (auto mode : {models::RecomputeMode::none, models::RecomputeMode::selective, models::RecomputeMode::full}) {
    if (mode != c.model.recompute)
      out << ", " << longest(in, mode, capacity, multiple) << " (" << recompute_name(mode) << ")";
  }
  out << "\n";
}

std::optional<std::string> check_memory_plan(const TrainConfig& c, double capacity) {
  const models::MemoryEstimate e = models::estimate_memory(memory_plan_input(c));
  if (e.total() <= capacity) return std::nullopt;
  std::ostringstream what;
  what << "the memory model estimates " << models::format_gib(e.total()) << " per rank (weights and optimizer state "
       << models::format_gib(e.master_weights + e.compute_copies + e.gradients + e.moments) << ", activations "
       << models::format_gib(e.activations) << ", loss " << models::format_gib(e.loss) << ") against "
       << models::format_gib(capacity) << " on the device";
  if (e.total() <= capacity * kPlanTolerance) return "warning: " + what.str() + "; starting anyway (within 10%)";
  std::ostringstream fix;
  fix << what.str() << ". To fit: model.recompute: full (now " << recompute_name(c.model.recompute)
      << "), parallel.shard: parameters over more ranks (now " << dist::shard_stage_name(c.parallel.shard) << " over "
      << c.parallel.dp * c.parallel.cp << "), a larger parallel.cp (now " << c.parallel.cp
      << "), or a shorter data.seq_len (now " << c.data.seq_len
      << "); `cpformer check-config CONFIG --memory` prints the longest context each recompute mode fits";
  throw config::ConfigError(fix.str());
}

std::optional<std::string> out_of_memory_note(const Error& error, const TrainConfig& c) {
  if (error.message().find(" out of memory") == std::string::npos) return std::nullopt;
  const models::MemoryEstimate e = models::estimate_memory(memory_plan_input(c));
  return "the memory planner estimated " + models::format_gib(e.total()) + " per rank for this run (activations " +
         models::format_gib(e.activations) + ", recompute " + recompute_name(c.model.recompute) +
         "); `cpformer check-config CONFIG --memory` prints the plan and the longest context each recompute mode "
         "fits";
}

}  // namespace cpf::trainer
