#pragma once
// nn::Sequential: stages applied in order, y = f_n(...f_2(f_1(x))).
//
// A stage is a module with `Tensor forward(const Tensor&) const` (Linear, Dropout, LayerNorm, RMSNorm,
// MLP, another Sequential, ...), registered as child "<index>" so its parameters are named
// "0.weight", "2.bias", ... as in PyTorch; or a function without parameters (an activation), which
// takes an index but registers nothing:
//
//   auto net = std::make_shared<nn::Sequential>();
//   net->add(std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 4, .out_features = 8}, &gen));
//   net->add("gelu", [](const Tensor& x) { return gelu(x); });
//   net->add(std::make_shared<nn::Dropout>(0.1, &gen));
//   Tensor y = net->forward(x);
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "framework/nn/module.h"

namespace cpf::nn {

class Sequential : public Module {
 public:
  using Function = std::function<Tensor(const Tensor&)>;

  // Appends a module stage and returns it (so its options and parameters stay reachable).
  template <class M>
  std::shared_ptr<M> add(std::shared_ptr<M> module) {
    static_assert(std::is_base_of_v<Module, M>, "Sequential::add: the stage must derive from nn::Module");
    CPF_CHECK(module != nullptr, "Sequential: stage ", stages_.size(), " is a null module");
    register_module(std::to_string(stages_.size()), module);
    M* raw = module.get();
    stages_.push_back({"", [raw](const Tensor& x) { return raw->forward(x); }});
    return module;
  }
  // Appends a function stage (no parameters); `name` is for messages.
  void add(const std::string& name, Function function);

  // Runs every stage in order; an empty Sequential returns x.
  Tensor forward(const Tensor& x) const;
  size_t size() const { return stages_.size(); }

 private:
  struct Stage {
    std::string function_name;  // empty for a module stage
    Function apply;
  };
  std::vector<Stage> stages_;
};

}  // namespace cpf::nn
