#pragma once
// Differentiable collectives: model code can stay in autograd across ranks.
//
//   forward                       backward (run by every rank, on its own thread, concurrently)
//   all_gather(x, dim)            reduce_scatter(g, dim, sum), each rank keeping its own piece size
//   reduce_scatter(x, dim, sum)   all_gather(g, dim)                      (avg: / n)
//   all_to_all(x, s, c)           all_to_all(g, c, s), the inverse permutation
//   all_reduce(x, sum)            all_reduce(g, sum)                      (avg: all_reduce(g, avg))
//   send_recv(x, dst, src)        send g to src, receive x's gradient from dst (a ring step)
//   send(x, dst) -> token         receive x's gradient from dst when the token is back-propagated
//   recv(shape, src)              send g to src
//
// The backward of a collective is itself a collective, so every rank must back-propagate through
// every differentiable collective it called (ranks whose output got no gradient contribute zeros).
// In practice: run the same model on every rank and call backward on every rank. The backward
// order of the collectives is then the same on every rank, as the engine orders nodes by creation.
#include <vector>

#include "framework/distributed/process_group.h"
#include "framework/tensor/tensor.h"

namespace cpf::dist {

Tensor all_gather(const Tensor& x, int64_t dim, ProcessGroup& group);
// op: sum or avg (max/min have no useful gradient; use ProcessGroup::reduce_scatter for them).
Tensor reduce_scatter(const Tensor& x, int64_t dim, ProcessGroup& group, ReduceOp op = ReduceOp::sum,
                      const std::vector<int64_t>& splits = {});
Tensor all_to_all(const Tensor& x, int64_t split_dim, int64_t concat_dim, ProcessGroup& group);
// op: sum or avg.
Tensor all_reduce(const Tensor& x, ProcessGroup& group, ReduceOp op = ReduceOp::sum);

// Sends x to `dst` and returns the tensor of x's shape and dtype received from `src` at once, so
// a ring shift (dst = r+1, src = r-1 on every rank) cannot deadlock.
Tensor send_recv(const Tensor& x, int dst, int src, ProcessGroup& group, int tag = 0);

// The split form, for pipelines: the sender gets a 0-d zero `token`; adding it to the loss (or
// passing it to backward) makes backward wait for x's gradient from `dst`. The receiver's output
// (of options.dtype, on options.device) requires grad when options.requires_grad is set and grad
// mode is on; its gradient is then sent back to `src`.
Tensor send(const Tensor& x, int dst, ProcessGroup& group, int tag = 0);
Tensor recv(const Shape& shape, int src, ProcessGroup& group, TensorOptions options = {.requires_grad = true},
            int tag = 0);

// Data parallel: reduces the gradients of `params` across the group in place (avg by default), one
// all_reduce per dtype over a flat bucket. Parameters without a gradient are skipped; every rank
// must have gradients for the same parameters (otherwise the buckets differ and the all_reduce
// reports the mismatch).
void all_reduce_gradients(const std::vector<Tensor>& params, ProcessGroup& group, ReduceOp op = ReduceOp::avg);

}  // namespace cpf::dist
