#include "framework/io/sharded_checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "framework/core/error.h"
#include "framework/io/checkpoint_folder.h"
#include "framework/io/checkpoint_meta.h"
#include "framework/io/checkpoint_pieces.h"
#include "framework/io/file_io.h"
#include "framework/io/tensor_integrity.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/views.h"

namespace cpf::io {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// ".receipt-00002-of-00004.json": what rank 2 wrote (file sizes, checksums), for finish's meta.json.
std::string receipt_name(int64_t rank, int64_t world) {
  char buf[64];
  std::snprintf(buf, sizeof buf, ".receipt-%05lld-of-%05lld.json", static_cast<long long>(rank),
                static_cast<long long>(world));
  return buf;
}

void check_rank(int64_t rank, int64_t world, const char* op) {
  CPF_CHECK(world >= 1 && rank >= 0 && rank < world, op, ": rank ", rank, " of world ", world,
            " (expected 0 <= rank < world)");
}

void check_piece_names(const optim::NamedTensors& tensors, const char* what) {
  for (const auto& [name, t] : tensors) {
    const auto piece = parse_piece_name(name);
    CPF_CHECK(piece && t.dim() == 1 && t.numel() == piece->second.second - piece->second.first,
              "write_checkpoint_shard: ", what, " '", name, "' of shape ", t.shape(),
              " is not a piece (a 1-D tensor named <tensor>[begin:end] with end - begin elements)");
  }
}

// One file of this rank: written, fsynced, recorded in the receipt.
void write_shard_file(const fs::path& path, const optim::NamedTensors& tensors, json& receipt) {
  const TensorChecksums sums = save_safetensors(path.string(), tensors, {}, /*sync=*/true);
  const std::string file = path.filename().string();
  receipt["files"][file] = size_of(path);
  receipt["checksums"][file] = sums;
}

// Adds rank `rank`'s receipt to `out` and checks that the files it names are there with their sizes.
void read_receipt(const fs::path& tmp, int64_t rank, int64_t world, bool with_optimizer, CheckpointMetaFile& out) {
  const fs::path path = tmp / receipt_name(rank, world);
  CPF_CHECK(fs::exists(path), "finish_sharded_checkpoint: rank ", rank, " of ", world, " left no receipt in ",
            tmp.string(), " (its write failed or has not returned)");
  const json receipt = json::parse(read_file(path.string()));
  for (const std::string& role : {std::string("model"), std::string("optimizer")}) {
    if (role == "optimizer" && !with_optimizer) continue;
    const std::string file = shard_file_name(role, rank, world);
    CPF_CHECK(receipt.contains("files") && receipt["files"].contains(file), "finish_sharded_checkpoint: rank ", rank,
              " wrote no ", file);
    const uint64_t size = receipt["files"][file].get<uint64_t>();
    CPF_CHECK(fs::exists(tmp / file) && size_of(tmp / file) == size, "finish_sharded_checkpoint: ", file,
              " is missing or not the ", size, " bytes rank ", rank, " wrote");
    out.file_sizes[file] = size;
    out.checksums[file] = receipt["checksums"][file].get<TensorChecksums>();
  }
}

}  // namespace

std::string shard_file_name(const std::string& role, int64_t rank, int64_t world) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%s.shard-%05lld-of-%05lld.safetensors", role.c_str(), static_cast<long long>(rank),
                static_cast<long long>(world));
  return buf;
}

std::optional<std::pair<std::string, std::pair<int64_t, int64_t>>> parse_piece_name(const std::string& name) {
  const size_t open = name.rfind('[');
  if (open == std::string::npos || open == 0 || name.back() != ']') return std::nullopt;
  const std::string range = name.substr(open + 1, name.size() - open - 2);
  const size_t colon = range.find(':');
  const auto digits = [](const std::string& s) {
    return !s.empty() && s.size() <= 18 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (colon == std::string::npos || !digits(range.substr(0, colon)) || !digits(range.substr(colon + 1))) {
    return std::nullopt;
  }
  const int64_t begin = std::stoll(range.substr(0, colon)), end = std::stoll(range.substr(colon + 1));
  if (begin >= end) return std::nullopt;
  return std::make_pair(name.substr(0, open), std::make_pair(begin, end));
}

std::string prepare_sharded_checkpoint(const std::string& dir, int64_t step) {
  CPF_CHECK(!dir.empty(), "prepare_sharded_checkpoint: the folder name is empty");
  std::error_code ec;
  fs::create_directories(dir, ec);
  CPF_CHECK(!ec, "prepare_sharded_checkpoint: cannot create ", dir, ": ", ec.message());
  remove_leftovers(dir);
  const fs::path tmp = sharded_checkpoint_temp_dir(dir, step);
  fs::create_directory(tmp, ec);
  CPF_CHECK(!ec, "prepare_sharded_checkpoint: cannot create ", tmp.string(), ": ", ec.message());
  return tmp.string();
}

std::string sharded_checkpoint_temp_dir(const std::string& dir, int64_t step) {
  return (fs::path(dir) / (kCheckpointTempPrefix + checkpoint_dir_name(step))).string();
}

void write_checkpoint_shard(const std::string& tmp, int64_t rank, int64_t world, const optim::NamedTensors& model,
                            const optim::NamedTensors* state) {
  check_rank(rank, world, "write_checkpoint_shard");
  CPF_CHECK(fs::is_directory(tmp), "write_checkpoint_shard: ", tmp,
            " is not a folder (rank 0 prepares it with prepare_sharded_checkpoint before the ranks write)");
  check_piece_names(model, "parameter piece");
  if (state) check_piece_names(*state, "optimizer state piece");
  // Refused before a byte is written: a non-finite checkpoint would poison every resume from it.
  std::optional<NonFiniteValue> bad = find_non_finite(model);
  if (!bad && state) bad = find_non_finite(*state);
  CPF_CHECK(!bad, "write_checkpoint_shard: refusing to write rank ", rank, "'s pieces into ", tmp, ": ",
            bad ? bad->describe() : "", "; the checkpoints already there are kept");
  json receipt{{"files", json::object()}, {"checksums", json::object()}};
  write_shard_file(fs::path(tmp) / shard_file_name("model", rank, world), model, receipt);
  if (state) write_shard_file(fs::path(tmp) / shard_file_name("optimizer", rank, world), *state, receipt);
  write_file((fs::path(tmp) / receipt_name(rank, world)).string(), receipt.dump(), /*sync=*/true);
}

std::string finish_sharded_checkpoint(const std::string& dir, const std::string& tmp, const CheckpointMeta& meta,
                                      int64_t world, int keep_last) {
  CPF_CHECK(world >= 1, "finish_sharded_checkpoint: world ", world, " must be at least 1");
  CPF_CHECK(keep_last >= 0, "finish_sharded_checkpoint: keep_last must be >= 0 (0 keeps all), got ", keep_last);
  const std::string name = checkpoint_dir_name(meta.step);
  CPF_CHECK(fs::path(tmp).filename() == kCheckpointTempPrefix + name, "finish_sharded_checkpoint: ", tmp,
            " is not the temporary folder of step ", meta.step, " (prepare_sharded_checkpoint's)");
  CheckpointMetaFile written;
  written.meta = meta;
  written.shards = world;
  for (int64_t r = 0; r < world; ++r) read_receipt(tmp, r, world, !meta.optimizer_name.empty(), written);
  for (int64_t r = 0; r < world; ++r) remove_tree(fs::path(tmp) / receipt_name(r, world));
  write_file((fs::path(tmp) / kCheckpointMetaFile).string(), checkpoint_meta_json(written), /*sync=*/true);
  sync_directory(tmp);
  const fs::path final_path = fs::path(dir) / name;
  publish(tmp, final_path);
  sync_directory(dir);
  if (keep_last > 0) remove_older_checkpoints(dir, name, keep_last);
  return final_path.string();
}

std::vector<std::string> shard_files(const std::string& role, int64_t world) {
  std::vector<std::string> files;
  for (int64_t r = 0; r < world; ++r) files.push_back(shard_file_name(role, r, world));
  return files;
}

PieceCover check_piece_cover(const std::vector<std::pair<std::string, std::vector<SafetensorsEntry>>>& files,
                             const optim::NamedTensors& expected, const char* what) {
  std::map<std::string, const Tensor*> live;
  for (const auto& [name, t] : expected) live[name] = &t;
  PieceCover cover;
  for (const auto& [file, entries] : files) {
    for (const SafetensorsEntry& e : entries) {
      const auto piece = parse_piece_name(e.name);
      CPF_CHECK(piece, file, " holds tensor '", e.name, "', which is not a piece (<tensor>[begin:end])");
      const auto& [tensor, range] = *piece;
      const auto it = live.find(tensor);
      CPF_CHECK(it != live.end(), file, " has tensor '", tensor, "' which ", what, " does not have");
      CPF_CHECK(e.dtype == it->second->dtype() && e.shape == Shape{range.second - range.first} &&
                    range.second <= it->second->numel(),
                file, ": piece '", e.name, "' (", e.dtype, " ", e.shape, ") does not fit '", tensor, "' (",
                it->second->dtype(), ", ", it->second->numel(), " elements) of ", what);
      cover[tensor].push_back({file, e.name, range.first, range.second});
    }
  }
  for (const auto& [name, t] : expected) {
    std::vector<StoredPiece>& pieces = cover[name];
    std::sort(pieces.begin(), pieces.end(),
              [](const StoredPiece& a, const StoredPiece& b) { return a.begin < b.begin; });
    int64_t covered = 0;
    for (size_t i = 0; i < pieces.size(); ++i) {
      CPF_CHECK(pieces[i].begin <= covered, "elements [", covered, ", ", pieces[i].begin, ") of '", name,
                "' are in no file (", what, " has ", t.numel(), ")");
      CPF_CHECK(pieces[i].begin == covered, "elements [", pieces[i].begin, ", ", std::min(covered, pieces[i].end),
                ") of '", name, "' are in both ", pieces[i - 1].file, " and ", pieces[i].file);
      covered = pieces[i].end;
    }
    CPF_CHECK(covered == t.numel(), "elements [", covered, ", ", t.numel(), ") of '", name, "' are in no file (", what,
              " has ", t.numel(), ")");
  }
  return cover;
}

optim::NamedTensors assemble_pieces(const PieceCover& cover,
                                    const std::map<std::string, std::map<std::string, Tensor>>& loaded,
                                    const optim::NamedTensors& expected) {
  optim::NamedTensors whole;
  for (const auto& [name, t] : expected) {
    Tensor out = empty(t.shape(), {.dtype = t.dtype()});
    const Tensor flat = raw::view(out, {t.numel()});
    for (const StoredPiece& p : cover.at(name)) {
      raw::copy_(raw::narrow(flat, 0, p.begin, p.end - p.begin), loaded.at(p.file).at(p.stored));
    }
    whole.emplace_back(name, out);
  }
  return whole;
}

}  // namespace cpf::io
