// GPT mixed precision (GPTOptions::compute_dtype = bf16 over f32 parameters): logits in bf16, the loss
// in f32, every parameter and gradient f32 and close to the fp32 model's, the optimizer state f32,
// every architecture variant (MHA/GQA/MLA, RMSNorm/LayerNorm, GELU/SwiGLU, learned/RoPE, tied or not).
#include <gtest/gtest.h>

#include <cmath>

#include "framework/autograd/ops.h"
#include "framework/optim/adamw.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/storage.h"
#include "models/gpt.h"
#include "models/gpt_input.h"
#include "models/gpt_test_options.h"
#include "support/test_utils.h"

namespace cpf::models {
namespace {

GPTOptions small(AttentionType attention) { return precision_gpt(attention); }

// Two documents of 7 and 5 tokens.
GPTInput batch() { return make_prompt_input({{1, 4, 2, 7, 3, 9, 5}, {2, 8, 6, 1, 10}}); }
Tensor labels() { return from_vector<int64_t>({4, 2, 7, 3, 9, 5, -100, 8, 6, 1, 10, -100}, {12}); }

// Max |a - b| / max(max |b|, floor).
double rel_max_error(const Tensor& a, const Tensor& b, double floor = 0.0) {
  const auto x = a.to_vector<double>();
  const auto y = b.to_vector<double>();
  double err = 0, scale = floor;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    err = std::max(err, std::abs(x[i] - y[i]));
    scale = std::max(scale, std::abs(y[i]));
  }
  return scale == 0 ? err : err / scale;
}

struct Variant {
  const char* name;
  GPTOptions options;
};

std::vector<Variant> variants() {
  std::vector<Variant> out{
      {"mha", small(AttentionType::mha)}, {"gqa", small(AttentionType::gqa)}, {"mla", small(AttentionType::mla)}};
  GPTOptions gpt2 = small(AttentionType::mha);
  gpt2.norm = NormType::layernorm;
  gpt2.positions = PositionType::learned;
  gpt2.max_positions = 16;
  gpt2.bias = true;
  gpt2.tie_embeddings = false;
  out.push_back({"gpt2-style", gpt2});
  GPTOptions llama = small(AttentionType::gqa);
  llama.mlp = nn::Activation::swiglu;
  out.push_back({"llama-style", llama});
  return out;
}

// Logits and gradients through ~10 bf16 roundings per layer: relative errors of a few 2^-8 against
// the largest element (measured at most 2.3e-2 over these variants, on gradients). 5e-2 for logits and
// 1e-1 for gradients keep a 2-4x margin and still fail on a wrong cast or formula (O(1) errors).
constexpr double kLogitsRtol = 5e-2;
constexpr double kGradRtol = 1e-1;

TEST(GPTPrecision, Bf16ComputeTracksFp32WithF32MasterWeightsAndGradients) {
  for (const Variant& v : variants()) {
    SCOPED_TRACE(v.name);
    Generator g32(5), g16(5);
    GPT fp32(v.options, &g32);
    GPTOptions mixed_options = v.options;
    mixed_options.compute_dtype = DType::bf16;
    GPT bf16(mixed_options, &g16);
    EXPECT_TRUE(bf16.precision().mixed());

    const Tensor logits32 = fp32.forward(batch());
    const Tensor logits16 = bf16.forward(batch());
    EXPECT_EQ(logits32.dtype(), DType::f32);
    EXPECT_EQ(logits16.dtype(), DType::bf16);
    EXPECT_LE(rel_max_error(logits16, logits32), kLogitsRtol);

    const Tensor loss32 = GPT::loss(logits32, labels(), 10);
    const Tensor loss16 = GPT::loss(logits16, labels(), 10);
    EXPECT_EQ(loss16.dtype(), DType::f32);  // computed in f32 from bf16 logits
    EXPECT_NEAR(loss16.item<double>(), loss32.item<double>(), 2e-2 * loss32.item<double>());
    backward(loss32);
    backward(loss16);

    const auto p32 = fp32.named_parameters();
    const auto p16 = bf16.named_parameters();
    ASSERT_EQ(p32.size(), p16.size());
    // Some gradients are zero in exact arithmetic (a key bias shifts every score of a row equally, and
    // softmax ignores that): fp32 leaves ~1e-9 there, bf16 ~1e-5. Errors are measured against at least
    // 1% of the largest gradient of the model, so those rounding residues do not count as relative errors.
    double largest = 0;
    for (const auto& [name, p] : p32) {
      for (double g : p.grad().to_vector<double>()) largest = std::max(largest, std::abs(g));
    }
    for (size_t i = 0; i < p16.size(); ++i) {
      const auto& [name, p] = p16[i];
      EXPECT_EQ(p.dtype(), DType::f32) << name;
      ASSERT_TRUE(p.grad().defined()) << name << " received no gradient";
      EXPECT_EQ(p.grad().dtype(), DType::f32) << name;
      EXPECT_LE(rel_max_error(p.grad(), p32[i].second.grad(), 1e-2 * largest), kGradRtol) << name;
    }
  }
}

TEST(GPTPrecision, OptimizerStateOfABf16ModelIsF32) {
  GPTOptions o = small(AttentionType::mha);
  o.compute_dtype = DType::bf16;
  GPT model(o);
  optim::AdamW adamw(model.named_parameters(), {.lr = 1e-3});
  backward(GPT::loss(model.forward(batch()), labels(), 10));
  adamw.step();
  for (const auto& [name, t] : adamw.state_tensors()) EXPECT_EQ(t.dtype(), DType::f32) << name;
  for (const auto& [name, p] : model.named_parameters()) EXPECT_EQ(p.dtype(), DType::f32) << name;
}

TEST(GPTPrecision, LossWithAKnownValidCountEqualsTheCountedOne) {
  GPT model(small(AttentionType::mha));
  const Tensor logits = model.forward(batch());
  EXPECT_EQ(GPT::loss(logits, labels(), 13, 10).item<double>(), GPT::loss(logits, labels(), 13).item<double>());
}

TEST(GPTPrecision, UnsupportedPrecisionsAndDevicesAreRejected) {
  GPTOptions o = small(AttentionType::mha);
  o.dtype = DType::f64;
  o.compute_dtype = DType::bf16;
  EXPECT_CPF_ERROR(GPT{o}, "GPT: compute dtype bf16 with f64 parameters is not supported");
  o.compute_dtype = std::nullopt;  // f64 throughout (the gradcheck model) stays valid
  EXPECT_EQ(GPT(o).precision().compute, DType::f64);
  // Inputs on another device than the model's.
  if (has_device_backend(DeviceType::cuda) && device_backend(DeviceType::cuda).device_count() > 0) {
    GPT model(small(AttentionType::mha));
    GPTInput in = batch();
    in.tokens = raw::to(in.tokens, Device::cuda(0));
    EXPECT_CPF_ERROR(model.forward(in), "must be on the model's device cpu");
  }
}

}  // namespace
}  // namespace cpf::models
