#pragma once
// Shared by the GPU attention suites: one forward + backward through raw::attention_forward/backward
// on any device, and a comparison with the CPU reference that names the case, the tensor, the
// norm-wise relative error and the worst element, so one GPU run pinpoints a failure.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "attention/attention_op.h"
#include "attention/attention_problem.h"
#include "tests/tensor/cuda/cuda_test_utils.h"

namespace cpf::testing {

struct AttentionResult {
  Tensor out, lse, dq, dk, dv;  // on the CPU
};

// Forward, then backward from the forward's out and lse with (dout, dlse) (dlse may be undefined).
// Inputs are CPU tensors; they are moved to `device` for the call and the results back.
inline AttentionResult run_attention_on(const Device& device, const Tensor& q, const Tensor& k, const Tensor& v,
                                        const Tensor& dout, const Tensor& dlse, const AttentionSpec& spec,
                                        const std::optional<SequenceInfo>& seq, const AttentionKernelConfig& config) {
  auto put = [&](const Tensor& t) { return t.defined() ? raw::to(t, device) : Tensor(); };
  const Tensor dq_ = put(q), dk_ = put(k), dv_ = put(v);
  const raw::AttentionForward f = raw::attention_forward(dq_, dk_, dv_, spec, seq, config);
  const raw::AttentionGrads g =
      raw::attention_backward(put(dout), put(dlse), dq_, dk_, dv_, f.out, f.lse, spec, seq, config);
  return {on_cpu(f.out), on_cpu(f.lse), on_cpu(g.dq), on_cpu(g.dk), on_cpu(g.dv)};
}

// `actual` (any device) against `expected` (the CPU reference): same shape, no NaN, the same -inf
// entries, and a norm-wise relative error over the finite entries of at most `rtol`. Where the
// reference is exactly 0, |actual| must also stay below rtol x max|reference|: a gradient that cancels
// to 0 in one summation order may keep a rounding residue in another, but a masked or padded entry
// that got real values cannot hide in the norm. Exact zeros at padding and at rows that see no key
// are checked separately (expect_exact_zeros_without_keys).
inline ::testing::AssertionResult close_to_reference(const Tensor& actual, const Tensor& expected, double rtol) {
  if (actual.shape() != expected.shape()) {
    return ::testing::AssertionFailure() << "shape " << shape_str(actual.shape()) << " vs reference "
                                         << shape_str(expected.shape());
  }
  const auto a = on_cpu(actual).to_vector<double>();
  const auto b = expected.to_vector<double>();
  double scale = 0;
  for (double x : b) scale = std::isfinite(x) ? std::max(scale, std::abs(x)) : scale;
  double num = 0, den = 0, worst = -1;
  size_t worst_i = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i])) {
      return ::testing::AssertionFailure() << "NaN at element " << i << " (reference " << b[i] << ")";
    }
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i]) {
        return ::testing::AssertionFailure() << "element " << i << " is " << a[i] << ", reference " << b[i];
      }
      continue;
    }
    if (b[i] == 0 && std::abs(a[i]) > rtol * scale) {
      return ::testing::AssertionFailure() << "element " << i << " is " << a[i] << " where the reference is exactly 0 "
                                           << "(padding, masked, or cancelled); allowed " << rtol * scale;
    }
    const double err = std::abs(a[i] - b[i]);
    num += err * err;
    den += b[i] * b[i];
    if (err > worst) {
      worst = err;
      worst_i = i;
    }
  }
  const double rel = den == 0 ? std::sqrt(num) : std::sqrt(num / den);
  if (rel > rtol) {
    return ::testing::AssertionFailure() << "norm-wise relative error " << rel << " > " << rtol
                                         << "; largest difference " << worst << " at element " << worst_i << " ("
                                         << a[worst_i] << " vs reference " << b[worst_i] << ") of "
                                         << shape_str(expected.shape());
  }
  return ::testing::AssertionSuccess();
}

struct AttentionTolerance {
  double values = 1e-5;  // out, dq, dk, dv
  double lse = 1e-5;
};

inline void expect_results_close(const AttentionResult& got, const AttentionResult& want, AttentionTolerance tol,
                                 const std::string& what) {
  EXPECT_TRUE(close_to_reference(got.out, want.out, tol.values)) << what << ": out";
  EXPECT_TRUE(close_to_reference(got.lse, want.lse, tol.lse)) << what << ": lse";
  EXPECT_TRUE(close_to_reference(got.dq, want.dq, tol.values)) << what << ": dq";
  EXPECT_TRUE(close_to_reference(got.dk, want.dk, tol.values)) << what << ": dk";
  EXPECT_TRUE(close_to_reference(got.dv, want.dv, tol.values)) << what << ": dv";
}

// The contract's exact zeros: out and dq are 0 in every (token, head) row whose lse is -inf (padding
// and rows that see no key), dk and dv at every kv storage token outside all sequences.
inline void expect_exact_zeros_without_keys(const AttentionProblem& p, const AttentionResult& got,
                                            const std::string& what) {
  const auto lse = got.lse.to_vector<double>(), out = got.out.to_vector<double>(), dq = got.dq.to_vector<double>();
  const int64_t rows = p.format == QkvFormat::thd ? 1 : p.batch;
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t h = 0; h < p.h_q; ++h) {
      for (int64_t col = 0; col < p.s_q; ++col) {
        if (lse[static_cast<size_t>(p.lse_offset(row, h, col))] != -INFINITY) continue;
        const int64_t o = p.element_offset(row, col, p.s_q, h, p.h_q, p.d_v);
        const int64_t g = p.element_offset(row, col, p.s_q, h, p.h_q, p.d_qk);
        for (int64_t e = 0; e < p.d_v; ++e) {
          ASSERT_EQ(out[static_cast<size_t>(o + e)], 0.0)
              << what << ": out at row " << row << " col " << col << " head " << h << " (lse -inf)";
        }
        for (int64_t e = 0; e < p.d_qk; ++e) {
          ASSERT_EQ(dq[static_cast<size_t>(g + e)], 0.0)
              << what << ": dq at row " << row << " col " << col << " head " << h << " (lse -inf)";
        }
      }
    }
  }
  // kv storage tokens (row * s_kv + col) that no sequence covers.
  std::vector<bool> covered(static_cast<size_t>(p.batch * p.s_kv), false);
  for (const AttentionSequence& s : p.sequences) {
    for (int64_t i = 0; i < s.kv_len; ++i) covered[static_cast<size_t>(s.kv_token + i)] = true;
  }
  const auto dk = got.dk.to_vector<double>(), dv = got.dv.to_vector<double>();
  const int64_t kv_row_len = p.format == QkvFormat::thd ? p.batch * p.s_kv : p.s_kv;
  for (size_t t = 0; t < covered.size(); ++t) {
    if (covered[t]) continue;
    const int64_t row = static_cast<int64_t>(t) / kv_row_len, col = static_cast<int64_t>(t) % kv_row_len;
    for (int64_t h = 0; h < p.h_kv; ++h) {
      for (int64_t e = 0; e < p.d_qk; ++e) {
        ASSERT_EQ(dk[static_cast<size_t>(p.element_offset(row, col, kv_row_len, h, p.h_kv, p.d_qk) + e)], 0.0)
            << what << ": dk at padded kv token " << t << " head " << h;
      }
      for (int64_t e = 0; e < p.d_v; ++e) {
        ASSERT_EQ(dv[static_cast<size_t>(p.element_offset(row, col, kv_row_len, h, p.h_kv, p.d_v) + e)], 0.0)
            << what << ": dv at padded kv token " << t << " head " << h;
      }
    }
  }
}

// Bitwise equality (determinism checks).
inline ::testing::AssertionResult bitwise_equal(const Tensor& a, const Tensor& b) {
  const auto x = on_cpu(a).to_vector<double>(), y = on_cpu(b).to_vector<double>();
  if (x.size() != y.size()) return ::testing::AssertionFailure() << "sizes " << x.size() << " vs " << y.size();
  for (size_t i = 0; i < x.size(); ++i) {
    const bool same = x[i] == y[i] || (std::isnan(x[i]) && std::isnan(y[i]));
    if (!same) return ::testing::AssertionFailure() << "element " << i << ": " << x[i] << " vs " << y[i];
  }
  return ::testing::AssertionSuccess();
}

}  // namespace cpf::testing
