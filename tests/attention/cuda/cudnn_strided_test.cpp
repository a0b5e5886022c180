// cuDNN attention on q, k, v that are strided views of one fused (.., (h_q + 2 h_kv) d) projection
// (attention/cuda/cudnn/strided_layout.h): cuDNN reads them through their strides and writes dq, dk, dv
// into one buffer laid out like the projection. The same kernels run as on dense copies, so out, lse,
// dq, dk and dv must equal the dense call's bit for bit; and through autograd the split's backward
// hands that buffer on without a cat. Skips without a GPU.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "attention/attention_op.h"
#include "attention/dot_product_attention.h"
#include "attention/nn/attention_layout.h"
#include "framework/autograd/engine.h"
#include "framework/autograd/functions/join.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/join.h"
#include "framework/tensor/ops/views.h"
#include "tests/tensor/cuda/cuda_test_utils.h"

namespace cpf {
namespace {

using testing::on_cpu;
using testing::on_gpu;
using testing::random_cpu;

struct Case {
  std::string name;
  QkvFormat format = QkvFormat::bshd;
  MaskType mask = MaskType::causal;
  int64_t batch = 2, seq = 128;  // thd: batch 1, seq the total tokens
  int64_t h_q = 4, h_kv = 4, d = 64;
  std::optional<SequenceInfo> info;
  bool deterministic = false;
  bool filled_rows = false;  // padded slots: dq, dk, dv get their zero rows by a masked fill (new tensors)

  int64_t row() const { return (h_q + 2 * h_kv) * d; }
  Shape packed_shape() const {
    if (format == QkvFormat::thd) return {seq, row()};
    return format == QkvFormat::sbhd ? Shape{seq, batch, row()} : Shape{batch, seq, row()};
  }
  AttentionSpec spec() const { return {.qkv_format = format, .mask = mask}; }
  AttentionKernelConfig config() const { return {.backend = AttentionBackend::cudnn, .deterministic = deterministic}; }
};

std::vector<Case> cases() {
  return {{.name = "bshd_mha"},
          {.name = "bshd_gqa", .h_q = 8, .h_kv = 2},
          {.name = "sbhd_gqa", .format = QkvFormat::sbhd, .h_q = 8, .h_kv = 2},
          {.name = "bshd_deterministic", .deterministic = true},
          {.name = "thd_packed",
           .format = QkvFormat::thd,
           .batch = 1,
           .seq = 300,
           .info = SequenceInfo::from_lengths({200, 100})},
          {.name = "thd_gqa_padded",
           .format = QkvFormat::thd,
           .batch = 1,
           .seq = 384,
           .h_q = 8,
           .h_kv = 2,
           .info = SequenceInfo::from_lengths({150, 77}, 192),
           .filled_rows = true}};
}

struct Views {
  Tensor q, k, v;  // (.., H, D) views of one packed (.., row) tensor
};

Views split_views(const Case& c, const Tensor& packed) {
  const auto parts = raw::split(packed, std::vector<int64_t>{c.h_q * c.d, c.h_kv * c.d, c.h_kv * c.d}, -1);
  using nn::split_heads;
  return {split_heads(parts[0], c.h_q, c.d), split_heads(parts[1], c.h_kv, c.d), split_heads(parts[2], c.h_kv, c.d)};
}

void expect_bitwise_equal(const Tensor& strided, const Tensor& dense, const std::string& what) {
  ASSERT_EQ(strided.shape(), dense.shape()) << what;
  EXPECT_EQ(on_cpu(strided).to_vector<double>(), on_cpu(dense).to_vector<double>()) << what << " differs";
}

class CudnnStrided : public testing::CudaTest {};

TEST_F(CudnnStrided, ViewsOfOneProjectionMatchDenseInputsBitForBit) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const Tensor packed = on_gpu(random_cpu(c.packed_shape(), DType::bf16, 11));
    const Views s = split_views(c, packed);
    ASSERT_FALSE(s.k.is_contiguous());
    const Tensor q = raw::contiguous(s.q), k = raw::contiguous(s.k), v = raw::contiguous(s.v);
    const raw::AttentionForward fs = raw::attention_forward(s.q, s.k, s.v, c.spec(), c.info, c.config());
    const raw::AttentionForward fd = raw::attention_forward(q, k, v, c.spec(), c.info, c.config());
    expect_bitwise_equal(fs.out, fd.out, c.name + " out");
    expect_bitwise_equal(fs.lse, fd.lse, c.name + " lse");
    const Tensor dout = on_gpu(random_cpu(fd.out.shape(), DType::bf16, 12));
    const raw::AttentionGrads gs =
        raw::attention_backward(dout, Tensor(), s.q, s.k, s.v, fs.out, fs.lse, c.spec(), c.info, c.config());
    const raw::AttentionGrads gd =
        raw::attention_backward(dout, Tensor(), q, k, v, fd.out, fd.lse, c.spec(), c.info, c.config());
    if (!c.deterministic) {
      // The non-deterministic dQ accumulates in fp32 atomics: equal up to summation order only.
      EXPECT_LT(testing::rel_error(on_cpu(gs.dq), on_cpu(gd.dq)), 1e-2) << c.name;
    } else {
      expect_bitwise_equal(gs.dq, gd.dq, c.name + " dq");
    }
    expect_bitwise_equal(gs.dk, gd.dk, c.name + " dk");
    expect_bitwise_equal(gs.dv, gd.dv, c.name + " dv");
    // dq, dk, dv lie side by side in one buffer laid out like the projection (no row had to be filled).
    if (!c.filled_rows) {
      EXPECT_EQ(gs.dq.storage(), gs.dv.storage());
      EXPECT_EQ(gs.dk.strides(), s.k.strides());
    }
  }
}

// Through autograd, as MultiHeadAttention runs it: split of one projection, attention, backward. The
// projection's gradient is the packed buffer (split's backward concatenates nothing) and equals the
// gradient of the same attention on dense leaves, joined.
TEST_F(CudnnStrided, SplitBackwardHandsOnThePackedGradients) {
  const Case c{.name = "autograd_bshd_gqa", .h_q = 8, .h_kv = 2, .deterministic = true};
  Tensor packed = on_gpu(random_cpu(c.packed_shape(), DType::bf16, 21));
  packed.set_requires_grad(true);
  const std::vector<Tensor> parts = split(packed, std::vector<int64_t>{c.h_q * c.d, c.h_kv * c.d, c.h_kv * c.d}, -1);
  using nn::split_heads;
  const AttentionOutput out =
      dot_product_attention(split_heads(parts[0], c.h_q, c.d), split_heads(parts[1], c.h_kv, c.d),
                            split_heads(parts[2], c.h_kv, c.d), c.spec(), c.info, c.config());
  const Tensor dout = on_gpu(random_cpu(out.out.shape(), DType::bf16, 22));
  backward(out.out, dout);
  ASSERT_TRUE(packed.grad().defined());

  const Views s = split_views(c, packed.detach());
  Tensor q = raw::contiguous(s.q), k = raw::contiguous(s.k), v = raw::contiguous(s.v);
  for (Tensor* t : {&q, &k, &v}) t->set_requires_grad(true);
  const AttentionOutput dense_out = dot_product_attention(q, k, v, c.spec(), c.info, c.config());
  backward(dense_out.out, dout);
  const Tensor joined = raw::cat({nn::merge_heads(q.grad()), nn::merge_heads(k.grad()), nn::merge_heads(v.grad())}, -1);
  expect_bitwise_equal(packed.grad(), joined, "the projection's gradient");
}

}  // namespace
}  // namespace cpf
