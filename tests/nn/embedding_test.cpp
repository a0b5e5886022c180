#include <gtest/gtest.h>

#include "framework/autograd/ops.h"
#include "framework/nn/embedding.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

TEST(Embedding, LooksUpRowsAndInitsWithTheGivenStd) {
  Generator gen(7);
  nn::Embedding emb({.num_embeddings = 512, .embedding_dim = 64, .init_std = 0.02}, &gen);
  ASSERT_EQ(emb.named_parameters().size(), 1u);
  EXPECT_EQ(emb.named_parameters()[0].first, "weight");
  EXPECT_EQ(emb.weight().shape(), (Shape{512, 64}));
  const auto w = emb.weight().to_vector<double>();
  double sum = 0, sq = 0;
  for (double v : w) {
    sum += v;
    sq += v * v;
  }
  const double mean = sum / w.size();
  EXPECT_NEAR(mean, 0.0, 0.001);
  EXPECT_NEAR(std::sqrt(sq / w.size() - mean * mean), 0.02, 0.001);

  Tensor ids = from_vector<int64_t>({3, 0, 511, 3, 7, 1}, {2, 3});
  Tensor out = emb.forward(ids);
  ASSERT_EQ(out.shape(), (Shape{2, 3, 64}));
  const auto o = out.to_vector<double>();
  const int64_t id_list[] = {3, 0, 511, 3, 7, 1};
  for (int64_t t = 0; t < 6; ++t) {
    for (int64_t c = 0; c < 64; ++c) EXPECT_EQ(o[t * 64 + c], w[id_list[t] * 64 + c]);
  }
}

TEST(Embedding, GradientSumsRepeatedIds) {
  nn::Embedding emb({.num_embeddings = 4, .embedding_dim = 2, .dtype = DType::f64});
  backward(sum(emb.forward(from_vector<int32_t>({1, 1, 3}, {3}))));
  EXPECT_EQ(emb.weight().grad().to_vector<double>(), (std::vector<double>{0, 0, 2, 2, 0, 0, 1, 1}));
}

TEST(Embedding, RejectsBadOptionsAndIds) {
  EXPECT_CPF_ERROR(nn::Embedding({.num_embeddings = 0, .embedding_dim = 4}),
                   "Embedding: num_embeddings=0 and embedding_dim=4 must be positive");
  EXPECT_CPF_ERROR(nn::Embedding({.num_embeddings = 4, .embedding_dim = 4, .init_std = 0}),
                   "Embedding: init_std=0 must be positive and finite");
  EXPECT_CPF_ERROR(nn::Embedding({.num_embeddings = 4, .embedding_dim = 4, .dtype = DType::i64}),
                   "Embedding: dtype must be floating");
  nn::Embedding emb({.num_embeddings = 4, .embedding_dim = 2});
  EXPECT_CPF_ERROR(emb.forward(zeros({3})), "Embedding: ids must be i32 or i64, got f32");
  EXPECT_CPF_ERROR(emb.forward(Tensor()), "Embedding: ids are undefined");
  EXPECT_CPF_ERROR(emb.forward(from_vector<int64_t>({0, 4}, {2})), "4");
}

}  // namespace
}  // namespace cpf
