#pragma once
// `cpformer generate`: sampling from a trained checkpoint, for text, token-shard and synthetic models.
//
// The checkpoint carries its effective config (meta.json extra.config), which rebuilds the model and
// picks the tokenizer: synthetic tasks use their 14-token alphabet ("12+34="), text and shard models
// the run's tokenizer (data.tokenizer: bytes, gpt2 or the run folder's copy of a tokenizer file;
// run_tokenizer.h). Special tokens in prompts ("<|endoftext|>") become their ids.
//
// Prompts decode together as one batch (one prompt, or one per line of a prompts file). The model sees
// the last data.seq_len tokens of each sequence, as in training. With the KV cache (the default) each
// new token costs one token's forward; without it every token reruns the whole window. Both give the
// same tokens (models/gpt_decoder.h). Decoding is greedy (temperature 0) or samples with temperature,
// top-k and top-p (generate_sampling.h), each prompt from its own Philox stream (seed + prompt index),
// so a prompt's completion does not depend on the other prompts of the batch; it stops at end-of-text.
//
// On a CUDA device (--device cuda[:N]) the model runs in bf16 by default (f32 master weights, as in
// training); --precision fp32 keeps f32. On the CPU the default is fp32. There, decoding steps replay one
// captured CUDA graph (--no-cuda-graph launches them one by one), and greedy decoding picks its tokens on
// the device (one read-back of two numbers a sequence); sampling reads the logits back and draws on the host.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "apps/generate/generate_sampling.h"

namespace cpf::trainer {

struct GenerateOptions {
  std::string checkpoint;                   // a checkpoint, a folder of checkpoints, or a run folder
  std::optional<std::string> prompt;        // synthetic default: the first held-out prompt; text: required
  std::optional<std::string> prompts_file;  // one prompt per line (empty lines skipped); not with prompt
  int64_t max_new_tokens = 64;
  double temperature = 0.0;  // 0 = greedy
  int64_t top_k = 0;         // 0 = off
  double top_p = 1.0;        // 1 = off
  uint64_t seed = 1;
  std::string device = "cpu";            // "cpu", "cuda" or "cuda:N"
  std::optional<std::string> precision;  // "fp32" or "bf16"; default bf16 on CUDA, fp32 on the CPU
  bool kv_cache = true;                  // false: rerun the full window for every token
  bool cuda_graph = true;                // replay decoding steps from one CUDA graph (models/gpt_decoder.h)
};

struct GenerateResult {
  std::string checkpoint;  // the folder that was loaded
  std::string prompt_text;
  std::string completion_text;  // the end-of-text token, when produced, is rendered too
  std::vector<int64_t> completion;
  bool ended = false;  // stopped at end-of-text
};

struct GenerateBatchResult {
  std::vector<GenerateResult> results;  // one per prompt, in order
  std::string device;                   // "cpu", "cuda:0"
  std::string precision;                // "fp32" or "bf16"
  bool kv_cache = true;
  int64_t graph_replays = 0;     // decoding steps replayed from the CUDA graph
  std::string graph_note;        // why none were ("" when they were, or nothing asked for one)
  int64_t new_tokens = 0;        // tokens generated over all prompts
  int64_t tokens_fed = 0;        // tokens the model processed (prompts, decoded tokens, refed windows)
  double seconds = 0;            // wall time of decoding (prefill included, model loading not)
  double tokens_per_second = 0;  // new_tokens / seconds
};

// Throws cpf::Error for options that are wrong whatever the checkpoint and machine: --tokens < 1, the
// sampling options (check_sampling_options), --prompt with --prompts, a device or precision name that
// is not one. (generate_batch checks them too; the CLI turns them into usage errors.)
void check_generate_options(const GenerateOptions& options);

// Every prompt of the options (throws cpf::Error: bad options, unreadable or empty prompts file,
// unsupported source, unreadable checkpoint, a device this build or machine lacks).
GenerateBatchResult generate_batch(const GenerateOptions& options);

// One prompt (options.prompt or the synthetic default); throws when options.prompts_file is set.
GenerateResult generate(const GenerateOptions& options);

// "12 tokens in 0.034 s: 352.9 tokens/s (cpu, fp32, kv cache)" for the console (", cuda graph" when it served).
std::string throughput_line(const GenerateBatchResult& batch);

}  // namespace cpf::trainer
