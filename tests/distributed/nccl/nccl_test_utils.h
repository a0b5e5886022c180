#pragma once
// Helpers for the multi-GPU suites: a fixture that skips below 2 GPUs, the NCCL launch, device
// inputs (contiguous or strided) and comparisons that name the rank and case on failure.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "distributed/dist_test_utils.h"
#include "framework/distributed/launcher.h"
#include "framework/distributed/nccl/nccl_init.h"
#include "tests/tensor/cuda/cuda_test_utils.h"

namespace cpf::testing {

// Every multi-GPU test derives from this: below 2 visible GPUs it skips with the reason.
class MultiGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const int gpus = cuda::device_count();
    if (gpus < 2) {
      GTEST_SKIP() << "needs at least 2 CUDA devices, " << gpus
                   << " visible: the multi-GPU suite runs on the 2- and 4-GPU machines (NCCL_NVLS_ENABLE=0)";
    }
  }
  // The world sizes to try: 2, and every visible GPU (up to 8) when more than 2.
  static std::vector<int> world_sizes() {
    const int gpus = std::min(cuda::device_count(), 8);
    std::vector<int> sizes{2};
    if (gpus > 2) sizes.push_back(gpus);
    return sizes;
  }
};

// Runs fn on n rank threads, rank r on cuda:r, over NCCL; a failing rank fails the launch.
inline void run_nccl(int n, const std::function<void(dist::RankContext&)>& fn,
                     std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  dist::launch(n, fn, {.timeout = timeout, .backend = dist::Backend::nccl});
}

// `host` (a cpu tensor) on `device`, as a contiguous tensor or as a non-contiguous view with the
// same values (every other element of a twice-as-wide last dim).
inline Tensor on_device(const Tensor& host, Device device, Layout layout = Layout::contiguous) {
  if (layout == Layout::contiguous || host.dim() == 0) return raw::contiguous(raw::to(host, device));
  Shape wide = host.shape();
  wide.back() *= 2;
  Tensor base = zeros(wide, {.dtype = host.dtype()});
  raw::copy_(raw::slice(base, -1, 0, wide.back(), 2), host);
  Tensor moved = raw::to(base, device);
  Tensor view = raw::slice(moved, -1, 0, wide.back(), 2);
  EXPECT_FALSE(view.is_contiguous());
  return view;
}

// Tolerance (norm-wise relative error) of a reduction of n inputs by NCCL against the serial
// reference: exact for integers, bool and max/min (no rounding); floats differ by NCCL's summation
// order, and bf16 sums are rounded to bf16 at each step of NCCL's ring (not once at the end).
inline double reduce_tolerance(DType dtype, dist::ReduceOp op) {
  if (op == dist::ReduceOp::max || op == dist::ReduceOp::min) return 0.0;
  switch (dtype) {
    case DType::f64: return 1e-12;
    case DType::f32: return 1e-6;
    case DType::bf16: return 1.5e-2;
    default: return 0.0;
  }
}

// actual (any device) against expected (cpu): same shape and dtype, then exact or within `tol`.
inline ::testing::AssertionResult matches(const Tensor& actual, const Tensor& expected, double tol) {
  if (actual.shape() != expected.shape()) {
    return ::testing::AssertionFailure() << "shape " << shape_str(actual.shape()) << " vs expected "
                                         << shape_str(expected.shape());
  }
  if (actual.dtype() != expected.dtype()) {
    return ::testing::AssertionFailure() << "dtype " << actual.dtype() << " vs expected " << expected.dtype();
  }
  if (tol == 0.0) return all_close(actual, expected, 0.0, 0.0);
  const double err = rel_error(actual, expected);
  if (!(err <= tol)) return ::testing::AssertionFailure() << "relative error " << err << " > " << tol;
  return ::testing::AssertionSuccess();
}

}  // namespace cpf::testing
