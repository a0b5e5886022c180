#include "framework/autograd/functions/linalg.h"

#include "framework/autograd/node.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/linear.h"
#include "framework/tensor/ops/matmul.h"
#include "framework/tensor/ops/reduce.h"
#include "framework/tensor/ops/views.h"

namespace cpf {

Tensor matmul(const Tensor& a, const Tensor& b) {
  return autograd::record("matmul", raw::matmul(a, b), {a, b},
                          [sa = autograd::SavedTensor(a), sb = autograd::SavedTensor(b)](const autograd::GradList& g) {
                            // Promote 1-D operands to matrices so one formula covers every case:
                            // dA = dC @ B^T, dB = A^T @ dC, then sum over broadcast batch dims.
                            const Tensor& av = sa.unpack();
                            const Tensor& bv = sb.unpack();
                            Tensor a2 = av.dim() == 1 ? raw::unsqueeze(av, 0) : av;
                            Tensor b2 = bv.dim() == 1 ? raw::unsqueeze(bv, 1) : bv;
                            Tensor gc = g[0];
                            if (av.dim() == 1 && bv.dim() == 1) {
                              gc = raw::reshape(gc, {1, 1});
                            } else if (av.dim() == 1) {
                              gc = raw::unsqueeze(gc, -2);
                            } else if (bv.dim() == 1) {
                              gc = raw::unsqueeze(gc, -1);
                            }
                            Tensor ga = raw::matmul(gc, raw::transpose(b2, -1, -2));
                            Tensor gb = raw::matmul(raw::transpose(a2, -1, -2), gc);
                            Shape a2_shape = a2.shape(), b2_shape = b2.shape();
                            ga = raw::reshape(raw::sum_to(ga, a2_shape), av.shape());
                            gb = raw::reshape(raw::sum_to(gb, b2_shape), bv.shape());
                            return autograd::GradList{ga, gb};
                          });
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  Tensor y = raw::linear(x, weight, bias);  // validates
  std::vector<Tensor> inputs{x, weight};
  if (bias.defined()) inputs.push_back(bias);
  return autograd::record(
      "linear", y, inputs,
      [sx = autograd::SavedTensor(x), sw = autograd::SavedTensor(weight), has_bias = bias.defined()](
          const autograd::GradList& g) {
        const Tensor& xv = sx.unpack();
        const Tensor& wv = sw.unpack();
        const int64_t in = wv.size(1), out = wv.size(0);
        int64_t rows = 1;
        for (int64_t d = 0; d + 1 < xv.dim(); ++d) rows *= xv.size(d);
        const Tensor x2 = raw::reshape(raw::contiguous(xv), {rows, in});     // (M, K)
        const Tensor g2 = raw::reshape(raw::contiguous(g[0]), {rows, out});  // (M, N)
        autograd::GradList grads{raw::reshape(raw::matmul(g2, wv), xv.shape()),  // (M, K)
                                 raw::matmul(raw::transpose(g2, 0, 1), x2)};     // (N, K)
        if (has_bias) grads.push_back(raw::sum(g2, {0}));                          // (N)
        return grads;
      });
}

}  // namespace cpf
