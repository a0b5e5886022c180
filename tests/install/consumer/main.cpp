// Uses the installed package: loss = sum(w * w) has gradient 2 * w.
#include <iostream>
#include <vector>

#include "framework/autograd/ops.h"

int main() {
  cpf::Tensor w = cpf::from_vector<float>({1.0f, 2.0f, 3.0f}, {3});
  w.set_requires_grad();
  cpf::Tensor loss = cpf::sum(cpf::mul(w, w));
  cpf::backward(loss);
  const std::vector<float> grad = w.grad().to_vector<float>();
  std::cout << "loss = " << loss.item<float>() << "\ndloss/dw = [";
  for (size_t i = 0; i < grad.size(); ++i) std::cout << (i ? ", " : "") << grad[i];
  std::cout << "]\n";
  return grad == std::vector<float>{2.0f, 4.0f, 6.0f} ? 0 : 1;
}
