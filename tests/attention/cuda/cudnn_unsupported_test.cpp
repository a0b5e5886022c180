// cuDNN's unsupported_reason (attention/cuda/cudnn/fused_attention.h): the static checks that name what the
// fused attention cannot run (dtypes, head dims, position offsets, key order, rows without keys) need no
// GPU and run everywhere; the runtime version check too.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attention/attention_problem.h"
#include "attention/cuda/cudnn/fused_attention.h"
#include "framework/tensor/cuda/cuda.h"
#include "tests/attention/cuda/cudnn_case.h"

namespace cpf {
namespace {

using Case = testing::CudnnCase;
using testing::shape_of;
using testing::spec_of;

AttentionProblem problem_of(const Case& c, DType dtype) {
  const Tensor q = empty(shape_of(c, c.s_q, c.h_q, c.d_qk), {.dtype = dtype});
  const Tensor k = empty(shape_of(c, c.s_kv, c.h_kv, c.d_qk), {.dtype = dtype});
  const Tensor v = empty(shape_of(c, c.s_kv, c.h_kv, c.d_v), {.dtype = dtype});
  return check_attention_inputs(q, k, v, spec_of(c), c.seq, {});
}

std::string reason_for(const Case& c, DType dtype = DType::bf16, bool backward = false, bool has_dlse = false) {
  return attention_cuda::cudnn::unsupported_reason(problem_of(c, dtype), dtype, backward, has_dlse);
}

TEST(CudnnUnsupportedReason, NamesWhatCudnnCannotRun) {
  const Case plain{.name = "plain"};
  EXPECT_NE(reason_for(plain, DType::f32).find("f32 inputs"), std::string::npos) << reason_for(plain, DType::f32);
  EXPECT_NE(reason_for(plain, DType::f64).find("f64 inputs"), std::string::npos);
  EXPECT_NE(reason_for(plain, DType::bf16, true, true).find("dlse is set"), std::string::npos);

  const Case d12{.name = "d12", .d_qk = 12, .d_v = 12};
  EXPECT_NE(reason_for(d12).find("head_dim_qk 12 is not a multiple of 8"), std::string::npos) << reason_for(d12);
  const Case d512{.name = "d512", .d_qk = 512, .d_v = 512};
  EXPECT_NE(reason_for(d512).find("is above 256"), std::string::npos) << reason_for(d512);
  const Case mla256{.name = "mla_256_128", .d_qk = 256, .d_v = 128};
  EXPECT_NE(reason_for(mla256, DType::bf16, true).find("192/128"), std::string::npos)
      << reason_for(mla256, DType::bf16, true);

  // Offsets that differ per sequence and are not bottom-right aligned (equal lengths).
  const Case offsets{.name = "offsets",
                     .format = QkvFormat::thd,
                     .mask = MaskType::causal,
                     .batch = 1,
                     .s_q = 128,
                     .s_kv = 128,
                     .seq = SequenceInfo::from_lengths({64, 64}).with_position_offsets({0, 10}, {0, 0})};
  EXPECT_NE(reason_for(offsets).find("not one band with the same diagonal in every sequence"), std::string::npos)
      << reason_for(offsets);

  // Key positions that do not increase.
  std::vector<int64_t> q_pos(64), kv_pos(64);
  for (int64_t i = 0; i < 64; ++i) q_pos[static_cast<size_t>(i)] = kv_pos[static_cast<size_t>(i)] = 63 - i;
  const Case shuffled{.name = "shuffled",
                      .format = QkvFormat::thd,
                      .mask = MaskType::causal,
                      .batch = 1,
                      .s_q = 64,
                      .s_kv = 64,
                      .seq = SequenceInfo::from_lengths({64}).with_positions(q_pos, kv_pos)};
  EXPECT_NE(reason_for(shuffled).find("the key positions of sequence 0 do not increase (63 then 62"), std::string::npos)
      << reason_for(shuffled);

  // bshd rows with no keys cannot go through cuDNN's per-row form.
  const Case empty_row{.name = "empty_row",
                       .mask = MaskType::padding,
                       .s_q = 64,
                       .s_kv = 64,
                       .seq = SequenceInfo::from_lengths({64, 64}, {64, 0}, 64, 64)};
  EXPECT_NE(reason_for(empty_row).find("has 64 queries and 0 keys"), std::string::npos) << reason_for(empty_row);
}

TEST(CudnnUnsupportedReason, WithoutPositionBoundsOffsetsDoNotMatter) {
  // No window: positions are irrelevant, so the static checks pass (the probe then needs a GPU).
  const Case c{.name = "no_window",
               .format = QkvFormat::thd,
               .batch = 1,
               .s_q = 128,
               .s_kv = 128,
               .seq = SequenceInfo::from_lengths({64, 64}).with_position_offsets({0, 10}, {0, 0})};
  const std::string reason = reason_for(c);
  if (cuda::is_available()) {
    EXPECT_EQ(reason, "");
  } else {
    EXPECT_EQ(reason, "no CUDA device is visible");
  }
}

TEST(CudnnRuntime, VersionIsReported) {
  // Linked against cuDNN 9: the loaded library reports 9xxxx.
  EXPECT_GE(attention_cuda::cudnn::runtime_version(), 90000);
}

}  // namespace
}  // namespace cpf
