// raw::index_copy_: rows written at indices along any dim, in index order (a repeated index keeps the
// last row), against a plain loop; and every refused input with its message.
#include <gtest/gtest.h>

#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/index.h"
#include "framework/tensor/ops/views.h"
#include "support/index_utils.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

using testing::all_close;
using testing::random_tensor;

// dst with src.select(d, i) written at index[i] for i in order.
Tensor reference_index_copy(const Tensor& dst, int64_t d, const std::vector<int64_t>& index, const Tensor& src) {
  std::vector<double> out = dst.to_vector<double>();
  const std::vector<double> sv = src.to_vector<double>();
  for (int64_t p = 0; p < src.numel(); ++p) {
    Shape at = testing::unravel(p, src.shape());
    at[static_cast<size_t>(d)] = index[static_cast<size_t>(at[static_cast<size_t>(d)])];
    out[static_cast<size_t>(testing::ravel(at, dst.shape()))] = sv[static_cast<size_t>(p)];
  }
  return from_vector(out, dst.shape());
}

TEST(IndexCopy, WritesRowsInIndexOrderAlongEveryDim) {
  for (int64_t d = 0; d < 3; ++d) {
    Shape dst_shape{5, 4, 6};
    Shape src_shape = dst_shape;
    src_shape[static_cast<size_t>(d)] = 3;
    const std::vector<int64_t> index{d + 1, 0, d + 1};  // a repeat: the third row wins
    for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::i64}) {
      Tensor dst = raw::to(random_tensor(dst_shape, DType::f64, 3 + d, -4, 4), dtype);
      const Tensor src = raw::to(random_tensor(src_shape, DType::f64, 9 + d, -4, 4), dtype);
      const Tensor expected = reference_index_copy(raw::to(dst, DType::f64), d, index, raw::to(src, DType::f64));
      const uint64_t version = dst.version();
      raw::index_copy_(dst, d, raw::to(from_vector(index, {3}), DType::i32), src);
      EXPECT_GT(dst.version(), version);
      EXPECT_TRUE(all_close(raw::to(dst, DType::f64), expected, 0, 0)) << "dim " << d << " " << dtype_name(dtype);
    }
  }
}

TEST(IndexCopy, WritesIntoStridedViewsAndTakesEmptyIndices) {
  Tensor base = random_tensor({6, 8}, DType::f64, 21);
  const Tensor before = raw::clone(base);
  const Tensor view = raw::narrow(base, 1, 2, 4);  // (6, 4), row stride 8
  const Tensor src = random_tensor({2, 4}, DType::f64, 22);
  raw::index_copy_(view, 0, from_vector<int64_t>({4, 1}, {2}), src);
  const std::vector<double> b = base.to_vector<double>(), old = before.to_vector<double>(), s = src.to_vector<double>();
  for (int64_t r = 0; r < 6; ++r) {
    for (int64_t c = 0; c < 8; ++c) {
      const bool written = (r == 4 || r == 1) && c >= 2 && c < 6;
      const double want =
          written ? s[static_cast<size_t>((r == 4 ? 0 : 1) * 4 + c - 2)] : old[static_cast<size_t>(r * 8 + c)];
      EXPECT_EQ(b[static_cast<size_t>(r * 8 + c)], want) << r << "," << c;
    }
  }
  raw::index_copy_(base, 0, from_vector<int64_t>({}, {0}), random_tensor({0, 8}, DType::f64, 23));
  EXPECT_TRUE(all_close(raw::narrow(base, 1, 0, 2), raw::narrow(before, 1, 0, 2), 0, 0));
}

TEST(IndexCopy, RefusesWhatItCannotWrite) {
  const Tensor dst = random_tensor({3, 4}, DType::f64, 31);
  const Tensor src = random_tensor({2, 4}, DType::f64, 32);
  const Tensor index = from_vector<int64_t>({0, 2}, {2});
  EXPECT_CPF_ERROR(raw::index_copy_(dst, 0, from_vector<int64_t>({0, 3}, {2}), src),
                   "index_copy_: index 3 at position [1] is out of range for dim 0 of size 3");
  EXPECT_CPF_ERROR(raw::index_copy_(dst, 0, index, raw::to(src, DType::f32)), "index_copy_");
  EXPECT_CPF_ERROR(raw::index_copy_(dst, 0, index, random_tensor({2, 5}, DType::f64, 33)),
                   "index_copy_: src of shape [2,5] does not fit dst of shape [3,4] with 2 indices along dim 0");
  EXPECT_CPF_ERROR(raw::index_copy_(dst, 0, from_vector<int64_t>({0, 1}, {1, 2}), src),
                   "index_copy_: index must be 1-D, got shape [1,2]");
  EXPECT_CPF_ERROR(raw::index_copy_(dst, 2, index, src), "index_copy_: dim 2 out of range for a tensor of rank 2");
  EXPECT_CPF_ERROR(raw::index_copy_(dst, 0, raw::to(index, DType::f64), src), "index_copy_");
  EXPECT_CPF_ERROR(raw::index_copy_(raw::expand(random_tensor({1, 4}, DType::f64, 34), {3, 4}), 0, index, src),
                   "index_copy_");
}

}  // namespace
}  // namespace cpf
