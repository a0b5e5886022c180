#pragma once
// Several linear layers that read the same input as one GEMM: y = x @ [W_1; ...; W_n]^T + [b_1; ...; b_n],
// x (..., K) -> (..., N_1 + ... + N_n), the outputs side by side in that order. Attention's q/k/v
// projections and SwiGLU's gate/up projections are such groups: one GEMM of width sum(N_i) runs closer
// to the GPU's peak than n narrow ones (k and v are 256 wide in a GQA model of hidden 768), and the
// backward's input gradient is one GEMM instead of n plus the n - 1 adds that sum them.
//
// The parameters stay separate tensors (module names and checkpoints unchanged): the forward reads the
// concatenation of their compute copies (LinearWeights::compute_weight, built per call), and the
// backward's weight gradient, one (sum(N_i), K) GEMM, is handed to each weight as its row block.
// Dtype rules are linear's (framework/autograd/functions/linear.h): f32 weights with bf16 x compute in
// bf16 and get f32 gradients.
#include <vector>

#include "framework/autograd/functions/linear.h"
#include "framework/tensor/tensor.h"

namespace cpf {

// The parts' compute copies already concatenated, kept by the caller across calls (nn::ComputeCopies::
// find_stacked): weight (sum N, K) and bias (sum N) in x's dtype, the bias undefined when the parts have none.
struct LinearCatStacked {
  Tensor weight, bias;
};

// parts: one or more LinearWeights with the same in_features K, weight dtype and device; biases all
// defined or all undefined. With fewer than min_fused_rows rows in x (decoding, tiny batches) the weight
// concatenation would cost more than one GEMM saves: the parts then run as separate linears whose
// outputs are joined (same values, the same gradients), unless `stacked` holds the concatenation already,
// which then runs as one GEMM whatever the rows.
inline constexpr int64_t kLinearCatMinFusedRows = 128;
Tensor linear_cat(const Tensor& x, const std::vector<LinearWeights>& parts,
                  int64_t min_fused_rows = kLinearCatMinFusedRows, const LinearCatStacked& stacked = {});

}  // namespace cpf
