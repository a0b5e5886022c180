#include "framework/tensor/device.h"

#include <charconv>

#include "framework/core/error.h"

namespace cpf {

Device Device::parse(const std::string& text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  if (text.rfind("cuda:", 0) == 0) {
    int index = -1;
    const char* begin = text.data() + 5;
    const char* end = text.data() + text.size();
    const auto result = std::from_chars(begin, end, index);
    CPF_CHECK(result.ec == std::errc() && result.ptr == end && index >= 0, "invalid device '", text,
              "': the index after 'cuda:' must be a non-negative integer");
    return cuda(index);
  }
  CPF_FAIL("invalid device '", text, "' (expected 'cpu', 'cuda' or 'cuda:N')");
}

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }

std::ostream& operator<<(std::ostream& os, const Device& device) { return os << device.str(); }

}  // namespace cpf
