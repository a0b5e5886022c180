#include "framework/autograd/functions/linalg.h"

#include "framework/autograd/node.h"
#include "framework/tensor/ops/copy.h"
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
                            Tensor gb;
                            if (b2.dim() == 2 && a2.dim() > 2) {
                              // A shared matrix under batched rows: fold the batch into the rows, one
                              // (K, M') x (M', N) GEMM, instead of a (batch, K, N) gradient per row block
                              // summed afterwards (a (T, K, N) tensor for a (1, T, 1, K) input).
                              const int64_t k = a2.size(-1), n = gc.size(-1);
                              const Tensor a_rows = raw::reshape(raw::contiguous(a2), {a2.numel() / k, k});  // (M', K)
                              const Tensor g_rows = raw::reshape(raw::contiguous(gc), {gc.numel() / n, n});  // (M', N)
                              gb = raw::matmul(raw::transpose(a_rows, 0, 1), g_rows);                        // (K, N)
                            } else {
                              gb = raw::matmul(raw::transpose(a2, -1, -2), gc);
                            }
                            Shape a2_shape = a2.shape(), b2_shape = b2.shape();
                            ga = raw::reshape(raw::sum_to(ga, a2_shape), av.shape());
                            gb = raw::reshape(raw::sum_to(gb, b2_shape), bv.shape());
                            return autograd::GradList{ga, gb};
                          });
}

}  // namespace cpf
