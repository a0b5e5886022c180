#include "framework/autograd/functions/nn.h"

#include "framework/autograd/node.h"
#include "framework/tensor/ops/cross_entropy.h"
#include "framework/tensor/ops/embedding.h"
#include "framework/tensor/ops/norm.h"
#include "framework/tensor/ops/rope.h"
#include "framework/tensor/ops/softmax.h"

namespace cpf {

using autograd::GradList;
using autograd::SavedTensor;

Tensor softmax(const Tensor& x, int64_t dim) {
  Tensor y = raw::softmax(x, dim);
  // The backward needs only the output: saving y instead of x avoids recomputing the exponentials.
  return autograd::record("softmax", y, {x}, [sy = SavedTensor(y), dim](const GradList& g) {
    return GradList{raw::softmax_backward(g[0], sy.unpack(), dim)};
  });
}

Tensor log_softmax(const Tensor& x, int64_t dim) {
  Tensor y = raw::log_softmax(x, dim);
  return autograd::record("log_softmax", y, {x}, [sy = SavedTensor(y), dim](const GradList& g) {
    return GradList{raw::log_softmax_backward(g[0], sy.unpack(), dim)};
  });
}

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  raw::LayerNormResult r = raw::layer_norm(x, weight, bias, eps);
  return autograd::record("layer_norm", r.y, {x, weight, bias},
                          [sx = SavedTensor(x), sw = SavedTensor(weight), sm = SavedTensor(r.mean),
                           sr = SavedTensor(r.rstd), has_bias = bias.defined()](const GradList& g) {
                            raw::NormGrads d =
                                raw::layer_norm_backward(g[0], sx.unpack(), sw.unpack(), sm.unpack(), sr.unpack());
                            return GradList{d.dx, d.dweight, has_bias ? d.dbias : Tensor()};
                          });
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  raw::RmsNormResult r = raw::rms_norm(x, weight, eps);
  return autograd::record("rms_norm", r.y, {x, weight},
                          [sx = SavedTensor(x), sw = SavedTensor(weight), sr = SavedTensor(r.rstd)](const GradList& g) {
                            raw::NormGrads d = raw::rms_norm_backward(g[0], sx.unpack(), sw.unpack(), sr.unpack());
                            return GradList{d.dx, d.dweight};
                          });
}

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  Tensor out = raw::embedding(weight, ids);
  return autograd::record("embedding", out, {weight},
                          [sids = SavedTensor(ids), rows = weight.size(0)](const GradList& g) {
                            return GradList{raw::embedding_backward(g[0], sids.unpack(), rows)};
                          });
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  raw::CrossEntropyResult r = raw::cross_entropy(logits, targets, ignore_index);
  return autograd::record("cross_entropy", r.loss, {logits},
                          [sl = SavedTensor(logits), st = SavedTensor(targets), slse = SavedTensor(r.lse),
                           count = r.count, ignore_index](const GradList& g) {
                            // The count tensor: on a device the backward then never waits for the GPU.
                            return GradList{raw::cross_entropy_backward(g[0], sl.unpack(), st.unpack(), slse.unpack(),
                                                                        count, ignore_index)};
                          });
}

Tensor rope(const Tensor& x, const Tensor& positions, double base, int64_t rotary_dim, bool inverse) {
  return rope(x, positions, RopeFrequencies{.base = base}, rotary_dim, inverse);
}

Tensor rope(const Tensor& x, const Tensor& positions, const RopeFrequencies& frequencies, int64_t rotary_dim,
            bool inverse) {
  Tensor y = raw::rope(x, positions, frequencies, rotary_dim, inverse);
  return autograd::record("rope", y, {x},
                          [sp = SavedTensor(positions), frequencies, rotary_dim, inverse](const GradList& g) {
                            return GradList{raw::rope_backward(g[0], sp.unpack(), frequencies, rotary_dim, inverse)};
                          });
}

}  // namespace cpf
