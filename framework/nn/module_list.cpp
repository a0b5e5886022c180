#include "framework/nn/module_list.h"

namespace cpf::nn {

const std::shared_ptr<Module>& ModuleList::at(size_t index) const {
  CPF_CHECK(index < modules_.size(), "ModuleList: index ", index, " is out of range for a list of ", modules_.size(),
            " modules");
  return modules_[index];
}

}  // namespace cpf::nn
