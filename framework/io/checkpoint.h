#pragma once
// Training checkpoints: model weights, optimizer state and run metadata, written atomically.
//
//   <dir>/step_00001200/model.safetensors      parameters by name ("blocks.0.attn.q_proj.weight")
//                      /optimizer.safetensors  Optimizer::state_tensors() ("exp_avg.blocks.0...")
//                      /meta.json              step, RNG state, data cursor, config hash, optimizer
//                                              name and step count, byte size of each file, the
//                                              checksum of every tensor and of meta.json itself
//
// Saving writes everything into <dir>/.tmp-step_XXXXXXXX, fsyncs each file and the folder, then
// renames the folder into place and fsyncs <dir>: a crash at any point leaves either the complete
// new checkpoint or none, and the previous ones untouched. Resuming scans the step_* folders newest
// first, validates each one fully against the live model and optimizer (names, shapes, dtypes, file
// sizes, config hash, and every tensor's bytes against its checksum) and loads the first valid one;
// loading validates everything before it copies anything into the live tensors. Non-finite values
// are refused both ways: a save of NaN or inf parameters or optimizer state throws, naming the
// tensor, before anything is written, and a checkpoint holding them is never loaded. See
// docs/checkpoints.md.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "framework/io/safetensors.h"
#include "framework/io/tensor_integrity.h"
#include "framework/optim/optimizer.h"

namespace cpf::io {

struct CheckpointMeta {
  int64_t step = 0;       // optimizer steps completed when the checkpoint was taken (>= 0)
  uint64_t rng_seed = 0;  // Generator::seed() / offset() to restore with set_state
  uint64_t rng_offset = 0;
  int64_t data_cursor = 0;                   // the data loader's position (its own unit: samples, tokens, batches)
  std::string config_hash;                   // identifies the training config; resume refuses a different one
  std::map<std::string, std::string> extra;  // anything else the trainer wants back (strings)
  // Filled in by save and read back by load: the optimizer's name ("" for weights only) and steps.
  std::string optimizer_name;
  int64_t optimizer_step = 0;
};

// "step_00001200" (at least 8 digits).
std::string checkpoint_dir_name(int64_t step);

// Writes <dir>/step_XXXXXXXX atomically and returns its path. `optimizer` may be null (weights only).
// Throws, writing nothing, when a parameter or optimizer state tensor holds a non-finite value (the
// message names it; find_non_finite in framework/io/tensor_integrity.h is the same test for callers
// that want to know first). A checkpoint of the same step is replaced atomically. keep_last > 0 then
// deletes other step_* folders, oldest first, until keep_last remain counting the new one (which,
// being finite, is never lost to rotation); 0 keeps everything. Leftover .tmp-step_* folders of
// crashed saves are removed.
std::string save_checkpoint(const std::string& dir, const optim::NamedTensors& model, const optim::Optimizer* optimizer,
                            const CheckpointMeta& meta, int keep_last = 0);

// The step_* folders of `dir` (complete names only, not validated), ascending by step.
std::vector<std::string> list_checkpoints(const std::string& dir);

// Parses and checks meta.json of a checkpoint folder; throws naming the problem.
CheckpointMeta read_checkpoint_meta(const std::string& path);

// How deep checkpoint_problem looks: meta.json and the safetensors headers only, or also every
// tensor's bytes (read from the disk once: checksums, and finite floating-point values).
enum class CheckDepth { headers, data };

// Why the checkpoint at `path` cannot be loaded into `model` (and `optimizer`, when not null), or ""
// when it can. An empty expected_config_hash accepts any config.
std::string checkpoint_problem(const std::string& path, const optim::NamedTensors& model,
                               const optim::Optimizer* optimizer, const std::string& expected_config_hash,
                               CheckDepth depth = CheckDepth::headers);

// The newest loadable checkpoint in `dir`, checked with CheckDepth::data; invalid ones (truncated,
// corrupted, non-finite, another config...) are skipped with a warning naming them and the reason.
// nullopt when there is none (or `dir` does not exist).
std::optional<std::string> find_latest_valid(const std::string& dir, const optim::NamedTensors& model,
                                             const optim::Optimizer* optimizer,
                                             const std::string& expected_config_hash);

// Validates (as checkpoint_problem, then the tensor data it read: checksums, finite values), and only
// then copies the weights into `model`'s tensors and the state into `optimizer`. A checkpoint written
// before checksums were recorded (format version 1) loads with a note that it is unverified. Throws
// naming the problem, leaving every live tensor unchanged. Returns the metadata for the caller to
// restore RNG and data position.
CheckpointMeta load_checkpoint(const std::string& path, const optim::NamedTensors& model, optim::Optimizer* optimizer,
                               const std::string& expected_config_hash);

}  // namespace cpf::io
