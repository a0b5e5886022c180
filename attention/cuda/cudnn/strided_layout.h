#pragma once
// How cuDNN's fused attention reads q, k, v (and writes dq, dk, dv) in memory: through the tensors' own
// strides when they meet the graph's rules, so the views that split one fused q/k/v projection (row
// stride (h_q + 2 h_kv) d) go in without a copy, and the backward writes dq, dk, dv into one packed
// buffer laid out like that projection, which split's backward then hands on without a cat
// (framework/autograd/functions/join.cpp). docs/attention.md, "Strided q, k, v".
//
// Header without CUDA or cuDNN: the checks run (and are tested) on any tensor.
#include <array>
#include <cstdint>
#include <optional>

#include "attention/attention_problem.h"
#include "attention/spec.h"
#include "framework/tensor/tensor.h"

namespace cpf::attention_cuda::cudnn {

using Strides4 = std::array<int64_t, 4>;  // (b, h, s, d) element strides (as in attention/cuda/cudnn/graph_building.h)

// The graphs declare 16-byte alignment (CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT) for every I/O tensor.
inline constexpr int64_t kCudnnAlignmentBytes = 16;

struct IoLayout {
  Strides4 strides{};      // (b, h, s, d); thd's b stride is the whole tensor (ragged offsets override it)
  int64_t row_stride = 0;  // elements from one token to the next: thd's ragged offsets advance by it
};

// The layout of a dense (contiguous) tensor of `format` with `heads` x `dim` per token and `batch` x
// `seq` tokens (thd: batch 1, seq the total).
IoLayout dense_layout(QkvFormat format, int64_t batch, int64_t seq, int64_t heads, int64_t dim);

// t's own layout when cuDNN can read it in place: the innermost dim contiguous, the base pointer and
// every other stride a multiple of 16 bytes (what the graphs declare); nullopt
// when it must be copied (attention/cuda/cudnn/fused_attention.cpp then makes it dense).
std::optional<IoLayout> in_place_layout(const Tensor& t, QkvFormat format);

// q, k, v and o (out and dout share o's) as a graph declares them.
struct Layouts {
  IoLayout q, k, v, o;
};

// Every one dense: the layouts of a call's prepared key (its copies, or its dense inputs).
Layouts dense_layouts(const AttentionProblem& p);

// dq, dk, dv as views of one fresh buffer laid out exactly like the storage q, k, v are cut from, when
// they are the three pieces of one fused projection: one storage holding nothing else, every token a
// row of h_q d_qk + h_kv d_qk + h_kv d_v elements with q, k, v side by side in that order, tokens in
// row-major order. The backward then writes its gradients there in place (same strides as q, k, v) and
// split's backward joins them without a copy. nullopt for anything else (fresh dense gradients).
std::optional<std::array<Tensor, 3>> packed_gradients(const Tensor& q, const Tensor& k, const Tensor& v);

}  // namespace cpf::attention_cuda::cudnn
