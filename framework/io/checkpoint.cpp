#include "framework/io/checkpoint.h"

#include <fcntl.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <set>

#include "framework/autograd/grad_mode.h"
#include "framework/core/logging.h"
#include "framework/io/checkpoint_folder.h"
#include "framework/io/checkpoint_meta.h"
#include "framework/io/checkpoint_pieces.h"
#include "framework/io/file_io.h"
#include "framework/io/tensor_integrity.h"
#include "framework/tensor/ops/copy.h"

namespace cpf::io {
namespace {

namespace fs = std::filesystem;
constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kMetaFile = kCheckpointMetaFile;

using MetaFile = CheckpointMetaFile;

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

// Format 2: the checksums recorded for `file` name exactly the tensors its header lists.
void check_checksum_names(const char* file, const MetaFile& mf, const std::vector<SafetensorsEntry>& entries) {
  if (!mf.has_checksums()) return;
  const auto sums = mf.checksums.find(file);
  CPF_CHECK(sums != mf.checksums.end(), kMetaFile, " records no checksums for ", file);
  for (const SafetensorsEntry& e : entries) {
    CPF_CHECK(sums->second.count(e.name) == 1, kMetaFile, " records no checksum for tensor '", e.name, "' of ", file);
  }
  CPF_CHECK(sums->second.size() == entries.size(), kMetaFile, " records checksums of ", sums->second.size(),
            " tensors for ", file, ", which holds ", entries.size());
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
  const SafetensorsHeader header = read_safetensors_header(path.string());
  std::map<std::string, StoredTensor> stored;
  for (const SafetensorsEntry& e : header.entries) stored[e.name] = {e.dtype, e.shape};
  check_tensor_list(std::move(stored), file, expected, what);
  check_checksum_names(file, mf, header.entries);
}

// A sharded checkpoint's files of `role`: each with its recorded size, checksum names and a valid header,
// and together tiling every tensor of `expected` exactly once. Returns the tiling.
PieceCover check_shard_files(const fs::path& dir, const std::string& role, const MetaFile& mf,
                             const optim::NamedTensors& expected, const char* what) {
  std::vector<std::pair<std::string, std::vector<SafetensorsEntry>>> headers;
  for (const std::string& file : shard_files(role, mf.shards)) {
    const auto recorded = mf.file_sizes.find(file);
    CPF_CHECK(recorded != mf.file_sizes.end(), kMetaFile, " records no size for ", file);
    CPF_CHECK(fs::exists(dir / file), file, " is missing");
    const uint64_t actual = size_of(dir / file);
    CPF_CHECK(actual == recorded->second, file, " is ", actual, " bytes but ", kMetaFile, " records ", recorded->second,
              " (incomplete or modified file)");
    SafetensorsHeader header = read_safetensors_header((dir / file).string());
    check_checksum_names(file.c_str(), mf, header.entries);
    headers.emplace_back(file, std::move(header.entries));
  }
  return check_piece_cover(headers, expected, what);
}

// The names of the tensor files of a checkpoint (one per role, or the shards), for the data checks.
std::vector<std::string> tensor_files(const MetaFile& mf, bool with_optimizer) {
  if (mf.shards == 0) {
    return with_optimizer ? std::vector<std::string>{kModelFile, kOptimizerFile} : std::vector<std::string>{kModelFile};
  }
  std::vector<std::string> files = shard_files("model", mf.shards);
  if (with_optimizer) {
    for (const std::string& f : shard_files("optimizer", mf.shards)) files.push_back(f);
  }
  return files;
}

// The same check on tensors already read (the file could have changed since its header was checked).
void check_loaded(const optim::NamedTensors& loaded, const char* file, const optim::NamedTensors& expected,
                  const char* what) {
  std::map<std::string, StoredTensor> stored;
  for (const auto& [name, t] : loaded) stored[name] = {t.dtype(), t.shape()};
  check_tensor_list(std::move(stored), file, expected, what);
}

// Reads every tensor of `file` from the disk (in bounded chunks) and checks its integrity.
void check_tensor_data(const fs::path& dir, const char* file, const MetaFile& mf) {
  const FileReader reader((dir / file).string());
  const SafetensorsHeader h = read_safetensors_header(reader);
  check_checksum_names(file, mf, h.entries);
  for (const SafetensorsEntry& e : h.entries) {
    const StoredTensorCheck c = check_stored_tensor(reader, h.data_start + e.begin, e.end - e.begin, e.name, e.dtype);
    check_tensor_integrity(file, mf, e.name, c.checksum, c.non_finite);
  }
}

// The same on tensors already read into memory (what load_checkpoint is about to copy).
void check_loaded_data(const optim::NamedTensors& loaded, const char* file, const MetaFile& mf) {
  for (const auto& [name, t] : loaded) {
    const size_t nbytes = static_cast<size_t>(t.numel()) * dtype_size(t.dtype());
    const void* data = nbytes > 0 ? t.raw_data() : "";
    check_tensor_integrity(file, mf, name, tensor_checksum(data, nbytes),
                           find_non_finite(name, t.dtype(), data, t.numel()));
  }
}

// A sharded checkpoint's tensors of `role`, read from every shard file (each checked as read: checksums,
// finite values), re-tiled against `expected` and assembled whole.
optim::NamedTensors load_sharded(const fs::path& dir, const std::string& role, const MetaFile& mf,
                                 const optim::NamedTensors& expected, const char* what) {
  std::vector<std::pair<std::string, std::vector<SafetensorsEntry>>> headers;
  std::map<std::string, std::map<std::string, Tensor>> loaded;
  for (const std::string& file : shard_files(role, mf.shards)) {
    const optim::NamedTensors pieces = load_safetensors((dir / file).string());
    check_loaded_data(pieces, file.c_str(), mf);
    std::vector<SafetensorsEntry> entries;
    for (const auto& [name, t] : pieces) {
      entries.push_back({.name = name, .dtype = t.dtype(), .file_dtype = dtype_name(t.dtype()), .shape = t.shape()});
      loaded[file][name] = t;
    }
    headers.emplace_back(file, std::move(entries));
  }
  return assemble_pieces(check_piece_cover(headers, expected, what), loaded, expected);
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
  if (mf.shards > 0) {
    check_shard_files(dir, "model", mf, model, "the model");
  } else {
    check_tensor_file(dir, kModelFile, mf, model, "the model");
  }
  if (optimizer) {
    CPF_CHECK(!mf.meta.optimizer_name.empty(), "the checkpoint holds no optimizer state (weights only)");
    CPF_CHECK(mf.meta.optimizer_name == optimizer->name(), "the checkpoint holds ", mf.meta.optimizer_name,
              " state but the optimizer is ", optimizer->name());
    if (mf.shards > 0) {
      check_shard_files(dir, "optimizer", mf, optimizer->state_tensors(), "the optimizer");
    } else {
      check_tensor_file(dir, kOptimizerFile, mf, optimizer->state_tensors(), "the optimizer");
    }
  }
}

// Non-finite weights or optimizer state would poison every resume from this checkpoint, and with
// rotation push the good ones out: such a save is refused before anything is written. Every saved
// checkpoint is therefore finite, so rotation (which keeps the new one) never removes the last
// finite checkpoint.
void refuse_non_finite(const std::string& dir, int64_t step, const optim::NamedTensors& model,
                       const optim::Optimizer* optimizer) {
  std::optional<NonFiniteValue> bad = find_non_finite(model);
  const char* what = "model parameter";
  if (!bad && optimizer) {
    bad = find_non_finite(optimizer->state_tensors());
    what = "optimizer state";
  }
  if (!bad) return;
  const std::vector<std::string> kept = list_checkpoints(dir);
  CPF_FAIL("save_checkpoint: refusing to write step ", step, " into ", dir, ": ", what, " ", bad->describe(),
           "; the checkpoints already there are kept",
           kept.empty() ? std::string(" (there are none)") : " (newest: " + kept.back() + ")");
}

}  // namespace

CheckpointMetaFile read_meta_file(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  CPF_CHECK(fs::is_directory(dir), "not a folder");
  CPF_CHECK(fs::exists(dir / kCheckpointMetaFile), kCheckpointMetaFile, " is missing");
  CheckpointMetaFile mf = parse_checkpoint_meta(read_file((dir / kCheckpointMetaFile).string()));
  const int64_t dir_step = parse_step_dir(dir.filename().string());
  CPF_CHECK(dir_step < 0 || dir_step == mf.meta.step, "folder name says step ", dir_step, " but ", kCheckpointMetaFile,
            " says step ", mf.meta.step);
  return mf;
}

// One tensor's data against meta.json: its checksum (format 2) and finite floating-point values.
void check_tensor_integrity(const char* file, const CheckpointMetaFile& mf, const std::string& name,
                            const std::string& checksum, const std::optional<NonFiniteValue>& non_finite) {
  if (mf.has_checksums()) {
    const auto sums = mf.checksums.find(file);
    CPF_CHECK(sums != mf.checksums.end() && sums->second.count(name) == 1, kCheckpointMetaFile,
              " records no checksum for tensor '", name, "' of ", file);
    const std::string& recorded = sums->second.at(name);
    CPF_CHECK(checksum == recorded, file, ": tensor '", name, "' fails its checksum (", kCheckpointMetaFile,
              " records ", recorded, ", the data hashes to ", checksum, "): the file is corrupted");
  }
  CPF_CHECK(!non_finite, file, ": ", non_finite ? non_finite->describe() : "",
            "; a checkpoint of non-finite values cannot be used");
}

std::string save_checkpoint(const std::string& dir, const optim::NamedTensors& model, const optim::Optimizer* optimizer,
                            const CheckpointMeta& meta, int keep_last) {
  CPF_CHECK(!dir.empty(), "save_checkpoint: the folder name is empty");
  CPF_CHECK(keep_last >= 0, "save_checkpoint: keep_last must be >= 0 (0 keeps all), got ", keep_last);
  CPF_CHECK(!model.empty(), "save_checkpoint: the model has no parameters");
  const std::string name = checkpoint_dir_name(meta.step);
  refuse_non_finite(dir, meta.step, model, optimizer);
  std::error_code ec;
  fs::create_directories(dir, ec);
  CPF_CHECK(!ec, "save_checkpoint: cannot create ", dir, ": ", ec.message());
  remove_leftovers(dir);

  const fs::path tmp = fs::path(dir) / (kCheckpointTempPrefix + name);
  const fs::path final_path = fs::path(dir) / name;
  fs::create_directory(tmp, ec);
  CPF_CHECK(!ec, "save_checkpoint: cannot create ", tmp.string(), ": ", ec.message());
  try {
    MetaFile written;
    written.meta = meta;
    written.meta.optimizer_name.clear();
    written.meta.optimizer_step = 0;
    written.checksums[kModelFile] = save_safetensors((tmp / kModelFile).string(), model, {}, /*sync=*/true);
    written.file_sizes[kModelFile] = size_of(tmp / kModelFile);
    if (optimizer) {
      written.checksums[kOptimizerFile] =
          save_safetensors((tmp / kOptimizerFile).string(), optimizer->state_tensors(), {}, /*sync=*/true);
      written.file_sizes[kOptimizerFile] = size_of(tmp / kOptimizerFile);
      written.meta.optimizer_name = optimizer->name();
      written.meta.optimizer_step = optimizer->step_count();
    }
    write_file((tmp / kMetaFile).string(), checkpoint_meta_json(written), /*sync=*/true);
    sync_directory(tmp.string());
    publish(tmp, final_path);
    sync_directory(dir);
  } catch (...) {
    fs::remove_all(tmp, ec);  // best effort: the next save removes it otherwise
    throw;
  }
  if (keep_last > 0) remove_older_checkpoints(dir, name, keep_last);
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
                               const optim::Optimizer* optimizer, const std::string& expected_config_hash,
                               CheckDepth depth) {
  try {
    const MetaFile mf = read_meta_file(path);
    check_checkpoint(path, mf, model, optimizer, expected_config_hash);
    if (depth == CheckDepth::data) {
      for (const std::string& file : tensor_files(mf, optimizer != nullptr)) check_tensor_data(path, file.c_str(), mf);
    }
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
    const std::string problem = checkpoint_problem(*it, model, optimizer, expected_config_hash, CheckDepth::data);
    if (problem.empty()) return *it;
    log_warn("checkpoint: skipping ", *it, ": ", problem);
  }
  return std::nullopt;
}

CheckpointMeta load_checkpoint(const std::string& path, const optim::NamedTensors& model, optim::Optimizer* optimizer,
                               const std::string& expected_config_hash) {
  const std::string problem = checkpoint_problem(path, model, optimizer, expected_config_hash);
  CPF_CHECK(problem.empty(), "load_checkpoint: ", path, ": ", problem);
  MetaFile mf;
  // Read everything before touching live tensors: a bad byte anywhere aborts with nothing changed.
  const fs::path dir(path);
  optim::NamedTensors weights;
  optim::NamedTensors state;
  try {
    mf = read_meta_file(path);
    if (mf.shards > 0) {
      weights = load_sharded(dir, "model", mf, model, "the model");
      if (optimizer) state = load_sharded(dir, "optimizer", mf, optimizer->state_tensors(), "the optimizer");
    } else {
      weights = load_safetensors((dir / kModelFile).string());
      check_loaded(weights, kModelFile, model, "the model");
      check_loaded_data(weights, kModelFile, mf);
      if (optimizer) {
        state = load_safetensors((dir / kOptimizerFile).string());
        check_loaded(state, kOptimizerFile, optimizer->state_tensors(), "the optimizer");
        check_loaded_data(state, kOptimizerFile, mf);
      }
    }
  } catch (const Error& e) {
    CPF_FAIL("load_checkpoint: ", path, ": ", e.message());
  }
  if (!mf.has_checksums()) {
    log_info("checkpoint: ", path, " has no checksums (format version ", mf.version,
             ", written before they were recorded): its data is loaded unverified");
  }
  const std::map<std::string, Tensor> by_name(weights.begin(), weights.end());

  NoGradGuard no_grad;
  for (const auto& [name, live] : model) raw::copy_(live, by_name.at(name));
  if (optimizer) optimizer->load_state(state, mf.meta.optimizer_step);
  return mf.meta;
}

}  // namespace cpf::io
