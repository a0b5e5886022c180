#include "attention/dot_product_attention.h"

#include "framework/autograd/node.h"

namespace cpf {

AttentionOutput dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionSpec& spec,
                                      const std::optional<SequenceInfo>& seq, const FlashConfig& config) {
  raw::AttentionForward forward = raw::attention_forward(q, k, v, spec, seq, config);
  if (!autograd::any_requires_grad({q, k, v})) return {forward.out, forward.lse};
  using autograd::SavedTensor;
  auto backward = [sq = SavedTensor(q), sk = SavedTensor(k), sv = SavedTensor(v), so = SavedTensor(forward.out),
                   sl = SavedTensor(forward.lse), spec, seq, config](const autograd::GradList& g) {
    const Tensor& out = so.unpack();
    // Only lse may have received a gradient (e.g. a loss on lse alone): dout is then zero.
    const Tensor dout = g[0].defined() ? g[0] : zeros_like(out);
    raw::AttentionGrads grads =
        raw::attention_backward(dout, g[1], sq.unpack(), sk.unpack(), sv.unpack(), out, sl.unpack(), spec, seq, config);
    return autograd::GradList{grads.dq, grads.dk, grads.dv};
  };
  std::vector<Tensor> outputs =
      autograd::record("dot_product_attention", {forward.out, forward.lse}, {q, k, v}, std::move(backward));
  return {outputs[0], outputs[1]};
}

}  // namespace cpf
