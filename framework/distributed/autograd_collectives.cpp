#include "framework/distributed/autograd_collectives.h"

#include <map>

#include "framework/autograd/grad_mode.h"
#include "framework/autograd/node.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/views.h"

namespace cpf::dist {
namespace {

using autograd::GradList;

// The gradient of an output, or zeros when none reached it on this rank: the backward collective
// must still run, because the other ranks' backward waits for this rank.
Tensor grad_or_zeros(const Tensor& g, const Shape& shape, DType dtype, Device device) {
  return g.defined() ? g : zeros(shape, {.dtype = dtype, .device = device});
}

void check_differentiable_op(ReduceOp op, const char* name) {
  CPF_CHECK(op == ReduceOp::sum || op == ReduceOp::avg, "dist::", name, ": only sum and avg are differentiable, got ",
            reduce_op_name(op), "; use ProcessGroup::", name, " outside autograd");
}

}  // namespace

Tensor all_gather(const Tensor& x, int64_t dim, ProcessGroup& group) {
  Tensor y = group.all_gather(x, dim);
  return autograd::record("dist::all_gather", y, {x},
                          [pg = group.shared_from_this(), dim, shape = x.shape(), out_shape = y.shape(),
                           dtype = x.dtype(), device = x.device()](const GradList& g) {
                            const Tensor grad = grad_or_zeros(g[0], out_shape, dtype, device);
                            // Each rank's out says how big its piece is (the ranks' sizes along dim may differ).
                            const Tensor gx = empty(shape, {.dtype = dtype, .device = device});
                            pg->reduce_scatter_async(grad, dim, ReduceOp::sum, gx)->wait();
                            return GradList{gx};
                          });
}

Tensor reduce_scatter(const Tensor& x, int64_t dim, ProcessGroup& group, ReduceOp op,
                      const std::vector<int64_t>& splits) {
  check_differentiable_op(op, "reduce_scatter");
  Tensor y = group.reduce_scatter(x, dim, op, splits);
  return autograd::record("dist::reduce_scatter", y, {x},
                          [pg = group.shared_from_this(), dim, op, out_shape = y.shape(), dtype = x.dtype(),
                           device = x.device()](const GradList& g) {
                            Tensor gx = pg->all_gather(grad_or_zeros(g[0], out_shape, dtype, device), dim);
                            if (op == ReduceOp::avg) gx = raw::mul(gx, 1.0 / pg->size());
                            return GradList{gx};
                          });
}

Tensor all_to_all(const Tensor& x, int64_t split_dim, int64_t concat_dim, ProcessGroup& group) {
  Tensor y = group.all_to_all(x, split_dim, concat_dim);
  return autograd::record("dist::all_to_all", y, {x},
                          [pg = group.shared_from_this(), split_dim, concat_dim, out_shape = y.shape(),
                           dtype = x.dtype(), device = x.device()](const GradList& g) {
                            const Tensor grad = grad_or_zeros(g[0], out_shape, dtype, device);
                            return GradList{pg->all_to_all(grad, concat_dim, split_dim)};
                          });
}

Tensor all_reduce(const Tensor& x, ProcessGroup& group, ReduceOp op) {
  check_differentiable_op(op, "all_reduce");
  Tensor y = group.all_reduce(x, op);
  return autograd::record(
      "dist::all_reduce", y, {x},
      [pg = group.shared_from_this(), op, shape = x.shape(), dtype = x.dtype(), device = x.device()](
          const GradList& g) { return GradList{pg->all_reduce(grad_or_zeros(g[0], shape, dtype, device), op)}; });
}

Tensor send_recv(const Tensor& x, int dst, int src, ProcessGroup& group, int tag) {
  Tensor y = empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});
  group.batch_p2p({P2POp::send(x, dst, tag), P2POp::recv(y, src, tag)});
  return autograd::record(
      "dist::send_recv", y, {x},
      [pg = group.shared_from_this(), dst, src, tag, shape = x.shape(), dtype = x.dtype(),
       device = x.device()](const GradList& g) {
        // The gradient travels the other way: y came from src, x went to dst.
        Tensor gx = empty(shape, {.dtype = dtype, .device = device});
        pg->batch_p2p({P2POp::send(grad_or_zeros(g[0], shape, dtype, device), src, tag), P2POp::recv(gx, dst, tag)});
        return GradList{gx};
      });
}

Tensor send(const Tensor& x, int dst, ProcessGroup& group, int tag) {
  group.send(x, dst, tag);
  const DType token_dtype = is_floating(x.dtype()) ? x.dtype() : DType::f32;
  Tensor token = zeros({}, {.dtype = token_dtype, .device = x.device()});
  return autograd::record("dist::send", token, {x},
                          [pg = group.shared_from_this(), dst, tag, shape = x.shape(), dtype = x.dtype(),
                           device = x.device()](const GradList&) {
                            Tensor gx = empty(shape, {.dtype = dtype, .device = device});
                            pg->recv(gx, dst, tag);
                            return GradList{gx};
                          });
}

Tensor recv(const Shape& shape, int src, ProcessGroup& group, TensorOptions options, int tag) {
  const DType dtype = options.dtype;
  const Device device = options.device;
  Tensor y = empty(shape, {.dtype = dtype, .device = device});
  group.recv(y, src, tag);
  if (!options.requires_grad || !grad_enabled() || !is_floating(dtype)) return y;
  // A node with no inputs: the gradient stops here and is sent back to the rank it came from.
  return autograd::record_source("dist::recv", y,
                                 [pg = group.shared_from_this(), src, tag, shape, dtype, device](const GradList& g) {
                                   pg->send(grad_or_zeros(g[0], shape, dtype, device), src, tag);
                                   return GradList{};
                                 });
}

void all_reduce_gradients(const std::vector<Tensor>& params, ProcessGroup& group, ReduceOp op) {
  // One flat bucket per dtype, in parameter order: few large messages instead of many small ones.
  std::map<DType, std::vector<Tensor>> grads;
  for (const Tensor& p : params) {
    if (p.defined() && p.grad().defined()) grads[p.grad().dtype()].push_back(p.grad());
  }
  for (auto& [dtype, list] : grads) {
    int64_t total = 0;
    for (const Tensor& g : list) total += g.numel();
    Tensor bucket = empty({total}, {.dtype = dtype, .device = list.front().device()});
    int64_t offset = 0;
    for (const Tensor& g : list) {
      raw::copy_(raw::view(raw::narrow(bucket, 0, offset, g.numel()), g.shape()), g);
      offset += g.numel();
    }
    group.all_reduce_(bucket, op);
    offset = 0;
    for (const Tensor& g : list) {
      raw::copy_(g, raw::view(raw::narrow(bucket, 0, offset, g.numel()), g.shape()));
      offset += g.numel();
    }
  }
}

}  // namespace cpf::dist
