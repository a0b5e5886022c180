#include "framework/distributed/process_group.h"

#include <algorithm>
#include <numeric>

#include "framework/tensor/shape_utils.h"

namespace cpf::dist {
namespace {

bool shares_storage(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.storage() && a.storage() == b.storage();
}

bool same_view(const Tensor& a, const Tensor& b) {
  return shares_storage(a, b) && a.offset() == b.offset() && a.shape() == b.shape() && a.strides() == b.strides();
}

void check_input(const Tensor& input, const std::string& ctx) {
  CPF_CHECK(input.defined(), ctx, ": the input tensor is undefined");
}

// out, when given: the input's dtype, the expected shape, and no memory shared with the input
// unless in place is allowed and it is exactly the input's view.
void check_out(const Tensor& out, const Tensor& input, const Shape& expected, bool in_place_ok,
               const std::string& ctx) {
  if (!out.defined()) return;
  CPF_CHECK(out.dtype() == input.dtype(), ctx, ": out is ", out.dtype(), " but the input is ", input.dtype());
  CPF_CHECK(out.shape() == expected, ctx, ": out has shape ", out.shape(), " but the result has shape ", expected,
            " (input ", input.shape(), ")");
  if (in_place_ok) {
    CPF_CHECK(!shares_storage(out, input) || same_view(out, input), ctx,
              ": out shares memory with the input without being the same view; pass the input itself to run in "
              "place, or a separate tensor");
  } else {
    CPF_CHECK(!shares_storage(out, input), ctx,
              ": out shares memory with the input; this operation cannot run in "
              "place, pass a separate tensor");
  }
}

void check_reduce_dtype(ReduceOp op, DType dtype, const std::string& ctx) {
  if (dtype == DType::boolean) {
    CPF_CHECK(op == ReduceOp::max || op == ReduceOp::min, ctx, ": ", reduce_op_name(op),
              " of bool tensors is not meaningful; use max (logical or) or min (logical and)");
  }
  CPF_CHECK(op != ReduceOp::avg || is_floating(dtype), ctx, ": avg needs a floating dtype (f32, f64, bf16), got ",
            dtype, "; use sum and divide");
}

void check_peer(int peer, int size, const char* what, const std::string& ctx) {
  CPF_CHECK(peer >= 0 && peer < size, ctx, ": ", what, " ", peer, " is out of range for a group of size ", size,
            " (expected 0..", size - 1, ")");
}

}  // namespace

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
  }
  return "?";
}

std::vector<int64_t> even_splits(int64_t total, int parts) {
  CPF_CHECK(parts > 0, "even_splits: need at least one part, got ", parts);
  std::vector<int64_t> out(static_cast<size_t>(parts), total / parts);
  for (int64_t r = 0; r < total % parts; ++r) out[static_cast<size_t>(r)] += 1;
  return out;
}

std::string ProcessGroup::describe() const {
  return str_cat("group '", name(), "' (global ranks ", global_ranks(), ")");
}

// Concatenated, not streamed: every NCCL operation builds it once, and a string stream costs more.
std::string ProcessGroup::op_context(const char* op) const {
  std::string out(op);
  out.append(" on group '").append(name()).append("'");
  return out;
}

WorkPtr ProcessGroup::all_reduce_async(const Tensor& input, ReduceOp op, const Tensor& out) {
  const std::string ctx = op_context("all_reduce");
  check_input(input, ctx);
  check_reduce_dtype(op, input.dtype(), ctx);
  check_out(out, input, input.shape(), /*in_place_ok=*/true, ctx);
  return do_all_reduce(input, op, out);
}

WorkPtr ProcessGroup::broadcast_async(const Tensor& input, int root, const Tensor& out) {
  const std::string ctx = op_context("broadcast");
  check_input(input, ctx);
  check_peer(root, size(), "root", ctx);
  check_out(out, input, input.shape(), /*in_place_ok=*/true, ctx);
  return do_broadcast(input, root, out);
}

WorkPtr ProcessGroup::all_gather_async(const Tensor& input, int64_t dim, const Tensor& out) {
  const std::string ctx = op_context("all_gather");
  check_input(input, ctx);
  const int64_t d = normalize_dim(dim, input.dim(), ctx.c_str());
  CPF_CHECK(input.dim() > 0, ctx, ": cannot gather a 0-d tensor along a dim; reshape it to [1] first");
  if (out.defined()) {
    // The total along dim is only known once every rank arrived; the backend checks it.
    Shape expected = input.shape();
    if (out.dim() == input.dim()) expected[static_cast<size_t>(d)] = out.size(d);
    check_out(out, input, expected, /*in_place_ok=*/false, ctx);
  }
  return do_all_gather(input, d, out);
}

WorkPtr ProcessGroup::reduce_scatter_async(const Tensor& input, int64_t dim, ReduceOp op, const Tensor& out,
                                           const std::vector<int64_t>& splits) {
  const std::string ctx = op_context("reduce_scatter");
  check_input(input, ctx);
  check_reduce_dtype(op, input.dtype(), ctx);
  const int64_t d = normalize_dim(dim, input.dim(), ctx.c_str());
  CPF_CHECK(input.dim() > 0, ctx, ": cannot scatter a 0-d tensor along a dim; reshape it to [n] first");
  const int64_t total = input.size(d);
  int64_t out_size = 0;
  if (!splits.empty()) {
    CPF_CHECK(static_cast<int>(splits.size()) == size(), ctx, ": splits ", splits, " has ", splits.size(),
              " entries for a group of size ", size());
    CPF_CHECK(std::all_of(splits.begin(), splits.end(), [](int64_t s) { return s >= 0; }), ctx, ": splits ", splits,
              " has a negative size");
    const int64_t sum = std::accumulate(splits.begin(), splits.end(), int64_t{0});
    CPF_CHECK(sum == total, ctx, ": splits ", splits, " add up to ", sum, " but dim ", d, " of the input ",
              input.shape(), " has size ", total);
    out_size = splits[static_cast<size_t>(rank())];
  } else if (out.defined() && out.dim() == input.dim()) {
    out_size = out.size(d);  // each rank's out says how big its piece is; the backend checks the sum
  } else {
    out_size = even_splits(total, size())[static_cast<size_t>(rank())];
  }
  Shape expected = input.shape();
  expected[static_cast<size_t>(d)] = out_size;
  check_out(out, input, expected, /*in_place_ok=*/false, ctx);
  return do_reduce_scatter(input, d, op, out, out_size, splits);
}

WorkPtr ProcessGroup::all_to_all_async(const Tensor& input, int64_t split_dim, int64_t concat_dim, const Tensor& out) {
  const std::string ctx = op_context("all_to_all");
  check_input(input, ctx);
  CPF_CHECK(input.dim() > 0, ctx, ": cannot split a 0-d tensor; reshape it first");
  const int64_t s = normalize_dim(split_dim, input.dim(), ctx.c_str());
  const int64_t c = normalize_dim(concat_dim, input.dim(), ctx.c_str());
  CPF_CHECK(input.size(s) % size() == 0, ctx, ": split dim ", s, " of size ", input.size(s),
            " cannot be split evenly across ", size(), " ranks (input ", input.shape(), ")");
  Shape expected = input.shape();
  expected[static_cast<size_t>(s)] /= size();
  expected[static_cast<size_t>(c)] *= size();
  check_out(out, input, expected, /*in_place_ok=*/false, ctx);
  return do_all_to_all(input, s, c, out);
}

WorkPtr ProcessGroup::batch_p2p_async(const std::vector<P2POp>& ops) {
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2POp& op = ops[i];
    // The message prefix is built only for a rejected op: this runs at every step of a CP ring.
    if (op.tensor.defined() && op.peer >= 0 && op.peer < size() && op.tag >= 0) continue;
    const std::string ctx = op_context("batch_p2p");
    const char* kind = op.kind == P2POp::Kind::send ? "send" : "recv";
    CPF_CHECK(op.tensor.defined(), ctx, ": op ", i, " (", kind, ") has an undefined tensor");
    check_peer(op.peer, size(), op.kind == P2POp::Kind::send ? "destination" : "source", ctx);
    CPF_CHECK(op.tag >= 0, ctx, ": op ", i, " (", kind, ") has a negative tag ", op.tag);
  }
  return do_batch_p2p(ops);
}

WorkPtr ProcessGroup::send_async(const Tensor& tensor, int dst, int tag) {
  return batch_p2p_async({P2POp::send(tensor, dst, tag)});
}

WorkPtr ProcessGroup::recv_async(const Tensor& out, int src, int tag) {
  return batch_p2p_async({P2POp::recv(out, src, tag)});
}

WorkPtr ProcessGroup::barrier_async() { return do_barrier(); }

Tensor ProcessGroup::all_reduce(const Tensor& input, ReduceOp op) { return all_reduce_async(input, op)->wait_tensor(); }
void ProcessGroup::all_reduce_(const Tensor& tensor, ReduceOp op) { all_reduce_async(tensor, op, tensor)->wait(); }
Tensor ProcessGroup::broadcast(const Tensor& input, int root) { return broadcast_async(input, root)->wait_tensor(); }
void ProcessGroup::broadcast_(const Tensor& tensor, int root) { broadcast_async(tensor, root, tensor)->wait(); }
Tensor ProcessGroup::all_gather(const Tensor& input, int64_t dim) {
  return all_gather_async(input, dim)->wait_tensor();
}
Tensor ProcessGroup::reduce_scatter(const Tensor& input, int64_t dim, ReduceOp op, const std::vector<int64_t>& splits) {
  return reduce_scatter_async(input, dim, op, Tensor(), splits)->wait_tensor();
}
Tensor ProcessGroup::all_to_all(const Tensor& input, int64_t split_dim, int64_t concat_dim) {
  return all_to_all_async(input, split_dim, concat_dim)->wait_tensor();
}
std::vector<Tensor> ProcessGroup::batch_p2p(const std::vector<P2POp>& ops) {
  WorkPtr work = batch_p2p_async(ops);
  work->wait();
  return work->result();
}
void ProcessGroup::send(const Tensor& tensor, int dst, int tag) { send_async(tensor, dst, tag)->wait(); }
void ProcessGroup::recv(const Tensor& out, int src, int tag) { recv_async(out, src, tag)->wait(); }
void ProcessGroup::barrier() { barrier_async()->wait(); }

std::shared_ptr<ProcessGroup> ProcessGroup::new_group(const std::vector<int>& ranks, const std::string& name) {
  const std::string ctx = op_context("new_group");
  CPF_CHECK(!ranks.empty(), ctx, ": the rank list is empty");
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  for (int r : ranks) check_peer(r, size(), "rank", ctx);
  const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  CPF_CHECK(dup == sorted.end(), ctx, ": rank ", dup == sorted.end() ? 0 : *dup, " appears twice in ", ranks);
  return do_new_group(ranks, name);
}

std::shared_ptr<ProcessGroup> ProcessGroup::split(const std::vector<std::vector<int>>& partition,
                                                  const std::string& name) {
  const std::string ctx = op_context("split");
  std::vector<int> part_of(static_cast<size_t>(size()), -1);
  for (size_t p = 0; p < partition.size(); ++p) {
    CPF_CHECK(!partition[p].empty(), ctx, ": part ", p, " is empty");
    for (int r : partition[p]) {
      check_peer(r, size(), "rank", ctx);
      CPF_CHECK(part_of[static_cast<size_t>(r)] < 0, ctx, ": rank ", r, " is in parts ",
                part_of[static_cast<size_t>(r)], " and ", p, "; the parts must be disjoint");
      part_of[static_cast<size_t>(r)] = static_cast<int>(p);
    }
  }
  for (int r = 0; r < size(); ++r) {
    CPF_CHECK(part_of[static_cast<size_t>(r)] >= 0, ctx, ": rank ", r, " is in no part; every rank needs one");
  }
  return do_split(partition, name);
}

std::shared_ptr<ProcessGroup> ProcessGroup::do_split(const std::vector<std::vector<int>>& partition,
                                                     const std::string& name) {
  std::shared_ptr<ProcessGroup> mine;
  for (const std::vector<int>& part : partition) {
    std::shared_ptr<ProcessGroup> group = do_new_group(part, name);
    if (group) mine = group;
  }
  return mine;
}

}  // namespace cpf::dist
