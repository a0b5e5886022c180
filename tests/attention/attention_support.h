#pragma once
// Shared by the attention tests: random inputs in any format and the kernel-vs-oracle comparison of
// out, lse and the gradients of q, k, v (seeded through both out and lse).
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "attention/dot_product_attention.h"
#include "support/test_utils.h"
#include "tests/attention/naive_attention.h"

namespace cpf::testing {

// Shape of a q/k/v tensor: (batch, seq) ordered per format, or (tokens) for thd.
inline Shape attention_shape(QkvFormat format, int64_t batch, int64_t seq, int64_t heads, int64_t dim) {
  switch (format) {
    case QkvFormat::bshd: return {batch, seq, heads, dim};
    case QkvFormat::sbhd: return {seq, batch, heads, dim};
    case QkvFormat::thd: return {seq, heads, dim};
  }
  return {};
}

inline Tensor leaf(const Shape& shape, DType dtype, uint64_t seed) {
  Tensor t = random_tensor(shape, dtype, seed);
  t.set_requires_grad(true);
  return t;
}

struct AttentionRun {
  Tensor out, lse, dq, dk, dv;
};

// Runs `fn` on fresh leaves copied from q/k/v and back-propagates (dout, dlse).
template <class Fn>
AttentionRun run_attention(Fn&& fn, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                           const Tensor& dlse) {
  Tensor lq = raw::clone(q).set_requires_grad(true);
  Tensor lk = raw::clone(k).set_requires_grad(true);
  Tensor lv = raw::clone(v).set_requires_grad(true);
  auto [out, lse] = fn(lq, lk, lv);
  backward(std::vector<Tensor>{out, lse}, std::vector<Tensor>{dout, raw::to(dlse, lse.dtype())});
  return {out.detach(), lse.detach(), lq.grad(), lk.grad(), lv.grad()};
}

// Compares dot_product_attention with the naive oracle: values and gradients.
inline void expect_matches_reference(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionSpec& spec,
                                     const std::optional<SequenceInfo>& seq, const AttentionKernelConfig& config = {},
                                     double tol = 1e-10) {
  const AttentionOutput probe = dot_product_attention(q, k, v, spec, seq, config);
  const Tensor dout = random_tensor(probe.out.shape(), q.dtype(), 101);
  const Tensor dlse = random_tensor(probe.lse.shape(), probe.lse.dtype(), 102);
  const AttentionRun got = run_attention(
      [&](const Tensor& a, const Tensor& b, const Tensor& c) {
        auto r = dot_product_attention(a, b, c, spec, seq, config);
        return std::pair{r.out, r.lse};
      },
      q, k, v, dout, dlse);
  const AttentionRun want = run_attention(
      [&](const Tensor& a, const Tensor& b, const Tensor& c) {
        auto r = naive_attention(a, b, c, spec, seq);
        return std::pair{r.out, r.lse};
      },
      q, k, v, dout, dlse);
  EXPECT_TRUE(all_close(got.out, want.out, tol, tol)) << "out, " << spec.str();
  EXPECT_TRUE(all_close(got.lse, want.lse, tol, tol)) << "lse, " << spec.str();
  EXPECT_TRUE(all_close(got.dq, want.dq, tol, tol)) << "dq, " << spec.str();
  EXPECT_TRUE(all_close(got.dk, want.dk, tol, tol)) << "dk, " << spec.str();
  EXPECT_TRUE(all_close(got.dv, want.dv, tol, tol)) << "dv, " << spec.str();
}

}  // namespace cpf::testing
