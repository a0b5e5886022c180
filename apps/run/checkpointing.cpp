#include "apps/run/checkpointing.h"

#include <cstdio>
#include <filesystem>
#include <functional>

#include "apps/run/collective_phase.h"
#include "framework/core/logging.h"
#include "framework/io/sharded_checkpoint.h"

namespace cpf::trainer {
namespace fs = std::filesystem;

namespace {

constexpr const char* kCursorKey = "data_cursor";
constexpr const char* kConfigKey = "config";
constexpr const char* kLogWindowKey = "log_window";
constexpr const char* kFp8ScalingKey = "fp8_scaling";

// "steps=2 tokens=256 loss=<%.17g> seconds=<%.17g>": exact, so the resumed average is the uninterrupted one.
std::string log_window_text(const LogWindow& w) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "steps=%lld tokens=%lld loss=%.17g seconds=%.17g", static_cast<long long>(w.steps),
                static_cast<long long>(w.tokens), w.loss, w.seconds);
  return buf;
}

LogWindow parse_log_window(const std::string& text, const std::string& path) {
  LogWindow w;
  long long steps = 0, tokens = 0;
  const int got =
      std::sscanf(text.c_str(), "steps=%lld tokens=%lld loss=%lf seconds=%lf", &steps, &tokens, &w.loss, &w.seconds);
  CPF_CHECK(got == 4 && steps >= 0 && tokens >= 0, "resume: ", path, ": meta.json's extra.", kLogWindowKey, " '", text,
            "' is not 'steps=N tokens=N loss=X seconds=X'");
  w.steps = steps;
  w.tokens = tokens;
  return w;
}

// FNV-1a, 64 bits: stable across platforms and runs (std::hash is not).
std::string fnv1a_hex(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// Only the sections that change what a checkpoint means.
struct HashedSections {
  TrainConfig* c;
};
template <class V>
void describe(V& v, HashedSections& h) {
  v.field("seed", h.c->run.seed, "");
  v.section("model", h.c->model, "");
  v.section("optimizer", h.c->optimizer, "");
  v.section("schedule", h.c->schedule, "");
  v.section("data", h.c->data, "");
}

}  // namespace

std::string checkpoints_dir(const TrainConfig& config) { return (fs::path(run_dir(config)) / "checkpoints").string(); }

std::string config_hash(const TrainConfig& config) {
  TrainConfig copy = config;
  // Recomputation changes how the gradients are computed, not what a checkpoint holds: a run may resume
  // with another model.recompute (as with another parallel layout, which is not hashed either).
  copy.model.recompute = models::RecomputeMode::none;
  copy.model.recompute_layers = 0;
  HashedSections sections{&copy};
  config::ConfigWriter writer;
  describe(writer, sections);
  return fnv1a_hex(writer.str());
}

std::optional<std::string> find_resume_checkpoint(const TrainConfig& config, const optim::NamedTensors& params,
                                                  const optim::Optimizer& optimizer) {
  const std::string dir = checkpoints_dir(config);
  const auto all = io::list_checkpoints(dir);
  if (all.empty()) return std::nullopt;
  const std::string hash = config_hash(config);
  if (auto found = io::find_latest_valid(dir, params, &optimizer, hash)) return found;
  CPF_FAIL("resume: none of the ", all.size(), " checkpoints in ", dir, " can be loaded; the newest, ", all.back(),
           ": ", io::checkpoint_problem(all.back(), params, &optimizer, hash, io::CheckDepth::data),
           ". Use another run.out_dir, or run.resume: replace to delete them and start over in this folder");
}

namespace {

// The trainer's part of a loaded checkpoint's metadata: step, data cursor, open log window, FP8 state.
ResumeState resume_state_of(const io::CheckpointMeta& meta, const std::string& path) {
  auto it = meta.extra.find(kCursorKey);
  CPF_CHECK(it != meta.extra.end(), "resume: ", path, " has no data cursor in meta.json (extra.", kCursorKey, ")");
  ResumeState state{meta.step, models::data::parse_data_cursor(it->second)};
  if (auto w = meta.extra.find(kLogWindowKey); w != meta.extra.end()) {
    state.window = parse_log_window(w->second, path);
    state.carried = true;
  }
  if (auto f = meta.extra.find(kFp8ScalingKey); f != meta.extra.end()) state.fp8_scaling = f->second;
  return state;
}

}  // namespace

ResumeState load_training_checkpoint(const std::string& path, const TrainConfig& config,
                                     const optim::NamedTensors& params, optim::Optimizer& optimizer) {
  return resume_state_of(io::load_checkpoint(path, params, &optimizer, config_hash(config)), path);
}

ResumeState load_training_checkpoint_pieces(const std::string& path, const TrainConfig& config,
                                            const optim::NamedTensors& pieces, optim::Optimizer& optimizer) {
  return resume_state_of(io::load_checkpoint_pieces(path, pieces, &optimizer, config_hash(config)), path);
}

io::CheckpointMeta training_checkpoint_meta(const TrainConfig& config, int64_t step,
                                            const models::data::DataCursor& cursor, const LogWindow& open_window,
                                            const std::string& fp8_scaling) {
  io::CheckpointMeta meta;
  meta.step = step;
  meta.rng_seed = static_cast<uint64_t>(config.run.seed);
  meta.config_hash = config_hash(config);
  meta.extra[kCursorKey] = cursor.str();
  meta.extra[kConfigKey] = to_yaml(config);
  meta.extra[kLogWindowKey] = log_window_text(open_window);
  if (!fp8_scaling.empty()) meta.extra[kFp8ScalingKey] = fp8_scaling;
  return meta;
}

std::string save_training_checkpoint(const TrainConfig& config, const optim::NamedTensors& params,
                                     const optim::Optimizer& optimizer, int64_t step,
                                     const models::data::DataCursor& cursor, const LogWindow& open_window,
                                     const std::string& fp8_scaling) {
  return io::save_checkpoint(checkpoints_dir(config), params, &optimizer,
                             training_checkpoint_meta(config, step, cursor, open_window, fp8_scaling),
                             static_cast<int>(config.run.keep_checkpoints));
}

namespace {

// A phase of the sharded save, collective (collective_phase.h): the failing rank's message there, the
// phase's name on the others.
void collective_phase(dist::ProcessGroup& group, Device device, bool mine, const std::string& what,
                      const std::function<void()>& phase) {
  run_collective_phase(group, device, mine, phase,
                       what + " failed on another rank (its log names why); nothing was published");
}

}  // namespace

std::string save_sharded_training_checkpoint(const TrainConfig& config, dist::ProcessGroup& group,
                                             const optim::NamedTensors& pieces, const optim::Optimizer& optimizer,
                                             int64_t step, const models::data::DataCursor& cursor,
                                             const LogWindow& open_window, Device device,
                                             const std::string& fp8_scaling) {
  const std::string dir = checkpoints_dir(config), what = "checkpoint at step " + std::to_string(step);
  collective_phase(group, device, group.rank() == 0, what + ": preparing its folder",
                   [&] { io::prepare_sharded_checkpoint(dir, step); });
  const std::string tmp = io::sharded_checkpoint_temp_dir(dir, step);
  const optim::NamedTensors state = optimizer.state_tensors();
  collective_phase(group, device, true, what + ": writing a rank's shard",
                   [&] { io::write_checkpoint_shard(tmp, group.rank(), group.size(), pieces, &state); });
  io::CheckpointMeta meta = training_checkpoint_meta(config, step, cursor, open_window, fp8_scaling);
  meta.optimizer_name = optimizer.name();
  meta.optimizer_step = optimizer.step_count();
  std::string published;
  collective_phase(group, device, group.rank() == 0, what + ": publishing", [&] {
    published =
        io::finish_sharded_checkpoint(dir, tmp, meta, group.size(), static_cast<int>(config.run.keep_checkpoints));
  });
  return published;
}

std::string resolve_checkpoint(const std::string& dir) {
  CPF_CHECK(fs::is_directory(dir), "generate: ", dir, " is not a folder (give a checkpoint, or a run folder)");
  if (fs::exists(fs::path(dir) / "meta.json")) return dir;
  for (const fs::path& candidate : {fs::path(dir), fs::path(dir) / "checkpoints"}) {
    const auto found = io::list_checkpoints(candidate.string());
    if (!found.empty()) return found.back();
  }
  CPF_FAIL("generate: ", dir, " holds no checkpoint (no meta.json, no step_* folder, no checkpoints/ folder)");
}

TrainConfig checkpoint_config(const std::string& checkpoint) {
  const io::CheckpointMeta meta = io::read_checkpoint_meta(checkpoint);
  auto it = meta.extra.find(kConfigKey);
  CPF_CHECK(it != meta.extra.end(), "generate: ", checkpoint, " was not written by cpformer train (meta.json has no ",
            "extra.", kConfigKey, ")");
  return load_train_config_string(it->second, checkpoint + "/meta.json:extra.config");
}

}  // namespace cpf::trainer
