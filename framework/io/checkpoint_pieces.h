#pragma once
// Reading the pieces of a sharded checkpoint (sharded_checkpoint.h): which stored pieces tile each
// tensor, and the whole tensors assembled from them. Internal to framework/io (checkpoint.cpp).
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "framework/io/safetensors.h"
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

}  // namespace cpf::io
