#include "attention/cuda/cudnn/strided_layout.h"

#include <cstdint>

#include "framework/tensor/ops/views.h"

namespace cpf::attention_cuda::cudnn {
namespace {

int64_t expected_rank(QkvFormat format) { return format == QkvFormat::thd ? 3 : 4; }

bool aligned_bytes(int64_t elements, DType dtype) {
  return (elements * static_cast<int64_t>(dtype_size(dtype))) % kCudnnAlignmentBytes == 0;
}

// Tokens (every dim before the head dim) in row-major order, `row` elements apart; the head dim packed
// at stride `dim`, the innermost dim contiguous. Returns the number of tokens, 0 when not so.
int64_t packed_tokens(const Tensor& t, int64_t row) {
  if (t.stride(-1) != 1 || (t.size(-2) > 1 && t.stride(-2) != t.size(-1))) return 0;
  int64_t expected = row;
  for (int64_t i = t.dim() - 3; i >= 0; --i) {
    if (t.size(i) > 1 && t.stride(i) != expected) return 0;
    expected *= t.size(i);
  }
  return expected / row;
}

}  // namespace

IoLayout dense_layout(QkvFormat format, int64_t batch, int64_t seq, int64_t heads, int64_t dim) {
  switch (format) {
    case QkvFormat::bshd: return {{seq * heads * dim, dim, heads * dim, 1}, heads * dim};
    case QkvFormat::sbhd: return {{heads * dim, dim, batch * heads * dim, 1}, batch * heads * dim};
    case QkvFormat::thd: return {{seq * heads * dim, dim, heads * dim, 1}, heads * dim};
  }
  CPF_FAIL("unknown qkv_format");
}

Layouts dense_layouts(const AttentionProblem& p) {
  return {dense_layout(p.format, p.batch, p.s_q, p.h_q, p.d_qk),
          dense_layout(p.format, p.batch, p.s_kv, p.h_kv, p.d_qk),
          dense_layout(p.format, p.batch, p.s_kv, p.h_kv, p.d_v), dense_layout(p.format, p.batch, p.s_q, p.h_q, p.d_v)};
}

std::optional<IoLayout> in_place_layout(const Tensor& t, QkvFormat format) {
  if (!t.defined() || t.dim() != expected_rank(format)) return std::nullopt;
  // (B, S, H, D), (S, B, H, D) or (T, H, D): a dense tensor keeps today's key (and plan) exactly.
  const int64_t heads = t.size(-2), dim = t.size(-1);
  if (t.is_contiguous()) {
    const int64_t batch = format == QkvFormat::thd ? 1 : t.size(format == QkvFormat::sbhd ? 1 : 0);
    const int64_t seq = t.size(format == QkvFormat::bshd ? 1 : 0);
    if (reinterpret_cast<uintptr_t>(t.raw_data()) % kCudnnAlignmentBytes != 0) return std::nullopt;
    return dense_layout(format, batch, seq, heads, dim);
  }
  if (t.stride(-1) != 1 || reinterpret_cast<uintptr_t>(t.raw_data()) % kCudnnAlignmentBytes != 0) return std::nullopt;
  for (int64_t i = 0; i + 1 < t.dim(); ++i) {
    if (!aligned_bytes(t.stride(i), t.dtype())) return std::nullopt;
  }
  switch (format) {
    case QkvFormat::bshd: return IoLayout{{t.stride(0), t.stride(2), t.stride(1), 1}, t.stride(1)};
    case QkvFormat::sbhd: return IoLayout{{t.stride(1), t.stride(2), t.stride(0), 1}, t.stride(0)};
    case QkvFormat::thd: return IoLayout{{t.size(0) * t.stride(0), t.stride(1), t.stride(0), 1}, t.stride(0)};
  }
  return std::nullopt;
}

std::optional<std::array<Tensor, 3>> packed_gradients(const Tensor& q, const Tensor& k, const Tensor& v) {
  if (!q.defined() || !k.defined() || !v.defined() || q.dim() < 3 || k.dim() != q.dim() || v.dim() != q.dim()) {
    return std::nullopt;
  }
  if (q.storage() == nullptr || k.storage() != q.storage() || v.storage() != q.storage()) return std::nullopt;
  if (k.dtype() != q.dtype() || v.dtype() != q.dtype()) return std::nullopt;
  for (int64_t i = 0; i + 2 < q.dim(); ++i) {
    if (k.size(i) != q.size(i) || v.size(i) != q.size(i)) return std::nullopt;
  }
  const int64_t q_width = q.size(-2) * q.size(-1), k_width = k.size(-2) * k.size(-1);
  const int64_t row = q_width + k_width + v.size(-2) * v.size(-1);
  const int64_t tokens = packed_tokens(q, row);
  if (tokens == 0 || packed_tokens(k, row) != tokens || packed_tokens(v, row) != tokens) return std::nullopt;
  if (q.offset() != 0 || k.offset() != q_width || v.offset() != q_width + k_width) return std::nullopt;
  // The storage holds these three and nothing else: the buffer below mirrors it without waste.
  if (q.storage()->nbytes() != static_cast<size_t>(tokens * row) * dtype_size(q.dtype())) return std::nullopt;
  const Tensor buffer = empty({tokens * row}, {.dtype = q.dtype(), .device = q.device()});  // (tokens, row)
  return std::array<Tensor, 3>{raw::as_strided(buffer, q.shape(), q.strides(), q.offset()),
                               raw::as_strided(buffer, k.shape(), k.strides(), k.offset()),
                               raw::as_strided(buffer, v.shape(), v.strides(), v.offset())};
}

}  // namespace cpf::attention_cuda::cudnn
