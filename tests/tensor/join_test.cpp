#include "framework/tensor/ops/join.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

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

// Naive cat: for every output element, find the input it falls into along d.
Tensor reference_cat(const std::vector<Tensor>& tensors, int64_t d) {
  Shape shape = tensors[0].shape();
  shape[d] = 0;
  std::vector<std::vector<double>> values;
  for (const Tensor& t : tensors) {
    shape[d] += t.size(d);
    values.push_back(t.to_vector<double>());
  }
  std::vector<double> out(static_cast<size_t>(shape_numel(shape)));
  for (int64_t p = 0; p < static_cast<int64_t>(out.size()); ++p) {
    Shape idx = unravel(p, shape);
    size_t k = 0;
    while (idx[d] >= tensors[k].size(d)) idx[d] -= tensors[k++].size(d);
    out[p] = values[k][ravel(idx, tensors[k].shape())];
  }
  return from_vector(out, shape);
}

// Naive stack: out[..., i, ...] = tensors[i][...].
Tensor reference_stack(const std::vector<Tensor>& tensors, int64_t d) {
  Shape shape = tensors[0].shape();
  shape.insert(shape.begin() + d, static_cast<int64_t>(tensors.size()));
  std::vector<double> out(static_cast<size_t>(shape_numel(shape)));
  for (int64_t p = 0; p < static_cast<int64_t>(out.size()); ++p) {
    Shape idx = unravel(p, shape);
    const int64_t i = idx[d];
    idx.erase(idx.begin() + d);
    out[p] = tensors[i].to_vector<double>()[ravel(idx, tensors[i].shape())];
  }
  return from_vector(out, shape);
}

using FakeCudaBackend = testing::HostAsDevice;  // tests/support/host_as_device.h

TEST(Cat, MatchesReferenceAlongEveryDim) {
  for (int64_t dim : {0, 1, 2, -1, -3}) {
    const int64_t d = dim < 0 ? dim + 3 : dim;
    Shape a{2, 3, 4}, b{2, 3, 4}, c{2, 3, 4};
    a[d] = 1;
    b[d] = 5;
    c[d] = 2;
    std::vector<Tensor> inputs{random_tensor(a, DType::f32, 1), random_tensor(b, DType::f32, 2),
                               random_tensor(c, DType::f32, 3)};
    Tensor out = raw::cat(inputs, dim);
    Shape expected_shape{2, 3, 4};
    expected_shape[d] = 8;
    EXPECT_EQ(out.shape(), expected_shape) << "dim " << dim;
    EXPECT_TRUE(all_close(out, reference_cat(inputs, d), 0, 0)) << "dim " << dim;
    EXPECT_EQ(out.dtype(), DType::f32);
  }
}

TEST(Cat, EmptyPiecesAndSingleInput) {
  Tensor a = random_tensor({0, 3}, DType::f64, 1);
  Tensor b = random_tensor({2, 3}, DType::f64, 2);
  Tensor c = random_tensor({0, 3}, DType::f64, 3);
  Tensor out = raw::cat({a, b, c}, 0);
  EXPECT_TRUE(all_close(out, b, 0, 0));
  Tensor all_empty = raw::cat({a, c}, 0);
  EXPECT_EQ(all_empty.shape(), (Shape{0, 3}));
  // A tensor with a zero-size dim outside the cat dim joins others of that shape.
  Tensor e1 = zeros({0, 2}), e2 = zeros({0, 5});
  EXPECT_EQ(raw::cat({e1, e2}, 1).shape(), (Shape{0, 7}));
  // One input: a fresh copy, not an alias.
  Tensor single = raw::cat({b}, 1);
  EXPECT_FALSE(single.storage() == b.storage());
  EXPECT_TRUE(all_close(single, b, 0, 0));
}

TEST(Cat, NonContiguousInputs) {
  Tensor base = random_tensor({4, 6}, DType::f32, 4);
  Tensor t = raw::transpose(base, 0, 1);                                    // (6, 4), strides (1, 6)
  Tensor s = raw::slice(random_tensor({6, 9}, DType::f32, 5), 1, 1, 9, 2);  // (6, 4), step 2
  Tensor e = raw::expand(random_tensor({1, 4}, DType::f32, 6), {3, 4});     // stride 0
  ASSERT_FALSE(t.is_contiguous());
  ASSERT_FALSE(s.is_contiguous());
  EXPECT_TRUE(all_close(raw::cat({t, s, e}, 0), reference_cat({t, s, e}, 0), 0, 0));
  EXPECT_TRUE(all_close(raw::cat({t, s}, -1), reference_cat({t, s}, 1), 0, 0));
}

TEST(Cat, EveryDtype) {
  for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::i32, DType::i64, DType::boolean}) {
    Tensor a = raw::reshape(arange(0, 6, 1, {.dtype = dtype == DType::boolean ? DType::i64 : dtype}), {2, 3});
    Tensor b = raw::reshape(arange(6, 10, 1, {.dtype = dtype == DType::boolean ? DType::i64 : dtype}), {2, 2});
    if (dtype == DType::boolean) {
      a = raw::to(a, DType::boolean);
      b = raw::to(b, DType::boolean);
    }
    Tensor out = raw::cat({a, b}, 1);
    EXPECT_EQ(out.dtype(), dtype);
    EXPECT_TRUE(all_close(out, reference_cat({a, b}, 1), 0, 0)) << dtype;
  }
}

TEST(Cat, Errors) {
  Tensor a = zeros({2, 3});
  EXPECT_CPF_ERROR(raw::cat({}, 0), "cat: expected at least one tensor, got an empty list");
  EXPECT_CPF_ERROR(raw::cat({a, Tensor()}, 0), "cat: tensor 1 is undefined");
  EXPECT_CPF_ERROR(raw::cat({scalar_tensor(1.0), scalar_tensor(2.0)}, 0),
                   "cat: tensor 0 is zero-dimensional; cat joins along an existing dim (use stack");
  EXPECT_CPF_ERROR(raw::cat({a, zeros({2, 3}, {.dtype = DType::f64})}, 0),
                   "cat: tensor 1 has dtype f64 but tensor 0 has dtype f32");
  EXPECT_CPF_ERROR(raw::cat({a, zeros({2, 3, 1})}, 0),
                   "cat: tensor 1 of shape [2,3,1] has rank 3 but tensor 0 of shape [2,3] has rank 2");
  EXPECT_CPF_ERROR(raw::cat({a, zeros({2, 4}), zeros({3, 3})}, 1),
                   "cat: tensor 2 of shape [3,3] does not match tensor 0 of shape [2,3] outside dim 1 (sizes differ "
                   "at dim 0)");
  EXPECT_CPF_ERROR(raw::cat({a, a}, 2), "cat: dim 2 out of range for a tensor of rank 2");
  EXPECT_CPF_ERROR(raw::cat({a, a}, -3), "cat: dim -3 out of range for a tensor of rank 2");
}

TEST(Stack, MatchesReferenceAlongEveryDim) {
  std::vector<Tensor> inputs{random_tensor({2, 3}, DType::f64, 1), random_tensor({2, 3}, DType::f64, 2),
                             raw::transpose(random_tensor({3, 2}, DType::f64, 3), 0, 1),
                             random_tensor({2, 3}, DType::f64, 4)};
  for (int64_t dim : {0, 1, 2, -1, -3}) {
    const int64_t d = dim < 0 ? dim + 3 : dim;
    Tensor out = raw::stack(inputs, dim);
    Shape expected_shape{2, 3};
    expected_shape.insert(expected_shape.begin() + d, 4);
    EXPECT_EQ(out.shape(), expected_shape);
    EXPECT_TRUE(all_close(out, reference_stack(inputs, d), 0, 0)) << "dim " << dim;
  }
  // Scalars stack into a vector; empty tensors stack too.
  EXPECT_TRUE(all_close(raw::stack({scalar_tensor(1.0), scalar_tensor(2.0)}), from_vector<float>({1, 2}, {2}), 0, 0));
  EXPECT_EQ(raw::stack({zeros({0, 2}), zeros({0, 2})}, 1).shape(), (Shape{0, 2, 2}));
}

TEST(Stack, Errors) {
  Tensor a = zeros({2, 3});
  EXPECT_CPF_ERROR(raw::stack({}, 0), "stack: expected at least one tensor, got an empty list");
  EXPECT_CPF_ERROR(raw::stack({Tensor(), a}, 0), "stack: tensor 0 is undefined");
  EXPECT_CPF_ERROR(raw::stack({a, zeros({2, 4})}, 0),
                   "stack: tensor 1 of shape [2,4] differs from tensor 0 of shape [2,3] (stack needs equal shapes)");
  EXPECT_CPF_ERROR(raw::stack({a, zeros({2, 3}, {.dtype = DType::i64})}, 0),
                   "stack: tensor 1 has dtype i64 but tensor 0 has dtype f32");
  EXPECT_CPF_ERROR(raw::stack({a, a}, 3), "stack: dim 3 out of range for a tensor of rank 3");
  EXPECT_CPF_ERROR(raw::stack({a, a}, -4), "stack: dim -4 out of range for a tensor of rank 3");
}

TEST(JoinDevices, MixedAndUnsupportedDevicesAreRejected) {
  if (has_device_backend(DeviceType::cuda)) {
    GTEST_SKIP() << "a real CUDA backend is registered; device dispatch is covered by the GPU suites";
  }
  static FakeCudaBackend fake;
  register_device_backend(DeviceType::cuda, &fake);
  {
    Tensor host = zeros({2, 3});
    Tensor dev = empty({2, 3}, {.device = Device::cuda(0)});
    EXPECT_CPF_ERROR(raw::cat({host, dev}, 0), "cat: tensor 1 is on cuda:0 but tensor 0 is on cpu");
    EXPECT_CPF_ERROR(raw::stack({dev, host}, 0), "stack: tensor 1 is on cpu but tensor 0 is on cuda:0");
    EXPECT_CPF_ERROR(raw::cat({dev, dev}, 0), "cat: no kernel for device cuda:0 in this build");
    EXPECT_CPF_ERROR(raw::stack({dev}, 0), "stack: no kernel for device cuda:0 in this build");
    // Splitting only makes views, which need no kernel.
    const auto pieces = raw::split(dev, 1, 0);
    ASSERT_EQ(pieces.size(), 2u);
    EXPECT_EQ(pieces[1].device(), Device::cuda(0));
  }
  register_device_backend(DeviceType::cuda, nullptr);
}

TEST(Split, BySizesGivesViews) {
  Tensor x = random_tensor({3, 7, 2}, DType::f32, 7);
  const auto pieces = raw::split(x, std::vector<int64_t>{2, 0, 4, 1}, 1);
  ASSERT_EQ(pieces.size(), 4u);
  const std::vector<int64_t> starts{0, 2, 2, 6};
  const std::vector<int64_t> sizes{2, 0, 4, 1};
  for (size_t i = 0; i < pieces.size(); ++i) {
    EXPECT_EQ(pieces[i].shape(), (Shape{3, sizes[i], 2}));
    EXPECT_TRUE(pieces[i].storage() == x.storage());
    EXPECT_EQ(pieces[i].offset(), x.offset() + starts[i] * x.stride(1));
    // Element by element against the plain index arithmetic.
    const auto xv = x.to_vector<float>();
    const auto pv = pieces[i].to_vector<float>();
    for (int64_t p = 0; p < pieces[i].numel(); ++p) {
      Shape idx = unravel(p, pieces[i].shape());
      idx[1] += starts[i];
      EXPECT_EQ(pv[p], xv[ravel(idx, x.shape())]);
    }
  }
  // Writing through a piece writes x.
  raw::fill_(pieces[3], 5.0);
  EXPECT_EQ(raw::select(raw::select(x, 1, 6), 0, 2).to_vector<float>(), (std::vector<float>{5, 5}));
  EXPECT_TRUE(all_close(raw::cat(pieces, -2), x, 0, 0));
}

TEST(Split, ByChunkSize) {
  Tensor x = raw::transpose(random_tensor({7, 3}, DType::f64, 8), 0, 1);  // (3, 7), non-contiguous
  const auto pieces = raw::split(x, 3, -1);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].shape(), (Shape{3, 3}));
  EXPECT_EQ(pieces[1].shape(), (Shape{3, 3}));
  EXPECT_EQ(pieces[2].shape(), (Shape{3, 1}));
  EXPECT_TRUE(all_close(raw::cat(pieces, 1), x, 0, 0));
  EXPECT_TRUE(all_close(pieces[1], raw::narrow(x, 1, 3, 3), 0, 0));
  // A chunk at least as large as the dim gives the whole tensor; an empty dim gives one empty piece.
  EXPECT_EQ(raw::split(x, 10, 0).size(), 1u);
  const auto empty_pieces = raw::split(zeros({0, 4}), 2, 0);
  ASSERT_EQ(empty_pieces.size(), 1u);
  EXPECT_EQ(empty_pieces[0].shape(), (Shape{0, 4}));
  // Exact division: no trailing empty piece.
  EXPECT_EQ(raw::split(zeros({6}), 2, 0).size(), 3u);
}

TEST(Split, Errors) {
  Tensor x = zeros({4, 6});
  EXPECT_CPF_ERROR(raw::split(scalar_tensor(1.0), 1, 0), "split: cannot split a zero-dimensional tensor");
  EXPECT_CPF_ERROR(raw::split(scalar_tensor(1.0), std::vector<int64_t>{1}, 0),
                   "split: cannot split a zero-dimensional tensor");
  EXPECT_CPF_ERROR(raw::split(x, std::vector<int64_t>{2, -1, 5}, 1), "split: sizes [2,-1,5] contain a negative size");
  EXPECT_CPF_ERROR(raw::split(x, std::vector<int64_t>{2, 3}, 1),
                   "split: sizes [2,3] add up to 5 but dim 1 has size 6 (shape [4,6])");
  EXPECT_CPF_ERROR(raw::split(x, 0, 1), "split: chunk_size must be positive, got 0");
  EXPECT_CPF_ERROR(raw::split(x, -2, 1), "split: chunk_size must be positive, got -2");
  EXPECT_CPF_ERROR(raw::split(x, 2, 2), "split: dim 2 out of range for a tensor of rank 2");
  EXPECT_CPF_ERROR(raw::split(x, std::vector<int64_t>{4}, -3), "split: dim -3 out of range for a tensor of rank 2");
  EXPECT_CPF_ERROR(raw::split(Tensor(), 1, 0), "split: argument 'x' is an undefined tensor");
}

}  // namespace
}  // namespace cpf
