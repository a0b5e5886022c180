#include "apps/cli/config_check.h"

#include "apps/trainer/evaluation.h"
#include "apps/trainer/step/grad_accumulation.h"
#include "apps/trainer/trainer.h"
#include "framework/distributed/environment.h"
#include "framework/distributed/launcher.h"
#include "framework/tensor/storage.h"
#include "models/data/file_glob.h"

namespace cpf::trainer {
namespace {

std::string describe_model(const TrainConfig& c) {
  const auto& m = c.model;
  const char* attention = m.attention == models::AttentionType::mha   ? "mha"
                          : m.attention == models::AttentionType::gqa ? "gqa"
                                                                      : "mla";
  return std::to_string(m.num_layers) + " layers, hidden " + std::to_string(m.hidden_size) + ", " +
         std::to_string(m.num_heads) + " heads (" + attention +
         (m.attention == models::AttentionType::gqa ? ", " + std::to_string(m.num_kv_heads) + " kv heads" : "") +
         "), vocab " + std::to_string(m.vocab_size) + ", " + nn::activation_name(m.mlp) + ", " +
         (m.norm == models::NormType::rmsnorm ? "rmsnorm" : "layernorm") + ", " +
         (m.positions == models::PositionType::rope ? "rope" : "learned positions");
}

// Files are opened when present (unreadable ones throw DataError, as in train); absent ones are
// reported unchecked, since a config may be validated before its data is downloaded.
RuntimeNeed training_files(const TrainConfig& c) {
  if (c.data.source != "synthetic") {
    try {
      models::data::expand_file_pattern(c.data.path, "data.path");
    } catch (const Error& e) {
      return {"data files", false, e.message()};
    }
  }
  const auto source = open_training_source(c);
  return {"data files", true, source->name() + ", " + std::to_string(source->num_documents()) + " documents"};
}

RuntimeNeed held_out_files(const TrainConfig& c) {
  try {
    models::data::expand_file_pattern(c.run.eval_path, "run.eval_path");
  } catch (const Error& e) {
    return {"held-out files", false, e.message()};
  }
  try {
    const auto source = make_eval_source(c, nullptr);
    return {"held-out files", true, source->name() + ", " + std::to_string(source->num_documents()) + " documents"};
  } catch (const Error& e) {
    throw DataError("run.eval_path: " + e.message());
  }
}

// run.device: cuda needs a CUDA build and a visible GPU; the nccl backend needs NCCL in this program
// and, without a launcher, one GPU per rank on this machine.
std::vector<RuntimeNeed> device_needs(const TrainConfig& c) {
  std::vector<RuntimeNeed> needs;
  int gpus = 0;
  if (c.run.device == RunDevice::cuda) {
    try {
      rank_device_of(c, 0);
      gpus = device_backend(DeviceType::cuda).device_count();
      needs.push_back({"cuda device", true, std::to_string(gpus) + " visible"});
    } catch (const Error& e) {
      needs.push_back({"cuda device", false, e.message()});
    }
  }
  if (c.parallel.backend == dist::Backend::nccl) {
    const int64_t world = c.parallel.dp * c.parallel.cp;
    if (!dist::has_launch_backend(dist::Backend::nccl)) {
      needs.push_back({"nccl backend", false,
                       "this build has no NCCL backend; rebuild with -DCPF_WITH_CUDA=ON -DCPF_WITH_NCCL=ON "
                       "(docs/distributed.md)"});
    } else if (gpus > 0 && !dist::read_launch_environment() && world > gpus) {
      needs.push_back({"nccl backend", false,
                       std::to_string(world) + " ranks (parallel.dp x parallel.cp) need one GPU each but " +
                           std::to_string(gpus) +
                           " are visible here; on several nodes start them with torchrun, "
                           "srun or mpirun"});
    } else if (gpus > 0) {
      needs.push_back({"nccl backend", true, std::to_string(world) + " rank(s)"});
    }
  }
  return needs;
}

}  // namespace

std::vector<RuntimeNeed> check_runtime_needs(const TrainConfig& c) {
  std::vector<RuntimeNeed> needs{training_files(c)};
  if (!c.run.eval_path.empty()) needs.push_back(held_out_files(c));
  for (auto& n : device_needs(c)) needs.push_back(std::move(n));
  return needs;
}

void print_config_check(const std::string& name, const TrainConfig& c, std::ostream& out) {
  const std::vector<RuntimeNeed> needs = check_runtime_needs(c);
  std::string unchecked;
  for (const auto& n : needs) {
    if (!n.checked) unchecked += (unchecked.empty() ? "" : ", ") + n.what;
  }
  if (unchecked.empty()) {
    out << name << ": OK\n";
  } else {
    out << name << ": config valid, NOT fully checked (" << unchecked
        << " could not be checked here; train may refuse it)\n";
  }
  out << "  model: " << describe_model(c) << "\n";
  out << "  data: " << c.data.source << (c.data.source == "synthetic" ? ":" + c.data.task : " " + c.data.path) << ", "
      << c.data.layout << ", seq_len " << c.data.seq_len << "\n";
  if (const int64_t accum = grad_accum_steps(c); accum > 1) {
    out << "  batch: " << accum * micro_step_tokens(c) << " tokens per step = " << accum
        << " accumulated micro-batches x " << models::data::effective_tokens_per_batch(c.data) << " tokens x dp "
        << c.parallel.dp << "\n";
  }
  out << "  parallel: dp=" << c.parallel.dp << " cp=" << c.parallel.cp << " backend "
      << dist::backend_name(c.parallel.backend);
  if (c.parallel.cp > 1) {
    out << " cp_comm_type=" << cp::comm_type_name(c.parallel.cp_comm_type) << ": supported (CP support check passed)";
  }
  out << "\n";
  out << "  compute: " << (c.run.device == RunDevice::cuda ? "cuda" : "cpu") << ", " << precision_description(c)
      << ", attention backend " << attention_backend_name(c.attention.backend)
      << (c.attention.deterministic ? " (deterministic)" : "") << "\n";
  for (const auto& n : needs) {
    out << "  " << n.what << ": " << (n.checked ? "OK (" : "NOT CHECKED (") << n.detail << ")\n";
  }
}

}  // namespace cpf::trainer
