#include "apps/run/resume_rules.h"

#include <charconv>
#include <cstdio>
#include <map>
#include <sstream>
#include <vector>

#include "apps/run/checkpointing.h"
#include "framework/core/error.h"
#include "framework/io/checkpoint.h"

namespace cpf::trainer {
namespace {

// Flattens a config into "section.key" -> value text, visiting the describe() functions as the schema
// does (so a key added there is compared without being listed here).
class FlatConfig {
 public:
  template <class T, class... Rest>
  void field(const std::string& key, const T& value, const std::string&, Rest&&...) {
    std::ostringstream s;
    if constexpr (std::is_same_v<T, bool>) {
      s << (value ? "true" : "false");
    } else if constexpr (std::is_same_v<T, double>) {
      char buf[32];
      const auto end = std::to_chars(buf, buf + sizeof buf, value).ptr;  // shortest form that reads back
      s << std::string(buf, end);
    } else {
      s << value;
    }
    values[prefix_ + key] = s.str();
  }
  template <class E, class C>
  void choice(const std::string& key, const E& value, const C& choices, const std::string&) {
    for (const auto& [name, v] : choices) {
      if (v == value) values[prefix_ + key] = name;
    }
  }
  template <class S>
  void section(const std::string& key, S& options, const std::string&) {
    const std::string outer = prefix_;
    prefix_ += key + ".";
    describe(*this, options);
    prefix_ = outer;
  }

  std::map<std::string, std::string> values;

 private:
  std::string prefix_;
};

std::map<std::string, std::string> flatten(TrainConfig config) {
  FlatConfig flat;
  describe(flat, config);
  return flat.values;
}

// The keys the checkpoint's config hash covers (checkpointing.h).
bool hashed_key(const std::string& key) {
  for (const char* prefix : {"model.", "optimizer.", "schedule.", "data."}) {
    if (key.rfind(prefix, 0) == 0) return true;
  }
  return key == "run.seed";
}

std::string show(const std::string& value) { return value.empty() ? "\"\"" : value; }

}  // namespace

std::string config_differences(const TrainConfig& saved, const TrainConfig& current) {
  const auto before = flatten(saved), now = flatten(current);
  std::string out;
  for (const auto& [key, value] : now) {
    if (!hashed_key(key)) continue;
    auto it = before.find(key);
    const std::string old_value = it == before.end() ? "(absent)" : it->second;
    if (old_value == value) continue;
    out += (out.empty() ? "" : "; ") + key + ": " + show(old_value) + " in the checkpoint, " + show(value) + " now";
  }
  return out;
}

std::optional<std::string> explain_config_mismatch(const TrainConfig& current) {
  const auto all = io::list_checkpoints(checkpoints_dir(current));
  if (all.empty()) return std::nullopt;
  TrainConfig saved;
  try {
    saved = checkpoint_config(all.back());
  } catch (const std::exception&) {
    return std::nullopt;  // no readable config: the checkpoint's own problem says why
  }
  if (config_hash(saved) == config_hash(current)) return std::nullopt;
  const std::string differences = config_differences(saved, current);
  return "resume: the newest checkpoint, " + all.back() + ", was written with another config: " +
         (differences.empty() ? "hash " + config_hash(saved) + " in the checkpoint, " + config_hash(current) + " now"
                              : differences) +
         ". Change them back to continue it, set run.resume: replace to delete the folder's checkpoints and start "
         "over, or give this run another folder (run.out_dir or run.name)";
}

void check_resume_step(const TrainConfig& config, int64_t step, const std::string& checkpoint) {
  CPF_CHECK(step <= config.run.steps, "resume: run.steps=", config.run.steps, " but the run folder's checkpoint ",
            checkpoint, " is at step ", step, ", beyond it: there is nothing to train. Set run.steps to ", step,
            " or more to continue it, or run.resume: replace to start over");
}

std::optional<std::string> schedule_change_warning(const TrainConfig& saved, const TrainConfig& current, int64_t step) {
  const optim::LrSchedule before(schedule_options(saved)), now(schedule_options(current));
  const double lr_before = before.lr_at(step), lr_now = now.lr_at(step);
  if (lr_before == lr_now) return std::nullopt;
  const int64_t total_before = before.options().total_steps, total_now = now.options().total_steps;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "warning: the learning-rate schedule changed since the checkpoint of step %lld: step %lld takes lr "
                "%.3e where the saved run's schedule gives %.3e (it decays over %lld steps now, %lld before: "
                "schedule.total_steps 0 follows run.steps). To extend a run without a jump, give "
                "schedule.total_steps the full length when it starts",
                static_cast<long long>(step), static_cast<long long>(step + 1), lr_now, lr_before,
                static_cast<long long>(total_now), static_cast<long long>(total_before));
  return std::string(buf);
}

}  // namespace cpf::trainer
