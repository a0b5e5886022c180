#pragma once
// cpf::Error and the CPF_CHECK macro family: every failure in cpformer is an exception that carries
// file:line, the condition that failed and a message with the offending values.
//
//   CPF_CHECK(a.size(-1) == b.size(-2), "matmul: inner dimensions differ: a=", a.shape(), " b=", b.shape());
//
// Arguments after the condition are streamed into the message; shapes (std::vector) print as [4,8].
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace cpf {

class Error : public std::runtime_error {
 public:
  Error(std::string file, int line, std::string condition, std::string message);
  const std::string& file() const noexcept { return file_; }
  int line() const noexcept { return line_; }
  const std::string& condition() const noexcept { return condition_; }
  // The message alone, without the location suffix that what() adds.
  const std::string& message() const noexcept { return message_; }

 private:
  std::string file_;
  int line_;
  std::string condition_;
  std::string message_;
};

namespace detail {

template <class T>
void append_value(std::ostream& os, const T& value) {
  os << value;
}
template <class T>
void append_value(std::ostream& os, const std::vector<T>& values) {
  os << '[';
  for (size_t i = 0; i < values.size(); ++i) os << (i ? "," : "") << values[i];
  os << ']';
}
inline void append_value(std::ostream& os, bool value) { os << (value ? "true" : "false"); }

[[noreturn]] void throw_error(const char* file, int line, const char* condition, std::string message);

}  // namespace detail

// The arguments streamed into one string (vectors as "[a,b]", bools as true/false): the message builder of
// CPF_CHECK, logs and every error text.
template <class... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (detail::append_value(os, args), ...);
  return os.str();
}

// "[4,8]" for a shape; used in messages and printing.
std::string shape_str(const std::vector<int64_t>& shape);

}  // namespace cpf

#define CPF_CHECK(cond, ...)                                                              \
  do {                                                                                    \
    if (!(cond)) [[unlikely]] {                                                           \
      ::cpf::detail::throw_error(__FILE__, __LINE__, #cond, ::cpf::str_cat(__VA_ARGS__)); \
    }                                                                                     \
  } while (0)

#define CPF_FAIL(...) ::cpf::detail::throw_error(__FILE__, __LINE__, "", ::cpf::str_cat(__VA_ARGS__))
