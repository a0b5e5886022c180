#pragma once
// SGD with momentum, optional Nesterov momentum and (coupled, L2) weight decay, as torch.optim.SGD
// with dampening 0:
//
//   g   <- g + wd * p                      when the parameter's group has weight decay
//   buf <- momentum * buf + g              when momentum > 0 (buf starts at 0, so the first step has buf = g)
//   d   <- nesterov ? g + momentum * buf : buf      (d = g without momentum)
//   p   <- p - lr * d
//
// State: "momentum_buffer.<name>" when momentum > 0, none otherwise.
#include "framework/optim/optimizer.h"

namespace cpf::optim {

// Fields are the YAML keys of the `optimizer:` section (docs/optim.md).
struct SGDOptions {
  double lr = 0.01;           // >= 0
  double momentum = 0.9;      // in [0, 1)
  bool nesterov = false;      // needs momentum > 0
  double weight_decay = 0.0;  // >= 0, coupled: added to the gradient
  bool decay_all = false;     // also decay norms, biases, embeddings and 1-D tensors
};

// Throws naming the first invalid field.
void validate(const SGDOptions& options);

class SGD : public Optimizer {
 public:
  // Groups from weight_decay_groups(params, options.weight_decay, options.decay_all).
  SGD(const NamedTensors& params, const SGDOptions& options);
  // Explicit groups: each group's weight_decay is used and options.weight_decay/decay_all are ignored.
  SGD(std::vector<ParamGroup> groups, const SGDOptions& options);

  const SGDOptions& options() const { return options_; }

 protected:
  void update(const Tensor& param, const Tensor& grad, const std::vector<Tensor>& state, double weight_decay,
              int64_t step) override;

 private:
  SGDOptions options_;
};

}  // namespace cpf::optim
