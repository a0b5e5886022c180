#pragma once
// Kernels of the unfused attention path (private to cpf_attention_cuda). Plain parameter blocks, as
// in framework/tensor/cuda/kernels.cuh: the C++ glue (unfused_attention.cpp) turns the problem into
// these and the .cu file never sees framework types.
#include <cuda_runtime.h>

#include <cstdint>

namespace cpf::attention_cuda::unfused {

// A chunk of score rows: `groups` x `rows` rows of `cols` scores, contiguous. Row (g, r) holds the
// scores of query token r of the chunk (storage token q_token0 + r) under query head
// head0 + g * head_step against key tokens kv_token0 .. kv_token0 + cols - 1 of the same sequence.
struct ScoreRows {
  int64_t groups = 0, rows = 0, cols = 0;
  int64_t head0 = 0, head_step = 1;
  // lse / delta entry of row (g, r): ((lse_row * h_q + head) * s_q + lse_col0 + r).
  int64_t lse_row = 0, lse_col0 = 0, h_q = 0, s_q = 0;
  const int64_t* q_pos = nullptr;               // device, one per row r
  const int64_t* kv_pos = nullptr;              // device, one per column
  int64_t window_left = -1, window_right = -1;  // -1: unbounded (mask.h)
};

// Forward: scores (scale * Q K^T, masked here) become the probabilities P in place and each row's
// log-sum-exp goes to lse; rows that see no key get P = 0 and lse = -inf.
template <class T>
void launch_softmax_rows(const ScoreRows& rows, T* scores, T* lse, cudaStream_t stream);

// Backward: scores (scale * Q K^T) become P = exp(S - lse) (0 where masked or lse = -inf) and
// dp (dO V^T) becomes dS = P * (dP - delta) in place.
template <class T>
void launch_backward_rows(const ScoreRows& rows, T* scores, T* dp, const T* lse, const T* delta, cudaStream_t stream);

// delta[b, h, s] = sum_d dout * out - dlse[b, h, s] (dlse may be null) over every lse entry; out and
// dout are contiguous (token, h_q, d_v) with token = s * batch + b for sbhd, b * s_q + s otherwise.
struct DeltaParams {
  int64_t batch = 1, s_q = 0, h_q = 0, d_v = 0;
  bool sbhd = false;
};
template <class T>
void launch_delta(const DeltaParams& params, const T* out, const T* dout, const T* dlse, T* delta, cudaStream_t stream);

}  // namespace cpf::attention_cuda::unfused
