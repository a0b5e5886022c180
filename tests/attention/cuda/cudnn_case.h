#pragma once
// The attention cases of the cuDNN tests (cudnn_test.cpp runs them on the GPU, cudnn_unsupported_test.cpp
// asks unsupported_reason about them): layout, mask, window, shapes and sequence metadata.
#include <cstdint>
#include <optional>
#include <string>

#include "attention/attention_op.h"

namespace cpf::testing {

struct CudnnCase {
  std::string name;
  QkvFormat format = QkvFormat::bshd;
  MaskType mask = MaskType::no_mask;
  AttentionWindow window;
  int64_t batch = 2, s_q = 128, s_kv = 128;  // thd: storage tokens
  int64_t h_q = 4, h_kv = 4, d_qk = 64, d_v = 64;
  std::optional<SequenceInfo> seq;
  bool deterministic = false;
};

inline Shape shape_of(const CudnnCase& c, int64_t seq, int64_t heads, int64_t dim) {
  switch (c.format) {
    case QkvFormat::bshd: return {c.batch, seq, heads, dim};
    case QkvFormat::sbhd: return {seq, c.batch, heads, dim};
    case QkvFormat::thd: return {seq, heads, dim};
  }
  return {};
}

inline AttentionSpec spec_of(const CudnnCase& c) {
  return {.qkv_format = c.format, .mask = c.mask, .window = c.window};
}

}  // namespace cpf::testing
