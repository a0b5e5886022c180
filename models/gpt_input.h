#pragma once
// From the data loader's batches (models/data) to what the GPT consumes.
//
// Both layouts become THD: a bshd batch (B, T) is B sequences of T tokens each (its rows), which is
// also exactly how the loader shards bshd rows under CP (chunks r and 2P-1-r of every row), so the
// model needs one code path. Under CP the SequenceInfo is the global batch's.
#include <cstdint>
#include <vector>

#include "models/data/cp_shard.h"
#include "models/gpt.h"

namespace cpf::models {

struct GPTBatch {
  GPTInput input;
  Tensor labels;                        // (T) i64, -100 = no loss
  int64_t num_valid_labels = 0;         // on this rank
  int64_t global_num_valid_labels = 0;  // over the CP group
};

// One rank's share (shard_for_rank) as model input and labels.
GPTBatch make_gpt_batch(const data::LocalBatch& local);

// The batch with its tokens, positions and labels on `device` (the model's; a no-op for the CPU). The
// SequenceInfo and the label counts stay on the host: the attention kernels take them from there.
GPTBatch to_device(GPTBatch batch, Device device);

// Inference on prompts: each prefix is one sequence (positions 0..len-1), packed back to back.
GPTInput make_prompt_input(const std::vector<std::vector<int64_t>>& prefixes, Device device = Device::cpu());

// The row of the logits holding each prompt's last token (for next-token prediction).
std::vector<int64_t> last_token_rows(const std::vector<std::vector<int64_t>>& prefixes);

}  // namespace cpf::models
