// One cuDNN attention execution's variant pack (attention/cuda/cudnn/variant_pack.h).
#include "attention/cuda/cudnn/variant_pack.h"

#include <array>

#include "attention/cuda/device_tables.h"
#include "framework/tensor/cuda/runtime.cuh"

namespace cpf::attention_cuda::cudnn {

void VariantPack::run(const ExecutionPlan& plan, const Device& device) {
  Tensor workspace;
  if (plan.workspace_bytes > 0) {
    workspace = empty({(plan.workspace_bytes + 7) / 8}, {.dtype = DType::i64, .device = device});
  }
  cuda::DeviceGuard guard(device.index);
  execute(handle_for(device.index), plan, uids_, pointers_, workspace.defined() ? workspace.raw_data() : nullptr);
}

void add_common(VariantPack& pack, Scalars& s, const AttentionProblem& p, const SdpaMapping& m, const SdpaGraphKey& key,
                const Layouts& layouts, const RowTables& tables, const Device& device) {
  s.scale = static_cast<float>(p.scale);
  pack.add_host(kUidScale, &s.scale);
  if (key.padding || key.right_bound || key.left_bound) pack.add_host(kUidNegInf, &s.neg_inf);
  if (key.right_shift) {
    s.right = static_cast<int32_t>(m.right);
    pack.add_host(kUidRightBound, &s.right);
  }
  if (key.left_bound) {
    s.left_f = static_cast<float>(m.left);
    s.left_i = static_cast<int32_t>(m.left);
    pack.add_host(kUidLeftBound, key.bottom_right ? static_cast<void*>(&s.left_i) : static_cast<void*>(&s.left_f));
  }
  if (key.padding) {  // the mapping's lengths (row_tables: uploaded once per mapping and stream)
    pack.add(kUidSeqLenQ, tables.seq_len_q);
    pack.add(kUidSeqLenKv, tables.seq_len_kv);
  }
  if (key.ragged) {
    const std::array<int64_t, 4> strides{layouts.q.row_stride, layouts.k.row_stride, layouts.v.row_stride,
                                         layouts.o.row_stride};
    const std::array<const std::vector<int64_t>*, 4> first{&m.q_token, &m.kv_token, &m.kv_token, &m.q_token};
    const std::array<int64_t, 4> total{p.s_q, p.s_kv, p.s_kv, p.s_q};
    const std::array<int64_t, 4> uids{kUidOffsetQ, kUidOffsetK, kUidOffsetV, kUidOffsetO};
    // The dense layouts' tables come with the row tables; strided views (other row strides) make theirs.
    const bool dense = strides == tables.offset_row_strides && key.ragged_int64 == tables.offsets_int64;
    for (size_t i = 0; i < 4; ++i) {
      pack.add(uids[i], dense
                            ? tables.offsets[i]
                            : device_table(ragged_offsets(*first[i], total[i], strides[i], key.ragged_int64), device));
    }
  }
}

}  // namespace cpf::attention_cuda::cudnn
