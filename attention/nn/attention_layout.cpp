#include "attention/nn/attention_layout.h"

#include <numeric>

#include "attention/cp/sharding.h"
#include "framework/autograd/ops.h"
#include "framework/core/error.h"

namespace cpf::nn {

void check_hidden(const Tensor& x, QkvFormat format, int64_t hidden_size, const char* op) {
  CPF_CHECK(x.defined(), op, ": the input is undefined");
  const int64_t rank = format == QkvFormat::thd ? 2 : 3;
  const char* layout = format == QkvFormat::thd    ? "(tokens, hidden)"
                       : format == QkvFormat::bshd ? "(batch, seq, hidden)"
                                                   : "(seq, batch, hidden)";
  CPF_CHECK(x.dim() == rank && x.size(-1) == hidden_size, op, ": qkv_format ", qkv_format_name(format), " expects ",
            layout, " inputs with hidden = ", hidden_size, ": x=", x.shape());
}

Tensor split_heads(const Tensor& x, int64_t heads, int64_t dim) {
  Shape shape(x.shape().begin(), x.shape().end() - 1);
  shape.push_back(heads);
  shape.push_back(dim);
  return reshape(x, shape);
}

Tensor merge_heads(const Tensor& x) {
  Shape shape(x.shape().begin(), x.shape().end() - 2);
  shape.push_back(x.size(-2) * x.size(-1));
  return reshape(x, shape);
}

Tensor rope_positions(const Tensor& x_heads, QkvFormat format, const std::optional<SequenceInfo>& seq, bool kv) {
  const bool thd = format == QkvFormat::thd;
  const int64_t batch = thd ? 1 : x_heads.size(format == QkvFormat::bshd ? 0 : 1);
  const int64_t seq_len = thd ? x_heads.size(0) : x_heads.size(format == QkvFormat::bshd ? 1 : 0);
  std::vector<int64_t> pos;
  if (seq) {
    pos = kv ? seq->resolved_kv_positions() : seq->resolved_q_positions();
  } else {
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t t = 0; t < seq_len; ++t) pos.push_back(t);
    }
  }
  // thd storage may end before the tensor does; those tokens belong to no sequence.
  pos.resize(static_cast<size_t>(batch * seq_len), 0);
  // On x's device: the RoPE kernel takes positions from where x lives (one small upload per call).
  return thd ? from_vector(pos, {seq_len}, x_heads.device()) : from_vector(pos, {batch, seq_len}, x_heads.device());
}

Tensor cp_rope_positions(const Tensor& x_heads, QkvFormat format, const std::optional<SequenceInfo>& seq, bool kv,
                         int64_t cp_size, int64_t cp_rank) {
  const bool thd = format == QkvFormat::thd;
  std::vector<int64_t> global_pos;
  if (seq) global_pos = kv ? seq->resolved_kv_positions() : seq->resolved_q_positions();
  std::vector<int64_t> pos;
  if (thd) {
    CPF_CHECK(seq.has_value(), "attention (thd) under context parallelism needs the global sequence info");
    const cp::ThdShard shard =
        cp::thd_shard(kv ? seq->cu_seqlens_kv : seq->cu_seqlens_q,
                      kv ? seq->cu_seqlens_kv_padded : seq->cu_seqlens_q_padded, cp_size, cp_rank);
    for (int64_t g : shard.global_index) pos.push_back(g < static_cast<int64_t>(global_pos.size()) ? global_pos[g] : 0);
    pos.resize(static_cast<size_t>(x_heads.size(0)), 0);
    return from_vector(pos, {x_heads.size(0)}, x_heads.device());
  }
  const int64_t batch = x_heads.size(format == QkvFormat::bshd ? 0 : 1);
  const int64_t local = x_heads.size(format == QkvFormat::bshd ? 1 : 0);
  const std::vector<int64_t> chunk_pos = cp::dual_chunk_positions(local * cp_size, cp_size, cp_rank);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t p : chunk_pos) {
      const int64_t g = b * local * cp_size + p;  // storage index in the global (batch, seq) axis
      pos.push_back(seq && g < static_cast<int64_t>(global_pos.size()) ? global_pos[g] : p);
    }
  }
  return from_vector(pos, {batch, local}, x_heads.device());
}

Tensor apply_rope(const Tensor& x_heads, QkvFormat format, const Tensor& positions, const RopeFrequencies& frequencies,
                  int64_t rotary_dim) {
  // cpf::rope takes (B, T, H, D) or (T, H, D); sbhd is rotated through a (B, T, H, D) view.
  if (format == QkvFormat::sbhd) {
    return permute(rope(permute(x_heads, {1, 0, 2, 3}), positions, frequencies, rotary_dim), {1, 0, 2, 3});
  }
  return rope(x_heads, positions, frequencies, rotary_dim);
}

}  // namespace cpf::nn

namespace cpf::nn {

Tensor sink_parameter(int64_t heads, DType module_dtype) {
  return zeros({heads}, {.dtype = module_dtype == DType::f64 ? DType::f64 : DType::f32});
}

Tensor cp_sink(const Tensor& sink, int64_t cp_size) {
  CPF_CHECK(cp_size >= 1, "cp_sink: cp_size=", cp_size, " must be at least 1");
  if (!sink.defined() || cp_size == 1) return sink;
  // sink + (sink - sink) / cp: the value exactly (a finite sink plus zero), the gradient / cp.
  const Tensor fixed = sink.detach();
  return add(fixed, mul(sub(sink, fixed), 1.0 / static_cast<double>(cp_size)));
}

AttentionSpec with_cp_sink(AttentionSpec spec, int64_t cp_size) {
  spec.sink = cp_sink(spec.sink, cp_size);
  return spec;
}

}  // namespace cpf::nn
