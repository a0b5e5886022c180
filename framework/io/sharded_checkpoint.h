#pragma once
// Sharded checkpoints: W ranks write one checkpoint in parallel, each rank only its pieces of the weights
// and of the optimizer state (ZeRO's shards, framework/distributed/zero_shards.h): 1-D flattened element
// ranges of whole tensors, named "<tensor>[begin:end]". Nothing is gathered and no rank holds more than
// its own part.
//
//   step_00000400/model.shard-00002-of-00004.safetensors      rank 2's pieces of the parameters
//                /optimizer.shard-00002-of-00004.safetensors  rank 2's pieces of the optimizer state
//                /meta.json   version 3, "shards": 4, every file's size and every piece's checksum
//
// Writing, in three phases the caller orders with its process group (barriers or flag all-reduces):
//   tmp = prepare_sharded_checkpoint(dir, step);              // rank 0, before anyone writes
//   write_checkpoint_shard(tmp, rank, world, pieces, state);  // every rank: its two files, fsynced
//   finish_sharded_checkpoint(dir, tmp, meta, world, keep);   // rank 0, once every rank has written
// finish writes meta.json from the receipts the ranks left (sizes and checksums), fsyncs and renames the
// folder into place: as with save_checkpoint, a crash at any point leaves the complete checkpoint or none.
//
// Reading needs no world size: checkpoint_problem, find_latest_valid and load_checkpoint (checkpoint.h)
// take both layouts. Every tensor the live model (and optimizer) names must be tiled exactly once by the
// pieces of all files (a gap or an overlap is refused, naming the tensor and the element), and is
// assembled whole from them, so a checkpoint of 4 ranks resumes on 2, on 1, or in another shard mode,
// and `cpformer generate` and `export` read it as any other.
//
// Reading without holding the whole: load_checkpoint_pieces fills one rank's pieces only, reading the
// stored tensors or pieces that overlap them (its own file when the world size and layout are the same),
// so a sharded run resumes with no rank ever holding more than its part.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "framework/io/checkpoint.h"

namespace cpf::io {

// "model.shard-00002-of-00004.safetensors"; role is "model" or "optimizer".
std::string shard_file_name(const std::string& role, int64_t rank, int64_t world);

// "<tensor>[begin:end]" -> (tensor, (begin, end)); nullopt for any other name.
std::optional<std::pair<std::string, std::pair<int64_t, int64_t>>> parse_piece_name(const std::string& name);

// Rank 0, before any rank writes: removes leftovers of interrupted saves and creates the (empty)
// temporary folder of step `step` in `dir`; returns it (sharded_checkpoint_temp_dir, which the other
// ranks compute themselves).
std::string prepare_sharded_checkpoint(const std::string& dir, int64_t step);
std::string sharded_checkpoint_temp_dir(const std::string& dir, int64_t step);

// Every rank: writes its pieces of the parameters (`model`) and of the optimizer state (`state`, null for
// weights only) into `tmp`, fsynced, with a receipt for finish. Names must be pieces
// ("<tensor>[begin:end]"). Throws, writing nothing, on a non-finite value (naming it) or a bad name.
void write_checkpoint_shard(const std::string& tmp, int64_t rank, int64_t world, const optim::NamedTensors& model,
                            const optim::NamedTensors* state);

// Rank 0, after every rank's write returned: meta.json (meta's optimizer_name empty = weights only),
// publish, rotation to keep_last (0 keeps all). Throws naming a rank whose files or receipt are missing
// (and leaves the temporary folder for the next save to remove). Returns the checkpoint's folder.
std::string finish_sharded_checkpoint(const std::string& dir, const std::string& tmp, const CheckpointMeta& meta,
                                      int64_t world, int keep_last = 0);

// Every rank, resuming a sharded run: fills `model_pieces` and, when `optimizer` is not null, its state
// (an optimizer over the pieces, so its state is named "<slot>.<tensor>[begin:end]") from the checkpoint
// at `path`, of either layout and any world size. Names are pieces ("<tensor>[begin:end]", 1-D) or whole
// tensors. Only the stored entries overlapping the wanted elements are read, each verified whole first
// (checksum, finite values); a gap, an element stored twice, a dtype that differs, another config hash
// or optimizer are refused, naming the tensor, and nothing live changes before everything was read. The
// pieces' versions move (copy_). The whole tensors' shapes are not known here: check the checkpoint against
// the whole model first (checkpoint_problem, as find_resume_checkpoint does).
CheckpointMeta load_checkpoint_pieces(const std::string& path, const optim::NamedTensors& model_pieces,
                                      optim::Optimizer* optimizer, const std::string& expected_config_hash);

}  // namespace cpf::io
