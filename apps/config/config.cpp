#include "apps/config/config.h"

#include <algorithm>

#include "apps/config/config_checks.h"
#include "attention/cp/cp_support.h"
#include "models/data/text_source.h"

namespace cpf::trainer {

int64_t data_vocab_size(const models::data::DataOptions& o) { return models::data::data_source_vocab_size(o); }

optim::LrScheduleOptions schedule_options(const TrainConfig& c) {
  optim::LrScheduleOptions s;
  s.decay = c.schedule.decay;
  s.lr = c.optimizer.lr;
  s.min_lr = c.optimizer.lr * c.schedule.min_lr_ratio;
  s.warmup_steps = c.schedule.warmup_steps;
  s.total_steps = c.schedule.total_steps > 0 ? c.schedule.total_steps : c.run.steps;
  return s;
}

// parallel.cp_a2a_head_groups against the heads each rank attends after the all-to-all (a2a: cp ranks,
// a2a+p2p: cp_a2a_size; KV heads replicated up to that size first, as the strategy does).
std::optional<std::string> a2a_head_groups_problem(const TrainConfig& c) {
  const cp::CommType comm = c.parallel.cp_comm_type;
  if (c.parallel.cp <= 1 || c.parallel.cp_a2a_head_groups == 0 ||
      (comm != cp::CommType::a2a && comm != cp::CommType::a2a_p2p)) {
    return std::nullopt;
  }
  const models::GPTOptions& m = c.model;
  const int64_t a = comm == cp::CommType::a2a ? c.parallel.cp : c.parallel.cp_a2a_size;
  const int64_t kv = m.attention == models::AttentionType::gqa ? m.num_kv_heads : m.num_heads;
  if (a <= 0 || m.num_heads % a != 0) return std::nullopt;  // cp_problem names that
  const std::string problem =
      cp::a2a_head_groups_problem(c.parallel.cp_a2a_head_groups, m.num_heads / a, std::max(kv, a) / a);
  if (problem.empty()) return std::nullopt;
  return problem;
}

std::optional<std::string> cp_problem(const TrainConfig& c) {
  if (c.parallel.cp <= 1) return std::nullopt;
  const models::GPTOptions& m = c.model;
  cp::CpQuery q;
  q.comm_type = c.parallel.cp_comm_type;
  q.cp_size = c.parallel.cp;
  q.a2a_size = q.comm_type == cp::CommType::a2a_p2p ? c.parallel.cp_a2a_size : 1;
  q.format = QkvFormat::thd;
  q.mask = MaskType::padding_causal;
  q.window = {m.window, 0};
  q.attention_sink = m.attention_sink;
  // attention.cp_mla_latent: on asks an MLA model to move its latent, which only p2p and all_gather can.
  q.mla_latent = m.attention == models::AttentionType::mla && c.attention.cp_mla_latent == cp::MlaLatentMode::on;
  q.num_heads = m.num_heads;
  if (m.attention == models::AttentionType::mla) {
    q.num_kv_heads = m.num_heads;
    q.head_dim_qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
    q.head_dim_v = m.v_head_dim;
  } else {
    q.num_kv_heads = m.attention == models::AttentionType::gqa ? m.num_kv_heads : m.num_heads;
    q.head_dim_qk = q.head_dim_v = m.head_dim > 0 ? m.head_dim : m.hidden_size / std::max<int64_t>(m.num_heads, 1);
  }
  return cp::unsupported_reason(q);
}

namespace {

// Overrides, then every key read, unknown keys rejected, cross-field checks.
TrainConfig read_train_config(const std::shared_ptr<config::ConfigDocument>& doc,
                              const std::vector<std::string>& overrides) {
  for (const auto& o : overrides) config::apply_override(*doc, o);
  TrainConfig c;
  config::ConfigReader reader(doc);
  describe(reader, c);
  reader.finish();
  check_train_config(reader, c);
  return c;
}

}  // namespace

TrainConfig load_train_config_string(const std::string& yaml, const std::string& name,
                                     const std::vector<std::string>& overrides) {
  return read_train_config(config::load_config_string(yaml, name), overrides);
}

TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides) {
  return read_train_config(config::load_config_file(path), overrides);
}

std::string to_yaml(const TrainConfig& config) {
  TrainConfig copy = config;
  config::ConfigWriter writer;
  describe(writer, copy);
  return writer.str();
}

std::string config_docs_markdown() {
  TrainConfig defaults;
  config::ConfigDocs docs;
  describe(docs, defaults);
  return docs.markdown();
}

models::GPTOptions model_options(const TrainConfig& config) {
  models::GPTOptions o = config.model;
  o.compute_dtype = compute_dtype(config);
  o.fp8_linears = config.run.precision == PrecisionMode::fp8;
  o.fp8_scaling = config.fp8;
  o.kernel_config = attention_kernel_config(config);
  return o;
}

std::string precision_description(const TrainConfig& config) {
  if (config.run.precision == PrecisionMode::fp32) return "fp32";
  if (config.run.precision == PrecisionMode::bf16) return "bf16 (f32 master weights)";
  const Fp8ScalingOptions& f = config.fp8;
  const std::string recipe = f.recipe == Fp8Recipe::current
                                 ? "current scaling"
                                 : "delayed scaling: amax history " + std::to_string(f.amax_history) + ", " +
                                       (f.amax_compute == raw::AmaxCompute::max ? "max" : "most recent");
  std::string blocks;
  if (f.bf16_first_blocks + f.bf16_last_blocks > 0) {
    blocks =
        "; bf16 blocks: first " + std::to_string(f.bf16_first_blocks) + ", last " + std::to_string(f.bf16_last_blocks);
  }
  const std::string fast = f.fast_forward_accumulation ? "; fast forward accumulation" : "";
  const std::string fused = f.fuse_activation_casts ? "" : "; activation casts not fused";
  return "fp8 linears (" + recipe + "; margin " + std::to_string(f.margin) + blocks + fast + fused +
         "), bf16 (f32 master weights)";
}

DType compute_dtype(const TrainConfig& config) {
  return config.run.precision == PrecisionMode::fp32 ? config.model.dtype : DType::bf16;
}

AttentionKernelConfig attention_kernel_config(const TrainConfig& config) {
  AttentionKernelConfig kernel_config;
  kernel_config.backend = config.attention.backend;
  kernel_config.deterministic = config.attention.deterministic;
  return kernel_config;
}

Device rank_device_of(const TrainConfig& config, int rank) {
  if (config.run.device == RunDevice::cpu) return Device::cpu();
  CPF_CHECK(has_device_backend(DeviceType::cuda), "run.device=cuda: this build has no CUDA backend; rebuild with ",
            "-DCPF_WITH_CUDA=ON (docs/build.md), or set run.device: cpu");
  const int gpus = device_backend(DeviceType::cuda).device_count();
  CPF_CHECK(gpus > 0, "run.device=cuda: no CUDA device is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES), ",
            "or set run.device: cpu");
  return Device::cuda(rank % gpus);
}

std::string run_dir(const TrainConfig& config) {
  return config.run.out_dir.empty() ? "runs/" + config.run.name : config.run.out_dir;
}

}  // namespace cpf::trainer
