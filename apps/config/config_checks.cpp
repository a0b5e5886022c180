// The cross-field checks of a train config (config_checks.h): every value that the schema's ranges and
// choices let through but that means nothing, or cannot run, beside the others, refused with the keys
// involved and their effective values.
#include "apps/config/config_checks.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <tuple>

#include "apps/config/accumulation.h"
#include "attention/cp/cp_support.h"
#include "framework/tensor/storage.h"
#include "models/data/synthetic_tasks.h"
#include "models/data/text_source.h"

namespace cpf::trainer {
namespace {

// Collects "section.key" -> value text, so cross-field messages can show the effective value.
class ValueText {
 public:
  template <class T>
  void field(const std::string& key, const T& value, const std::string&, config::Range = {}) {
    std::ostringstream os;
    if constexpr (std::is_same_v<T, bool>) {
      os << (value ? "true" : "false");
    } else {
      os << value;
    }
    values_[path(key)] = os.str();
  }
  template <class E>
  void choice(const std::string& key, const E& value, const config::Choices<E>& choices, const std::string&) {
    for (const auto& c : choices) {
      if (c.second == value) values_[path(key)] = c.first;
    }
  }
  template <class S>
  void section(const std::string& key, S& options, const std::string&) {
    prefix_.push_back(key);
    describe(*this, options);
    prefix_.pop_back();
  }
  std::string get(const std::string& path) const {
    auto it = values_.find(path);
    return it == values_.end() ? "?" : it->second;
  }

 private:
  std::string path(const std::string& key) const {
    std::string p;
    for (const auto& s : prefix_) p += s + ".";
    return p + key;
  }
  std::vector<std::string> prefix_;
  std::map<std::string, std::string> values_;
};

class Checker {
 public:
  Checker(const config::ConfigReader& reader, TrainConfig& config) : reader_(reader), config_(config) {
    describe(values_, config_);
  }
  // "file:line:column: path=value problem". `causes` are the other keys of the conflict: when `path`
  // comes from the file and a cause from a --set, the problem is that --set's and is located there.
  [[noreturn]] void fail(const std::string& path, const std::string& problem,
                         std::initializer_list<const char*> causes = {}) const {
    const std::string message = path + "=" + values_.get(path) + " " + problem;
    if (!from_set(path)) {
      for (const char* cause : causes) {
        if (from_set(cause)) throw config::ConfigError(reader_.location(cause).str() + ": " + message);
      }
    }
    reader_.fail(path, message);
  }
  bool from_set(const std::string& path) const { return !reader_.location(path).override_text.empty(); }
  std::string value(const std::string& path) const { return values_.get(path); }
  // A message of the form "key=value problem" from a component, re-rooted at `section`.
  [[noreturn]] void fail_message(const std::string& section, const std::string& key, const std::string& message) const {
    reader_.fail(section + "." + key, section + "." + message);
  }
  // A cpf::Error message from a component's own validation ("data: ... seq_len=30 ..."): located at the
  // first key of `section` it names.
  [[noreturn]] void fail_component(const std::string& section, const std::vector<std::string>& keys,
                                   std::string message) const {
    const std::string prefix = section + ": ";
    if (message.rfind(prefix, 0) == 0) message = message.substr(prefix.size());
    std::string best;
    size_t best_pos = std::string::npos;
    for (const auto& key : keys) {
      const size_t pos = message.find(key + "=");
      if (pos != std::string::npos && (pos < best_pos)) {
        best = key;
        best_pos = pos;
      }
    }
    if (best.empty()) reader_.fail(section, section + ": " + message);
    const std::string path = section + "." + best;
    reader_.fail(path, path + "=" + values_.get(path) + ": " + message);
  }

 private:
  const config::ConfigReader& reader_;
  TrainConfig& config_;
  ValueText values_;
};

const std::vector<std::string> kDataKeys = {
    "source",       "task",       "min_len",   "max_len", "num_examples", "path",    "text_split", "text_separator",
    "eot_token",    "vocab_size", "tokenizer", "layout",  "bshd_fill",    "seq_len", "batch_size", "tokens_per_batch",
    "pad_multiple", "seed",       "shuffle"};

// A target no evaluation can ever meet would train to the last step and then report it missed.
void check_targets_reachable(const Checker& check, const TrainConfig& c) {
  const auto& run = c.run;
  if (run.target_accuracy > 0 && run.eval_examples == 0) {
    check.fail("run.target_accuracy",
               "can never be reached: run.eval_examples=0 measures no exact match; set run.eval_examples > 0 or "
               "run.target_accuracy: 0",
               {"run.eval_examples"});
  }
  if (run.target_loss > 0 && run.eval_batches == 0) {
    check.fail("run.target_loss",
               "can never be reached: run.eval_batches=0 measures no held-out loss; set run.eval_batches > 0 or "
               "run.target_loss: 0",
               {"run.eval_batches"});
  }
  if (run.target_loss > 0 && c.data.source != "synthetic" && run.eval_path.empty()) {
    check.fail("run.target_loss",
               "can never be reached: data.source=" + c.data.source +
                   " has no held-out loss without run.eval_path; set run.eval_path or run.target_loss: 0",
               {"data.source", "run.eval_path"});
  }
}

// `text` in double quotes with control characters as \xNN, so the message shows what is there.
std::string quoted_visible(const std::string& text) {
  std::string out = "\"";
  for (const char ch : text) {
    const auto byte = static_cast<unsigned char>(ch);
    if (byte < 0x20 || byte == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", byte);
      out += hex;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

// Names and paths become folder and file names: a control character (a NUL cuts the name short, a
// backspace hides itself) or a space at either end makes a folder nobody can find by its name.
void check_names(const Checker& check, const TrainConfig& c) {
  const std::tuple<const char*, const char*, const std::string*> names[] = {{"run", "name", &c.run.name},
                                                                            {"run", "out_dir", &c.run.out_dir},
                                                                            {"run", "eval_path", &c.run.eval_path},
                                                                            {"data", "path", &c.data.path}};
  for (const auto& [section, key, value] : names) {
    const std::string shown = std::string(key) + "=" + quoted_visible(*value);
    const bool control = std::any_of(value->begin(), value->end(), [](char ch) {
      return static_cast<unsigned char>(ch) < 0x20 || static_cast<unsigned char>(ch) == 0x7f;
    });
    if (control) check.fail_message(section, key, shown + " holds a control character; names and paths may not");
    if (!value->empty() && (std::isspace(static_cast<unsigned char>(value->front())) ||
                            std::isspace(static_cast<unsigned char>(value->back())))) {
      check.fail_message(section, key,
                         shown + " begins or ends with a space; remove it (it would become part of a folder name)");
    }
  }
}

// The data options, and model.vocab_size resolved from the data's vocabulary (0: take it).
void check_data_and_vocab(const config::ConfigReader& reader, TrainConfig& c) {
  Checker early(reader, c);
  try {
    models::data::validate_data_options(c.data);
  } catch (const Error& e) {
    early.fail_component("data", kDataKeys, e.message());
  }
  int64_t vocab = 0;
  try {
    vocab = data_vocab_size(c.data);  // loads data.tokenizer
  } catch (const Error& e) {
    // A checkpoint's config (vocab_size resolved) may name a tokenizer file that has since moved:
    // generate reads the run folder's copy (run_tokenizer.h), and training reports the file when it
    // opens the data.
    std::error_code ec;
    if (c.model.vocab_size == 0 || std::filesystem::exists(c.data.tokenizer, ec)) {
      early.fail("data.tokenizer", e.message(), {"data.source"});
    }
    vocab = c.model.vocab_size;
  }
  if (c.model.vocab_size == 0) {
    c.model.vocab_size = vocab;
  } else if (c.model.vocab_size < vocab) {
    early.fail("model.vocab_size", "is smaller than the vocabulary of the data (" + std::to_string(vocab) + " tokens)",
               {"data.source", "data.vocab_size"});
  }
}

// The model's options and what context parallelism needs of the data and the model.
void check_model_and_parallel(const Checker& check, const TrainConfig& c) {
  if (auto p = models::check_options(c.model)) check.fail_message("model", p->key, p->message);
  if (c.model.positions == models::PositionType::learned && c.model.max_positions < c.data.seq_len) {
    check.fail("model.max_positions",
               "must be at least data.seq_len=" + std::to_string(c.data.seq_len) + " with learned positions",
               {"data.seq_len", "model.positions"});
  }

  const auto& par = c.parallel;
  const int64_t recomputed = c.model.recompute_layers == 0 ? c.model.num_layers : c.model.recompute_layers;
  if (par.shard == dist::ShardStage::parameters &&
      (c.model.recompute == models::RecomputeMode::none || recomputed < c.model.num_layers)) {
    check.fail("parallel.shard",
               "parameters (ZeRO-3) gathers each block's weights for its forward and again for its recompute in the "
               "backward, so every block must be recomputed: set model.recompute: full or selective with "
               "model.recompute_layers: 0 (now " +
                   std::string(c.model.recompute == models::RecomputeMode::none ? "none" : "on") + " for " +
                   std::to_string(c.model.recompute == models::RecomputeMode::none ? 0 : recomputed) + " of " +
                   std::to_string(c.model.num_layers) + " blocks), or use parallel.shard: gradients",
               {"model.recompute", "model.recompute_layers"});
  }
  if (par.shard != dist::ShardStage::none && par.dp * par.cp < 2) {
    check.fail("parallel.shard",
               "shards the training state over the dp x cp ranks, but this run has one rank (parallel.dp=" +
                   std::to_string(par.dp) + ", parallel.cp=" + std::to_string(par.cp) +
                   "); set parallel.shard: none or use more ranks",
               {"parallel.dp", "parallel.cp"});
  }
  if (par.cp > 1) {
    const int64_t chunks = 2 * par.cp;
    if (c.data.layout == "thd" && c.data.pad_multiple % chunks != 0) {
      check.fail("data.pad_multiple",
                 "must be a multiple of 2 x parallel.cp = " + std::to_string(chunks) +
                     " (context parallelism cuts every sequence slot into 2 x cp chunks)",
                 {"parallel.cp", "data.layout"});
    }
    if (c.data.layout == "bshd" && c.data.seq_len % chunks != 0) {
      check.fail("data.seq_len",
                 "must be a multiple of 2 x parallel.cp = " + std::to_string(chunks) +
                     " (context parallelism cuts every row into 2 x cp chunks)",
                 {"parallel.cp", "data.layout"});
    }
    if (auto reason = cp_problem(c)) {
      check.fail("parallel.cp_comm_type", "is not supported here: " + *reason,
                 {"parallel.cp", "parallel.cp_a2a_size", "model.num_heads", "model.num_kv_heads", "model.attention",
                  "model.hidden_size", "model.head_dim", "model.window"});
    }
    if (auto reason = a2a_head_groups_problem(c)) {
      check.fail(
          "parallel.cp_a2a_head_groups", *reason,
          {"parallel.cp", "parallel.cp_comm_type", "parallel.cp_a2a_size", "model.num_heads", "model.num_kv_heads"});
    }
  }
}

// Step, optimizer, schedule, device and evaluation options against each other.
void check_run(const Checker& check, const TrainConfig& c) {
  if (auto p = accumulation_problem(c)) {
    check.fail(p->key, p->problem,
               {"data.total_batch_tokens", "run.grad_accum_steps", "data.batch_size", "data.seq_len",
                "data.tokens_per_batch", "parallel.dp"});
  }

  if (c.run.profile > 0 && c.run.profile + 1 > c.run.steps) {
    check.fail("run.profile",
               "needs run.steps >= " + std::to_string(c.run.profile + 1) +
                   " (it profiles the steps after the first), got " + std::to_string(c.run.steps) +
                   "; lower it to at most " + std::to_string(std::max<int64_t>(c.run.steps - 1, 0)) +
                   " or raise run.steps",
               {"run.steps"});
  }

  const auto& opt = c.optimizer;
  if (opt.type == OptimizerType::sgd && opt.nesterov && opt.momentum <= 0) {
    check.fail("optimizer.nesterov", "needs optimizer.momentum > 0", {"optimizer.momentum", "optimizer.type"});
  }
  const optim::LrScheduleOptions sched = schedule_options(c);
  if (sched.decay != optim::LrDecay::constant && sched.warmup_steps > sched.total_steps) {
    check.fail("schedule.warmup_steps",
               "must not exceed the decay length of " + std::to_string(sched.total_steps) +
                   " steps; lower it (--set schedule.warmup_steps=" + std::to_string(sched.total_steps) +
                   " or less), raise run.steps (or schedule.total_steps), or use schedule.decay: constant",
               {"run.steps", "schedule.total_steps", "schedule.decay"});
  }

  if (c.parallel.backend == dist::Backend::nccl && c.run.device != RunDevice::cuda) {
    check.fail("parallel.backend",
               "nccl runs one rank per GPU but run.device=cpu; set run.device: cuda "
               "(or use parallel.backend: thread)",
               {"run.device"});
  }
  if (c.attention.backend != AttentionBackend::automatic && c.run.device == RunDevice::cpu) {
    check.fail("attention.backend",
               "selects CUDA attention kernels but run.device=cpu (the CPU has one attention "
               "implementation); use attention.backend: auto, or run.device: cuda",
               {"run.device"});
  }

  const auto& run = c.run;
  if (run.target_accuracy > 0 && c.data.source != "synthetic") {
    check.fail("run.target_accuracy", "needs data.source: synthetic (exact match is defined for synthetic tasks)",
               {"data.source"});
  }
  if (!run.eval_path.empty() && c.data.source == "synthetic") {
    check.fail("run.eval_path", "applies to text and shards; synthetic tasks have their own held-out split",
               {"data.source"});
  }
  check_targets_reachable(check, c);
}

// The fp8 section means something only under run.precision: fp8, and its bf16 blocks must leave one in FP8.
void check_fp8(const Checker& check, const TrainConfig& c) {
  if (c.fp8.recipe == Fp8Recipe::delayed && c.run.precision != PrecisionMode::fp8) {
    check.fail("fp8.recipe",
               "delayed scales FP8 GEMMs, but run.precision is not fp8; set run.precision: fp8 (or drop fp8.recipe)",
               {"run.precision"});
  }
  // Switches of the FP8 path moved off their defaults without it.
  for (const auto& [on, key, what] :
       {std::tuple{c.fp8.fast_forward_accumulation, "fp8.fast_forward_accumulation", "sets how FP8 GEMMs accumulate"},
        std::tuple{!c.fp8.fuse_activation_casts, "fp8.fuse_activation_casts",
                   "sets how the activations feed FP8 GEMMs"}}) {
    if (on && c.run.precision != PrecisionMode::fp8) {
      check.fail(key, std::string(what) + ", but run.precision is not fp8; set run.precision: fp8 (or drop the key)",
                 {"run.precision"});
    }
  }
  const int64_t bf16_blocks = c.fp8.bf16_first_blocks + c.fp8.bf16_last_blocks;
  if (bf16_blocks > 0 && c.run.precision != PrecisionMode::fp8) {
    check.fail(c.fp8.bf16_first_blocks > 0 ? "fp8.bf16_first_blocks" : "fp8.bf16_last_blocks",
               "keeps blocks out of FP8, but run.precision is not fp8 (every block is already " +
                   std::string(c.run.precision == PrecisionMode::bf16 ? "bf16" : "fp32") +
                   "); set run.precision: fp8 or drop the key",
               {"run.precision"});
  }
  if (c.run.precision == PrecisionMode::fp8 && bf16_blocks >= c.model.num_layers) {
    check.fail("fp8.bf16_first_blocks",
               "and fp8.bf16_last_blocks=" + std::to_string(c.fp8.bf16_last_blocks) + " leave none of the " +
                   std::to_string(c.model.num_layers) + " blocks in FP8; lower them (at most " +
                   std::to_string(c.model.num_layers - 1) + " together) or use run.precision: bf16",
               {"fp8.bf16_last_blocks", "model.num_layers"});
  }
}

}  // namespace

void check_train_config(const config::ConfigReader& reader, TrainConfig& c) {
  check_data_and_vocab(reader, c);
  const Checker check(reader, c);  // sees the resolved vocab_size
  check_model_and_parallel(check, c);
  check_run(check, c);
  check_fp8(check, c);
  check_names(check, c);
  if (c.run.out_dir.empty()) c.run.out_dir = "runs/" + c.run.name;
}

}  // namespace cpf::trainer
