#include "attention/dot_product_attention.h"

#include "framework/autograd/forward_stash.h"
#include "framework/autograd/node.h"
#include "framework/tensor/profile.h"

namespace cpf {

AttentionOutput dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionSpec& spec,
                                      const std::optional<SequenceInfo>& seq, const AttentionKernelConfig& config) {
  const profile::Scope scope("forward/attention", q.defined() ? q.device() : Device::cpu());
  // A selectively recomputed region keeps the first forward's out and lse (forward_stash.h).
  const std::vector<Tensor> kept = autograd::stashed("dot_product_attention", [&] {
    raw::AttentionForward f = raw::attention_forward(q, k, v, spec, seq, config);
    return std::vector<Tensor>{f.out, f.lse};
  });
  const raw::AttentionForward forward{kept[0], kept[1]};
  const bool has_sink = spec.sink.defined();
  std::vector<Tensor> inputs{q, k, v};
  if (has_sink) inputs.push_back(spec.sink);
  if (!autograd::any_requires_grad(inputs)) return {forward.out, forward.lse};
  using autograd::SavedTensor;
  // The spec keeps the sink's values, not its autograd identity: the node's inputs carry that.
  AttentionSpec saved_spec = spec;
  if (has_sink) saved_spec.sink = spec.sink.detach();
  auto backward = [sq = SavedTensor(q), sk = SavedTensor(k), sv = SavedTensor(v), so = SavedTensor(forward.out),
                   sl = SavedTensor(forward.lse), spec = std::move(saved_spec), seq, config,
                   has_sink](const autograd::GradList& g) {
    const Tensor& out = so.unpack();
    // Only lse may have received a gradient (e.g. a loss on lse alone): dout is then zero.
    const Tensor dout = g[0].defined() ? g[0] : zeros_like(out);
    raw::AttentionGrads grads =
        raw::attention_backward(dout, g[1], sq.unpack(), sk.unpack(), sv.unpack(), out, sl.unpack(), spec, seq, config);
    autograd::GradList result{grads.dq, grads.dk, grads.dv};
    if (has_sink) result.push_back(grads.dsink);
    return result;
  };
  std::vector<Tensor> outputs =
      autograd::record("dot_product_attention", {forward.out, forward.lse}, inputs, std::move(backward));
  return {outputs[0], outputs[1]};
}

}  // namespace cpf
