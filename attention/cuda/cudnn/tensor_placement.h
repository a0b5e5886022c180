#pragma once
// Which q, k, v tensors one cuDNN attention call hands to its graph, and the key their strides give
// (docs/attention.md, "Strided q, k, v"): views cuDNN can read as they are go in without a copy, the
// rest as dense copies. Private to cpf_attention_cuda (attention/cuda/cudnn/fused_attention.cpp).
#include <array>
#include <functional>
#include <optional>

#include "attention/attention_problem.h"
#include "attention/cuda/cudnn/graph_building.h"
#include "attention/cuda/cudnn/problem_mapping.h"
#include "attention/cuda/cudnn/strided_layout.h"

namespace cpf::attention_cuda::cudnn {

// The key's I/O strides from the layouts (the backward's dq/dk/dv share q/k/v's). thd: the b strides
// span cuDNN's own padded s, and the ragged offsets (token * row stride) are int64 when the last one
// passes int32.
void set_layouts(SdpaGraphKey& key, const AttentionProblem& p, const SdpaMapping& m, const Layouts& layouts);

// Contiguous and 16-byte aligned, as the graphs declare (CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT): a
// contiguous view may still start at an odd element (as_strided), and is then copied.
Tensor dense(const Tensor& t, DType dtype);

// The q, k, v cuDNN reads in one call, with the key and plan their layouts give.
struct Placed {
  SdpaGraphKey key;
  Layouts layouts;
  const ExecutionPlan* plan = nullptr;
  Tensor q, k, v;
  std::optional<std::array<Tensor, 3>> grads;  // backward in place: dq, dk, dv (views of one buffer)
};

// The plan for a key, or nullptr when cuDNN offers no engine for it (attention/cuda/cudnn/fused_attention.cpp's plan
// cache).
using PlanLookup = std::function<const ExecutionPlan*(const SdpaGraphKey&)>;

// `key`, `dense` and `plan`: the call as prepared for dense inputs. The forward reads every view
// in_place_layout accepts as it is (the q/k/v split of the fused projection included) and copies the
// rest; the backward reads them in place only when they are the three pieces of one fused projection,
// and then writes dq, dk, dv into one buffer laid out the same way (packed_gradients: the graph gives
// dQ/dK/dV q/k/v's strides), else it copies as today. A layout cuDNN has no engine for falls back to
// the copies and `plan`. Copies run under the profile scope attention/cudnn_copy_inputs.
Placed place_inputs(const SdpaGraphKey& key, const Layouts& dense_layouts, const SdpaMapping& m,
                    const ExecutionPlan& plan, const AttentionProblem& p, const Tensor& q, const Tensor& k,
                    const Tensor& v, const PlanLookup& lookup);

}  // namespace cpf::attention_cuda::cudnn
