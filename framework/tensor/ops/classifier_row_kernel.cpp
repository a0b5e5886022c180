#include "framework/tensor/ops/classifier_row_kernel.h"

#include <cstdlib>
#include <utility>

#include "framework/core/error.h"

namespace cpf::raw {

ClassifierRowKernel parse_classifier_row_kernel(const std::string& name) {
  const std::pair<const char*, ClassifierRowKernel> names[] = {{"auto", ClassifierRowKernel::automatic},
                                                               {"cached", ClassifierRowKernel::cached},
                                                               {"reread256", ClassifierRowKernel::reread256},
                                                               {"reread512", ClassifierRowKernel::reread512},
                                                               {"reread1024", ClassifierRowKernel::reread1024}};
  for (const auto& [n, kind] : names) {
    if (name == n) return kind;
  }
  CPF_FAIL("CPF_CLASSIFIER_ROW_KERNEL=", name,
           " is not a classifier row kernel; use auto, cached, reread256, reread512 or reread1024");
}

ClassifierRowKernel classifier_row_kernel_from_env() {
  // A throwing initialiser leaves the static uninitialised: every call reports the bad value again.
  static const ClassifierRowKernel choice = [] {
    const char* v = std::getenv("CPF_CLASSIFIER_ROW_KERNEL");
    return parse_classifier_row_kernel(v != nullptr ? v : "auto");
  }();
  return choice;
}

}  // namespace cpf::raw
