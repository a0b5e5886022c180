#include "framework/tensor/ops/index.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/reduce.h"
#include "framework/tensor/ops/views.h"
#include "framework/tensor/storage.h"
#include "support/host_as_device.h"
#include "support/index_utils.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

using testing::all_close;
using testing::random_tensor;

using testing::ravel;  // tests/support/index_utils.h
using testing::unravel;

Tensor bool_tensor(const std::vector<int32_t>& values, const Shape& shape) {
  return raw::to(from_vector(values, shape), DType::boolean);
}

Tensor random_index(int64_t high, const Shape& shape, DType dtype, uint64_t seed) {
  Generator gen(seed);
  return randint(0, high, shape, {.dtype = dtype}, &gen);
}

// ---- naive references (plain loops over multi-indices) ----

Tensor reference_index_select(const Tensor& x, int64_t d, const Tensor& index) {
  const auto xv = x.to_vector<double>();
  const auto iv = index.to_vector<int64_t>();
  Shape shape = x.shape();
  shape[d] = static_cast<int64_t>(iv.size());
  std::vector<double> out(static_cast<size_t>(shape_numel(shape)));
  for (int64_t p = 0; p < static_cast<int64_t>(out.size()); ++p) {
    Shape idx = unravel(p, shape);
    idx[d] = iv[idx[d]];
    out[p] = xv[ravel(idx, x.shape())];
  }
  return from_vector(out, shape);
}

Tensor reference_gather(const Tensor& x, int64_t d, const Tensor& index) {
  const auto xv = x.to_vector<double>();
  const auto iv = index.to_vector<int64_t>();
  std::vector<double> out(iv.size());
  for (int64_t p = 0; p < static_cast<int64_t>(out.size()); ++p) {
    Shape idx = unravel(p, index.shape());
    idx[d] = iv[p];
    out[p] = xv[ravel(idx, x.shape())];
  }
  return from_vector(out, index.shape());
}

// Adds in Acc, one contribution at a time in row-major order of the index (which is the order the
// kernels promise per destination), so f32 results must match bit for bit.
template <class Acc>
std::vector<Acc> reference_scatter_add(const Tensor& x, int64_t d, const Tensor& index, const Tensor& src) {
  std::vector<Acc> out;
  for (double v : x.to_vector<double>()) out.push_back(static_cast<Acc>(v));
  const auto iv = index.to_vector<int64_t>();
  const auto sv = src.to_vector<double>();
  for (int64_t p = 0; p < static_cast<int64_t>(iv.size()); ++p) {
    Shape idx = unravel(p, index.shape());
    idx[d] = iv[p];
    Acc& slot = out[ravel(idx, x.shape())];
    slot = static_cast<Acc>(slot + static_cast<Acc>(sv[p]));
  }
  return out;
}

template <class Acc>
std::vector<Acc> reference_index_add(const Tensor& x, int64_t d, const Tensor& index, const Tensor& src) {
  std::vector<Acc> out;
  for (double v : x.to_vector<double>()) out.push_back(static_cast<Acc>(v));
  const auto iv = index.to_vector<int64_t>();
  const auto sv = src.to_vector<double>();
  for (int64_t p = 0; p < src.numel(); ++p) {
    Shape idx = unravel(p, src.shape());
    idx[d] = iv[idx[d]];
    Acc& slot = out[ravel(idx, x.shape())];
    slot = static_cast<Acc>(slot + static_cast<Acc>(sv[p]));
  }
  return out;
}

Tensor reference_masked_fill(const Tensor& x, const Tensor& mask, double value) {
  const auto xv = x.to_vector<double>();
  const auto mv = raw::expand(mask, x.shape()).to_vector<bool>();
  std::vector<double> out(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) out[i] = mv[i] ? value : xv[i];
  return from_vector(out, x.shape());
}

using FakeCudaBackend = testing::HostAsDevice;  // tests/support/host_as_device.h

// ---- index_select ----

TEST(IndexSelect, MatchesReferenceForEveryDimAndIndexDtype) {
  Tensor x = random_tensor({3, 5, 4}, DType::f32, 1);
  for (DType index_dtype : {DType::i32, DType::i64}) {
    for (int64_t dim : {0, 1, 2, -1, -3}) {
      const int64_t d = dim < 0 ? dim + 3 : dim;
      Tensor index = random_index(x.size(d), {7}, index_dtype, 10 + d);  // 7 draws: repeats guaranteed
      Tensor out = raw::index_select(x, dim, index);
      Shape expected = x.shape();
      expected[d] = 7;
      EXPECT_EQ(out.shape(), expected);
      EXPECT_TRUE(all_close(out, reference_index_select(x, d, index), 0, 0)) << "dim " << dim << " " << index_dtype;
    }
  }
}

TEST(IndexSelect, NonContiguousInputsEmptyIndexAndDtypes) {
  Tensor x = raw::transpose(random_tensor({6, 4}, DType::f64, 2), 0, 1);                    // (4, 6)
  Tensor index = raw::slice(from_vector<int64_t>({5, 9, 0, 9, 5, 9, 2}, {7}), 0, 0, 7, 2);  // [5, 0, 5, 2]
  ASSERT_FALSE(index.is_contiguous());
  EXPECT_TRUE(all_close(raw::index_select(x, 1, index), reference_index_select(x, 1, index), 0, 0));
  EXPECT_TRUE(all_close(raw::index_select(x, 0, from_vector<int32_t>({3, 3, 1}, {3})),
                        reference_index_select(x, 0, from_vector<int32_t>({3, 3, 1}, {3})), 0, 0));
  Tensor none = raw::index_select(x, 1, zeros({0}, {.dtype = DType::i64}));
  EXPECT_EQ(none.shape(), (Shape{4, 0}));
  for (DType dtype : {DType::bf16, DType::i64, DType::boolean}) {
    Tensor t = raw::to(random_tensor({5, 3}, DType::f32, 3, -3, 3), dtype);
    Tensor i = from_vector<int64_t>({4, 0, 4}, {3});
    Tensor out = raw::index_select(t, 0, i);
    EXPECT_EQ(out.dtype(), dtype);
    EXPECT_TRUE(all_close(out, reference_index_select(t, 0, i), 0, 0)) << dtype;
  }
}

TEST(IndexSelect, ManySmallRowsRunInParallelAndMatch) {
  // An embedding lookup: 20000 rows of 4 from a table of 1000 (the path that splits over indices).
  Tensor table = random_tensor({1000, 4}, DType::f32, 4);
  Tensor index = random_index(1000, {20000}, DType::i64, 5);
  EXPECT_TRUE(all_close(raw::index_select(table, 0, index), reference_index_select(table, 0, index), 0, 0));
  // Large slices (split inside each slice).
  Tensor wide = random_tensor({3, 40000}, DType::f32, 6);
  Tensor rows = from_vector<int32_t>({2, 0, 2}, {3});
  EXPECT_TRUE(all_close(raw::index_select(wide, 0, rows), reference_index_select(wide, 0, rows), 0, 0));
}

TEST(IndexSelect, Errors) {
  Tensor x = zeros({3, 5});
  EXPECT_CPF_ERROR(raw::index_select(Tensor(), 0, zeros({1}, {.dtype = DType::i64})),
                   "index_select: argument 'x' is an undefined tensor");
  EXPECT_CPF_ERROR(raw::index_select(x, 0, Tensor()), "index_select: argument 'index' is an undefined tensor");
  EXPECT_CPF_ERROR(raw::index_select(scalar_tensor(1.0), 0, zeros({1}, {.dtype = DType::i64})),
                   "index_select: x must have at least one dimension, got a zero-dimensional tensor");
  EXPECT_CPF_ERROR(raw::index_select(x, 2, zeros({1}, {.dtype = DType::i64})),
                   "index_select: dim 2 out of range for a tensor of rank 2");
  EXPECT_CPF_ERROR(raw::index_select(x, 0, zeros({1})), "index_select: index must be i32 or i64, got f32");
  EXPECT_CPF_ERROR(raw::index_select(x, 0, zeros({2, 2}, {.dtype = DType::i64})),
                   "index_select: index must be 1-D, got shape [2,2]");
  EXPECT_CPF_ERROR(
      raw::index_select(x, 1, from_vector<int64_t>({0, 4, 5, 1}, {4})),
      "index_select: index 5 at position [2] is out of range for dim 1 of size 5 (expected 0 <= index < 5)");
  EXPECT_CPF_ERROR(raw::index_select(x, -2, from_vector<int32_t>({-1}, {1})),
                   "index_select: index -1 at position [0] is out of range for dim 0 of size 3");
  EXPECT_CPF_ERROR(raw::index_select(zeros({0, 2}), 0, from_vector<int32_t>({0}, {1})),
                   "index_select: index 0 at position [0] is out of range for dim 0 of size 0");
}

// ---- index_add_ ----

TEST(IndexAdd, MatchesSequentialReferenceBitForBit) {
  for (int64_t dim : {0, 1, -1}) {
    const int64_t d = dim < 0 ? dim + 2 : dim;
    Tensor dst = raw::transpose(random_tensor({5, 4}, DType::f32, 7), 0, 1);  // (4, 5) non-contiguous
    Shape src_shape = dst.shape();
    src_shape[d] = 9;
    Tensor src = random_tensor(src_shape, DType::f32, 8);
    Tensor index = random_index(dst.size(d), {9}, DType::i32, 9);
    const auto expected = reference_index_add<float>(dst, d, index, src);
    const uint64_t version = dst.version();
    raw::index_add_(dst, dim, index, src);
    EXPECT_GT(dst.version(), version);
    EXPECT_EQ(dst.to_vector<float>(), expected) << "dim " << dim;
  }
}

TEST(IndexAdd, LargeInputsStayDeterministic) {
  // Small slices, many repeated destinations: the bucketed parallel path.
  Tensor dst = random_tensor({100, 8}, DType::f32, 10);
  Tensor src = random_tensor({8192, 8}, DType::f32, 11);
  Tensor index = random_index(100, {8192}, DType::i64, 12);
  auto expected = reference_index_add<float>(dst, 0, index, src);
  raw::index_add_(dst, 0, index, src);
  EXPECT_EQ(dst.to_vector<float>(), expected);
  // Large slices: the loop over indices stays serial and each slice is split.
  Tensor wide = random_tensor({4, 40000}, DType::f32, 13);
  Tensor wide_src = random_tensor({6, 40000}, DType::f32, 14);
  Tensor rows = from_vector<int64_t>({1, 3, 1, 1, 0, 3}, {6});
  expected = reference_index_add<float>(wide, 0, rows, wide_src);
  raw::index_add_(wide, 0, rows, wide_src);
  EXPECT_EQ(wide.to_vector<float>(), expected);
}

TEST(IndexAdd, Bf16RoundsOnceAndIntegersAdd) {
  // 256 + 1 rounds back to 256 in bf16 (8 mantissa bits), so adding one at a time would never move;
  // accumulating in f32 and rounding once gives 272.
  Tensor dst = full({2}, 256.0, {.dtype = DType::bf16});
  Tensor src = ones({16}, {.dtype = DType::bf16});
  raw::index_add_(dst, 0, zeros({16}, {.dtype = DType::i64}), src);
  EXPECT_EQ(dst.to_vector<float>(), (std::vector<float>{272, 256}));
  Tensor counts = zeros({4}, {.dtype = DType::i64});
  raw::index_add_(counts, 0, from_vector<int32_t>({3, 1, 3, 3}, {4}), ones({4}, {.dtype = DType::i64}));
  EXPECT_EQ(counts.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 0, 3}));
}

TEST(IndexAdd, Errors) {
  Tensor dst = zeros({3, 2});
  Tensor index = from_vector<int64_t>({0, 2}, {2});
  Tensor src = ones({2, 2});
  EXPECT_CPF_ERROR(raw::index_add_(dst, 0, index, Tensor()), "index_add_: argument 'src' is an undefined tensor");
  EXPECT_CPF_ERROR(raw::index_add_(scalar_tensor(0.0), 0, index, src),
                   "index_add_: dst must have at least one dimension, got a zero-dimensional tensor");
  EXPECT_CPF_ERROR(raw::index_add_(dst, 2, index, src), "index_add_: dim 2 out of range for a tensor of rank 2");
  EXPECT_CPF_ERROR(raw::index_add_(dst, 0, zeros({2}), src), "index_add_: index must be i32 or i64, got f32");
  EXPECT_CPF_ERROR(raw::index_add_(dst, 0, zeros({2, 1}, {.dtype = DType::i64}), src),
                   "index_add_: index must be 1-D, got shape [2,1]");
  EXPECT_CPF_ERROR(raw::index_add_(dst, 0, index, ones({2, 2}, {.dtype = DType::f64})),
                   "index_add_: dtypes differ: f32 [3,2] vs f64 [2,2]");
  EXPECT_CPF_ERROR(
      raw::index_add_(zeros({3, 2}, {.dtype = DType::boolean}), 0, index, zeros({2, 2}, {.dtype = DType::boolean})),
      "index_add_: dtype bool is not supported (expected f32, f64, bf16, i32 or i64)");
  EXPECT_CPF_ERROR(raw::index_add_(dst, 0, index, ones({2, 3})),
                   "index_add_: src of shape [2,3] does not fit dst of shape [3,2] with 2 indices along dim 0 "
                   "(expected [2,2])");
  EXPECT_CPF_ERROR(raw::index_add_(raw::expand(zeros({1, 2}), {3, 2}), 0, index, src),
                   "index_add_: destination of shape [3,2] with strides [0,1] has elements that share memory");
  // An out-of-range index is caught before anything is written.
  EXPECT_CPF_ERROR(raw::index_add_(dst, 0, from_vector<int64_t>({1, 3}, {2}), src),
                   "index_add_: index 3 at position [1] is out of range for dim 0 of size 3");
  EXPECT_EQ(dst.to_vector<float>(), std::vector<float>(6, 0.0f));
}

// ---- gather ----

TEST(Gather, MatchesReferenceForEveryDimAndIndexDtype) {
  Tensor x = random_tensor({3, 4, 5}, DType::f32, 20);
  for (DType index_dtype : {DType::i32, DType::i64}) {
    for (int64_t dim : {0, 1, 2, -2}) {
      const int64_t d = dim < 0 ? dim + 3 : dim;
      for (int64_t k : {int64_t{1}, x.size(d) + 3, int64_t{0}}) {  // fewer, more (repeats) and no picks
        Shape shape = x.shape();
        shape[d] = k;
        Tensor index = random_index(x.size(d), shape, index_dtype, 21 + d + k);
        Tensor out = raw::gather(x, dim, index);
        EXPECT_EQ(out.shape(), shape);
        EXPECT_TRUE(all_close(out, reference_gather(x, d, index), 0, 0)) << "dim " << dim << " k " << k;
      }
    }
  }
}

TEST(Gather, NonContiguousAndExpandedInputs) {
  Tensor x = raw::permute(random_tensor({5, 3, 4}, DType::f64, 22), {1, 2, 0});     // (3, 4, 5)
  Tensor index = raw::transpose(random_index(5, {6, 4, 3}, DType::i64, 23), 0, 2);  // (3, 4, 6)
  ASSERT_FALSE(x.is_contiguous());
  ASSERT_FALSE(index.is_contiguous());
  EXPECT_TRUE(all_close(raw::gather(x, 2, index), reference_gather(x, 2, index), 0, 0));
  Tensor row = raw::expand(random_tensor({1, 6}, DType::f64, 24), {4, 6});  // stride 0 along dim 0
  Tensor cols = random_index(6, {4, 3}, DType::i32, 25);
  EXPECT_TRUE(all_close(raw::gather(row, 1, cols), reference_gather(row, 1, cols), 0, 0));
  Tensor pick_rows = random_index(4, {2, 6}, DType::i64, 26);
  EXPECT_TRUE(all_close(raw::gather(row, 0, pick_rows), reference_gather(row, 0, pick_rows), 0, 0));
}

TEST(Gather, TakeAlongAxisOfArgmaxIsTheMaximum) {
  Tensor x = random_tensor({64, 1000}, DType::f32, 27);
  Tensor at_max = raw::gather(x, 1, raw::argmax(x, 1, true));
  EXPECT_TRUE(all_close(at_max, raw::amax(x, {1}, true), 0, 0));
  // Large enough to run rows in parallel.
  Tensor index = random_index(1000, {64, 2048}, DType::i32, 28);
  EXPECT_TRUE(all_close(raw::gather(x, 1, index), reference_gather(x, 1, index), 0, 0));
}

TEST(Gather, Errors) {
  Tensor x = zeros({2, 3});
  EXPECT_CPF_ERROR(raw::gather(x, 1, Tensor()), "gather: argument 'index' is an undefined tensor");
  EXPECT_CPF_ERROR(raw::gather(scalar_tensor(1.0), 0, zeros({}, {.dtype = DType::i64})),
                   "gather: x must have at least one dimension, got a zero-dimensional tensor");
  EXPECT_CPF_ERROR(raw::gather(x, -3, zeros({2, 1}, {.dtype = DType::i64})),
                   "gather: dim -3 out of range for a tensor of rank 2");
  EXPECT_CPF_ERROR(raw::gather(x, 1, zeros({2, 1}, {.dtype = DType::boolean})),
                   "gather: index must be i32 or i64, got bool");
  EXPECT_CPF_ERROR(raw::gather(x, 1, zeros({2}, {.dtype = DType::i64})),
                   "gather: index of shape [2] must have the rank of x of shape [2,3]");
  EXPECT_CPF_ERROR(raw::gather(x, 1, zeros({3, 1}, {.dtype = DType::i64})),
                   "gather: index of shape [3,1] does not match x of shape [2,3] outside dim 1 (sizes differ at dim 0; "
                   "expand the index to broadcast it)");
  EXPECT_CPF_ERROR(raw::gather(x, 1, from_vector<int32_t>({0, 2, 3, 1}, {2, 2})),
                   "gather: index 3 at position [1,0] is out of range for dim 1 of size 3 (expected 0 <= index < 3)");
  EXPECT_CPF_ERROR(raw::gather(x, 0, from_vector<int64_t>({0, -2, 1}, {1, 3})),
                   "gather: index -2 at position [0,1] is out of range for dim 0 of size 2");
}

// ---- scatter_add / scatter_add_ ----

TEST(ScatterAdd, OutOfPlaceMatchesSequentialReferenceBitForBit) {
  Tensor x = random_tensor({4, 3, 5}, DType::f32, 30);
  for (DType index_dtype : {DType::i32, DType::i64}) {
    for (int64_t dim : {0, 1, 2, -1}) {
      const int64_t d = dim < 0 ? dim + 3 : dim;
      Shape shape = x.shape();
      shape[d] = 7;  // more contributions than destinations: repeats
      Tensor index = random_index(x.size(d), shape, index_dtype, 31 + d);
      Tensor src = random_tensor(shape, DType::f32, 32 + d);
      const auto before = x.to_vector<float>();
      Tensor out = raw::scatter_add(x, dim, index, src);
      EXPECT_EQ(out.shape(), x.shape());
      EXPECT_EQ(out.to_vector<float>(), reference_scatter_add<float>(x, d, index, src)) << "dim " << dim;
      EXPECT_EQ(x.to_vector<float>(), before);  // x untouched
    }
  }
}

TEST(ScatterAdd, InPlaceOnNonContiguousTensors) {
  Tensor dst = raw::transpose(random_tensor({5, 4}, DType::f64, 33), 0, 1);      // (4, 5)
  Tensor index = raw::transpose(random_index(4, {3, 6}, DType::i64, 34), 0, 1);  // (6, 3)
  Tensor src = raw::slice(random_tensor({6, 6}, DType::f64, 35), 1, 0, 6, 2);    // (6, 3)
  // dim 0 of dst has size 4; outside it index must match dst: use the first 3 columns of dst.
  Tensor view = raw::narrow(dst, 1, 1, 3);  // (4, 3) non-contiguous view into dst
  const auto expected = reference_scatter_add<double>(view, 0, index, src);
  const uint64_t version = dst.version();
  raw::scatter_add_(view, 0, index, src);
  EXPECT_GT(dst.version(), version);
  EXPECT_EQ(view.to_vector<double>(), expected);
  EXPECT_TRUE(all_close(
      raw::scatter_add(zeros({4, 3}, {.dtype = DType::f64}), 0, index, src),
      from_vector(reference_scatter_add<double>(zeros({4, 3}, {.dtype = DType::f64}), 0, index, src), {4, 3}), 0, 0));
}

TEST(ScatterAdd, LargeInputsStayDeterministic) {
  for (int64_t dim : {0, 1}) {
    Tensor x = random_tensor({64, 300}, DType::f32, 36);
    Shape shape = dim == 0 ? Shape{512, 300} : Shape{64, 1500};
    Tensor index = random_index(x.size(dim), shape, DType::i64, 37);
    Tensor src = random_tensor(shape, DType::f32, 38);
    const auto expected = reference_scatter_add<float>(x, dim, index, src);
    EXPECT_EQ(raw::scatter_add(x, dim, index, src).to_vector<float>(), expected) << "dim " << dim;
    raw::scatter_add_(x, dim, index, src);
    EXPECT_EQ(x.to_vector<float>(), expected) << "dim " << dim;
  }
}

TEST(ScatterAdd, Bf16RoundsOnceAndIntegersCount) {
  Tensor index = zeros({16}, {.dtype = DType::i32});
  Tensor src = ones({16}, {.dtype = DType::bf16});
  Tensor x = full({2}, 256.0, {.dtype = DType::bf16});
  Tensor out = raw::scatter_add(x, 0, index, src);
  EXPECT_EQ(out.dtype(), DType::bf16);
  EXPECT_EQ(out.to_vector<float>(), (std::vector<float>{272, 256}));
  raw::scatter_add_(x, 0, index, src);
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{272, 256}));
  // A histogram: scatter ones by value.
  Tensor counts = zeros({5}, {.dtype = DType::i32});
  raw::scatter_add_(counts, 0, from_vector<int64_t>({4, 0, 4, 2, 4}, {5}), ones({5}, {.dtype = DType::i32}));
  EXPECT_EQ(counts.to_vector<int32_t>(), (std::vector<int32_t>{1, 0, 1, 0, 3}));
}

TEST(ScatterAdd, Errors) {
  Tensor dst = zeros({3, 2});
  Tensor index = from_vector<int64_t>({0, 2, 1, 1}, {2, 2});
  Tensor src = ones({2, 2});
  EXPECT_CPF_ERROR(raw::scatter_add_(Tensor(), 0, index, src), "scatter_add_: argument 'dst' is an undefined tensor");
  EXPECT_CPF_ERROR(raw::scatter_add(dst, 0, index, Tensor()), "scatter_add: argument 'src' is an undefined tensor");
  EXPECT_CPF_ERROR(raw::scatter_add_(scalar_tensor(0.0), 0, zeros({}, {.dtype = DType::i64}), scalar_tensor(1.0)),
                   "scatter_add_: dst must have at least one dimension, got a zero-dimensional tensor");
  EXPECT_CPF_ERROR(raw::scatter_add(dst, 2, index, src), "scatter_add: dim 2 out of range for a tensor of rank 2");
  EXPECT_CPF_ERROR(raw::scatter_add(dst, 0, zeros({2, 2}), src), "scatter_add: index must be i32 or i64, got f32");
  EXPECT_CPF_ERROR(raw::scatter_add(dst, 0, zeros({4}, {.dtype = DType::i64}), ones({4})),
                   "scatter_add: index of shape [4] must have the rank of x of shape [3,2]");
  EXPECT_CPF_ERROR(raw::scatter_add_(dst, 0, zeros({2, 3}, {.dtype = DType::i64}), ones({2, 3})),
                   "scatter_add_: index of shape [2,3] does not match dst of shape [3,2] outside dim 0 (sizes differ "
                   "at dim 1");
  EXPECT_CPF_ERROR(raw::scatter_add_(dst, 0, index, ones({2, 2}, {.dtype = DType::bf16})),
                   "scatter_add_: dtypes differ: f32 [3,2] vs bf16 [2,2]");
  EXPECT_CPF_ERROR(
      raw::scatter_add(zeros({3, 2}, {.dtype = DType::boolean}), 0, index, zeros({2, 2}, {.dtype = DType::boolean})),
      "scatter_add: dtype bool is not supported (expected f32, f64, bf16, i32 or i64)");
  EXPECT_CPF_ERROR(raw::scatter_add_(dst, 0, index, ones({1, 2})),
                   "scatter_add_: src of shape [1,2] must have the shape of index [2,2]");
  EXPECT_CPF_ERROR(raw::scatter_add_(raw::expand(zeros({3, 1}), {3, 2}), 0, index, src),
                   "scatter_add_: destination of shape [3,2] with strides [1,0] has elements that share memory");
  // Nothing is written when an index is out of range.
  EXPECT_CPF_ERROR(
      raw::scatter_add_(dst, 0, from_vector<int32_t>({0, 1, 3, 0}, {2, 2}), src),
      "scatter_add_: index 3 at position [1,0] is out of range for dim 0 of size 3 (expected 0 <= index < 3)");
  EXPECT_EQ(dst.to_vector<float>(), std::vector<float>(6, 0.0f));
  EXPECT_CPF_ERROR(raw::scatter_add(dst, 1, from_vector<int64_t>({0, 1, 2, 0, 1, 1}, {3, 2}), ones({3, 2})),
                   "scatter_add: index 2 at position [1,0] is out of range for dim 1 of size 2");
}

// ---- masked_fill ----

TEST(MaskedFill, MatchesReferenceWithBroadcastMasks) {
  Tensor x = random_tensor({3, 4}, DType::f32, 40);
  Tensor full_mask = raw::compare(raw::CompareOp::gt, random_tensor({3, 4}, DType::f32, 41), 0.0);
  Tensor row_mask = bool_tensor({true, false, false, true}, {4});
  Tensor col_mask = bool_tensor({false, true, false}, {3, 1});
  Tensor scalar_mask = bool_tensor({true}, {});
  for (const Tensor& mask : {full_mask, row_mask, col_mask, scalar_mask}) {
    EXPECT_TRUE(all_close(raw::masked_fill(x, mask, 2.5), reference_masked_fill(x, mask, 2.5), 0, 0))
        << shape_str(mask.shape());
  }
  // -inf, as attention masks use it; non-contiguous x.
  Tensor xt = raw::transpose(random_tensor({4, 3}, DType::f32, 42), 0, 1);
  const double ninf = -std::numeric_limits<double>::infinity();
  EXPECT_TRUE(all_close(raw::masked_fill(xt, full_mask, ninf), reference_masked_fill(xt, full_mask, ninf), 0, 0));
  // Other dtypes.
  Tensor xi = from_vector<int64_t>({1, 2, 3, 4}, {2, 2});
  EXPECT_EQ(raw::masked_fill(xi, bool_tensor({false, true}, {2}), -7).to_vector<int64_t>(),
            (std::vector<int64_t>{1, -7, 3, -7}));
  Tensor xb = bool_tensor({true, true, false}, {3});
  EXPECT_EQ(raw::masked_fill(xb, bool_tensor({true, false, true}, {3}), 0).to_vector<bool>(),
            (std::vector<bool>{false, true, false}));
  Tensor xh = raw::to(x, DType::bf16);
  Tensor yh = raw::masked_fill(xh, full_mask, 0.1);
  EXPECT_EQ(yh.dtype(), DType::bf16);
  EXPECT_TRUE(all_close(
      yh, raw::to(reference_masked_fill(xh, full_mask, static_cast<float>(bfloat16(0.1f))), DType::bf16), 0, 0));
}

TEST(MaskedFill, Errors) {
  Tensor x = zeros({4});
  EXPECT_CPF_ERROR(raw::masked_fill(x, Tensor(), 1.0), "masked_fill: argument 'mask' is an undefined tensor");
  EXPECT_CPF_ERROR(raw::masked_fill(x, zeros({4}), 1.0), "masked_fill: mask must be bool, got f32");
  EXPECT_CPF_ERROR(raw::masked_fill(x, zeros({2, 4}, {.dtype = DType::boolean}), 1.0),
                   "masked_fill: mask of shape [2,4] cannot be broadcast to x of shape [4]");
  EXPECT_CPF_ERROR(raw::masked_fill(x, zeros({3}, {.dtype = DType::boolean}), 1.0),
                   "masked_fill: shapes [3] and [4] are not broadcastable");
  Tensor mask = zeros({4}, {.dtype = DType::boolean});
  EXPECT_CPF_ERROR(raw::masked_fill(zeros({4}, {.dtype = DType::i64}), mask, 0.5),
                   "masked_fill: value 0.5 is not representable in i64");
  EXPECT_CPF_ERROR(raw::masked_fill(zeros({4}, {.dtype = DType::i32}), mask, 3e9),
                   "masked_fill: value 3e+09 is not representable in i32");
  EXPECT_CPF_ERROR(raw::masked_fill(zeros({4}, {.dtype = DType::boolean}), mask, 2),
                   "masked_fill: value 2 is not representable in bool");
  EXPECT_CPF_ERROR(raw::masked_fill(zeros({4}, {.dtype = DType::i64}), mask, std::nan("")),
                   "is not representable in i64");
}

// ---- devices ----

TEST(IndexDevices, MixedAndUnsupportedDevicesAreRejected) {
  if (has_device_backend(DeviceType::cuda)) {
    GTEST_SKIP() << "a real CUDA backend is registered; device dispatch is covered by the GPU suites";
  }
  static FakeCudaBackend fake;
  register_device_backend(DeviceType::cuda, &fake);
  {
    const TensorOptions on_dev{.device = Device::cuda(0)};
    Tensor x = zeros({3, 2});
    Tensor x_dev = empty({3, 2}, on_dev);
    Tensor index = zeros({3, 2}, {.dtype = DType::i64});
    Tensor index_dev = empty({3, 2}, {.dtype = DType::i64, .device = Device::cuda(0)});
    Tensor index1 = zeros({2}, {.dtype = DType::i64});
    Tensor index1_dev = empty({2}, {.dtype = DType::i64, .device = Device::cuda(0)});
    Tensor mask_dev = empty({3, 2}, {.dtype = DType::boolean, .device = Device::cuda(0)});
    EXPECT_CPF_ERROR(raw::index_select(x, 0, index1_dev),
                     "index_select: tensors are on different devices: cpu vs cuda:0");
    EXPECT_CPF_ERROR(raw::index_select(x_dev, 0, index1_dev),
                     "index_select: no kernel for device cuda:0 in this build");
    EXPECT_CPF_ERROR(raw::index_add_(x, 0, index1, empty({2, 2}, on_dev)),
                     "index_add_: tensors are on different devices: cpu vs cuda:0");
    EXPECT_CPF_ERROR(raw::index_add_(x_dev, 0, index1_dev, empty({2, 2}, on_dev)),
                     "index_add_: no kernel for device cuda:0 in this build");
    EXPECT_CPF_ERROR(raw::gather(x_dev, 0, index), "gather: tensors are on different devices: cuda:0 vs cpu");
    EXPECT_CPF_ERROR(raw::gather(x_dev, 0, index_dev), "gather: no kernel for device cuda:0 in this build");
    EXPECT_CPF_ERROR(raw::scatter_add(x, 0, index, x_dev),
                     "scatter_add: tensors are on different devices: cpu vs cuda:0");
    EXPECT_CPF_ERROR(raw::scatter_add_(x_dev, 0, index_dev, x_dev), "scatter_add_: no kernel for device cuda:0");
    EXPECT_CPF_ERROR(raw::masked_fill(x, mask_dev, 0), "masked_fill: tensors are on different devices: cpu vs cuda:0");
    EXPECT_CPF_ERROR(raw::masked_fill(x_dev, mask_dev, 0), "masked_fill: no kernel for device cuda:0 in this build");
  }
  register_device_backend(DeviceType::cuda, nullptr);
}

}  // namespace
}  // namespace cpf
