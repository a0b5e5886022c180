#pragma once
// The model of the gradient-reducer tests (thread backend: grad_reducer_test; NCCL:
// cuda_distributed/grad_reducer_nccl_test): a tiny decoder whose gradients exercise what a
// data-parallel reducer meets in a GPT.
#include <vector>

#include "framework/autograd/grad_mode.h"
#include "framework/autograd/ops.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/random.h"

namespace cpf::testing {

// Tied embedding (the first and the last use of one parameter), an MLP in `matrix_dtype` (bf16
// exercises a second bucket dtype), an RMS norm; optionally a parameter the loss never uses,
// registered in the middle. Parameters are the same on every rank (fixed seed); the batch depends
// on the rank and the step. Everything lives on `device`.
struct TinyModel {
  static constexpr int64_t kVocab = 11, kDim = 8, kHidden = 16, kBatch = 2, kSeq = 5;

  DType matrix_dtype = DType::f32;
  bool with_unused = false;
  Device device;
  std::vector<Tensor> params;  // emb, w1, b1, [unused], w2, g

  TinyModel(DType matrix_dtype_, bool with_unused_, Device device_ = Device::cpu())
      : matrix_dtype(matrix_dtype_), with_unused(with_unused_), device(device_) {
    Generator gen(1234);
    auto make = [&](const Shape& shape, DType dtype) {
      Tensor t = raw::to(uniform(shape, -0.5, 0.5, {.dtype = dtype}, &gen), device);
      t.set_requires_grad(true);
      params.push_back(t);
    };
    make({kVocab, kDim}, DType::f32);
    make({kDim, kHidden}, matrix_dtype);
    make({kHidden}, matrix_dtype);
    if (with_unused) make({3, 2}, DType::f32);
    make({kHidden, kDim}, matrix_dtype);
    make({kDim}, DType::f32);
  }
  // An independent copy with the same values (the reference runs all_reduce_gradients on it).
  TinyModel copy() const {
    TinyModel other(matrix_dtype, with_unused, device);
    for (size_t i = 0; i < params.size(); ++i) {
      other.params[i] = raw::clone(params[i]);
      other.params[i].set_requires_grad(true);
    }
    return other;
  }

  Tensor loss(int rank, int step) const {
    const size_t k = with_unused ? 1 : 0;
    const Tensor &emb = params[0], &w1 = params[1], &b1 = params[2], &w2 = params[3 + k], &g = params[4 + k];
    Generator gen(static_cast<uint64_t>(100 * rank + step + 1));
    const Tensor ids = raw::to(randint(0, kVocab, {kBatch, kSeq}, {.dtype = DType::i64}, &gen), device);  // (B, T)
    const Tensor targets = raw::to(randint(0, kVocab, {kBatch * kSeq}, {.dtype = DType::i64}, &gen), device);
    const Tensor x = cpf::embedding(emb, ids);                                      // (B, T, D)
    Tensor h = cpf::gelu(cpf::add(cpf::matmul(cpf::to(x, matrix_dtype), w1), b1));  // (B, T, H)
    h = cpf::to(cpf::matmul(h, w2), DType::f32);                                    // (B, T, D)
    const Tensor y = cpf::rms_norm(cpf::add(x, h), g);
    const Tensor logits = cpf::matmul(y, cpf::transpose(emb, 0, 1));  // (B, T, V)
    return cpf::cross_entropy(cpf::reshape(logits, {kBatch * kSeq, kVocab}), targets);
  }
};

// A plain SGD step, so the next step starts from new values; clears the gradients.
inline void sgd_step(const std::vector<Tensor>& params) {
  NoGradGuard guard;
  for (const Tensor& p : params) {
    if (p.grad().defined()) raw::copy_(p, raw::sub(p, raw::mul(p.grad(), 0.1)));
    p.set_grad(Tensor());
  }
}

}  // namespace cpf::testing
