#include "apps/generate/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>

#include "apps/run/checkpointing.h"
#include "apps/run/run_tokenizer.h"
#include "apps/trainer/evaluation.h"
#include "framework/autograd/ops.h"
#include "framework/io/checkpoint.h"
#include "framework/tensor/ops/copy.h"
#include "models/data/synthetic_tasks.h"
#include "models/data/text_source.h"
#include "models/gpt_decoder.h"

namespace cpf::trainer {
namespace {

// Synthetic tasks use their 14-token alphabet; text and shard models the tokenizer of their run
// (run_tokenizer.h). Special tokens in a prompt ("<|endoftext|>") become their ids.
struct Tokenizer {
  bool synthetic = false;
  int64_t eot = 0;
  std::shared_ptr<const models::data::Tokenizer> text;
  std::vector<int64_t> encode(const std::string& prompt) const {
    if (synthetic) return models::data::synthetic_encode(prompt);
    return text->encode(prompt, models::data::SpecialTokens::parse);
  }
  std::string decode(const std::vector<int64_t>& ids) const {
    return synthetic ? models::data::synthetic_decode(ids) : text->decode(ids);
  }
};

Tokenizer model_tokenizer(const std::string& checkpoint, const TrainConfig& config) {
  if (config.data.source == "synthetic") return {true, models::data::synthetic_vocab::kEndOfText, nullptr};
  auto text = checkpoint_tokenizer(checkpoint, config);
  return {false, text->eot_token(), text};
}

// The lines of the prompts file that hold a prompt (a trailing '\r' is dropped, empty lines skipped).
std::vector<std::string> read_prompts_file(const std::string& path) {
  std::ifstream in(path);
  CPF_CHECK(in.good(), "generate: cannot read the prompts file ", path, ": ", std::strerror(errno));
  std::vector<std::string> prompts;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty()) prompts.push_back(line);
  }
  CPF_CHECK(!in.bad(), "generate: reading the prompts file ", path, " failed: ", std::strerror(errno));
  CPF_CHECK(!prompts.empty(), "generate: the prompts file ", path,
            " holds no prompt (one prompt per line; empty lines are skipped)");
  return prompts;
}

std::vector<std::vector<int64_t>> encode_prompts(const GenerateOptions& options, const TrainConfig& config,
                                                 const Tokenizer& tok) {
  if (options.prompts_file) {
    std::vector<std::vector<int64_t>> prompts;
    for (const std::string& text : read_prompts_file(*options.prompts_file)) prompts.push_back(tok.encode(text));
    return prompts;
  }
  if (options.prompt) {
    CPF_CHECK(!options.prompt->empty(), "generate: the prompt is empty");
    return {tok.encode(*options.prompt)};
  }
  CPF_CHECK(tok.synthetic, "generate: a text model needs a prompt (--prompt TEXT)");
  const models::data::SyntheticSource source({.task = models::data::parse_synthetic_task(config.data.task),
                                              .min_len = config.data.min_len,
                                              .max_len = config.data.max_len,
                                              .num_examples = config.data.num_examples,
                                              .seed = config.data.seed});
  return {source.example(0, models::data::Split::eval).prompt};
}

Device checked_device(const std::string& text) {
  const Device device = Device::parse(text);
  if (device.is_cpu()) return device;
  CPF_CHECK(has_device_backend(DeviceType::cuda), "generate: --device ", text,
            ": this build has no CUDA backend; rebuild with -DCPF_WITH_CUDA=ON (docs/build.md), or use --device cpu");
  const int gpus = device_backend(DeviceType::cuda).device_count();
  CPF_CHECK(device.index < gpus, "generate: --device ", text, ": this machine has ", gpus,
            " visible CUDA device(s) (check nvidia-smi and CUDA_VISIBLE_DEVICES), or use --device cpu");
  return device;
}

std::string checked_precision(const GenerateOptions& options, Device device) {
  const std::string precision = options.precision.value_or(device.is_cpu() ? "fp32" : "bf16");
  CPF_CHECK(precision == "fp32" || precision == "bf16", "generate: --precision ", precision,
            " is not one of fp32, bf16");
  return precision;
}

// Finite weights can still overflow; argmax over NaN would print token 0 as if it were an answer.
void check_finite_logits(bool finite, const std::string& checkpoint, size_t context, size_t prompt, size_t prompts) {
  CPF_CHECK(finite, "generate: the model of ", checkpoint, " gives non-finite logits after ", context, " tokens",
            prompts > 1 ? " (prompt " + std::to_string(prompt + 1) + " of " + std::to_string(prompts) + ")" : "",
            "; refusing to sample from them");
}

// The next token of each active sequence. Greedy: picked on the device by the decoder (inside its CUDA
// graph on decoding steps), one read-back of two numbers a sequence. Sampling: the logits rows are read
// back in f32 and drawn from on the host.
std::vector<int64_t> pick_tokens(models::GPTDecoder& decoder, const SamplingOptions& sampling,
                                 const std::vector<std::vector<int64_t>>& sequences, const std::vector<bool>& active,
                                 std::vector<std::unique_ptr<Generator>>& gens, const std::string& checkpoint) {
  std::vector<size_t> order;  // the sequence of each row
  for (size_t i = 0; i < sequences.size(); ++i) {
    if (active[i]) order.push_back(i);
  }
  if (sampling.temperature <= 0) {
    const models::GPTDecoder::GreedyPicks picks = decoder.next_greedy(sequences, active);
    for (size_t r = 0; r < order.size(); ++r) {
      check_finite_logits(picks.finite[r], checkpoint, sequences[order[r]].size(), order[r], sequences.size());
    }
    return picks.tokens;
  }
  const Tensor rows = decoder.next_logits(sequences, active);  // (A, V)
  const std::vector<float> host = raw::to(raw::to(rows, DType::f32), Device::cpu()).to_vector<float>();
  const size_t vocab = host.size() / order.size();
  std::vector<int64_t> tokens(order.size());
  for (size_t r = 0; r < order.size(); ++r) {
    const std::vector<double> logits(host.begin() + static_cast<std::ptrdiff_t>(r * vocab),
                                     host.begin() + static_cast<std::ptrdiff_t>((r + 1) * vocab));
    check_finite_logits(std::all_of(logits.begin(), logits.end(), [](double v) { return std::isfinite(v); }),
                        checkpoint, sequences[order[r]].size(), order[r], sequences.size());
    tokens[r] = sample_token(logits, sampling, *gens[order[r]]);
  }
  return tokens;
}

}  // namespace

void check_generate_options(const GenerateOptions& options) {
  CPF_CHECK(options.max_new_tokens >= 1, "generate: --tokens ", options.max_new_tokens, " must be at least 1");
  check_sampling_options({.temperature = options.temperature, .top_k = options.top_k, .top_p = options.top_p});
  CPF_CHECK(!(options.prompt && options.prompts_file), "generate: give either --prompt or --prompts FILE, not both");
  checked_precision(options, Device::parse(options.device));
}

GenerateBatchResult generate_batch(const GenerateOptions& options) {
  check_generate_options(options);
  const Device device = checked_device(options.device);
  GenerateBatchResult batch;
  batch.device = device.str();
  batch.precision = checked_precision(options, device);
  batch.kv_cache = options.kv_cache;
  const SamplingOptions sampling{.temperature = options.temperature, .top_k = options.top_k, .top_p = options.top_p};

  const std::string checkpoint = resolve_checkpoint(options.checkpoint);
  const TrainConfig config = checkpoint_config(checkpoint);
  const Tokenizer tok = model_tokenizer(checkpoint, config);
  std::vector<std::vector<int64_t>> sequences = encode_prompts(options, config, tok);
  int64_t longest = 0;
  for (const auto& prompt : sequences) {
    CPF_CHECK(!prompt.empty(), "generate: a prompt is empty");
    longest = std::max<int64_t>(longest, static_cast<int64_t>(prompt.size()));
    GenerateResult result;
    result.checkpoint = checkpoint;
    result.prompt_text = tok.decode(prompt);
    batch.results.push_back(std::move(result));
  }

  models::GPTOptions model_options = config.model;
  model_options.compute_dtype = batch.precision == "bf16" ? std::optional<DType>(DType::bf16) : std::nullopt;
  model_options.kernel_config = attention_kernel_config(config);
  models::GPT model(model_options);
  model.eval();
  // Refuses (naming the tensor) weights that fail their checksums or hold NaN or inf.
  io::load_checkpoint(checkpoint, model.named_parameters(), nullptr, "");
  model.to(device);
  // The model saw at most seq_len tokens per sequence in training: keep that much context.
  const int64_t context = std::min(config.data.seq_len, config.model.positions == models::PositionType::learned
                                                            ? config.model.max_positions
                                                            : std::numeric_limits<int64_t>::max());
  const int64_t n = static_cast<int64_t>(sequences.size());
  models::GPTDecoder decoder(model, n,
                             {.context = context,
                              .max_length = longest + options.max_new_tokens,
                              .kv_cache = options.kv_cache,
                              .cuda_graph = options.cuda_graph});
  std::vector<std::unique_ptr<Generator>> gens;  // Generator is not movable (an atomic offset)
  for (int64_t i = 0; i < n; ++i) gens.push_back(std::make_unique<Generator>(options.seed + static_cast<uint64_t>(i)));
  std::vector<bool> active(static_cast<size_t>(n), true);

  const auto start = std::chrono::steady_clock::now();
  for (int64_t step = 0; step < options.max_new_tokens; ++step) {
    if (std::find(active.begin(), active.end(), true) == active.end()) break;
    const std::vector<int64_t> picked = pick_tokens(decoder, sampling, sequences, active, gens, checkpoint);
    size_t row = 0;
    for (size_t i = 0; i < sequences.size(); ++i) {
      if (!active[i]) continue;
      const int64_t next = picked[row++];
      sequences[i].push_back(next);
      batch.results[i].completion.push_back(next);
      ++batch.new_tokens;
      if (next == tok.eot) {
        batch.results[i].ended = true;
        active[i] = false;
      }
    }
  }
  batch.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  batch.tokens_per_second = batch.seconds > 0 ? static_cast<double>(batch.new_tokens) / batch.seconds : 0.0;
  batch.tokens_fed = decoder.tokens_fed();
  batch.graph_replays = decoder.graph_replays();
  if (decoder.graph_replays() == 0 && !device.is_cpu()) batch.graph_note = decoder.graph_note();
  for (GenerateResult& r : batch.results) r.completion_text = tok.decode(r.completion);
  return batch;
}

GenerateResult generate(const GenerateOptions& options) {
  CPF_CHECK(!options.prompts_file, "generate: a prompts file gives several completions; call generate_batch");
  return generate_batch(options).results.front();
}

std::string throughput_line(const GenerateBatchResult& batch) {
  char line[256];
  std::snprintf(line, sizeof line, "%lld tokens in %.3f s: %.1f tokens/s (%s, %s, %s%s)",
                static_cast<long long>(batch.new_tokens), batch.seconds, batch.tokens_per_second, batch.device.c_str(),
                batch.precision.c_str(), batch.kv_cache ? "kv cache" : "full window",
                batch.graph_replays > 0 ? ", cuda graph" : "");
  return line;
}

}  // namespace cpf::trainer
