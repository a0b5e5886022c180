#pragma once
// GPTDecoder: next-token logits for a batch of growing token sequences, the loop of `cpformer
// generate` (and of any sampling code built on the library).
//
// The model sees at most `context` tokens of each sequence (the training seq_len): the last `context`
// tokens at positions 0 .. context-1, as in training. Two ways to get there, with the same result:
//
//   kv_cache = false   every call runs the full forward over each sequence's window
//   kv_cache = true    each layer keeps the keys/values of the tokens already seen
//                      (attention/nn/kv_cache.h), so a call feeds only the tokens added since the
//                      last one. Once a sequence outgrows `context` its window slides and every position
//                      changes, so from then on each of its calls refeeds its window (as the full
//                      forward does); until then decoding a token costs one token's forward.
//
// Sequences decode together: those with no new tokens since the last call (finished ones) sit it out.
//
// CUDA graphs (cuda_graph, on by default where the device captures them): a call in which every active
// sequence adds exactly one token to a window that still has room is a decoding step. Its tokens,
// positions and lengths go to the device in one upload (nn::KVDecodeTables), and the model's forward
// reads them there (decode_attention_append stores each layer's new keys and values and attends in one
// kernel), so the forward of one step is the forward of every step. The first decoding step runs eagerly (it settles
// the bf16 weight copies, the GEMM plans and the allocator), the second is captured into one graph, and every later one
// replays it: one launch a token instead of a few hundred. Sequences that sit a step out are fed a placeholder token
// into the first free row of their slot (past their length, so nothing they kept changes) and their rows
// are dropped. Prefills, window slides and full slots run eagerly as without graphs; a capture that fails
// leaves the decoder eager with the reason in graph_note(). Both paths give the same logits. On devices
// without graphs (the CPU) decoding steps still take the table path, eagerly, so the CPU tests cover it.
#include <cstdint>
#include <string>
#include <vector>

#include "attention/nn/kv_cache.h"
#include "framework/tensor/device_graph.h"
#include "models/gpt.h"

namespace cpf::models {

struct GPTDecoderOptions {
  int64_t context = 0;     // tokens of each sequence the model sees at most (>= 1)
  int64_t max_length = 0;  // longest sequence that will be passed (sizes the cache: min(context, max_length))
  bool kv_cache = true;
  // Decoding steps through device tables, replayed from one captured graph where the device captures
  // graphs (eagerly elsewhere, e.g. on the CPU: the same computation). Needs kv_cache.
  bool cuda_graph = true;
};

// The widest head a decoding step's attention sees for a model of `options`: mha/gqa's head dim; MLA's
// cached latent (kv_lora_rank + qk_rope_head_dim, + 1 with biases: multi_head_latent_attention_cached.cpp).
int64_t decode_head_dim(const GPTOptions& options);

class GPTDecoder {
 public:
  // `model` must outlive the decoder; it is used on its device, in eval mode, under NoGradGuard.
  GPTDecoder(const GPT& model, int64_t num_sequences, const GPTDecoderOptions& options);

  // Next-token logits (A, vocab_size), one row per active sequence in order, for `sequences` (each
  // sequence's whole history; it may only grow between calls, and active ones must be non-empty and no
  // longer than max_length). Rows are in the model's compute dtype on its device.
  Tensor next_logits(const std::vector<std::vector<int64_t>>& sequences, const std::vector<bool>& active);

  // Greedy decoding's next tokens (what argmax over next_logits' rows gives, the lowest id among equal
  // maxima) for the active sequences in order, and whether each row's logits were all finite: picked on
  // the device (inside the graph on decoding steps) and read back at once, two numbers a sequence.
  struct GreedyPicks {
    std::vector<int64_t> tokens;
    std::vector<bool> finite;
  };
  GreedyPicks next_greedy(const std::vector<std::vector<int64_t>>& sequences, const std::vector<bool>& active);

  // Tokens fed to the model so far (prompt and decoded tokens, refed windows included): the work done.
  int64_t tokens_fed() const { return tokens_fed_; }
  // Decoding steps served by the captured graph, and why there is none ("" while it serves or before the
  // second decoding step; "off" reasons name the option or device).
  int64_t graph_replays() const { return graph_replays_; }
  bool graph_captured() const { return graph_.defined(); }
  const std::string& graph_note() const { return graph_note_; }

 private:
  Tensor full_window_logits(const std::vector<std::vector<int64_t>>& sequences, const std::vector<bool>& active);
  Tensor cached_logits(const std::vector<std::vector<int64_t>>& sequences, const std::vector<bool>& active);
  // Whether this call is a decoding step the graph path can serve (see the header comment).
  bool is_decoding_step(const std::vector<std::vector<int64_t>>& sequences, const std::vector<bool>& active) const;
  // The decoding step's logits (S, V) for every sequence (placeholders included), eager or replayed, and
  // (with_picks, or always from the graph) their greedy picks (2, S).
  struct StepOutputs {
    Tensor logits, picks;
  };
  StepOutputs decoding_step(const std::vector<std::vector<int64_t>>& sequences, const std::vector<bool>& active,
                            bool with_picks);
  // After a decoding step: the active sequences' indices; their cached counts and tokens_fed advance.
  std::vector<int64_t> advance_decoded(const std::vector<bool>& active);
  void check_call(const std::vector<std::vector<int64_t>>& sequences, const std::vector<bool>& active) const;
  void record_lengths(const std::vector<std::vector<int64_t>>& sequences);

  const GPT& model_;
  GPTDecoderOptions options_;
  int64_t num_sequences_ = 0;
  std::vector<nn::KVCache> caches_;    // one per block
  std::vector<int64_t> window_start_;  // per sequence: index of its window's first token
  std::vector<int64_t> cached_;        // per sequence: tokens of its window already in the cache
  std::vector<int64_t> seen_length_;   // per sequence: its length at the last call
  int64_t tokens_fed_ = 0;
  // The graph path: (3, S) i64 on the device: tokens, positions, lengths (views in tables_).
  Tensor step_buffer_;
  nn::KVDecodeTables tables_;
  DeviceGraph graph_;
  StepOutputs graph_outputs_;  // logits (S, V) and picks (2, S), rewritten by every replay
  int64_t eager_decoding_steps_ = 0, graph_replays_ = 0;
  bool tables_usable_ = false;  // decoding steps through the device tables (eager where no graph)
  bool graph_usable_ = false;
  std::string graph_note_;
};

}  // namespace cpf::models
