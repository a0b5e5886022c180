// View ops (framework/tensor/ops/views.h) and copies (ops/copy.h): geometry, values against naive
// index arithmetic, storage sharing, and every error message.
#include "framework/tensor/ops/views.h"

#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "framework/tensor/ops/copy.h"
#include "support/test_utils.h"

namespace cpf {
namespace {

// 0, 1, 2, ... as f64 in the given shape, so every element names its flat position.
Tensor iota(const Shape& shape, DType dtype = DType::f64) {
  return raw::reshape(arange(0.0, static_cast<double>(shape_numel(shape)), 1.0, {.dtype = dtype}), shape);
}

std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

// Reads element `index` of `t` through its strides (the oracle for every view).
double at(const Tensor& t, const std::vector<int64_t>& index) {
  const auto capacity = static_cast<int64_t>(t.storage()->nbytes() / dtype_size(t.dtype()));
  const auto flat = raw::as_strided(t, {capacity}, {1}, 0).to_vector<double>();
  int64_t off = t.offset();
  for (size_t d = 0; d < index.size(); ++d) off += index[d] * t.strides()[d];
  return flat[static_cast<size_t>(off)];
}

// ---- reshape / view ----

TEST(View, ContiguousViewSharesStorage) {
  Tensor t = iota({2, 3, 4});
  Tensor v = raw::view(t, {6, 4});
  EXPECT_EQ(v.shape(), (Shape{6, 4}));
  EXPECT_EQ(v.strides(), (Shape{4, 1}));
  EXPECT_EQ(v.storage(), t.storage());
  EXPECT_EQ(values(v), values(t));
  EXPECT_EQ(raw::view(t, {-1}).shape(), (Shape{24}));
  EXPECT_EQ(raw::view(t, {4, -1, 2}).shape(), (Shape{4, 3, 2}));
  EXPECT_EQ(raw::view(t, {1, 24, 1}).shape(), (Shape{1, 24, 1}));
  EXPECT_EQ(raw::view(raw::view(t, {24}), {2, 3, 4}).strides(), (Shape{12, 4, 1}));
  // 0-d <-> 1-element shapes.
  Tensor s = scalar_tensor(5.0);
  EXPECT_EQ(raw::view(s, {1, 1}).shape(), (Shape{1, 1}));
  EXPECT_EQ(raw::view(raw::view(s, {1}), {}).dim(), 0);
  EXPECT_EQ(raw::view(s, {-1}).shape(), (Shape{1}));
  // Zero-size tensors view freely.
  EXPECT_EQ(raw::view(empty({0, 4}), {2, 0, 8}).shape(), (Shape{2, 0, 8}));
  // With a 0 among the other dims, -1 could be anything (as in PyTorch).
  EXPECT_CPF_ERROR(raw::view(empty({0, 4}), {0, -1, 2}), "view: the -1 in shape [0,-1,2] is ambiguous");
}

TEST(View, NonContiguousViewsWhereStridesAllow) {
  Tensor t = iota({4, 6});
  // Rows 1..3 of a contiguous matrix stay viewable as a flat range.
  Tensor rows = raw::narrow(t, 0, 1, 2);
  Tensor flat = raw::view(rows, {12});
  EXPECT_EQ(flat.storage(), t.storage());
  EXPECT_EQ(values(flat), values(raw::contiguous(rows)));
  // Splitting and inserting unit dims on a transposed tensor keeps its strides per group.
  Tensor tr = raw::transpose(t, 0, 1);  // (6, 4) strides (1, 6)
  Tensor split = raw::view(tr, {2, 3, 1, 4});
  EXPECT_EQ(split.strides()[0], 3);
  EXPECT_EQ(split.strides()[1], 1);
  EXPECT_EQ(split.strides()[3], 6);
  EXPECT_EQ(values(split), values(raw::reshape(raw::contiguous(tr), {2, 3, 1, 4})));
  // Columns sliced with a step: each kept column is still one element.
  Tensor cols = raw::slice(t, 1, 0, 6, 2);  // (4, 3) strides (6, 2)
  EXPECT_EQ(values(raw::view(cols, {4, 3, 1})), values(cols));
  EXPECT_EQ(values(raw::view(cols, {2, 2, 3})), values(cols));
}

// Exact oracle: `x` can be viewed as `target` iff one set of strides maps every row-major index of
// the target onto the memory offset of the same row-major element of x. Those strides, if they
// exist, are the offsets of the unit steps.
bool viewable(const Tensor& x, const Shape& target) {
  std::vector<int64_t> offsets;  // memory offset of x's elements in row-major order
  const int64_t n = x.numel();
  for (int64_t flat = 0; flat < n; ++flat) {
    int64_t off = 0, rest = flat;
    for (int64_t d = x.dim() - 1; d >= 0; --d) {
      off += (rest % x.size(d)) * x.stride(d);
      rest /= x.size(d);
    }
    offsets.push_back(off);
  }
  const Shape unit = contiguous_strides(target);
  Shape strides(target.size(), 0);
  for (size_t d = 0; d < target.size(); ++d) {
    if (target[d] > 1) strides[d] = offsets[static_cast<size_t>(unit[d])] - offsets[0];
  }
  for (int64_t flat = 0; flat < n; ++flat) {
    int64_t off = offsets[0], rest = flat;
    for (int64_t d = static_cast<int64_t>(target.size()) - 1; d >= 0; --d) {
      off += (rest % target[d]) * strides[d];
      rest /= target[d];
    }
    if (off != offsets[static_cast<size_t>(flat)]) return false;
  }
  return true;
}

// A random target shape for `shape`: adjacent dims merged, dims split, unit dims inserted.
Shape random_target(Shape shape, std::mt19937& rng) {
  for (int step = 0, steps = 1 + static_cast<int>(rng() % 3); step < steps; ++step) {
    const size_t d = rng() % shape.size();
    switch (rng() % 3) {
      case 0:
        if (d + 1 < shape.size()) {
          shape[d] *= shape[d + 1];
          shape.erase(shape.begin() + static_cast<int64_t>(d) + 1);
        }
        break;
      case 1:
        for (int64_t f : {2, 3, 5}) {
          if (shape[d] % f == 0 && shape[d] > f) {
            shape[d] /= f;
            shape.insert(shape.begin() + static_cast<int64_t>(d), f);
            break;
          }
        }
        break;
      default: shape.insert(shape.begin() + static_cast<int64_t>(rng() % (shape.size() + 1)), 1);
    }
  }
  return shape;
}

TEST(View, RandomisedViewAndReshapeAgreeWithCopies) {
  std::mt19937 rng(7);
  int views_made = 0, views_refused = 0;
  for (int trial = 0; trial < 400; ++trial) {
    std::vector<int64_t> perm{0, 1, 2, 3};
    std::shuffle(perm.begin(), perm.end(), rng);
    Tensor x = raw::permute(iota({2, 3, 4, 5}), perm);
    if (trial % 3 == 0) x = raw::slice(x, static_cast<int64_t>(rng() % 4), 0, 6, 2);  // gaps between elements
    if (trial % 5 == 0) x = raw::unsqueeze(x, static_cast<int64_t>(rng() % 5));
    const Shape target = random_target(x.shape(), rng);
    const bool expect_view = viewable(x, target);
    Tensor expected = raw::reshape(raw::contiguous(x), target);
    Tensor r = raw::reshape(x, target);
    ASSERT_EQ(values(r), values(expected));
    SCOPED_TRACE("shape " + shape_str(x.shape()) + " strides " + shape_str(x.strides()) + " -> " + shape_str(target));
    if (expect_view) {
      ++views_made;
      Tensor v = raw::view(x, target);
      EXPECT_EQ(v.storage(), x.storage());
      ASSERT_EQ(values(v), values(expected));
      EXPECT_EQ(r.storage(), x.storage()) << "reshape must not copy when a view is possible";
    } else {
      ++views_refused;
      EXPECT_CPF_ERROR(raw::view(x, target), "without copying (use reshape)");
      EXPECT_NE(r.storage(), x.storage());
    }
  }
  EXPECT_GT(views_made, 50);
  EXPECT_GT(views_refused, 50);
}

TEST(View, Errors) {
  Tensor t = iota({2, 3, 4});
  EXPECT_CPF_ERROR(raw::view(t, {-1, -1}), "view: only one dimension can be -1, got [-1,-1]");
  EXPECT_CPF_ERROR(raw::reshape(t, {5, -1}), "reshape: shape [5,-1] is invalid for 24 elements");
  EXPECT_CPF_ERROR(raw::view(t, {-2, 12}), "view: invalid dimension -2 in shape [-2,12]");
  EXPECT_CPF_ERROR(raw::view(t, {5, 5}), "view: shape [5,5] is invalid for input of 24 elements");
  EXPECT_CPF_ERROR(raw::view(t, {0, -1}), "view: the -1 in shape [0,-1] is ambiguous: the other dims multiply to 0");
  EXPECT_CPF_ERROR(raw::view(raw::transpose(iota({3, 4}), 0, 1), {12}),
                   "view: cannot view a tensor of shape [4,3] and strides [1,4] as [12] without copying (use reshape)");
}

TEST(Reshape, CopiesOnlyWhenNeeded) {
  Tensor t = iota({3, 4});
  Tensor same = raw::reshape(t, {4, 3});
  EXPECT_EQ(same.storage(), t.storage());
  Tensor tr = raw::transpose(t, 0, 1);
  Tensor copied = raw::reshape(tr, {12});
  EXPECT_NE(copied.storage(), t.storage());
  EXPECT_EQ(values(copied), (std::vector<double>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  EXPECT_TRUE(copied.is_contiguous());
  // The copy is independent of the base.
  raw::fill_(copied, -1);
  EXPECT_EQ(at(t, {0, 0}), 0);
}

// ---- permute / transpose ----

TEST(Permute, ValuesAndStrides) {
  Tensor t = iota({2, 3, 4});
  Tensor p = raw::permute(t, {2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(p.strides(), (Shape{1, 12, 4}));
  EXPECT_EQ(p.storage(), t.storage());
  EXPECT_FALSE(p.is_contiguous());
  for (int64_t a = 0; a < 4; ++a)
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t c = 0; c < 3; ++c) ASSERT_EQ(at(p, {a, b, c}), b * 12 + c * 4 + a);
  const auto pv = values(p);
  EXPECT_EQ(pv[1], 4);  // p[0][0][1] = t[0][1][0]
  EXPECT_EQ(raw::permute(t, {-1, 0, -2}).shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(values(raw::permute(p, {1, 2, 0})), values(t));
  EXPECT_EQ(raw::permute(scalar_tensor(1.0), {}).dim(), 0);
}

TEST(Permute, Transpose) {
  Tensor t = iota({2, 3, 4});
  Tensor tr = raw::transpose(t, 0, -1);
  EXPECT_EQ(tr.shape(), (Shape{4, 3, 2}));
  EXPECT_EQ(tr.strides(), (Shape{1, 4, 12}));
  EXPECT_EQ(at(tr, {3, 2, 1}), 1 * 12 + 2 * 4 + 3);
  EXPECT_EQ(raw::transpose(t, 1, 1).strides(), t.strides());
  EXPECT_EQ(values(raw::transpose(raw::transpose(t, 0, 2), 2, 0)), values(t));
  // A 0-d tensor transposes with itself (dims 0 and -1 both name "no dim").
  EXPECT_EQ(raw::transpose(scalar_tensor(2.0), 0, -1).item<double>(), 2.0);
}

TEST(Permute, Errors) {
  Tensor t = iota({2, 3, 4});
  EXPECT_CPF_ERROR(raw::permute(t, {0, 1}), "permute: 2 dims given for a tensor of rank 3 (dims=[0,1])");
  EXPECT_CPF_ERROR(raw::permute(t, {1, 1, 0}), "permute: dim 1 repeated in [1,1,0]");
  EXPECT_CPF_ERROR(raw::permute(t, {0, -2, 1}), "permute: dim 1 repeated in [0,-2,1]");
  EXPECT_CPF_ERROR(raw::permute(t, {0, 1, 3}), "permute: dim 3 out of range for a tensor of rank 3 (expected -3..2)");
  EXPECT_CPF_ERROR(raw::transpose(t, 0, 3), "transpose: dim 3 out of range for a tensor of rank 3 (expected -3..2)");
  EXPECT_CPF_ERROR(raw::transpose(t, -4, 0), "transpose: dim -4 out of range");
  EXPECT_CPF_ERROR(raw::transpose(scalar_tensor(1.0), 0, 1), "transpose: dim 1 out of range for a tensor of rank 0");
}

// ---- narrow / slice / select ----

TEST(Narrow, ValuesAndBounds) {
  Tensor t = iota({3, 4});
  Tensor n = raw::narrow(t, 1, 1, 2);
  EXPECT_EQ(n.shape(), (Shape{3, 2}));
  EXPECT_EQ(n.offset(), 1);
  EXPECT_EQ(values(n), (std::vector<double>{1, 2, 5, 6, 9, 10}));
  EXPECT_EQ(values(raw::narrow(t, -2, 2, 1)), (std::vector<double>{8, 9, 10, 11}));
  EXPECT_EQ(raw::narrow(t, 0, 3, 0).numel(), 0);
  EXPECT_EQ(values(raw::narrow(raw::narrow(t, 1, 1, 3), 1, 1, 2)), (std::vector<double>{2, 3, 6, 7, 10, 11}));
  EXPECT_CPF_ERROR(raw::narrow(t, 1, 2, 3), "narrow: range [2, 5) out of bounds for dim 1 of size 4 (shape [3,4])");
  EXPECT_CPF_ERROR(raw::narrow(t, 0, -1, 1), "narrow: range [-1, 0) out of bounds for dim 0 of size 3");
  EXPECT_CPF_ERROR(raw::narrow(t, 0, 1, -1), "narrow: range [1, 0) out of bounds");
  EXPECT_CPF_ERROR(raw::narrow(t, 2, 0, 1), "narrow: dim 2 out of range for a tensor of rank 2 (expected -2..1)");
  EXPECT_CPF_ERROR(raw::narrow(scalar_tensor(1.0), 0, 0, 1), "rank 0");
}

// Naive python-style slice indices.
std::vector<int64_t> slice_indices(int64_t n, int64_t start, int64_t end, int64_t step) {
  auto norm = [n](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + n : i, 0, n); };
  std::vector<int64_t> out;
  for (int64_t i = norm(start); i < norm(end); i += step) out.push_back(i);
  return out;
}

TEST(Slice, NegativeClampedAndStepped) {
  Tensor t = iota({2, 10});
  for (int64_t start : {-15, -10, -3, -1, 0, 2, 9, 10, 14}) {
    for (int64_t end : {-12, -4, -1, 0, 3, 10, 100}) {
      for (int64_t step : {1, 2, 3, 7}) {
        Tensor s = raw::slice(t, 1, start, end, step);
        const auto idx = slice_indices(10, start, end, step);
        ASSERT_EQ(s.shape(), (Shape{2, static_cast<int64_t>(idx.size())})) << start << ":" << end << ":" << step;
        std::vector<double> expected;
        for (int64_t r = 0; r < 2; ++r)
          for (int64_t i : idx) expected.push_back(static_cast<double>(r * 10 + i));
        ASSERT_EQ(values(s), expected) << start << ":" << end << ":" << step;
        EXPECT_EQ(s.storage(), t.storage());
      }
    }
  }
  Tensor every_other = raw::slice(t, -1, 1, 10, 2);
  EXPECT_EQ(every_other.strides(), (Shape{10, 2}));
  EXPECT_EQ(every_other.offset(), 1);
  EXPECT_EQ(values(raw::slice(every_other, 1, 1, 4, 2)), (std::vector<double>{3, 7, 13, 17}));
  EXPECT_CPF_ERROR(raw::slice(t, 1, 0, 5, 0), "slice: step must be positive, got 0");
  EXPECT_CPF_ERROR(raw::slice(t, 1, 0, 5, -1), "slice: step must be positive, got -1");
  EXPECT_CPF_ERROR(raw::slice(t, 2, 0, 5), "slice: dim 2 out of range");
}

TEST(Select, RemovesTheDim) {
  Tensor t = iota({3, 4});
  Tensor row = raw::select(t, 0, 1);
  EXPECT_EQ(row.shape(), (Shape{4}));
  EXPECT_EQ(values(row), (std::vector<double>{4, 5, 6, 7}));
  Tensor col = raw::select(t, 1, -1);
  EXPECT_EQ(col.shape(), (Shape{3}));
  EXPECT_EQ(col.strides(), (Shape{4}));
  EXPECT_EQ(values(col), (std::vector<double>{3, 7, 11}));
  Tensor one = raw::select(row, 0, 2);
  EXPECT_EQ(one.dim(), 0);
  EXPECT_EQ(one.item<double>(), 6);
  EXPECT_CPF_ERROR(raw::select(t, 0, 3), "select: index 3 out of range for dim 0 of size 3");
  EXPECT_CPF_ERROR(raw::select(t, 1, -5), "select: index -5 out of range for dim 1 of size 4");
  EXPECT_CPF_ERROR(raw::select(t, 2, 0), "select: dim 2 out of range");
  EXPECT_CPF_ERROR(raw::select(scalar_tensor(1.0), 0, 0), "rank 0");
}

// ---- expand / squeeze / unsqueeze / flatten ----

TEST(Expand, BroadcastsWithZeroStrides) {
  Tensor t = iota({3, 1});
  Tensor e = raw::expand(t, {2, 3, 4});
  EXPECT_EQ(e.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(e.strides(), (Shape{0, 1, 0}));
  EXPECT_EQ(e.storage(), t.storage());
  std::vector<double> expected;
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 4; ++j) expected.push_back(i);
  EXPECT_EQ(values(e), expected);
  EXPECT_EQ(raw::expand(t, {-1, 5}).shape(), (Shape{3, 5}));
  EXPECT_EQ(raw::expand(t, {0, 3, 2}).numel(), 0);
  EXPECT_EQ(raw::expand(scalar_tensor(4.0), {2, 2}).to_vector<float>(), std::vector<float>(4, 4.0f));
  EXPECT_EQ(raw::expand(t, {3, 1}).strides(), t.strides());
}

TEST(Expand, Errors) {
  Tensor t = iota({2, 3});
  EXPECT_CPF_ERROR(raw::expand(t, {4, 3}), "expand: shape [2,3] cannot be expanded to [4,3] (dim 0: 2 -> 4)");
  EXPECT_CPF_ERROR(raw::expand(t, {3}), "expand: cannot expand shape [2,3] to fewer dims [3]");
  EXPECT_CPF_ERROR(raw::expand(t, {-1, 2, 3}), "expand: new leading dimension -1 must be non-negative in [-1,2,3]");
  EXPECT_CPF_ERROR(raw::expand(iota({1, 3}), {-2, 3}), "expand: invalid size -2 at dim 0 of [-2,3]");
}

TEST(Squeeze, AndUnsqueeze) {
  Tensor t = iota({3, 1, 2, 1});
  EXPECT_EQ(raw::squeeze(t, 1).shape(), (Shape{3, 2, 1}));
  EXPECT_EQ(raw::squeeze(t, -1).shape(), (Shape{3, 1, 2}));
  EXPECT_EQ(raw::squeeze(t).shape(), (Shape{3, 2}));
  EXPECT_EQ(raw::squeeze(t).strides(), (Shape{2, 1}));
  EXPECT_EQ(raw::squeeze(iota({1, 1})).dim(), 0);
  EXPECT_EQ(raw::squeeze(scalar_tensor(1.0), 0).dim(), 0);
  EXPECT_EQ(values(raw::squeeze(t)), values(t));
  EXPECT_CPF_ERROR(raw::squeeze(t, 0), "squeeze: dim 0 has size 3, not 1 (shape [3,1,2,1])");
  EXPECT_CPF_ERROR(raw::squeeze(t, 4), "squeeze: dim 4 out of range for a tensor of rank 4");

  Tensor m = iota({2, 3});
  EXPECT_EQ(raw::unsqueeze(m, 0).shape(), (Shape{1, 2, 3}));
  EXPECT_EQ(raw::unsqueeze(m, 1).shape(), (Shape{2, 1, 3}));
  EXPECT_EQ(raw::unsqueeze(m, 2).shape(), (Shape{2, 3, 1}));
  EXPECT_EQ(raw::unsqueeze(m, -1).shape(), (Shape{2, 3, 1}));
  EXPECT_EQ(raw::unsqueeze(m, -3).shape(), (Shape{1, 2, 3}));
  EXPECT_TRUE(raw::unsqueeze(m, 1).is_contiguous());
  EXPECT_EQ(raw::unsqueeze(scalar_tensor(1.0), 0).shape(), (Shape{1}));
  EXPECT_EQ(values(raw::unsqueeze(raw::transpose(m, 0, 1), 1)), values(raw::transpose(m, 0, 1)));
  EXPECT_CPF_ERROR(raw::unsqueeze(m, 3), "unsqueeze: dim 3 out of range for a tensor of rank 3 (expected -3..2)");
  EXPECT_CPF_ERROR(raw::unsqueeze(m, -4), "unsqueeze: dim -4 out of range");
}

TEST(Flatten, Ranges) {
  Tensor t = iota({2, 3, 4, 5});
  EXPECT_EQ(raw::flatten(t).shape(), (Shape{120}));
  EXPECT_EQ(raw::flatten(t, 1).shape(), (Shape{2, 60}));
  EXPECT_EQ(raw::flatten(t, 1, 2).shape(), (Shape{2, 12, 5}));
  EXPECT_EQ(raw::flatten(t, -2, -1).shape(), (Shape{2, 3, 20}));
  EXPECT_EQ(raw::flatten(t, 2, 2).shape(), (Shape{2, 3, 4, 5}));
  EXPECT_EQ(raw::flatten(t).storage(), t.storage());
  EXPECT_EQ(raw::flatten(scalar_tensor(3.0)).shape(), (Shape{1}));
  Tensor tr = raw::transpose(t, 0, 3);
  EXPECT_EQ(values(raw::flatten(tr)), values(raw::contiguous(tr)));
  EXPECT_CPF_ERROR(raw::flatten(t, 2, 1), "flatten: start_dim 2 comes after end_dim 1");
  EXPECT_CPF_ERROR(raw::flatten(t, 0, 4), "flatten: dim 4 out of range");
}

// ---- as_strided ----

TEST(AsStrided, WindowsAndBounds) {
  Tensor t = iota({12});
  Tensor windows = raw::as_strided(t, {4, 3}, {2, 1}, 1);  // overlapping windows of 3, hop 2
  EXPECT_EQ(values(windows), (std::vector<double>{1, 2, 3, 3, 4, 5, 5, 6, 7, 7, 8, 9}));
  EXPECT_EQ(values(raw::as_strided(t, {3, 3}, {3, 1}, 3)), (std::vector<double>{3, 4, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(raw::as_strided(t, {}, {}, 11).item<double>(), 11);
  EXPECT_EQ(raw::as_strided(t, {0, 5}, {100, 100}, 12).numel(), 0) << "an empty view reaches nothing";
  // The view is bounded by the storage, not by the input view.
  EXPECT_EQ(values(raw::as_strided(raw::narrow(t, 0, 0, 2), {2}, {1}, 10)), (std::vector<double>{10, 11}));
  EXPECT_CPF_ERROR(raw::as_strided(t, {3, 3}, {3, 1}, 4),
                   "as_strided: view shape [3,3] strides [3,1] offset 4 reaches element 12 beyond a storage of 12 "
                   "elements");
  EXPECT_CPF_ERROR(raw::as_strided(t, {2}, {1}, -1), "as_strided: view shape [2] strides [1] offset -1");
  EXPECT_CPF_ERROR(raw::as_strided(t, {2}, {-1}, 5), "as_strided: negative size or stride: shape [2] strides [-1]");
  EXPECT_CPF_ERROR(raw::as_strided(t, {-2}, {1}, 0), "as_strided: negative size or stride");
  EXPECT_CPF_ERROR(raw::as_strided(t, {2, 2}, {1}, 0), "as_strided: shape [2,2] and strides [1] differ in rank");
}

// ---- sharing ----

TEST(Sharing, WritesThroughViewsReachTheBase) {
  Tensor base = zeros({3, 4}, {.dtype = DType::f64});
  raw::fill_(raw::narrow(base, 1, 1, 2), 1.0);
  raw::fill_(raw::select(base, 0, 2), 2.0);
  raw::copy_(raw::slice(raw::transpose(base, 0, 1), 0, 3, 4), from_vector<double>({7, 8, 9}, {3}));
  EXPECT_EQ(values(base), (std::vector<double>{0, 1, 1, 7, 0, 1, 1, 8, 2, 2, 2, 9}));
}

TEST(Sharing, VersionCounterIsShared) {
  Tensor base = zeros({4, 4});
  Tensor view = raw::transpose(raw::narrow(base, 0, 1, 2), 0, 1);
  Tensor other = raw::reshape(base, {16});
  const uint64_t v0 = base.version();
  EXPECT_EQ(view.version(), v0);
  raw::fill_(view, 3.0);
  EXPECT_EQ(base.version(), v0 + 1);
  EXPECT_EQ(other.version(), v0 + 1);
  raw::copy_(base, ones({4}));
  EXPECT_EQ(view.version(), v0 + 2);
  // A copy has its own counter.
  Tensor c = raw::clone(base);
  raw::zero_(c);
  EXPECT_EQ(base.version(), v0 + 2);
}

// ---- copies and conversions ----

TEST(Copy, BroadcastConvertAndErrors) {
  Tensor dst = zeros({2, 3}, {.dtype = DType::i32});
  raw::copy_(dst, from_vector<double>({1.9, -2.9, 3}, {3}));  // broadcast over rows, truncating
  EXPECT_EQ(dst.to_vector<int32_t>(), (std::vector<int32_t>{1, -2, 3, 1, -2, 3}));
  raw::copy_(dst, full({}, 5.0, {.dtype = DType::f32}));
  EXPECT_EQ(dst.to_vector<int32_t>(), std::vector<int32_t>(6, 5));
  EXPECT_CPF_ERROR(raw::copy_(dst, zeros({4})), "copy_: shapes [2,3] and [4] are not broadcastable (dim 1: 3 vs 4)");
  EXPECT_CPF_ERROR(raw::copy_(zeros({3}), zeros({2, 3})),
                   "copy_: source of shape [2,3] cannot be broadcast to destination [3]");
  EXPECT_CPF_ERROR(raw::copy_(Tensor(), zeros({3})), "copy_: argument 'dst' is an undefined tensor");
  EXPECT_CPF_ERROR(raw::copy_(zeros({3}), Tensor()), "copy_: argument 'src' is an undefined tensor");
  EXPECT_CPF_ERROR(raw::fill_(Tensor(), 1.0), "fill_: argument 'dst' is an undefined tensor");
  // Non-contiguous source and destination.
  Tensor a = iota({3, 4});
  Tensor b = zeros({4, 3}, {.dtype = DType::f64});
  raw::copy_(raw::transpose(b, 0, 1), a);
  EXPECT_EQ(values(b), values(raw::transpose(a, 0, 1)));
  raw::copy_(b, zeros({4, 3}, {.dtype = DType::f64}));  // large enough to go parallel below
  Tensor big_src = iota({300, 300});
  Tensor big_dst = zeros({300, 300}, {.dtype = DType::f32});
  raw::copy_(big_dst, raw::transpose(big_src, 0, 1));
  EXPECT_EQ(big_dst.to_vector<double>(), values(raw::transpose(big_src, 0, 1)));
}

TEST(Copy, ConversionsBetweenDTypes) {
  Tensor f = from_vector<double>({0.0, -0.0, 1e-300, 2.5, -1.0}, {5});
  EXPECT_EQ(raw::to(f, DType::boolean).to_vector<bool>(), (std::vector<bool>{false, false, true, true, true}));
  EXPECT_EQ(raw::to(f, DType::i64).to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 0, 2, -1}));
  EXPECT_EQ(raw::to(raw::to(f, DType::boolean), DType::f32).to_vector<float>(), (std::vector<float>{0, 0, 1, 1, 1}));
  Tensor big = from_vector<int64_t>({(int64_t{1} << 40) + 1}, {1});
  EXPECT_EQ(raw::to(big, DType::f64).item<double>(), static_cast<double>((int64_t{1} << 40) + 1));
  EXPECT_EQ(raw::to(raw::to(big, DType::f64), DType::i64).item<int64_t>(), (int64_t{1} << 40) + 1);
  EXPECT_EQ(raw::to(from_vector<float>({1.0f + 0x1p-8f}, {1}), DType::bf16).to_vector<float>()[0], 1.0f);
  EXPECT_EQ(raw::to(raw::to(from_vector<int32_t>({3, -7}, {2}), DType::bf16), DType::i32).to_vector<int32_t>(),
            (std::vector<int32_t>{3, -7}));
  EXPECT_TRUE(raw::to(f, DType::f64).is_same(f)) << "to() returns the input when nothing changes";
  EXPECT_TRUE(raw::to(f, Device::cpu()).is_same(f));
}

TEST(Copy, ContiguousAndClone) {
  Tensor t = iota({3, 4});
  EXPECT_TRUE(raw::contiguous(t).is_same(t));
  Tensor tr = raw::transpose(t, 0, 1);
  Tensor c = raw::contiguous(tr);
  EXPECT_FALSE(c.is_same(tr));
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_NE(c.storage(), t.storage());
  EXPECT_EQ(values(c), values(tr));
  Tensor cl = raw::clone(t);
  EXPECT_NE(cl.storage(), t.storage());
  EXPECT_EQ(values(cl), values(t));
  // Size-1 dims do not make a tensor non-contiguous whatever their stride.
  EXPECT_TRUE(raw::as_strided(t, {3, 1}, {1, 99}, 0).is_contiguous());
  EXPECT_FALSE(raw::as_strided(t, {3, 1}, {4, 99}, 0).is_contiguous());
  EXPECT_TRUE(raw::as_strided(t, {1, 4}, {99, 1}, 0).is_contiguous());
  EXPECT_TRUE(raw::unsqueeze(tr, 0).is_contiguous() == false);
  // Expanded tensors are materialised by contiguous().
  Tensor e = raw::contiguous(raw::expand(iota({1, 3}), {2, 3}));
  EXPECT_EQ(e.strides(), (Shape{3, 1}));
  EXPECT_EQ(values(e), (std::vector<double>{0, 1, 2, 0, 1, 2}));
}

}  // namespace
}  // namespace cpf
