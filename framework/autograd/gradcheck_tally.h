#pragma once
// What the single-process and the distributed gradcheck (framework/distributed/gradcheck.h) share:
// the contraction of the outputs with the check's fixed weights, and the comparison of each
// element's analytic and numeric derivative with the report's running totals and worst element.
#include <cstdint>
#include <vector>

#include "framework/autograd/gradcheck.h"

namespace cpf::gradcheck_detail {

// sum_k <w_k, out_k> in f64 (outputs without a weight are skipped); call without recording.
double contract(const std::vector<Tensor>& outputs, const std::vector<Tensor>& weights);

// Compares one element at a time against atol + rtol * |numeric| and keeps the report: elements
// checked, the largest absolute error, ok (false once any element fails or is NaN) and the element
// with the largest error relative to its tolerance (ties keep the first).
class GradcheckTally {
 public:
  explicit GradcheckTally(const GradcheckOptions& options) : atol_(options.atol), rtol_(options.rtol) {}

  void add(size_t input, int64_t index, const Shape& shape, double analytic, double numeric);
  GradcheckReport& report() { return report_; }

 private:
  double atol_;
  double rtol_;
  double worst_ratio_ = -1;
  GradcheckReport report_;
};

}  // namespace cpf::gradcheck_detail
