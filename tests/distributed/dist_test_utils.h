#pragma once
// Helpers for the distributed tests: per-rank inputs in every dtype and layout, serial references.
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "framework/distributed/launcher.h"
#include "framework/distributed/process_group.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/join.h"
#include "framework/tensor/ops/views.h"
#include "framework/tensor/random.h"
#include "support/test_utils.h"

namespace cpf::testing {

using dist::RankContext;
using dist::ReduceOp;
using namespace std::chrono_literals;

enum class Layout { contiguous, strided };

inline const char* layout_name(Layout layout) { return layout == Layout::contiguous ? "contiguous" : "strided"; }

// Runs fn on n threads over the thread backend, on cpu; a failing rank fails the launch.
inline void run_ranks(int n, const std::function<void(RankContext&)>& fn,
                      std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  dist::launch(n, fn, {.timeout = timeout, .devices = dist::DevicePolicy::cpu});
}

// Deterministic values for (seed) in `dtype`: integers in [-50, 50) for integer types, sign for
// bool, uniform [-1, 1) otherwise. Strided: the same shape as a permuted, step-2 slice of a bigger
// tensor, so no dimension is contiguous.
inline Tensor make_input(const Shape& shape, DType dtype, uint64_t seed, Layout layout = Layout::contiguous) {
  Shape base_shape(shape.rbegin(), shape.rend());
  const bool strided = layout == Layout::strided && !shape.empty();
  if (strided) base_shape[0] *= 2;
  Generator gen(seed);
  Tensor base;
  if (dtype == DType::i32 || dtype == DType::i64) {
    base = raw::to(randint(-50, 50, base_shape, {.dtype = DType::i64}, &gen), dtype);
  } else if (dtype == DType::boolean) {
    base = raw::compare(raw::CompareOp::gt, uniform(base_shape, -1, 1, {.dtype = DType::f64}, &gen), 0.0);
  } else {
    base = raw::to(uniform(base_shape, -1, 1, {.dtype = DType::f64}, &gen), dtype);
  }
  if (strided) base = raw::slice(base, 0, 0, base_shape[0], 2);
  std::vector<int64_t> reverse;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) reverse.push_back(d);
  Tensor out = raw::permute(base, reverse);
  if (!strided) out = raw::contiguous(out);
  return out;
}

// Every rank's input, as rank r of the test makes it.
inline std::vector<Tensor> all_inputs(int n, const std::function<Tensor(int rank)>& make) {
  std::vector<Tensor> out;
  for (int r = 0; r < n; ++r) out.push_back(make(r));
  return out;
}

// The serial reduction: inputs combined in rank order; f32 and bf16 accumulate in f32 and round
// once, integers in i64; avg divides the sum by n. What the backend must reproduce bit for bit.
inline Tensor reference_reduce(const std::vector<Tensor>& xs, ReduceOp op) {
  const DType dtype = xs[0].dtype();
  const auto combine = [op](auto a, auto b) {
    switch (op) {
      case ReduceOp::max: return a >= b ? a : b;
      case ReduceOp::min: return a <= b ? a : b;
      default: return a + b;
    }
  };
  const auto run = [&]<class A>() {
    std::vector<A> acc = xs[0].to_vector<A>();
    for (size_t s = 1; s < xs.size(); ++s) {
      const std::vector<A> v = xs[s].to_vector<A>();
      for (size_t i = 0; i < acc.size(); ++i) acc[i] = combine(acc[i], v[i]);
    }
    if (op == ReduceOp::avg) {
      for (A& a : acc) a /= static_cast<A>(xs.size());
    }
    return raw::to(from_vector<A>(acc, xs[0].shape()), dtype);
  };
  if (dtype == DType::f64) return run.template operator()<double>();
  if (dtype == DType::f32 || dtype == DType::bf16) return run.template operator()<float>();
  return run.template operator()<int64_t>();
}

// Exact equality (same shape, dtype and values).
inline ::testing::AssertionResult same_tensor(const Tensor& actual, const Tensor& expected) {
  if (actual.dtype() != expected.dtype()) {
    return ::testing::AssertionFailure() << "dtype " << actual.dtype() << " vs expected " << expected.dtype();
  }
  return all_close(actual, expected, 0.0, 0.0);
}

inline std::string param_name(int n, DType dtype, Layout layout) {
  return "n" + std::to_string(n) + "_" + dtype_name(dtype) + "_" + layout_name(layout);
}

}  // namespace cpf::testing
