#include "apps/trainer/step/step_window.h"

#include <cmath>

#include "framework/autograd/grad_mode.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/views.h"

namespace cpf::trainer {

StepWindow::StepWindow(Device device) : buffer_(zeros({kCapacity, 2}, {.dtype = DType::f64, .device = device})) {}

void StepWindow::add(const Tensor& sum_squares, const Tensor& loss, int64_t tokens) {
  CPF_CHECK(!full(), "StepWindow::add: ", kCapacity, " steps are in flight already; read() them first");
  CPF_CHECK(sum_squares.defined() && sum_squares.numel() == 1 && sum_squares.dtype() == DType::f64,
            "StepWindow::add: the sum of squares must be one f64 element");
  CPF_CHECK(loss.defined() && loss.numel() == 1 && is_floating(loss.dtype()),
            "StepWindow::add: the loss must be one floating element");
  CPF_CHECK(sum_squares.device() == buffer_.device() && loss.device() == buffer_.device(),
            "StepWindow::add: values on ", sum_squares.device(), " and ", loss.device(), " but the window is on ",
            buffer_.device());
  NoGradGuard no_grad;
  // Copies, not handles: a replayed step graph rewrites its loss buffer at the next step. f32 and bf16
  // widen to f64 exactly, as item<double>() reads them.
  const Tensor slot = raw::narrow(buffer_, 0, size(), 1);  // (1, 2)
  raw::copy_(raw::narrow(slot, 1, 0, 1), raw::reshape(sum_squares, {1, 1}));
  raw::copy_(raw::narrow(slot, 1, 1, 1), raw::reshape(loss, {1, 1}));
  tokens_.push_back(tokens);
}

std::vector<StepResult> StepWindow::read() {
  CPF_CHECK(!empty(), "StepWindow::read: no step since the last read");
  const std::vector<int64_t> tokens = std::move(tokens_);
  tokens_.clear();
  // (n, 2): one copy to the host, which waits for the steps that wrote it (and reports their errors).
  const std::vector<double> values =
      raw::narrow(buffer_, 0, 0, static_cast<int64_t>(tokens.size())).to_vector<double>();
  std::vector<StepResult> results;
  for (size_t i = 0; i < tokens.size(); ++i) {
    StepResult r;
    r.grad_norm = std::sqrt(values[2 * i]);
    r.loss = values[2 * i + 1];
    r.tokens = tokens[i];
    r.skipped = !std::isfinite(r.grad_norm);
    results.push_back(r);
  }
  return results;
}

}  // namespace cpf::trainer
