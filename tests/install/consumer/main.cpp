// Uses the installed package: loss = sum(w * w) has gradient 2 * w.
#include <iostream>
#include <vector>

#include "framework/autograd/ops.h"
#include "framework/distributed/rendezvous_tcp.h"

int main() {
  cpf::Tensor w = cpf::from_vector<float>({1.0f, 2.0f, 3.0f}, {3});
  w.set_requires_grad();
  cpf::Tensor loss = cpf::sum(cpf::mul(w, w));
  cpf::backward(loss);
  const std::vector<float> grad = w.grad().to_vector<float>();
  std::cout << "loss = " << loss.item<float>() << "\ndloss/dw = [";
  for (size_t i = 0; i < grad.size(); ++i) std::cout << (i ? ", " : "") << grad[i];
  std::cout << "]\n";
  const std::string token = cpf::dist::generate_rendezvous_token();  // links libcrypto
  std::cout << "rendezvous token: " << token.size() << " hex digits\n";
  return grad == std::vector<float>{2.0f, 4.0f, 6.0f} && token.size() == 32 ? 0 : 1;
}
