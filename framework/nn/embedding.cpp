#include "framework/nn/embedding.h"

#include <cmath>

#include "framework/autograd/ops.h"
#include "framework/tensor/profile.h"

namespace cpf::nn {

Embedding::Embedding(const EmbeddingOptions& options, Generator* gen) : options_(options) {
  CPF_CHECK(options.num_embeddings > 0 && options.embedding_dim > 0,
            "Embedding: num_embeddings=", options.num_embeddings, " and embedding_dim=", options.embedding_dim,
            " must be positive");
  CPF_CHECK(std::isfinite(options.init_std) && options.init_std > 0, "Embedding: init_std=", options.init_std,
            " must be positive and finite");
  CPF_CHECK(is_floating(options.dtype), "Embedding: dtype must be floating, got ", options.dtype);
  weight_ = register_parameter("weight", normal({options.num_embeddings, options.embedding_dim}, 0.0, options.init_std,
                                                {.dtype = options.dtype}, gen));
}

Tensor Embedding::forward(const Tensor& ids) const {
  const profile::Scope scope("forward/embedding", ids.defined() ? ids.device() : Device::cpu());
  CPF_CHECK(ids.defined(), "Embedding: ids are undefined");
  CPF_CHECK(ids.dtype() == DType::i64 || ids.dtype() == DType::i32, "Embedding: ids must be i32 or i64, got ",
            ids.dtype());
  return embedding(weight_, ids);  // (..., C)
}

}  // namespace cpf::nn
