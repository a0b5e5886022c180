// train_mlp: fits a two-layer MLP to a synthetic regression task with the autograd API and a
// hand-written SGD-with-momentum step; the smallest end-to-end use of cpformer.
//
//   build/cpu/examples/train_mlp [steps]
//
// The targets come from a fixed random "teacher" network, so the task is learnable and the loss must
// fall: the program exits with status 1 unless the final loss is at least 10x below the initial one.
// Everything is seeded, so the printed losses are the same on every run and thread count.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "framework/autograd/ops.h"

namespace {

constexpr int64_t kSamples = 512;
constexpr int64_t kInputs = 8;
constexpr int64_t kHidden = 64;
constexpr int64_t kOutputs = 2;
constexpr int64_t kTeacherHidden = 16;
constexpr double kLearningRate = 0.05;
constexpr double kMomentum = 0.9;

struct Mlp {
  cpf::Tensor w1, b1, w2, b2;  // (in, hidden), (hidden), (hidden, out), (out)

  // x (N, in) -> (N, out)
  cpf::Tensor forward(const cpf::Tensor& x) const {
    cpf::Tensor h = cpf::tanh(cpf::add(cpf::matmul(x, w1), b1));  // (N, hidden); b1 broadcasts over N
    return cpf::add(cpf::matmul(h, w2), b2);                      // (N, out)
  }
  std::vector<cpf::Tensor> parameters() const { return {w1, b1, w2, b2}; }
};

// A leaf parameter drawn from N(0, 1/fan_in), which keeps tanh out of saturation at the start.
cpf::Tensor init_weight(int64_t fan_in, int64_t fan_out, cpf::Generator& gen) {
  cpf::Tensor w = cpf::normal({fan_in, fan_out}, 0.0, 1.0 / std::sqrt(static_cast<double>(fan_in)), {}, &gen);
  w.set_requires_grad();
  return w;
}

cpf::Tensor init_bias(int64_t size) {
  cpf::Tensor b = cpf::zeros({size});
  b.set_requires_grad();
  return b;
}

// Plain SGD with momentum: v = momentum * v + grad; p -= lr * v. Runs outside the graph.
void sgd_momentum_step(const std::vector<cpf::Tensor>& params, std::vector<cpf::Tensor>& velocity) {
  cpf::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    cpf::mul_(velocity[i], kMomentum);
    cpf::add_(velocity[i], params[i].grad());
    cpf::add_(params[i], velocity[i], -kLearningRate);
    params[i].set_grad(cpf::Tensor());  // backward accumulates: clear for the next step
  }
}

int run(int64_t steps) {
  cpf::Generator gen(1234);

  // Data: x ~ N(0, 1); y = a fixed random tanh network of x (the teacher), so a perfect fit exists.
  const cpf::Tensor x = cpf::randn({kSamples, kInputs}, {}, &gen);  // (N, in)
  cpf::Tensor y;                                                    // (N, out)
  {
    cpf::NoGradGuard no_grad;
    const cpf::Tensor t1 = cpf::randn({kInputs, kTeacherHidden}, {}, &gen);
    const cpf::Tensor t2 = cpf::randn({kTeacherHidden, kOutputs}, {}, &gen);
    y = cpf::matmul(cpf::tanh(cpf::matmul(x, t1)), t2);
  }

  Mlp model{init_weight(kInputs, kHidden, gen), init_bias(kHidden), init_weight(kHidden, kOutputs, gen),
            init_bias(kOutputs)};
  const std::vector<cpf::Tensor> params = model.parameters();
  std::vector<cpf::Tensor> velocity;
  for (const cpf::Tensor& p : params) velocity.push_back(cpf::zeros_like(p));

  std::printf("train_mlp: %lld samples, %lld -> %lld (tanh) -> %lld, SGD lr=%g momentum=%g, %lld steps\n",
              static_cast<long long>(kSamples), static_cast<long long>(kInputs), static_cast<long long>(kHidden),
              static_cast<long long>(kOutputs), kLearningRate, kMomentum, static_cast<long long>(steps));
  const int64_t log_every = steps >= 10 ? steps / 10 : 1;
  double initial_loss = 0.0, final_loss = 0.0;
  for (int64_t step = 0; step <= steps; ++step) {
    const cpf::Tensor loss = cpf::mean(cpf::square(cpf::sub(model.forward(x), y)));  // MSE, shape []
    const double value = loss.item<double>();
    if (!std::isfinite(value)) {
      std::fprintf(stderr, "train_mlp: loss is %g at step %lld\n", value, static_cast<long long>(step));
      return 1;
    }
    if (step == 0) initial_loss = value;
    final_loss = value;
    if (step % log_every == 0 || step == steps) {
      std::printf("step %5lld  loss %.6f\n", static_cast<long long>(step), value);
    }
    if (step == steps) break;  // the last iteration only measures
    cpf::backward(loss);
    sgd_momentum_step(params, velocity);
  }

  const double ratio = initial_loss / final_loss;
  std::printf("initial loss %.6f, final loss %.6f: %.1fx lower\n", initial_loss, final_loss, ratio);
  if (!(ratio >= 10.0)) {
    std::fprintf(stderr, "train_mlp: FAILED: the loss fell only %.2fx (expected at least 10x)\n", ratio);
    return 1;
  }
  std::printf("train_mlp: OK\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const int64_t steps = argc > 1 ? std::stoll(argv[1]) : 500;
    if (steps < 1) {
      std::fprintf(stderr, "usage: train_mlp [steps >= 1]\n");
      return 2;
    }
    return run(steps);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_mlp: error: %s\n", e.what());
    return 1;
  }
}
