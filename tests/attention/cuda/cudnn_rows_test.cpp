// The row fix-ups of cuDNN's results (attention/cuda/cudnn/row_fixups.h): the runs of undefined tokens,
// and fill_token_rows / fill_lse_rows against a masked fill on the CPU, through both of their paths
// (thd with few runs: the rows alone, in place; many runs or bshd: the masked fill). flag_runs needs no
// GPU; the fills skip without one.
#include <gtest/gtest.h>

#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "attention/attention_problem.h"
#include "attention/cuda/cudnn/row_fixups.h"
#include "attention/sequence_info.h"
#include "framework/tensor/ops/index.h"
#include "tests/tensor/cuda/cuda_test_utils.h"

namespace cpf::attention_cuda::cudnn {
namespace {

using Runs = std::vector<std::pair<int64_t, int64_t>>;

TEST(CudnnRows, FlagRunsAreTheSetRunsInOrder) {
  const std::vector<uint8_t> flags{0, 1, 1, 0, 1, 0, 0, 1, 1, 1};
  EXPECT_EQ(flag_runs(flags, 8), (Runs{{1, 3}, {4, 5}, {7, 10}}));
  EXPECT_EQ(flag_runs(flags, 3), (Runs{{1, 3}, {4, 5}, {7, 10}}));
  EXPECT_EQ(flag_runs(flags, 2), Runs{}) << "more runs than allowed: none";
  EXPECT_EQ(flag_runs({0, 0, 0}, 8), Runs{});
  EXPECT_EQ(flag_runs({1, 1}, 8), (Runs{{0, 2}}));
}

class CudnnRowsGpu : public testing::CudaTest {};

constexpr int64_t kTokens = 40, kHeads = 2, kDim = 8;

// thd needs its sequences (cu_seqlens): two packed ones of kTokens / 2, like the two bshd rows.
AttentionProblem problem(QkvFormat format) {
  const bool thd = format == QkvFormat::thd;
  const Shape shape = thd ? Shape{kTokens, kHeads, kDim} : Shape{2, kTokens / 2, kHeads, kDim};
  const Tensor q = empty(shape, {.dtype = DType::bf16});
  const std::optional<SequenceInfo> seq =
      thd ? std::optional(SequenceInfo::from_lengths({kTokens / 2, kTokens / 2})) : std::nullopt;
  return check_attention_inputs(q, q, q, {.qkv_format = format}, seq, {});
}

// Token flags: set inside [start, start + length) of every `period` tokens.
std::vector<uint8_t> flags_every(int64_t period, int64_t start, int64_t length) {
  std::vector<uint8_t> flags(kTokens, 0);
  for (int64_t t = 0; t < kTokens; ++t) flags[t] = (t % period) >= start && (t % period) < start + length;
  return flags;
}

Tensor cpu_mask(const std::vector<uint8_t>& flags, const Shape& shape) {
  return from_vector(std::vector<bool>(flags.begin(), flags.end()), shape);
}

void expect_token_rows(QkvFormat format, const std::vector<uint8_t>& flags, bool in_place) {
  const AttentionProblem p = problem(format);
  const Shape shape = format == QkvFormat::thd ? Shape{kTokens, kHeads, kDim} : Shape{2, kTokens / 2, kHeads, kDim};
  const Shape mask_shape = format == QkvFormat::thd ? Shape{kTokens, 1, 1} : Shape{2, kTokens / 2, 1, 1};
  const Tensor host = testing::random_cpu(shape, DType::bf16, 7);
  const Tensor expected = raw::masked_fill(host, cpu_mask(flags, mask_shape), 0.0);
  const Tensor gpu = testing::on_gpu(host);
  const Tensor filled = fill_token_rows(p, gpu, flags, format == QkvFormat::thd ? kTokens : kTokens / 2, 0.0);
  EXPECT_EQ(filled.raw_data() == gpu.raw_data(), in_place);
  EXPECT_TRUE(testing::all_close(testing::on_cpu(filled), expected, 0, 0));
}

TEST_F(CudnnRowsGpu, ThdRunsAreFilledInPlace) { expect_token_rows(QkvFormat::thd, flags_every(20, 0, 10), true); }
TEST_F(CudnnRowsGpu, ManyRunsTakeTheMaskedFill) { expect_token_rows(QkvFormat::thd, flags_every(4, 1, 2), false); }
TEST_F(CudnnRowsGpu, BshdTakesTheMaskedFill) { expect_token_rows(QkvFormat::bshd, flags_every(20, 10, 10), false); }

TEST_F(CudnnRowsGpu, ThdLseRunsAreFilledWithMinusInfinity) {
  const double inf = std::numeric_limits<double>::infinity();
  for (const auto& flags : {flags_every(20, 10, 10), flags_every(4, 0, 1)}) {
    const Tensor host = testing::random_cpu({kHeads, kTokens}, DType::f32, 9);
    const Tensor expected = raw::masked_fill(host, cpu_mask(flags, {1, kTokens}), -inf);
    const Tensor filled = fill_lse_rows(problem(QkvFormat::thd), testing::on_gpu(host), flags, -inf);
    EXPECT_TRUE(testing::all_close(testing::on_cpu(filled), expected, 0, 0));
  }
}

}  // namespace
}  // namespace cpf::attention_cuda::cudnn
