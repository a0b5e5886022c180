#include "framework/autograd/gradcheck_tally.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/reduce.h"

namespace cpf::gradcheck_detail {

double contract(const std::vector<Tensor>& outputs, const std::vector<Tensor>& weights) {
  double total = 0;
  for (size_t k = 0; k < outputs.size() && k < weights.size(); ++k) {
    if (!weights[k].defined()) continue;
    total += raw::sum(raw::mul(raw::to(outputs[k], DType::f64), weights[k])).item<double>();
  }
  return total;
}

void GradcheckTally::add(size_t input, int64_t index, const Shape& shape, double analytic, double numeric) {
  const double error = std::abs(analytic - numeric);
  const double tolerance = atol_ + rtol_ * std::abs(numeric);
  const double ratio = std::isnan(error) ? std::numeric_limits<double>::infinity() : error / tolerance;
  report_.checked += 1;
  report_.max_abs_error = std::max(report_.max_abs_error, error);
  if (ratio > 1.0 || std::isnan(error)) report_.ok = false;
  if (ratio > worst_ratio_) {
    worst_ratio_ = ratio;
    report_.worst_input = input;
    report_.worst_index = index;
    report_.worst_shape = shape;
    report_.worst_analytic = analytic;
    report_.worst_numeric = numeric;
  }
}

}  // namespace cpf::gradcheck_detail
