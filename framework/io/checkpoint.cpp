#include "framework/io/checkpoint.h"

#include <fcntl.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "framework/autograd/grad_mode.h"
#include "framework/core/logging.h"
#include "framework/io/file_io.h"
#include "framework/tensor/ops/copy.h"

namespace cpf::io {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kMetaFile = "meta.json";
constexpr const char* kFormat = "cpformer-checkpoint";
constexpr int64_t kVersion = 1;
constexpr const char* kTempPrefix = ".tmp-";
constexpr const char* kOldPrefix = ".old-";

// "step_" followed by at least 8 digits; the step, or -1 for any other name.
int64_t parse_step_dir(const std::string& name) {
  if (name.rfind("step_", 0) != 0) return -1;
  const std::string digits = name.substr(5);
  if (digits.size() < 8 || digits.size() > 18) return -1;
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) return -1;
  return std::stoll(digits);
}

uint64_t size_of(const fs::path& path) {
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  CPF_CHECK(!ec, "cannot read the size of ", path.string(), ": ", ec.message());
  return size;
}

void remove_tree(const fs::path& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  CPF_CHECK(!ec, "cannot remove ", path.string(), ": ", ec.message());
}

void rename_path(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::rename(from, to, ec);
  CPF_CHECK(!ec, "cannot rename ", from.string(), " to ", to.string(), ": ", ec.message());
}

// The entries of a folder; throws cpf::Error (not filesystem_error) when it cannot be read.
std::vector<fs::directory_entry> list_dir(const fs::path& dir) {
  std::error_code ec;
  std::vector<fs::directory_entry> out;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) out.push_back(*it);
  CPF_CHECK(!ec, "cannot list ", dir.string(), ": ", ec.message());
  return out;
}

struct MetaFile {
  CheckpointMeta meta;
  std::map<std::string, uint64_t> file_sizes;
};

json meta_to_json(const CheckpointMeta& m, const std::map<std::string, uint64_t>& file_sizes) {
  json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["step"] = m.step;
  j["rng_seed"] = m.rng_seed;
  j["rng_offset"] = m.rng_offset;
  j["data_cursor"] = m.data_cursor;
  j["config_hash"] = m.config_hash;
  j["optimizer"] = m.optimizer_name.empty() ? json(nullptr)
                                            : json{{"name", m.optimizer_name}, {"step_count", m.optimizer_step}};
  j["files"] = file_sizes;
  j["extra"] = m.extra;
  return j;
}

MetaFile parse_meta(const std::string& text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    CPF_FAIL(kMetaFile, " is not valid JSON: ", e.what());
  }
  CPF_CHECK(j.is_object(), kMetaFile, " is not a JSON object");
  auto field = [&](const char* key) -> const json& {
    CPF_CHECK(j.contains(key), kMetaFile, " has no field '", key, "'");
    return j[key];
  };
  auto non_negative = [&](const char* key) {
    const json& v = field(key);
    CPF_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0, kMetaFile, ": '", key,
              "' must be an integer >= 0, got ", v.dump());
    return v.get<int64_t>();
  };
  auto unsigned_field = [&](const char* key) {
    const json& v = field(key);
    CPF_CHECK(v.is_number_unsigned(), kMetaFile, ": '", key, "' must be an unsigned integer, got ", v.dump());
    return v.get<uint64_t>();
  };
  CPF_CHECK(field("format") == kFormat, kMetaFile, ": format ", field("format").dump(), " is not \"", kFormat, "\"");
  CPF_CHECK(field("version") == kVersion, kMetaFile, ": version ", field("version").dump(),
            " is not supported (expected ", kVersion, ")");
  MetaFile out;
  CheckpointMeta& m = out.meta;
  m.step = non_negative("step");
  m.rng_seed = unsigned_field("rng_seed");
  m.rng_offset = unsigned_field("rng_offset");
  const json& cursor = field("data_cursor");
  CPF_CHECK(cursor.is_number_integer(), kMetaFile, ": 'data_cursor' must be an integer, got ", cursor.dump());
  m.data_cursor = cursor.get<int64_t>();
  CPF_CHECK(field("config_hash").is_string(), kMetaFile, ": 'config_hash' must be a string");
  m.config_hash = field("config_hash").get<std::string>();
  const json& opt = field("optimizer");
  if (!opt.is_null()) {
    CPF_CHECK(opt.is_object() && opt.contains("name") && opt["name"].is_string() && !opt["name"].empty() &&
                  opt.contains("step_count") && opt["step_count"].is_number_integer() &&
                  opt["step_count"].get<int64_t>() >= 0,
              kMetaFile, ": 'optimizer' must be null or {\"name\": string, \"step_count\": integer >= 0}, got ",
              opt.dump());
    m.optimizer_name = opt["name"].get<std::string>();
    m.optimizer_step = opt["step_count"].get<int64_t>();
  }
  const json& files = field("files");
  CPF_CHECK(files.is_object(), kMetaFile, ": 'files' must be an object of byte sizes");
  for (const auto& [name, size] : files.items()) {
    CPF_CHECK(size.is_number_unsigned(), kMetaFile, ": size of '", name, "' must be an unsigned integer");
    out.file_sizes[name] = size.get<uint64_t>();
  }
  const json& extra = field("extra");
  CPF_CHECK(extra.is_object(), kMetaFile, ": 'extra' must be an object of strings");
  for (const auto& [key, value] : extra.items()) {
    CPF_CHECK(value.is_string(), kMetaFile, ": 'extra' value of '", key, "' is not a string: ", value.dump());
    m.extra[key] = value.get<std::string>();
  }
  return out;
}

MetaFile read_meta_file(const fs::path& dir) {
  CPF_CHECK(fs::is_directory(dir), "not a folder");
  CPF_CHECK(fs::exists(dir / kMetaFile), kMetaFile, " is missing");
  MetaFile mf = parse_meta(read_file((dir / kMetaFile).string()));
  const int64_t dir_step = parse_step_dir(dir.filename().string());
  CPF_CHECK(dir_step < 0 || dir_step == mf.meta.step, "folder name says step ", dir_step, " but ", kMetaFile,
            " says step ", mf.meta.step);
  return mf;
}

struct StoredTensor {
  DType dtype;
  Shape shape;
};

// Checks that `stored` (the contents of `file`) holds exactly `expected`: same names, dtypes and
// shapes. `what` names the live side in messages ("the model", "the optimizer").
void check_tensor_list(std::map<std::string, StoredTensor> stored, const char* file,
                       const optim::NamedTensors& expected, const char* what) {
  for (const auto& [name, live] : expected) {
    const auto it = stored.find(name);
    CPF_CHECK(it != stored.end(), file, " has no tensor '", name, "' which ", what, " has");
    CPF_CHECK(it->second.dtype == live.dtype(), "tensor '", name, "' is ", it->second.dtype, " in ", file, " but ",
              live.dtype(), " in ", what);
    CPF_CHECK(it->second.shape == live.shape(), "tensor '", name, "' has shape ", it->second.shape, " in ", file,
              " but ", live.shape(), " in ", what);
    stored.erase(it);
  }
  CPF_CHECK(stored.empty(), file, " has tensor '", stored.empty() ? "" : stored.begin()->first, "' which ", what,
            " does not have (", stored.size(), " unexpected)");
}

// Checks that `file` in `dir` has the size meta.json recorded and a valid header matching `expected`.
void check_tensor_file(const fs::path& dir, const char* file, const MetaFile& mf, const optim::NamedTensors& expected,
                       const char* what) {
  const auto recorded = mf.file_sizes.find(file);
  CPF_CHECK(recorded != mf.file_sizes.end(), kMetaFile, " records no size for ", file);
  const fs::path path = dir / file;
  CPF_CHECK(fs::exists(path), file, " is missing");
  const uint64_t actual = size_of(path);
  CPF_CHECK(actual == recorded->second, file, " is ", actual, " bytes but ", kMetaFile, " records ", recorded->second,
            " (incomplete or modified file)");
  std::map<std::string, StoredTensor> stored;
  for (const SafetensorsEntry& e : read_safetensors_header(path.string()).entries) stored[e.name] = {e.dtype, e.shape};
  check_tensor_list(std::move(stored), file, expected, what);
}

// The same check on tensors already read (the file could have changed since its header was checked).
void check_loaded(const optim::NamedTensors& loaded, const char* file, const optim::NamedTensors& expected,
                  const char* what) {
  std::map<std::string, StoredTensor> stored;
  for (const auto& [name, t] : loaded) stored[name] = {t.dtype(), t.shape()};
  check_tensor_list(std::move(stored), file, expected, what);
}

void check_checkpoint(const fs::path& dir, const MetaFile& mf, const optim::NamedTensors& model,
                      const optim::Optimizer* optimizer, const std::string& expected_config_hash) {
  std::set<std::string> names;
  for (const auto& [name, t] : model) {
    CPF_CHECK(names.insert(name).second, "the model lists parameter '", name, "' more than once");
  }
  if (!expected_config_hash.empty()) {
    CPF_CHECK(mf.meta.config_hash == expected_config_hash, "config hash '", mf.meta.config_hash,
              "' differs from the expected '", expected_config_hash, "' (written by a different config)");
  }
  check_tensor_file(dir, kModelFile, mf, model, "the model");
  if (optimizer) {
    CPF_CHECK(!mf.meta.optimizer_name.empty(), "the checkpoint holds no optimizer state (weights only)");
    CPF_CHECK(mf.meta.optimizer_name == optimizer->name(), "the checkpoint holds ", mf.meta.optimizer_name,
              " state but the optimizer is ", optimizer->name());
    check_tensor_file(dir, kOptimizerFile, mf, optimizer->state_tensors(), "the optimizer");
  }
}

// Moves `tmp` to `final`, replacing an existing `final` atomically where the filesystem allows.
void publish(const fs::path& tmp, const fs::path& final_path) {
  if (!fs::exists(final_path)) {
    rename_path(tmp, final_path);
    return;
  }
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_path.c_str(), RENAME_EXCHANGE) == 0) {
    remove_tree(tmp);  // now holds the replaced checkpoint
    return;
  }
  // No atomic exchange here: move the old one aside first (a crash between the renames loses only
  // this step's older copy; earlier checkpoints stay valid).
  const fs::path old = final_path.parent_path() / (kOldPrefix + final_path.filename().string());
  remove_tree(old);
  rename_path(final_path, old);
  rename_path(tmp, final_path);
  remove_tree(old);
}

void remove_leftovers(const fs::path& dir) {
  for (const auto& entry : list_dir(dir)) {
    const std::string name = entry.path().filename().string();
    for (const char* prefix : {kTempPrefix, kOldPrefix}) {
      if (name.rfind(prefix, 0) == 0 && parse_step_dir(name.substr(std::string(prefix).size())) >= 0) {
        log_warn("checkpoint: removing ", entry.path().string(), " left by an interrupted save");
        remove_tree(entry.path());
      }
    }
  }
}

}  // namespace

std::string checkpoint_dir_name(int64_t step) {
  CPF_CHECK(step >= 0, "checkpoint: step must be >= 0, got ", step);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step_%08lld", static_cast<long long>(step));
  return buf;
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {};
  for (const auto& entry : list_dir(dir)) {
    const int64_t step = parse_step_dir(entry.path().filename().string());
    if (step >= 0 && entry.is_directory()) found.emplace_back(step, entry.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& [step, path] : found) out.push_back(std::move(path));
  return out;
}

std::string save_checkpoint(const std::string& dir, const optim::NamedTensors& model, const optim::Optimizer* optimizer,
                            const CheckpointMeta& meta, int keep_last) {
  CPF_CHECK(!dir.empty(), "save_checkpoint: the folder name is empty");
  CPF_CHECK(keep_last >= 0, "save_checkpoint: keep_last must be >= 0 (0 keeps all), got ", keep_last);
  CPF_CHECK(!model.empty(), "save_checkpoint: the model has no parameters");
  const std::string name = checkpoint_dir_name(meta.step);
  std::error_code ec;
  fs::create_directories(dir, ec);
  CPF_CHECK(!ec, "save_checkpoint: cannot create ", dir, ": ", ec.message());
  remove_leftovers(dir);

  const fs::path tmp = fs::path(dir) / (kTempPrefix + name);
  const fs::path final_path = fs::path(dir) / name;
  fs::create_directory(tmp, ec);
  CPF_CHECK(!ec, "save_checkpoint: cannot create ", tmp.string(), ": ", ec.message());
  try {
    std::map<std::string, uint64_t> sizes;
    save_safetensors((tmp / kModelFile).string(), model, {}, /*sync=*/true);
    sizes[kModelFile] = size_of(tmp / kModelFile);
    CheckpointMeta written = meta;
    written.optimizer_name.clear();
    written.optimizer_step = 0;
    if (optimizer) {
      save_safetensors((tmp / kOptimizerFile).string(), optimizer->state_tensors(), {}, /*sync=*/true);
      sizes[kOptimizerFile] = size_of(tmp / kOptimizerFile);
      written.optimizer_name = optimizer->name();
      written.optimizer_step = optimizer->step_count();
    }
    write_file((tmp / kMetaFile).string(), meta_to_json(written, sizes).dump(2) + "\n", /*sync=*/true);
    sync_directory(tmp.string());
    publish(tmp, final_path);
    sync_directory(dir);
  } catch (...) {
    fs::remove_all(tmp, ec);  // best effort: the next save removes it otherwise
    throw;
  }

  if (keep_last > 0) {
    std::vector<std::string> others;
    for (const std::string& path : list_checkpoints(dir)) {
      if (fs::path(path).filename() != name) others.push_back(path);
    }
    // Keep the newest keep_last - 1 others; delete the rest, oldest first. Renaming before removing
    // means a crash mid-delete never leaves a half-deleted step_* folder.
    const size_t keep_others = static_cast<size_t>(keep_last - 1);
    const size_t remove_count = others.size() > keep_others ? others.size() - keep_others : 0;
    for (size_t i = 0; i < remove_count; ++i) {
      const fs::path victim(others[i]);
      const fs::path aside = victim.parent_path() / (kOldPrefix + victim.filename().string());
      rename_path(victim, aside);
      remove_tree(aside);
    }
    if (remove_count > 0) sync_directory(dir);
  }
  return final_path.string();
}

CheckpointMeta read_checkpoint_meta(const std::string& path) {
  try {
    return read_meta_file(path).meta;
  } catch (const Error& e) {
    CPF_FAIL("checkpoint ", path, ": ", e.message());
  }
}

std::string checkpoint_problem(const std::string& path, const optim::NamedTensors& model,
                               const optim::Optimizer* optimizer, const std::string& expected_config_hash) {
  try {
    const MetaFile mf = read_meta_file(path);
    check_checkpoint(path, mf, model, optimizer, expected_config_hash);
    return "";
  } catch (const Error& e) {
    return e.message();
  } catch (const std::exception& e) {  // filesystem errors
    return e.what();
  }
}

std::optional<std::string> find_latest_valid(const std::string& dir, const optim::NamedTensors& model,
                                             const optim::Optimizer* optimizer,
                                             const std::string& expected_config_hash) {
  const std::vector<std::string> candidates = list_checkpoints(dir);
  for (auto it = candidates.rbegin(); it != candidates.rend(); ++it) {
    const std::string problem = checkpoint_problem(*it, model, optimizer, expected_config_hash);
    if (problem.empty()) return *it;
    log_warn("checkpoint: skipping ", *it, ": ", problem);
  }
  return std::nullopt;
}

CheckpointMeta load_checkpoint(const std::string& path, const optim::NamedTensors& model, optim::Optimizer* optimizer,
                               const std::string& expected_config_hash) {
  const std::string problem = checkpoint_problem(path, model, optimizer, expected_config_hash);
  CPF_CHECK(problem.empty(), "load_checkpoint: ", path, ": ", problem);
  const CheckpointMeta meta = read_checkpoint_meta(path);

  // Read everything before touching live tensors: a bad byte anywhere aborts with nothing changed.
  const fs::path dir(path);
  optim::NamedTensors weights;
  optim::NamedTensors state;
  try {
    weights = load_safetensors((dir / kModelFile).string());
    check_loaded(weights, kModelFile, model, "the model");
    if (optimizer) {
      state = load_safetensors((dir / kOptimizerFile).string());
      check_loaded(state, kOptimizerFile, optimizer->state_tensors(), "the optimizer");
    }
  } catch (const Error& e) {
    CPF_FAIL("load_checkpoint: ", path, ": ", e.message());
  }
  const std::map<std::string, Tensor> by_name(weights.begin(), weights.end());

  NoGradGuard no_grad;
  for (const auto& [name, live] : model) raw::copy_(live, by_name.at(name));
  if (optimizer) optimizer->load_state(state, meta.optimizer_step);
  return meta;
}

}  // namespace cpf::io
