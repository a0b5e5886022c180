#pragma once
// One cuDNN attention execution's variant pack (private to cpf_attention_cuda; used by
// attention/cuda/cudnn/fused_attention.cpp and attention/cuda/cudnn/grouped_execution.cpp): the device buffers and host
// scalars it binds, and the bindings every forward and backward shares (scale, bounds, lengths, ragged offsets).
#include <cstdint>
#include <limits>
#include <vector>

#include "attention/attention_problem.h"
#include "attention/cuda/cudnn/backend_api.h"
#include "attention/cuda/cudnn/graph_building.h"
#include "attention/cuda/cudnn/problem_mapping.h"
#include "attention/cuda/cudnn/row_fixup_tables.h"
#include "attention/cuda/cudnn/strided_layout.h"
#include "framework/tensor/tensor.h"

namespace cpf::attention_cuda::cudnn {

// Device buffers and host scalars of one execution (kept alive until cudnnBackendExecute returns;
// device tensors are freed in stream order afterwards, which the caching allocator makes safe).
class VariantPack {
 public:
  VariantPack() {  // a call binds at most 22 entries: no regrowth per call
    uids_.reserve(24);
    pointers_.reserve(24);
    keep_.reserve(24);
  }
  void add(int64_t uid, const Tensor& t) {
    uids_.push_back(uid);
    pointers_.push_back(t.raw_data());
    keep_.push_back(t);
  }
  void add_host(int64_t uid, void* value) {
    uids_.push_back(uid);
    pointers_.push_back(value);
  }
  // Runs `plan` with a workspace from the caching allocator (freed in stream order after the launch).
  void run(const ExecutionPlan& plan, const Device& device);

 private:
  std::vector<int64_t> uids_;
  std::vector<void*> pointers_;
  std::vector<Tensor> keep_;
};

// Host scalars by value, and the device tensors for lengths and ragged offsets.
struct Scalars {
  float scale = 1.0f, neg_inf = -std::numeric_limits<float>::infinity(), one = 1.0f, left_f = 0.0f;
  int32_t right = 0, left_i = 0;
};

// The scale, the bounds, the lengths (padding) and the ragged offsets (thd) of mapping `m` under `key`:
// `tables` holds the lengths and the dense layouts' offsets; other layouts make their offsets here.
void add_common(VariantPack& pack, Scalars& s, const AttentionProblem& p, const SdpaMapping& m, const SdpaGraphKey& key,
                const Layouts& layouts, const RowTables& tables, const Device& device);

}  // namespace cpf::attention_cuda::cudnn
