// load_checkpoint_pieces (sharded_checkpoint.h): a rank fills its own pieces of the weights and of the
// optimizer state from whichever stored tensors or pieces overlap them, reading nothing else.
//
//   stored (a checkpoint of 3 ranks)   |--- rank 0 ---|--- rank 1 ---|--- rank 2 ---|   one tensor
//   wanted (this rank of 2)            |------ rank 0 -------|
//   read                               |--- whole ----|-whole-(verified), overlap copied|
//
// Each stored entry that overlaps is first streamed whole through its checksum and the finite-value
// check (bounded memory), then only the overlap is read into the piece. Nothing is copied into a live
// tensor before every piece has been read and verified.
#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include "framework/autograd/grad_mode.h"
#include "framework/io/checkpoint_pieces.h"
#include "framework/io/file_io.h"
#include "framework/io/sharded_checkpoint.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/views.h"

namespace cpf::io {
namespace {

namespace fs = std::filesystem;

// One stored tensor or piece: elements [begin, end) of `tensor`, entry `entry` of file `file`.
struct Stored {
  size_t file = 0, entry = 0;
  int64_t begin = 0, end = 0;
};

// The files of one role ("model", "optimizer"), their headers, and each tensor's stored parts by begin.
class StoredIndex {
 public:
  StoredIndex(const fs::path& dir, const CheckpointMetaFile& mf, const std::string& role) : dir_(dir), mf_(mf) {
    const std::vector<std::string> names =
        mf.shards > 0 ? shard_files(role, mf.shards) : std::vector<std::string>{role + ".safetensors"};
    for (const std::string& name : names) add_file(name);
    for (auto& [tensor, parts] : parts_) {
      std::sort(parts.begin(), parts.end(), [](const Stored& a, const Stored& b) { return a.begin < b.begin; });
    }
  }

  // Elements [begin, end) of `tensor` in `dtype`, as a (end - begin) host tensor.
  Tensor read(const std::string& tensor, int64_t begin, int64_t end, DType dtype, const char* what);

 private:
  void add_file(const std::string& name);
  void verify(const Stored& s);  // once per stored entry

  fs::path dir_;
  const CheckpointMetaFile& mf_;
  std::vector<std::string> files_;
  std::vector<std::unique_ptr<FileReader>> readers_;
  std::vector<SafetensorsHeader> headers_;
  std::map<std::string, std::vector<Stored>> parts_;
  std::set<std::pair<size_t, size_t>> verified_;
};

void StoredIndex::add_file(const std::string& name) {
  const auto recorded = mf_.file_sizes.find(name);
  CPF_CHECK(recorded != mf_.file_sizes.end(), kCheckpointMetaFile, " records no size for ", name);
  CPF_CHECK(fs::exists(dir_ / name), name, " is missing");
  auto reader = std::make_unique<FileReader>((dir_ / name).string());
  CPF_CHECK(reader->size() == recorded->second, name, " is ", reader->size(), " bytes but ", kCheckpointMetaFile,
            " records ", recorded->second, " (incomplete or modified file)");
  const size_t file = files_.size();
  headers_.push_back(read_safetensors_header(*reader));
  files_.push_back(name);
  readers_.push_back(std::move(reader));
  const std::vector<SafetensorsEntry>& entries = headers_.back().entries;
  for (size_t i = 0; i < entries.size(); ++i) {
    const SafetensorsEntry& e = entries[i];
    CPF_CHECK(e.file_dtype == safetensors_dtype_name(e.dtype), name, ": tensor '", e.name, "' is stored as ",
              e.file_dtype, ", not as a checkpoint stores it");
    const auto piece = parse_piece_name(e.name);
    const int64_t numel = shape_numel(e.shape);
    if (piece) {
      parts_[piece->first].push_back({file, i, piece->second.first, piece->second.second});
    } else {
      parts_[e.name].push_back({file, i, 0, numel});
    }
  }
}

void StoredIndex::verify(const Stored& s) {
  if (!verified_.insert({s.file, s.entry}).second) return;
  const SafetensorsEntry& e = headers_[s.file].entries[s.entry];
  const StoredTensorCheck c =
      check_stored_tensor(*readers_[s.file], headers_[s.file].data_start + e.begin, e.end - e.begin, e.name, e.dtype);
  check_tensor_integrity(files_[s.file].c_str(), mf_, e.name, c.checksum, c.non_finite);
}

Tensor StoredIndex::read(const std::string& tensor, int64_t begin, int64_t end, DType dtype, const char* what) {
  const auto it = parts_.find(tensor);
  CPF_CHECK(it != parts_.end(), "the checkpoint holds no tensor '", tensor, "' which ", what, " has");
  Tensor out = empty({end - begin}, {.dtype = dtype});
  auto* data = static_cast<char*>(out.raw_data());
  const auto size = static_cast<int64_t>(dtype_size(dtype));
  int64_t at = begin;
  for (const Stored& s : it->second) {
    if (s.end <= at || s.begin >= end) continue;
    const SafetensorsEntry& e = headers_[s.file].entries[s.entry];
    CPF_CHECK(s.begin <= at, "elements [", at, ", ", s.begin, ") of '", tensor, "' are in no file");
    CPF_CHECK(at == begin || s.begin == at, "elements [", s.begin, ", ", at, ") of '", tensor,
              "' are stored twice (the second time in ", files_[s.file], ")");
    CPF_CHECK(e.dtype == dtype, files_[s.file], ": '", e.name, "' is ", e.dtype, " but ", what, " has ", dtype);
    verify(s);
    const int64_t stop = std::min(end, s.end);
    readers_[s.file]->read_at(headers_[s.file].data_start + e.begin + static_cast<uint64_t>((at - s.begin) * size),
                              data + (at - begin) * size, static_cast<size_t>((stop - at) * size));
    at = stop;
  }
  CPF_CHECK(at == end, "elements [", at, ", ", end, ") of '", tensor, "' are in no file (", what, " wants them)");
  return out;
}

// Every tensor of `wanted` (pieces "<tensor>[begin:end]" or whole tensors) read from `index`, in the live
// tensors' shapes.
optim::NamedTensors read_wanted(StoredIndex& index, const optim::NamedTensors& wanted, const char* what) {
  optim::NamedTensors out;
  for (const auto& [name, live] : wanted) {
    const auto piece = parse_piece_name(name);
    if (piece) {
      CPF_CHECK(live.dim() == 1 && live.numel() == piece->second.second - piece->second.first, what, "'s '", name,
                "' of shape ", live.shape(), " is not a piece (a 1-D tensor of end - begin elements)");
    }
    const Tensor flat = piece ? index.read(piece->first, piece->second.first, piece->second.second, live.dtype(), what)
                              : index.read(name, 0, live.numel(), live.dtype(), what);
    out.emplace_back(name, raw::view(flat, live.shape()));
  }
  return out;
}

}  // namespace

CheckpointMeta load_checkpoint_pieces(const std::string& path, const optim::NamedTensors& model_pieces,
                                      optim::Optimizer* optimizer, const std::string& expected_config_hash) {
  const fs::path dir(path);
  CheckpointMetaFile mf;
  optim::NamedTensors weights, state;
  try {
    mf = read_meta_file(dir);
    CPF_CHECK(expected_config_hash.empty() || mf.meta.config_hash == expected_config_hash, "config hash '",
              mf.meta.config_hash, "' differs from the expected '", expected_config_hash,
              "' (written by a different config)");
    StoredIndex model(dir, mf, "model");
    weights = read_wanted(model, model_pieces, "the model");
    if (optimizer) {
      CPF_CHECK(!mf.meta.optimizer_name.empty(), "the checkpoint holds no optimizer state (weights only)");
      CPF_CHECK(mf.meta.optimizer_name == optimizer->name(), "the checkpoint holds ", mf.meta.optimizer_name,
                " state but the optimizer is ", optimizer->name());
      StoredIndex stored_state(dir, mf, "optimizer");
      state = read_wanted(stored_state, optimizer->state_tensors(), "the optimizer");
    }
  } catch (const Error& e) {
    CPF_FAIL("load_checkpoint_pieces: ", path, ": ", e.message());
  }
  NoGradGuard no_grad;
  // copy_ moves each piece's version: what was gathered or cast from the old values is stale.
  for (size_t i = 0; i < model_pieces.size(); ++i) raw::copy_(model_pieces[i].second, weights[i].second);
  if (optimizer) optimizer->load_state(state, mf.meta.optimizer_step);
  return mf.meta;
}

}  // namespace cpf::io
