#include "apps/trainer/generate.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "apps/trainer/checkpointing.h"
#include "apps/trainer/evaluation.h"
#include "framework/autograd/ops.h"
#include "framework/io/checkpoint.h"
#include "models/data/synthetic_tasks.h"
#include "models/data/text_source.h"
#include "models/gpt_input.h"

namespace cpf::trainer {
namespace {

struct Tokenizer {
  bool synthetic = false;
  int64_t eot = 0;
  std::vector<int64_t> encode(const std::string& text) const {
    if (synthetic) return data::synthetic_encode(text);
    std::vector<int64_t> ids;
    for (unsigned char ch : text) ids.push_back(ch);
    return ids;
  }
  std::string decode(const std::vector<int64_t>& ids) const {
    if (synthetic) return data::synthetic_decode(ids);
    std::string text;
    for (int64_t id : ids) {
      if (id == eot) {
        text += "<|endoftext|>";
      } else {
        text += static_cast<char>(id);
      }
    }
    return text;
  }
};

// Index of the sampled token from one row of logits.
int64_t sample(const std::vector<double>& logits, double temperature, Generator& gen) {
  int64_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[static_cast<size_t>(best)]) best = static_cast<int64_t>(i);
  }
  if (temperature <= 0) return best;
  std::vector<double> p(logits.size());
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    p[i] = std::exp((logits[i] - logits[static_cast<size_t>(best)]) / temperature);
    total += p[i];
  }
  double u = uniform({1}, 0.0, 1.0, {.dtype = DType::f64}, &gen).item<double>() * total;
  for (size_t i = 0; i < p.size(); ++i) {
    u -= p[i];
    if (u <= 0) return static_cast<int64_t>(i);
  }
  return static_cast<int64_t>(p.size()) - 1;
}

}  // namespace

GenerateResult generate(const GenerateOptions& options) {
  CPF_CHECK(options.max_new_tokens >= 1, "generate: --tokens ", options.max_new_tokens, " must be at least 1");
  CPF_CHECK(std::isfinite(options.temperature) && options.temperature >= 0, "generate: --temperature ",
            options.temperature, " must be >= 0 (0 = greedy)");
  GenerateResult result;
  result.checkpoint = resolve_checkpoint(options.checkpoint);
  const TrainConfig config = checkpoint_config(result.checkpoint);
  CPF_CHECK(config.data.source != "shards", "generate: ", result.checkpoint,
            " is a token-shard model (data.source: shards); cpformer bundles no tokenizer for it, so only byte-level "
            "text and synthetic models can be prompted");
  Tokenizer tok{config.data.source == "synthetic",
                config.data.source == "synthetic" ? data::synthetic_vocab::kEndOfText : data::TextSource::kEndOfText};

  std::vector<int64_t> prompt;
  if (options.prompt) {
    prompt = tok.encode(*options.prompt);
  } else {
    CPF_CHECK(tok.synthetic, "generate: a text model needs a prompt (--prompt TEXT)");
    const data::SyntheticSource source({.task = data::parse_synthetic_task(config.data.task),
                                        .min_len = config.data.min_len,
                                        .max_len = config.data.max_len,
                                        .num_examples = config.data.num_examples,
                                        .seed = config.data.seed});
    prompt = source.example(0, data::Split::eval).prompt;
  }
  CPF_CHECK(!prompt.empty(), "generate: the prompt is empty");
  result.prompt_text = tok.decode(prompt);

  models::GPT model(config.model);
  model.eval();
  // Refuses (naming the tensor) weights that fail their checksums or hold NaN or inf.
  io::load_checkpoint(result.checkpoint, model.named_parameters(), nullptr, "");
  // The model saw at most seq_len tokens per sequence in training: keep that much context.
  const int64_t context = std::min(config.data.seq_len, config.model.positions == models::PositionType::learned
                                                            ? config.model.max_positions
                                                            : std::numeric_limits<int64_t>::max());
  Generator gen(options.seed);
  std::vector<int64_t> sequence = prompt;
  NoGradGuard no_grad;
  for (int64_t i = 0; i < options.max_new_tokens; ++i) {
    const int64_t n = static_cast<int64_t>(sequence.size());
    const std::vector<int64_t> window(sequence.begin() + std::max<int64_t>(0, n - context), sequence.end());
    const Tensor logits = model.forward(models::make_prompt_input({window}));  // (T, V)
    const std::vector<double> last = select(logits, 0, logits.size(0) - 1).to_vector<double>();
    // Finite weights can still overflow; argmax over NaN would print token 0 as if it were an answer.
    CPF_CHECK(std::all_of(last.begin(), last.end(), [](double v) { return std::isfinite(v); }), "generate: the model of ",
              result.checkpoint, " gives non-finite logits after ", n, " tokens; refusing to sample from them");
    const int64_t next = sample(last, options.temperature, gen);
    sequence.push_back(next);
    result.completion.push_back(next);
    if (next == tok.eot) {
      result.ended = true;
      break;
    }
  }
  result.completion_text = tok.decode(result.completion);
  return result;
}

}  // namespace cpf::trainer
