// custom_transformer: a small decoder-only transformer built from cpformer's public modules (no
// models/ code) and trained on a copy task; the template for research code that uses cpformer as a
// library (docs/library.md).
//
//   build/cpu/examples/custom_transformer [steps]
//
// Each sequence is L random tokens, a separator, then the same L tokens again; the loss is taken on
// the copy, which a model can only get right by attending back to the first half. It uses
// nn::Embedding, nn::MultiHeadAttention (RoPE, causal), nn::RMSNorm, nn::Sequential (the MLP),
// nn::Dropout, nn::ModuleList (the blocks), optim::AdamW, Module::save/load and profile::Scope.
// The program exits with status 1 unless the copy loss falls below a quarter of its initial value and
// a saved-and-reloaded model gives the same loss. Everything is seeded.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "attention/nn/multi_head_attention.h"
#include "framework/autograd/engine.h"
#include "framework/autograd/ops.h"
#include "framework/nn/dropout.h"
#include "framework/nn/embedding.h"
#include "framework/nn/linear.h"
#include "framework/nn/module_list.h"
#include "framework/nn/rms_norm.h"
#include "framework/nn/sequential.h"
#include "framework/optim/adamw.h"
#include "framework/tensor/profile.h"
#include "framework/tensor/random.h"

namespace {

using namespace cpf;

constexpr int64_t kVocab = 10;  // tokens 0..9; kSeparator = 10
constexpr int64_t kSeparator = kVocab;
constexpr int64_t kCopyLength = 6;  // L
constexpr int64_t kSeqLen = 2 * kCopyLength + 1;
constexpr int64_t kBatch = 16;

struct Config {
  int64_t vocab = kVocab + 1;
  int64_t hidden = 32;
  int64_t heads = 4;
  int64_t layers = 2;
  double dropout = 0.05;
};

// Pre-norm block: x + dropout(attn(norm(x))), then x + dropout(mlp(norm(x))).
class Block : public nn::Module {
 public:
  Block(const Config& c, Generator* gen) {
    attn_norm_ = register_module("attn_norm", std::make_shared<nn::RMSNorm>(nn::RMSNormOptions{.dim = c.hidden}));
    attn_ = register_module(
        "attn", std::make_shared<nn::MultiHeadAttention>(nn::MultiHeadAttentionOptions{.hidden_size = c.hidden,
                                                                                       .num_heads = c.heads,
                                                                                       .qkv_format = QkvFormat::bshd,
                                                                                       .mask = MaskType::causal,
                                                                                       .rope = true,
                                                                                       .init_std = 0.02},
                                                         gen));
    mlp_norm_ = register_module("mlp_norm", std::make_shared<nn::RMSNorm>(nn::RMSNormOptions{.dim = c.hidden}));
    mlp_ = register_module("mlp", std::make_shared<nn::Sequential>());
    mlp_->add(
        std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = c.hidden, .out_features = 4 * c.hidden}, gen));
    mlp_->add("gelu", [](const Tensor& x) { return gelu(x); });
    mlp_->add(
        std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 4 * c.hidden, .out_features = c.hidden}, gen));
    dropout_ = register_module("dropout", std::make_shared<nn::Dropout>(c.dropout, gen));
  }

  // x (B, T, C) -> (B, T, C)
  Tensor forward(const Tensor& x) const {
    const Tensor h = add(x, dropout_->forward(attn_->forward(attn_norm_->forward(x))));
    return add(h, dropout_->forward(mlp_->forward(mlp_norm_->forward(h))));
  }

 private:
  std::shared_ptr<nn::RMSNorm> attn_norm_, mlp_norm_;
  std::shared_ptr<nn::MultiHeadAttention> attn_;
  std::shared_ptr<nn::Sequential> mlp_;
  std::shared_ptr<nn::Dropout> dropout_;
};

class TinyTransformer : public nn::Module {
 public:
  TinyTransformer(const Config& c, Generator* gen) {
    embed_ =
        register_module("embed", std::make_shared<nn::Embedding>(
                                     nn::EmbeddingOptions{.num_embeddings = c.vocab, .embedding_dim = c.hidden}, gen));
    blocks_ = register_module("blocks", std::make_shared<nn::ModuleList>());
    for (int64_t i = 0; i < c.layers; ++i) blocks_->push_back(std::make_shared<Block>(c, gen));
    norm_ = register_module("norm", std::make_shared<nn::RMSNorm>(nn::RMSNormOptions{.dim = c.hidden}));
    head_ = register_module(
        "head", std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = c.hidden, .out_features = c.vocab}, gen));
  }

  // tokens (B, T) i64 -> logits (B * T, V)
  Tensor forward(const Tensor& tokens) const {
    Tensor x = embed_->forward(tokens);  // (B, T, C)
    for (const auto& block : blocks_->as<Block>()) x = block->forward(x);
    const Tensor logits = head_->forward(norm_->forward(x));  // (B, T, V)
    return reshape(logits, {tokens.size(0) * tokens.size(1), logits.size(-1)});
  }

 private:
  std::shared_ptr<nn::Embedding> embed_;
  std::shared_ptr<nn::ModuleList> blocks_;
  std::shared_ptr<nn::RMSNorm> norm_;
  std::shared_ptr<nn::Linear> head_;
};

struct Batch {
  Tensor tokens;   // (B, T) i64
  Tensor targets;  // (B * T) i64: the next token on the copy half, -100 elsewhere
};

Batch copy_batch(Generator& gen) {
  const std::vector<int64_t> draws =
      randint(0, kVocab, {kBatch, kCopyLength}, {.dtype = DType::i64}, &gen).to_vector<int64_t>();
  std::vector<int64_t> tokens, targets;
  for (int64_t b = 0; b < kBatch; ++b) {
    std::vector<int64_t> row(draws.begin() + b * kCopyLength, draws.begin() + (b + 1) * kCopyLength);
    row.push_back(kSeparator);
    row.insert(row.end(), draws.begin() + b * kCopyLength, draws.begin() + (b + 1) * kCopyLength);
    for (int64_t t = 0; t < kSeqLen; ++t) {
      tokens.push_back(row[t]);
      // Position t predicts token t + 1; only the copy (after the separator) is learnable.
      targets.push_back(t >= kCopyLength && t + 1 < kSeqLen ? row[t + 1] : -100);
    }
  }
  return {from_vector(tokens, {kBatch, kSeqLen}), from_vector(targets, {kBatch * kSeqLen})};
}

double eval_loss(TinyTransformer& model, const Batch& batch) {
  NoGradGuard no_grad;
  model.eval();
  const double loss = cross_entropy(model.forward(batch.tokens), batch.targets).item<double>();
  model.train();
  return loss;
}

int run(int64_t steps) {
  Generator gen(2024), data_gen(7);
  const Config config;
  TinyTransformer model(config, &gen);
  optim::AdamW opt(model.named_parameters(), {.lr = 3e-3, .weight_decay = 0.01});
  const Batch held_out = copy_batch(data_gen);
  const double initial = eval_loss(model, held_out);
  std::printf("custom_transformer: %lld parameters, initial copy loss %.4f\n",
              static_cast<long long>(model.num_parameters()), initial);

  profile::set_enabled(true);
  for (int64_t step = 1; step <= steps; ++step) {
    profile::Scope step_scope("step");
    const Batch batch = copy_batch(data_gen);
    Tensor loss;
    {
      profile::Scope scope("forward");
      loss = cross_entropy(model.forward(batch.tokens), batch.targets);
    }
    {
      profile::Scope scope("backward");
      backward(loss);
    }
    {
      profile::Scope scope("optimizer");
      opt.step();
      opt.zero_grad();
    }
    if (step % 50 == 0 || step == steps) {
      std::printf("step %4lld  train loss %.4f  held-out loss %.4f\n", static_cast<long long>(step),
                  loss.item<double>(), eval_loss(model, held_out));
    }
  }
  profile::set_enabled(false);
  std::cout << profile::format_table(profile::snapshot());

  const double final_loss = eval_loss(model, held_out);
  // Save, rebuild from another seed, load: the reloaded model must give the very same loss.
  const std::string path = (std::filesystem::temp_directory_path() / "custom_transformer.safetensors").string();
  model.save(path);
  Generator other(99);
  TinyTransformer reloaded(config, &other);
  reloaded.load(path);
  const double reloaded_loss = eval_loss(reloaded, held_out);
  std::filesystem::remove(path);
  std::printf("final held-out copy loss %.4f (reloaded from %s: %.4f)\n", final_loss, path.c_str(), reloaded_loss);
  if (!(final_loss < initial / 4)) {
    std::fprintf(stderr, "custom_transformer: the copy loss fell from %.4f to only %.4f (expected below %.4f)\n",
                 initial, final_loss, initial / 4);
    return 1;
  }
  if (reloaded_loss != final_loss) {
    std::fprintf(stderr, "custom_transformer: the reloaded model's loss %.6f differs from %.6f\n", reloaded_loss,
                 final_loss);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const int64_t steps = argc > 1 ? std::stoll(argv[1]) : 200;
    if (steps < 1) {
      std::fprintf(stderr, "usage: custom_transformer [steps >= 1]\n");
      return 2;
    }
    return run(steps);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "custom_transformer: %s\n", e.what());
    return 1;
  }
}
