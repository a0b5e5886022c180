#pragma once
// The memory model of a GPT training step on one rank: what `cpformer check-config --memory` prints,
// what the trainer logs next to the measured peak, and what refuses a config that cannot fit before
// its first step. One model for all three, so the planner and the refusal never disagree.
//
// Per rank, in bytes (N parameters, T tokens of this rank's micro-batch, L blocks, C hidden, W ranks):
//   master weights   N x 4 (f32); shard parameters: N x 4 / W plus the root (embeddings, final norm,
//                    head) and two blocks whole (the one running, the one prefetched)
//   compute copies   N x 2 under bf16; shard parameters: of the whole units only (cast per use); under
//                    fp8 (mha/gqa) also each block's FP8 transposed weight copy (1 byte a parameter),
//                    kept to its backward (one block's at a time where blocks are fully recomputed)
//   gradients        N x 4 (f32), / W with shard gradients or parameters; only the part above
//                    activations + loss (the peak is where the backward starts or ends)
//   moments          N x 8 (AdamW), N x 4 (SGD + momentum); / W with any shard
//   activations      T x L_kept x (bytes a token keeps per block, by recompute mode)
//                    + T x (one block's whole activations) while a recomputed block runs backward
//   attention        what the CP strategy holds beside the block (received K/V tiles, gathered K/V)
//   communication    the gradient reducer's flat buckets (N x 4) when W > 1; shard gradients or
//                    parameters: the reduced shards (N x 4 / W) and two buckets in flight
//   loss             the fused classifier: one chunk of logits (its gradient written over it), d(hidden)
//                    (T x C x 4) and d(head weight) (V x C x 4)
// The bytes a token keeps per block are counted from the tensors each op saves for its backward (under
// fp8, a linear keeps its input as a one-byte FP8 copy)
// (docs/long_context.md lists them); a GPU test holds the model within 10% of measured peaks.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "models/gpt.h"

namespace cpf::models {

// How a step is run, beside the model's options: what the memory depends on.
struct MemoryPlanInput {
  GPTOptions model;     // vocab_size resolved (> 0); recompute as configured
  int64_t seq_len = 0;  // tokens of one row (the global sequence under CP)
  int64_t rows = 1;     // rows per micro-batch (batch_size under bshd)
  int64_t cp = 1;       // context-parallel ranks sharing a row
  int64_t ranks = 1;    // every rank sharing the step (dp x cp): > 1 adds the reducer's buckets
  std::string cp_comm_type = "p2p";
  bool bf16 = false;                // mixed precision: bf16 compute over f32 parameters
  std::string optimizer = "adamw";  // adamw | sgd
  bool momentum = false;            // sgd: momentum buffers
  std::string shard = "none";       // parallel.shard: optimizer divides the moments by ranks, gradients also
                                    // the gradients, parameters also the master weights
};

struct MemoryEstimate {
  int64_t parameters = 0;
  int64_t tokens_per_rank = 0;
  double master_weights = 0, compute_copies = 0, gradients = 0, moments = 0;
  double activations = 0, attention = 0, communication = 0, loss = 0;
  double total() const;
  // One line per part, aligned: "  master weights       4.32 GB" ... and the total.
  std::vector<std::string> lines() const;
};

// Parameters of the GPT `o` describes, counted from the shapes its modules create (no model is built).
int64_t count_parameters(const GPTOptions& o);
// Parameters of one of its blocks (norms, attention, MLP).
int64_t block_parameters(const GPTOptions& o);

// The estimate for `in` (validated: seq_len, rows, cp >= 1, vocab_size > 0).
MemoryEstimate estimate_memory(const MemoryPlanInput& in);

// The longest seq_len (a multiple of `multiple`, at most `limit`) whose estimate fits in `capacity` bytes
// with the same plan otherwise, or nullopt when even `multiple` tokens do not fit.
std::optional<int64_t> largest_fitting_seq_len(MemoryPlanInput in, double capacity, int64_t multiple,
                                               int64_t limit = int64_t{1} << 24);

// A device's memory by name: "h100" (80 GB card: 79.2 GiB usable), "h200" (139.8 GiB usable), or a
// size such as "80GiB", "141GB", "64G". Throws naming the accepted forms.
double device_capacity_bytes(const std::string& name);

// "12.3 GiB"
std::string format_gib(double bytes);

}  // namespace cpf::models
