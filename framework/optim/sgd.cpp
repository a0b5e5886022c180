#include "framework/optim/sgd.h"

#include <cmath>

#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"

namespace cpf::optim {

void validate(const SGDOptions& o) {
  CPF_CHECK(std::isfinite(o.lr) && o.lr >= 0, "sgd: lr must be finite and >= 0, got ", o.lr);
  CPF_CHECK(o.momentum >= 0 && o.momentum < 1, "sgd: momentum must be in [0, 1), got ", o.momentum);
  CPF_CHECK(!o.nesterov || o.momentum > 0, "sgd: nesterov needs momentum > 0, got momentum ", o.momentum);
  CPF_CHECK(std::isfinite(o.weight_decay) && o.weight_decay >= 0, "sgd: weight_decay must be finite and >= 0, got ",
            o.weight_decay);
}

namespace {
const SGDOptions& validated(const SGDOptions& options) {
  validate(options);
  return options;
}
std::vector<std::string> slots_for(const SGDOptions& options) {
  if (options.momentum > 0) return {"momentum_buffer"};
  return {};
}
}  // namespace

SGD::SGD(const NamedTensors& params, const SGDOptions& options)
    : SGD(weight_decay_groups(params, validated(options).weight_decay, options.decay_all), options) {}

SGD::SGD(std::vector<ParamGroup> groups, const SGDOptions& options)
    : Optimizer("sgd", std::move(groups), validated(options).lr, slots_for(options)), options_(options) {}

void SGD::update(const Tensor& param, const Tensor& grad, const std::vector<Tensor>& state, double weight_decay,
                 int64_t step) {
  Tensor d = grad;
  if (weight_decay != 0.0) {
    d = raw::clone(grad);  // never write into the caller's gradient
    raw::add_(d, param, weight_decay);
  }
  if (!state.empty()) {
    const Tensor& buf = state[0];
    raw::mul_(buf, options_.momentum);
    raw::add_(buf, d);
    if (options_.nesterov) {
      if (d.is_same(grad)) d = raw::clone(grad);
      raw::add_(d, buf, options_.momentum);
    } else {
      d = buf;
    }
  }
  raw::add_(param, d, -lr());
}

}  // namespace cpf::optim
