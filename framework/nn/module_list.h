#pragma once
// nn::ModuleList: an indexed list of child modules whose forward the owner writes (a stack of blocks
// with extra arguments, say). Children are registered as "0", "1", ..., so their parameters are named
// "<index>.<name>" under the list's own name, as in PyTorch:
//
//   blocks_ = register_module("blocks", std::make_shared<nn::ModuleList>());
//   for (int i = 0; i < layers; ++i) blocks_->push_back(std::make_shared<MyBlock>(options, gen));
//   for (const auto& block : blocks_->as<MyBlock>()) x = block->forward(x, seq);
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "framework/nn/module.h"

namespace cpf::nn {

class ModuleList : public Module {
 public:
  // Appends `module` as child "<size()>" and returns it.
  template <class M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> module) {
    static_assert(std::is_base_of_v<Module, M>, "ModuleList::push_back: the entry must derive from nn::Module");
    register_module(std::to_string(modules_.size()), module);
    modules_.push_back(module);
    return module;
  }

  size_t size() const { return modules_.size(); }
  bool empty() const { return modules_.empty(); }
  // Throws for an index out of range, naming it and the size.
  const std::shared_ptr<Module>& at(size_t index) const;
  // The entry as an M; throws when it is another type.
  template <class M>
  std::shared_ptr<M> at(size_t index) const {
    auto typed = std::dynamic_pointer_cast<M>(at(index));
    CPF_CHECK(typed != nullptr, "ModuleList: entry ", index, " is not of the requested module type");
    return typed;
  }
  // Every entry as an M (throws when one is another type).
  template <class M>
  std::vector<std::shared_ptr<M>> as() const {
    std::vector<std::shared_ptr<M>> out;
    for (size_t i = 0; i < modules_.size(); ++i) out.push_back(at<M>(i));
    return out;
  }

  std::vector<std::shared_ptr<Module>>::const_iterator begin() const { return modules_.begin(); }
  std::vector<std::shared_ptr<Module>>::const_iterator end() const { return modules_.end(); }

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

}  // namespace cpf::nn
