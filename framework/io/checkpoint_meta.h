#pragma once
// meta.json of a checkpoint folder (framework/io/checkpoint.h): writing and strict parsing.
//
// Format version 2 (written now) records, besides the run metadata and each file's byte size, the
// XXH3-64 checksum of every tensor of every file and a checksum of meta.json itself (over its
// canonical JSON without that field), so a flipped bit anywhere in a checkpoint is detected. Version 1
// (no checksums) is still read: such checkpoints load, with a note that their data is unverified.
// Version 3 is version 2 plus "shards": W, a checkpoint written in parallel by W ranks, each into its own
// model and optimizer files of pieces (framework/io/sharded_checkpoint.h); one-file checkpoints stay
// version 2, so older builds still read them.
#include <cstdint>
#include <map>
#include <string>

#include "framework/io/checkpoint.h"

namespace cpf::io {

inline constexpr const char* kCheckpointMetaFile = "meta.json";
inline constexpr int64_t kCheckpointVersion = 2;
inline constexpr int64_t kCheckpointVersionSharded = 3;
inline constexpr int64_t kCheckpointVersionWithoutChecksums = 1;

struct CheckpointMetaFile {
  CheckpointMeta meta;
  int64_t version = kCheckpointVersion;
  std::map<std::string, uint64_t> file_sizes;        // file name -> bytes
  std::map<std::string, TensorChecksums> checksums;  // file name -> tensor -> checksum (version 2)
  int64_t shards = 0;                                // 0: model.safetensors (+ optimizer); W >= 1: W shard files each
  bool has_checksums() const { return version >= 2; }
};

// The text of meta.json (pretty-printed, newline-terminated), its own checksum included.
std::string checkpoint_meta_json(const CheckpointMetaFile& file);

// Parses and validates meta.json's text; throws cpf::Error naming the field and the problem.
CheckpointMetaFile parse_checkpoint_meta(const std::string& text);

}  // namespace cpf::io
