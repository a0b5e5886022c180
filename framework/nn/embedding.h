#pragma once
// Embedding: a (num_embeddings, embedding_dim) table looked up by integer ids.
//
//   ids (...) i32/i64 -> (..., embedding_dim)
//
// The weight's gradient is accumulated deterministically (cpf::embedding), so data-parallel ranks
// and repeated runs agree bit for bit.
#include "framework/core/generator.h"
#include "framework/nn/module.h"

namespace cpf::nn {

struct EmbeddingOptions {
  int64_t num_embeddings = 0;
  int64_t embedding_dim = 0;
  double init_std = 0.02;  // normal(0, init_std), GPT-2 style; must be > 0
  DType dtype = DType::f32;
};

class Embedding : public Module {
 public:
  explicit Embedding(const EmbeddingOptions& options, Generator* gen = nullptr);
  Tensor forward(const Tensor& ids) const;
  const Tensor& weight() const { return weight_; }  // (num_embeddings, embedding_dim)
  const EmbeddingOptions& options() const { return options_; }

 private:
  EmbeddingOptions options_;
  Tensor weight_;
};

}  // namespace cpf::nn
