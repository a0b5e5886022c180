#pragma once
// FP8 casts of many weights at once (framework/autograd/fp8_weight_cache.h refreshes a step's FP8 weight
// copies with them): each weight given as its row blocks, the way linear_cat holds q, k and v, or gate and
// up, as separate (N_i, K) tensors of one (sum N_i, K) weight.
//
//   per weight   cat(parts) (f32)  ->  abs_max  ->  quantize_fp8_transposed      a launch or three each,
//                                                                                the parts copied once
//   here         abs_max_rows(all)  ->  quantize_fp8_transposed_rows(all)         one launch each for up to
//                                                                                48 row blocks, no copy
//
// The values are those of the per-weight ops bit for bit: a cast is per element with its weight's scale,
// and a max does not depend on the order it is taken in. A backend casts in one launch the weights whose
// every block fits its kernel (CUDA: rows and width multiples of 64, aligned data) and the others one by one;
// the CPU casts them one by one.
#include <vector>

#include "framework/tensor/ops/fp8.h"
#include "framework/tensor/tensor.h"

namespace cpf::raw {

// One weight to cast.
struct Fp8RowsCast {
  std::vector<Tensor> parts;  // (N_i, K) row blocks of the weight (sum N_i, K): f32 or bf16, one dtype and device
  Tensor scale;               // () f32 on the parts' device: the scale the weight is cast with
  Tensor amax_out;            // () f32 or undefined: becomes max(amax_out, max |weight|) (delayed scaling)
};

// abs_max(cat(weights[i], 0)) for each i: a () f32 each (views into one buffer).
std::vector<Tensor> abs_max_rows(const std::vector<std::vector<Tensor>>& weights);

// quantize_fp8_transposed(cat(c.parts, 0), c.scale, fp8, c.amax_out) for each c: q (N, K) and qt (K, N).
std::vector<Fp8Transposed> quantize_fp8_transposed_rows(const std::vector<Fp8RowsCast>& casts, DType fp8);

}  // namespace cpf::raw
