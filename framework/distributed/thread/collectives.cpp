#include "framework/distributed/thread/collectives.h"

#include <algorithm>
#include <numeric>

#include "framework/distributed/thread/kernels.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/views.h"

namespace cpf::dist::thread {
namespace {

using Offsets = std::vector<int64_t>;  // n + 1 prefix sums along the dim

std::string agree_on_dtype_and_shape(const Round& round) {
  std::string e = first_disagreement(round, "dtype", [](const OpDesc& d) { return d.dtype; });
  if (e.empty()) e = first_disagreement(round, "shape", [](const OpDesc& d) { return d.shape; });
  return e;
}

std::string agree_on_param(const Round& round, size_t index, const char* field) {
  return first_disagreement(round, field, [index](const OpDesc& d) { return d.params.at(index); });
}

// Shapes equal except along `dim` (where the ranks' sizes may differ).
std::string agree_outside_dim(const Round& round, int64_t dim) {
  const Shape& first = round.slots[0].desc.shape;
  for (size_t r = 1; r < round.slots.size(); ++r) {
    Shape a = first, b = round.slots[r].desc.shape;
    if (a.size() == b.size()) a[static_cast<size_t>(dim)] = b[static_cast<size_t>(dim)];
    if (a != b) {
      return str_cat("ranks disagree on the shape outside dim ", dim, ": rank 0 has ", first, ", rank ", r, " has ",
                     round.slots[r].desc.shape);
    }
  }
  return "";
}

Offsets prefix_sums(const std::vector<int64_t>& sizes) {
  Offsets offsets(sizes.size() + 1, 0);
  std::partial_sum(sizes.begin(), sizes.end(), offsets.begin() + 1);
  return offsets;
}

// Where a rank's collective result is computed: `out` when given and directly usable, else a new
// host tensor (contiguous when the kernel needs it).
Tensor result_buffer(const Tensor& out, const Shape& shape, DType dtype, bool need_contiguous) {
  if (out.defined() && out.device().is_cpu() && (!need_contiguous || out.is_contiguous())) return out;
  return empty(shape, {.dtype = dtype});
}

// After every rank finished: move the result into `out` (or to the input's device) and bump the
// version of what this rank's caller gets back, once.
std::vector<Tensor> finalize(const Tensor& buffer, const Tensor& out, Device device) {
  if (out.defined()) {
    if (!out.is_same(buffer)) {
      if (out.device().is_cpu()) {
        copy_view(out, buffer);
      } else {
        raw::copy_(out, buffer);
        device_written(out);
      }
    }
    out.bump_version();
    return {out};
  }
  buffer.bump_version();
  if (device.is_cpu()) return {buffer};
  Tensor on_device = raw::to(buffer, device);
  device_written(on_device);
  return {on_device};
}

OpDesc make_desc(const char* kind, const Tensor& input, std::vector<int64_t> params) {
  OpDesc desc;
  desc.kind = kind;
  desc.dtype = input.dtype();
  desc.shape = input.shape();
  desc.params = std::move(params);
  return desc;
}

int64_t inner_size(const Shape& shape, int64_t dim) {
  int64_t inner = 1;
  for (size_t d = static_cast<size_t>(dim) + 1; d < shape.size(); ++d) inner *= shape[d];
  return inner;
}

}  // namespace

std::vector<Tensor> run_all_reduce(const OpContext& ctx, const Tensor& input, ReduceOp op, const Tensor& out) {
  Slot slot;
  slot.desc = make_desc("all_reduce", input, {int64_t(op)});
  slot.input = host_contiguous(input);
  slot.output = result_buffer(out, input.shape(), input.dtype(), /*need_contiguous=*/true);
  const Tensor buffer = slot.output;
  auto round = ctx.group.rendezvous.arrive(
      ctx.seq, ctx.rank, std::move(slot),
      [](Round& r) {
        std::string e = agree_on_dtype_and_shape(r);
        if (e.empty()) {
          e = first_disagreement(r, "reduce op",
                                 [](const OpDesc& d) { return std::string(reduce_op_name(ReduceOp(d.params[0]))); });
        }
        return e;
      },
      ctx.what);
  const int n = ctx.group.sync->size();
  const int64_t numel = input.numel();
  const int64_t begin = numel * ctx.rank / n;
  const int64_t end = numel * (ctx.rank + 1) / n;
  const int64_t bytes = static_cast<int64_t>(dtype_size(input.dtype()));
  std::vector<const void*> ins;
  std::vector<void*> outs;
  for (const Slot& s : round->slots) {
    ins.push_back(static_cast<const char*>(s.input.raw_data()) + begin * bytes);
    outs.push_back(static_cast<char*>(s.output.raw_data()) + begin * bytes);
  }
  reduce_into(op, input.dtype(), ins, outs, end - begin);
  ctx.group.rendezvous.finish(ctx.seq, round, ctx.rank, ctx.what);
  return finalize(buffer, out, input.device());
}

std::vector<Tensor> run_broadcast(const OpContext& ctx, const Tensor& input, int root, const Tensor& out) {
  Slot slot;
  slot.desc = make_desc("broadcast", input, {root});
  // Only root's data is read; the other ranks' inputs only describe the shape.
  if (ctx.rank == root) slot.input = host_view(input);
  auto round = ctx.group.rendezvous.arrive(
      ctx.seq, ctx.rank, std::move(slot),
      [](Round& r) {
        std::string e = agree_on_param(r, 0, "root");
        if (e.empty()) e = agree_on_dtype_and_shape(r);
        return e;
      },
      ctx.what);
  const Tensor& source = round->slots[static_cast<size_t>(root)].input;
  const Tensor buffer = result_buffer(out, input.shape(), input.dtype(), /*need_contiguous=*/false);
  if (!same_view(buffer, source)) copy_view(buffer, source);
  ctx.group.rendezvous.finish(ctx.seq, round, ctx.rank, ctx.what);
  return finalize(buffer, out, input.device());
}

std::vector<Tensor> run_all_gather(const OpContext& ctx, const Tensor& input, int64_t dim, const Tensor& out) {
  Slot slot;
  slot.desc = make_desc("all_gather", input, {dim});
  if (out.defined()) slot.desc.out_shape = out.shape();
  slot.input = host_view(input);
  auto round = ctx.group.rendezvous.arrive(
      ctx.seq, ctx.rank, std::move(slot),
      [dim](Round& r) {
        std::string e = agree_on_param(r, 0, "dim");
        if (e.empty()) e = first_disagreement(r, "dtype", [](const OpDesc& d) { return d.dtype; });
        if (e.empty()) e = agree_outside_dim(r, dim);
        if (!e.empty()) return e;
        std::vector<int64_t> sizes;
        for (const Slot& s : r.slots) sizes.push_back(s.desc.shape[static_cast<size_t>(dim)]);
        auto offsets = std::make_shared<Offsets>(prefix_sums(sizes));
        Shape total = r.slots[0].desc.shape;
        total[static_cast<size_t>(dim)] = offsets->back();
        for (size_t k = 0; k < r.slots.size(); ++k) {
          const Shape& given = r.slots[k].desc.out_shape;
          if (!given.empty() && given != total) {
            return str_cat("rank ", k, "'s out has shape ", given, " but the gathered result has shape ", total,
                           " (sizes along dim ", dim, ": ", sizes, ")");
          }
        }
        r.payload = offsets;
        return std::string();
      },
      ctx.what);
  const auto& offsets = *std::static_pointer_cast<Offsets>(round->payload);
  Shape total = input.shape();
  total[static_cast<size_t>(dim)] = offsets.back();
  const Tensor buffer = result_buffer(out, total, input.dtype(), /*need_contiguous=*/false);
  for (size_t s = 0; s < round->slots.size(); ++s) {
    copy_view(raw::narrow(buffer, dim, offsets[s], offsets[s + 1] - offsets[s]), round->slots[s].input);
  }
  ctx.group.rendezvous.finish(ctx.seq, round, ctx.rank, ctx.what);
  return finalize(buffer, out, input.device());
}

std::vector<Tensor> run_reduce_scatter(const OpContext& ctx, const Tensor& input, int64_t dim, ReduceOp op,
                                       const Tensor& out, int64_t out_size, const std::vector<int64_t>& splits) {
  Slot slot;
  slot.desc = make_desc("reduce_scatter", input, {dim, int64_t(op)});
  slot.desc.splits = splits;
  slot.desc.piece = out_size;
  slot.input = host_contiguous(input);
  auto round = ctx.group.rendezvous.arrive(
      ctx.seq, ctx.rank, std::move(slot),
      [dim](Round& r) {
        std::string e = agree_on_param(r, 0, "dim");
        if (e.empty()) e = agree_on_dtype_and_shape(r);
        if (e.empty()) {
          e = first_disagreement(r, "reduce op",
                                 [](const OpDesc& d) { return std::string(reduce_op_name(ReduceOp(d.params[1]))); });
        }
        if (e.empty()) e = first_disagreement(r, "splits", [](const OpDesc& d) { return d.splits; });
        if (!e.empty()) return e;
        std::vector<int64_t> pieces;
        for (const Slot& s : r.slots) pieces.push_back(s.desc.piece);
        auto offsets = std::make_shared<Offsets>(prefix_sums(pieces));
        const int64_t total = r.slots[0].desc.shape[static_cast<size_t>(dim)];
        if (offsets->back() != total) {
          return str_cat("the ranks' pieces along dim ", dim, " are ", pieces, " and add up to ", offsets->back(),
                         ", but the input ", r.slots[0].desc.shape, " has ", total);
        }
        r.payload = offsets;
        return std::string();
      },
      ctx.what);
  const auto& offsets = *std::static_pointer_cast<Offsets>(round->payload);
  Shape piece_shape = input.shape();
  piece_shape[static_cast<size_t>(dim)] = out_size;
  const Tensor buffer = result_buffer(out, piece_shape, input.dtype(), /*need_contiguous=*/true);
  // Row-major: the input is `outer` blocks of (size along dim) x inner; this rank's piece is a
  // contiguous run of out_size * inner elements inside each block.
  const Shape& shape = input.shape();
  const int64_t inner = inner_size(shape, dim);
  const int64_t outer = input.numel() / std::max<int64_t>(shape[static_cast<size_t>(dim)] * inner, 1);
  const int64_t run = out_size * inner;
  const int64_t bytes = static_cast<int64_t>(dtype_size(input.dtype()));
  std::vector<const void*> ins(round->slots.size());
  std::vector<void*> outs(1);
  for (int64_t o = 0; o < (run > 0 ? outer : 0); ++o) {
    const int64_t from = (o * shape[static_cast<size_t>(dim)] + offsets[static_cast<size_t>(ctx.rank)]) * inner;
    for (size_t s = 0; s < round->slots.size(); ++s) {
      ins[s] = static_cast<const char*>(round->slots[s].input.raw_data()) + from * bytes;
    }
    outs[0] = static_cast<char*>(buffer.raw_data()) + o * run * bytes;
    reduce_into(op, input.dtype(), ins, outs, run);
  }
  ctx.group.rendezvous.finish(ctx.seq, round, ctx.rank, ctx.what);
  return finalize(buffer, out, input.device());
}

std::vector<Tensor> run_all_to_all(const OpContext& ctx, const Tensor& input, int64_t split_dim, int64_t concat_dim,
                                   const Tensor& out) {
  Slot slot;
  slot.desc = make_desc("all_to_all", input, {split_dim, concat_dim});
  slot.input = host_view(input);
  auto round = ctx.group.rendezvous.arrive(
      ctx.seq, ctx.rank, std::move(slot),
      [](Round& r) {
        std::string e = agree_on_param(r, 0, "split dim");
        if (e.empty()) e = agree_on_param(r, 1, "concat dim");
        if (e.empty()) e = agree_on_dtype_and_shape(r);
        return e;
      },
      ctx.what);
  const int64_t n = ctx.group.sync->size();
  const int64_t chunk = input.size(split_dim) / n;
  Shape out_shape = input.shape();
  out_shape[static_cast<size_t>(split_dim)] = chunk;
  const int64_t piece = out_shape[static_cast<size_t>(concat_dim)];  // each source's extent along concat_dim
  out_shape[static_cast<size_t>(concat_dim)] *= n;
  const Tensor buffer = result_buffer(out, out_shape, input.dtype(), /*need_contiguous=*/false);
  for (int64_t s = 0; s < n; ++s) {
    const Tensor& source = round->slots[static_cast<size_t>(s)].input;
    copy_view(raw::narrow(buffer, concat_dim, s * piece, piece),
              raw::narrow(source, split_dim, ctx.rank * chunk, chunk));
  }
  ctx.group.rendezvous.finish(ctx.seq, round, ctx.rank, ctx.what);
  return finalize(buffer, out, input.device());
}

std::vector<Tensor> run_barrier(const OpContext& ctx) {
  Slot slot;
  slot.desc.kind = "barrier";
  auto round = ctx.group.rendezvous.arrive(
      ctx.seq, ctx.rank, std::move(slot), [](Round&) { return std::string(); }, ctx.what);
  ctx.group.rendezvous.finish(ctx.seq, round, ctx.rank, ctx.what);
  return {};
}

std::shared_ptr<GroupState> run_new_group(const OpContext& ctx, const std::vector<int>& ranks,
                                          const std::string& name) {
  Slot slot;
  slot.desc.kind = "new_group";
  slot.desc.ranks = ranks;
  slot.desc.name = name;
  GroupState& parent = ctx.group;
  auto round = parent.rendezvous.arrive(
      ctx.seq, ctx.rank, std::move(slot),
      [&parent](Round& r) {
        std::string e = first_disagreement(r, "member ranks", [](const OpDesc& d) { return d.ranks; });
        if (e.empty()) e = first_disagreement(r, "name", [](const OpDesc& d) { return d.name; });
        if (!e.empty()) return e;
        const OpDesc& d = r.slots[0].desc;
        std::vector<int> global;
        for (int member : d.ranks) global.push_back(parent.sync->global_ranks()[static_cast<size_t>(member)]);
        const std::string group_name = d.name.empty() ? str_cat(parent.sync->name(), d.ranks) : d.name;
        r.payload = GroupState::create(group_name, std::move(global), parent.sync->timeout(), parent.sync->abort_ptr());
        return std::string();
      },
      ctx.what);
  auto state = std::static_pointer_cast<GroupState>(round->payload);
  parent.rendezvous.finish(ctx.seq, round, ctx.rank, ctx.what);
  return std::find(ranks.begin(), ranks.end(), ctx.rank) == ranks.end() ? nullptr : state;
}

std::shared_ptr<GroupState> run_split(const OpContext& ctx, const std::vector<std::vector<int>>& partition,
                                      const std::string& name) {
  Slot slot;
  slot.desc.kind = "split";
  for (const std::vector<int>& part : partition) {  // compared between ranks: the parts, -1 between them
    slot.desc.ranks.insert(slot.desc.ranks.end(), part.begin(), part.end());
    slot.desc.ranks.push_back(-1);
  }
  slot.desc.name = name;
  GroupState& parent = ctx.group;
  auto round = parent.rendezvous.arrive(
      ctx.seq, ctx.rank, std::move(slot),
      [&parent, &partition](Round& r) {
        std::string e = first_disagreement(r, "partition", [](const OpDesc& d) { return d.ranks; });
        if (e.empty()) e = first_disagreement(r, "name", [](const OpDesc& d) { return d.name; });
        if (!e.empty()) return e;
        auto states = std::make_shared<std::vector<std::shared_ptr<GroupState>>>();
        for (const std::vector<int>& part : partition) {
          std::vector<int> global;
          for (int member : part) global.push_back(parent.sync->global_ranks()[static_cast<size_t>(member)]);
          const std::string group_name =
              r.slots[0].desc.name.empty() ? str_cat(parent.sync->name(), part) : r.slots[0].desc.name;
          states->push_back(
              GroupState::create(group_name, std::move(global), parent.sync->timeout(), parent.sync->abort_ptr()));
        }
        r.payload = states;
        return std::string();
      },
      ctx.what);
  const auto states = std::static_pointer_cast<std::vector<std::shared_ptr<GroupState>>>(round->payload);
  parent.rendezvous.finish(ctx.seq, round, ctx.rank, ctx.what);
  for (size_t p = 0; p < partition.size(); ++p) {
    if (std::find(partition[p].begin(), partition[p].end(), ctx.rank) != partition[p].end()) return (*states)[p];
  }
  return nullptr;
}

std::vector<Tensor> run_batch_p2p(GroupState& group, int rank, const std::vector<P2POp>& ops) {
  const std::string& name = group.sync->name();
  std::vector<std::shared_ptr<Message>> sent;
  std::vector<std::string> sent_what;
  for (const P2POp& op : ops) {
    if (op.kind != P2POp::Kind::send) continue;
    sent.push_back(group.mailbox.post(rank, op.peer, op.tag, host_view(op.tensor)));
    sent_what.push_back(str_cat("send to rank ", op.peer, " (tag ", op.tag, ") on group '", name, "'"));
  }
  std::vector<Tensor> received;
  try {
    for (const P2POp& op : ops) {
      if (op.kind != P2POp::Kind::recv) continue;
      const std::string what = str_cat("recv from rank ", op.peer, " (tag ", op.tag, ") on group '", name, "'");
      const Tensor buffer =
          op.tensor.device().is_cpu() ? op.tensor : empty(op.tensor.shape(), {.dtype = op.tensor.dtype()});
      group.mailbox.receive(rank, op.peer, op.tag, buffer, what);
      if (buffer.is_same(op.tensor)) {
        op.tensor.bump_version();
      } else {
        raw::copy_(op.tensor, buffer);
        device_written(op.tensor);
      }
      received.push_back(op.tensor);
    }
  } catch (...) {
    // Leave no message pointing at a tensor the caller is about to get back.
    for (size_t i = 0; i < sent.size(); ++i) {
      try {
        group.mailbox.complete_send(sent[i], sent_what[i]);
      } catch (...) {
      }
    }
    throw;
  }
  for (size_t i = 0; i < sent.size(); ++i) group.mailbox.complete_send(sent[i], sent_what[i]);
  return received;
}

}  // namespace cpf::dist::thread
