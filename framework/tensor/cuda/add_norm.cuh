#pragma once
// What the two halves of the residual add fused with the norm share (add_norm.cu: the forward;
// add_norm_backward.cu: the backward): block shapes and the dtype visitor. Private to the CUDA backend.
#include "framework/tensor/cuda/row_kernels.cuh"

namespace cpf::cuda::kernels::add_norm_detail {

constexpr int kCachedThreads = 128;  // a block per long row (as norm.cu's register-cached kernel)

// fn<T>() with T = TX, or bf16 when `code` says so beside an f32 TX (the only mixed pair).
template <class TX, class Fn>
void visit_narrow(int code, Fn&& fn) {
  if constexpr (std::is_same_v<TX, float>) {
    if (code == kBF16) return fn.template operator()<bf16>();
  }
  fn.template operator()<TX>();
}

}  // namespace cpf::cuda::kernels::add_norm_detail
