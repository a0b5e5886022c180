// GPT::forward_loss: the fused classifier (no whole logits) against the unfused path
// (classifier_chunk_rows = -1: forward, then GPT::loss) for every architecture, tied and untied heads:
// the loss and every parameter gradient equal to 1e-12 in f64, close in bf16 mixed precision; the
// no-grad path; refused inputs.
#include <gtest/gtest.h>

#include <cmath>

#include "framework/autograd/ops.h"
#include "models/gpt.h"
#include "models/gpt_input.h"
#include "models/gpt_test_options.h"
#include "support/test_utils.h"

namespace cpf::models {
namespace {

using testing::all_close;

GPTOptions base() { return f64_gpt(); }

// Every architecture the model builds, each with the head tied or not.
std::vector<std::pair<std::string, GPTOptions>> variants() {
  std::vector<std::pair<std::string, GPTOptions>> out;
  GPTOptions mha = base();
  out.emplace_back("mha tied", mha);
  GPTOptions gqa = base();
  gqa.attention = AttentionType::gqa;
  gqa.num_kv_heads = 2;
  gqa.tie_embeddings = false;
  gqa.mlp = nn::Activation::swiglu;
  out.emplace_back("gqa untied swiglu", gqa);
  GPTOptions mla = base();
  mla.attention = AttentionType::mla;
  mla.tie_embeddings = false;
  out.emplace_back("mla untied", mla);
  GPTOptions gpt2 = base();
  gpt2.positions = PositionType::learned;
  gpt2.norm = NormType::layernorm;
  gpt2.bias = true;
  gpt2.attention_sink = true;
  out.emplace_back("learned positions layernorm bias sink tied", gpt2);
  return out;
}

struct StepResult {
  double loss = 0;
  std::vector<std::pair<std::string, Tensor>> grads;
};

StepResult train_step(GPTOptions o, int64_t chunk_rows, const Tensor& labels, int64_t normalizer) {
  o.classifier_chunk_rows = chunk_rows;
  Generator gen(7);
  GPT model(o, &gen);
  const GPTInput in = make_prompt_input({{1, 2, 3, 4, 5}, {6, 7, 8}});
  const Tensor loss = model.forward_loss(in, labels, normalizer);
  backward(loss);
  StepResult r;
  r.loss = loss.item<double>();
  for (auto& [name, p] : model.named_parameters()) r.grads.emplace_back(name, p.grad());
  return r;
}

void expect_equal_runs(const StepResult& got, const StepResult& ref, double tol, const std::string& what) {
  EXPECT_NEAR(got.loss, ref.loss, tol * std::abs(ref.loss) + tol) << what;
  ASSERT_EQ(got.grads.size(), ref.grads.size()) << what;
  for (size_t i = 0; i < ref.grads.size(); ++i) {
    ASSERT_TRUE(got.grads[i].second.defined() && ref.grads[i].second.defined()) << what << " " << ref.grads[i].first;
    EXPECT_TRUE(all_close(got.grads[i].second, ref.grads[i].second, tol, tol)) << what << " " << ref.grads[i].first;
  }
}

TEST(GPTForwardLoss, EqualsTheUnfusedPathForEveryArchitecture) {
  const Tensor labels = from_vector<int64_t>({2, -100, 4, 5, 12, 0, -100, 9}, {8});
  for (const auto& [name, o] : variants()) {
    const StepResult ref = train_step(o, -1, labels, 10);
    for (int64_t chunk : {0, 3}) {
      expect_equal_runs(train_step(o, chunk, labels, 10), ref, 1e-12, name + " chunk " + std::to_string(chunk));
    }
  }
}

TEST(GPTForwardLoss, Bf16MixedPrecisionMatchesTheUnfusedPath) {
  const Tensor labels = from_vector<int64_t>({2, 3, 4, 5, 12, 0, 11, 9}, {8});
  GPTOptions o = base();
  o.dtype = DType::f32;
  o.compute_dtype = DType::bf16;
  const StepResult ref = train_step(o, -1, labels, 8);
  const StepResult got = train_step(o, 3, labels, 8);
  EXPECT_NEAR(got.loss, ref.loss, 1e-4 * std::abs(ref.loss));
  for (size_t i = 0; i < ref.grads.size(); ++i) {
    // bf16 noise: the unfused path rounds dlogits and the head's gradients to bf16 at other points.
    const auto a = got.grads[i].second.to_vector<double>(), b = ref.grads[i].second.to_vector<double>();
    double num = 0, den = 0;
    for (size_t k = 0; k < a.size(); ++k) {
      num += (a[k] - b[k]) * (a[k] - b[k]);
      den += b[k] * b[k];
    }
    EXPECT_LT(std::sqrt(num / den), 2e-2) << ref.grads[i].first;
  }
}

TEST(GPTForwardLoss, WithoutGradModeTakesThePlainPath) {
  GPTOptions o = base();
  o.classifier_chunk_rows = 3;
  GPT model(o);
  const GPTInput in = make_prompt_input({{1, 2, 3, 4}});
  const Tensor labels = from_vector<int64_t>({2, -100, 4, 5}, {4});
  Tensor loss;
  {
    NoGradGuard no_grad;
    loss = model.forward_loss(in, labels, 3);
  }
  EXPECT_FALSE(loss.requires_grad());
  EXPECT_NEAR(loss.item<double>(), GPT::loss(model.forward(in), labels, 3).item<double>(), 1e-12);
}

TEST(GPTForwardLoss, RefusesBadInputs) {
  GPTOptions o = base();
  GPT model(o);
  const GPTInput in = make_prompt_input({{1, 2, 3}});
  EXPECT_CPF_ERROR(model.forward_loss(in, from_vector<int64_t>({1, 2, 3}, {3}), 0),
                   "GPT::forward_loss: normalizer=0 must be at least 1");
  EXPECT_CPF_ERROR(model.forward_loss(in, from_vector<int64_t>({1, 2}, {2}), 1),
                   "classifier_loss: labels must have shape [3] to match hidden [3,16], got [2]");
  EXPECT_CPF_ERROR(model.forward_loss(in, from_vector<int64_t>({1, 13, 2}, {3}), 1),
                   "classifier_loss: target 13 at row 1 is out of range for C=13 classes");
  // A device divisor only reaches the fused path: the unfused loss would silently divide by the value.
  const Tensor divisor = scalar_tensor(3.0, {.dtype = DType::f64});
  {
    // Without recording the fused path computes the loss alone (evaluation), and takes the device divisor.
    NoGradGuard no_grad;
    const Tensor labels = from_vector<int64_t>({1, 2, 3}, {3});
    EXPECT_EQ(model.forward_loss(in, labels, 3, -1, nullptr, divisor).item<double>(),
              model.forward_loss(in, labels, 3).item<double>());
    GPTOptions unfused_options = o;
    unfused_options.classifier_chunk_rows = -1;
    const GPT unfused(unfused_options);
    EXPECT_CPF_ERROR(unfused.forward_loss(in, labels, 3, -1, nullptr, divisor),
                     "GPT::forward_loss: a normalizer_tensor needs the fused classifier "
                     "(model.classifier_chunk_rows >= 0, now -1)");
  }
  o.classifier_chunk_rows = -2;
  const auto p = check_options(o);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->key, "classifier_chunk_rows");
  EXPECT_EQ(p->message, "classifier_chunk_rows=-2 must be -1 (unfused), 0 (by memory) or a row count");
}

}  // namespace
}  // namespace cpf::models
