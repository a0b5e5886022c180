#pragma once
// The memory planner of a training config (models/memory_model.h applied to a TrainConfig):
//
//   cpformer check-config CONFIG --memory [--device-memory h100|h200|80GiB]   print_memory_plan
//   cpformer train CONFIG on GPUs                                             check_memory_plan, before
//                                                                             step 1; the step lines
//                                                                             carry the estimate beside
//                                                                             the measured peak
//
// A config whose estimate exceeds the device by more than kPlanTolerance is refused with the numbers and
// the knobs that would make it fit; one above the device but within the tolerance is started with a
// warning (the model is held within 10% of measured peaks, docs/long_context.md).
#include <optional>
#include <ostream>
#include <string>

#include "apps/config/config.h"
#include "models/memory_model.h"

namespace cpf::trainer {

inline constexpr double kPlanTolerance = 1.10;

// The model's inputs for `config`'s rank 0 (tokens per micro-batch, CP, ranks, precision, optimizer).
models::MemoryPlanInput memory_plan_input(const TrainConfig& config);

// The plan: each part of the estimate, the device's capacity, and the longest data.seq_len that fits
// under this recompute mode and under each other one. `device`: a name for device_capacity_bytes, or
// empty for the visible GPU's memory (cuda runs), else an 80 GB H100.
void print_memory_plan(const TrainConfig& config, const std::string& device, std::ostream& out);

// Throws a ConfigError naming the estimate, the capacity and the knobs when the estimate exceeds
// `capacity` x kPlanTolerance; returns a warning line when it exceeds `capacity` alone, else nullopt.
std::optional<std::string> check_memory_plan(const TrainConfig& config, double capacity);

// For an error raised while a step runs: when it is a device out of memory, what to add to its message (the
// planner's estimate for this run, and the knobs); nullopt for any other error.
std::optional<std::string> out_of_memory_note(const Error& error, const TrainConfig& config);

}  // namespace cpf::trainer
