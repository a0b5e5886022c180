// Building blocks shared by the CP strategies: the context's helpers and the Ulysses exchange.
#include "attention/attention_sink.h"
#include "attention/cp/strategy.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/index.h"
#include "framework/tensor/ops/reduce.h"
#include "framework/tensor/ops/views.h"

namespace cpf::cp {

std::vector<int> CpContext::cp_ranks_of(const dist::ProcessGroup& group) const {
  std::vector<int> ranks;
  for (int global : group.global_ranks()) {
    const int cp = global < static_cast<int>(cp_rank_of_global.size()) ? cp_rank_of_global[global] : -1;
    CPF_CHECK(cp >= 0, "context parallel: global rank ", global, " of ", group.describe(),
              " is not a member of the CP group");
    ranks.push_back(cp);
  }
  return ranks;
}

void CpContext::count_sent(const Tensor& t, int64_t times, int64_t numerator, int64_t denominator) const {
  const int64_t bytes = t.numel() * static_cast<int64_t>(dtype_size(t.dtype())) * times * numerator / denominator;
  (backward ? stats->backward_bytes_sent : stats->forward_bytes_sent) += bytes;
}

Tensor seq_to_head_split(const CpContext& ctx, dist::ProcessGroup& group, const Tensor& local) {
  // (T, H, D) -> piece j = heads [j H/A, (j+1) H/A) goes to member j; received pieces stack along
  // tokens in member order: (A T, H/A, D).
  ctx.count_sent(local, 1, group.size() - 1, group.size());
  return raw::contiguous(group.all_to_all(raw::contiguous(local), 1, 0));
}

Tensor head_to_seq_split(const CpContext& ctx, dist::ProcessGroup& group, const Tensor& gathered) {
  // (A T, H/A, D) -> piece j = member j's tokens goes back to member j; heads stack: (T, H, D).
  ctx.count_sent(gathered, 1, group.size() - 1, group.size());
  return raw::contiguous(group.all_to_all(raw::contiguous(gathered), 0, 1));
}

Tensor replicate_kv_heads(const Tensor& kv, int64_t a2a) {
  const int64_t heads = kv.size(1);
  if (heads >= a2a) return kv;
  // Replica j serves the query heads of rank j, which all use KV head j / (a2a / heads).
  std::vector<int64_t> source;
  for (int64_t j = 0; j < a2a; ++j) source.push_back(j / (a2a / heads));
  return raw::index_select(kv, 1, from_vector(source, {a2a}, kv.device()));
}

Tensor reduce_replicated_kv_heads(const Tensor& grad, int64_t num_kv_heads) {
  const int64_t replicated = grad.size(1);
  if (replicated == num_kv_heads) return grad;
  // (T, A, D) -> (T, Hkv, A / Hkv, D) -> sum over the replicas.
  Tensor grouped = raw::reshape(grad, {grad.size(0), num_kv_heads, replicated / num_kv_heads, grad.size(2)});
  return raw::sum(grouped, {2});
}

}  // namespace cpf::cp

namespace cpf::cp {

CpForward with_sink(const CpContext& ctx, CpForward forward, int64_t first_head) {
  if (!ctx.sink.defined()) return forward;
  const Tensor slice = raw::contiguous(raw::narrow(ctx.sink, 0, first_head, forward.out.size(1)));
  raw::SinkRescaled rescaled = raw::apply_attention_sink(forward.out, forward.lse, slice, QkvFormat::thd);
  forward.out = rescaled.out;
  forward.lse = rescaled.lse;
  return forward;
}

}  // namespace cpf::cp
