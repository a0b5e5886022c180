#pragma once
// `cpformer generate`: sampling from a trained checkpoint, for byte-level text and synthetic models.
//
// The checkpoint carries its effective config (meta.json extra.config), which rebuilds the model and
// picks the tokenizer: synthetic tasks use their 14-token alphabet ("12+34="), text uses bytes.
// Token shards have no bundled tokenizer, so they are refused. Decoding is greedy (temperature 0) or
// samples from softmax(logits / temperature) with a seeded Philox stream; it stops at end-of-text.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cpf::trainer {

struct GenerateOptions {
  std::string checkpoint;             // a checkpoint, a folder of checkpoints, or a run folder
  std::optional<std::string> prompt;  // synthetic default: the first held-out prompt; text: required
  int64_t max_new_tokens = 64;
  double temperature = 0.0;  // 0 = greedy
  uint64_t seed = 1;
};

struct GenerateResult {
  std::string checkpoint;  // the folder that was loaded
  std::string prompt_text;
  std::string completion_text;  // the end-of-text token, when produced, is rendered too
  std::vector<int64_t> completion;
  bool ended = false;  // stopped at end-of-text
};

// Throws cpf::Error (bad prompt, unsupported source, unreadable checkpoint).
GenerateResult generate(const GenerateOptions& options);

}  // namespace cpf::trainer
