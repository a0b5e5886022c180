// Readable printing: nested brackets in row-major order, 4 significant decimals for floats, long
// dimensions elided with "..." (first and last 3 entries), followed by dtype, device and shape.
#include <iomanip>
#include <sstream>

#include "framework/tensor/ops/copy.h"
#include "framework/tensor/tensor.h"

namespace cpf {
namespace {

constexpr int64_t kEdgeItems = 3;
constexpr int64_t kSummariseAbove = 1000;

void print_value(std::ostream& os, double v, DType dtype) {
  if (dtype == DType::boolean) {
    os << (v != 0 ? "true" : "false");
  } else if (is_integral(dtype)) {
    os << static_cast<int64_t>(v);
  } else {
    os << std::setprecision(4) << std::fixed << v;
  }
}

void print_rec(std::ostream& os, const Tensor& t, const std::vector<double>& values, int64_t dim, int64_t offset,
               const Shape& strides, bool summarise, int indent) {
  if (t.dim() == 0) {
    print_value(os, values[0], t.dtype());
    return;
  }
  const int64_t n = t.size(dim);
  os << '[';
  for (int64_t i = 0; i < n; ++i) {
    if (summarise && n > 2 * kEdgeItems && i == kEdgeItems) {
      os << (dim + 1 == t.dim() ? "..., " : "...,\n" + std::string(indent + 1, ' '));
      i = n - kEdgeItems;
    }
    if (dim + 1 == t.dim()) {
      print_value(os, values[offset + i * strides[dim]], t.dtype());
    } else {
      print_rec(os, t, values, dim + 1, offset + i * strides[dim], strides, summarise, indent + 1);
    }
    if (i + 1 < n) os << (dim + 1 == t.dim() ? ", " : ",\n" + std::string(indent + 1, ' '));
  }
  os << ']';
}

}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  std::ostringstream os;
  const Tensor host = raw::contiguous(raw::to(*this, Device::cpu()));
  const std::vector<double> values = host.to_vector<double>();
  os << "tensor(";
  print_rec(os, host, values, 0, 0, host.strides(), numel() > kSummariseAbove, 7);
  os << ", dtype=" << dtype() << ", device=" << device() << ", shape=" << shape_str(shape());
  if (requires_grad()) os << ", requires_grad";
  os << ')';
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& tensor) { return os << tensor.str(); }

}  // namespace cpf
