#pragma once
// Reading the pieces of a sharded checkpoint (sharded_checkpoint.h): which stored pieces tile each
// tensor, the whole tensors assembled from them, and the meta.json checks both loaders share. Internal
// to framework/io (checkpoint.cpp, checkpoint_ranges.cpp).
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "framework/io/checkpoint_meta.h"
#include "framework/io/safetensors.h"
#include "framework/io/tensor_integrity.h"
#include "framework/optim/optimizer.h"

namespace cpf::io {

// Elements [begin, end) of a tensor, stored as tensor `stored` of file `file`.
struct StoredPiece {
  std::string file, stored;
  int64_t begin = 0, end = 0;
};
using PieceCover = std::map<std::string, std::vector<StoredPiece>>;  // tensor -> its pieces by begin

// The shard files of one role ("model", "optimizer") of a checkpoint written by `world` ranks.
std::vector<std::string> shard_files(const std::string& role, int64_t world);

// Checks that the pieces the files hold ((file, its header's entries) in rank order) tile every tensor of
// `expected` exactly once, in its dtype, and name nothing else; throws naming the tensor, the element
// and the files. `what` names the live side ("the model"). Returns every tensor's pieces.
PieceCover check_piece_cover(const std::vector<std::pair<std::string, std::vector<SafetensorsEntry>>>& files,
                             const optim::NamedTensors& expected, const char* what);

// The tensors of `expected` (names, shapes, dtypes), each assembled on the host from its pieces in
// `loaded` (file -> stored name -> tensor).
optim::NamedTensors assemble_pieces(const PieceCover& cover,
                                    const std::map<std::string, std::map<std::string, Tensor>>& loaded,
                                    const optim::NamedTensors& expected);

// meta.json of the checkpoint folder `dir`, parsed and checked against the folder's step number.
CheckpointMetaFile read_meta_file(const std::filesystem::path& dir);

// One stored tensor's data against meta.json: its checksum (format 2) and finite floating-point values;
// throws naming the file and the tensor.
void check_tensor_integrity(const char* file, const CheckpointMetaFile& mf, const std::string& name,
                            const std::string& checksum, const std::optional<NonFiniteValue>& non_finite);

}  // namespace cpf::io
