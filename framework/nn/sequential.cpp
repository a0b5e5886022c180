#include "framework/nn/sequential.h"

namespace cpf::nn {

void Sequential::add(const std::string& name, Function function) {
  CPF_CHECK(function != nullptr, "Sequential: function stage '", name, "' (stage ", stages_.size(), ") is empty");
  CPF_CHECK(!name.empty(), "Sequential: function stage ", stages_.size(), " needs a name (for messages)");
  stages_.push_back({name, std::move(function)});
}

Tensor Sequential::forward(const Tensor& x) const {
  Tensor y = x;
  for (size_t i = 0; i < stages_.size(); ++i) {
    y = stages_[i].apply(y);
    CPF_CHECK(y.defined(), "Sequential: stage ", i,
              stages_[i].function_name.empty() ? std::string() : " ('" + stages_[i].function_name + "')",
              " returned an undefined tensor");
  }
  return y;
}

}  // namespace cpf::nn
