#include "attention/attention_problem.h"

#include <array>

#include "attention/attention_sink.h"

#include "framework/core/error.h"

namespace cpf {
namespace {

// (batch, seq, heads, dim) of a tensor in `format`; batch = 1 for thd.
struct Dims {
  int64_t batch = 1, seq = 0, heads = 0, dim = 0;
};

Dims dims_of(const Tensor& t, QkvFormat format) {
  switch (format) {
    case QkvFormat::bshd: return {t.size(0), t.size(1), t.size(2), t.size(3)};
    case QkvFormat::sbhd: return {t.size(1), t.size(0), t.size(2), t.size(3)};
    case QkvFormat::thd: return {1, t.size(0), t.size(1), t.size(2)};
  }
  CPF_FAIL("unknown qkv_format");
}

void check_tensors(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionSpec& spec, const char* op) {
  CPF_CHECK(q.defined() && k.defined() && v.defined(), op, ": q, k and v must all be defined (q ",
            q.defined() ? "defined" : "undefined", ", k ", k.defined() ? "defined" : "undefined", ", v ",
            v.defined() ? "defined" : "undefined", ")");
  CPF_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(), op,
            ": Q, K and V must have the same dtype: q=", q.dtype(), " k=", k.dtype(), " v=", v.dtype());
  CPF_CHECK(is_floating(q.dtype()), op, ": Q, K and V must be f32, f64 or bf16: dtype=", q.dtype());
  CPF_CHECK(q.device() == k.device() && q.device() == v.device(), op,
            ": Q, K and V must be on the same device: q=", q.device(), " k=", k.device(), " v=", v.device());
  const int64_t rank = spec.qkv_format == QkvFormat::thd ? 3 : 4;
  const char* layout = spec.qkv_format == QkvFormat::thd    ? "(tokens, heads, dim)"
                       : spec.qkv_format == QkvFormat::bshd ? "(batch, seq, heads, dim)"
                                                            : "(seq, batch, heads, dim)";
  CPF_CHECK(q.dim() == rank && k.dim() == rank && v.dim() == rank, op, ": qkv_format ",
            qkv_format_name(spec.qkv_format), " expects ", layout, " tensors: q=", q.shape(), " k=", k.shape(),
            " v=", v.shape());
}

// Every rule on q, k, v, the spec and the kernel config, in the order the messages are tested.
// Returns the (batch, seq, heads, dim) of q, k and v.
std::array<Dims, 3> check_shapes(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionSpec& spec,
                                 const std::optional<SequenceInfo>& seq, const AttentionKernelConfig& config,
                                 const char* op) {
  check_spec(spec);
  check_tensors(q, k, v, spec, op);
  const Dims dq = dims_of(q, spec.qkv_format), dk = dims_of(k, spec.qkv_format), dv = dims_of(v, spec.qkv_format);
  CPF_CHECK(dq.batch == dk.batch && dq.batch == dv.batch, op,
            ": Q, K and V must have the same batch size: q=", q.shape(), " k=", k.shape(), " v=", v.shape());
  CPF_CHECK(dk.seq == dv.seq, op, ": K and V must have the same sequence length: q=", q.shape(), " k=", k.shape(),
            " v=", v.shape());
  CPF_CHECK(dk.heads == dv.heads, op, ": K and V must have the same number of heads: k=", k.shape(), " v=", v.shape());
  CPF_CHECK(dk.heads > 0 && dq.heads % dk.heads == 0, op,
            ": the query heads must be a multiple of the key/value heads (GQA/MQA): h_q=", dq.heads,
            " h_kv=", dk.heads);
  CPF_CHECK(dq.dim == dk.dim, op, ": Q and K must have the same head dim (d_qk): q=", q.shape(), " k=", k.shape());
  CPF_CHECK(spec.num_heads == 0 || spec.num_heads == dq.heads, op, ": spec num_heads=", spec.num_heads, " but q has ",
            dq.heads, " heads: q=", q.shape());
  CPF_CHECK(spec.num_kv_heads == 0 || spec.num_kv_heads == dk.heads, op, ": spec num_kv_heads=", spec.num_kv_heads,
            " but k has ", dk.heads, " heads: k=", k.shape());
  CPF_CHECK(spec.head_dim_qk == 0 || spec.head_dim_qk == dq.dim, op, ": spec head_dim_qk=", spec.head_dim_qk,
            " but q has head dim ", dq.dim, ": q=", q.shape());
  CPF_CHECK(spec.head_dim_v == 0 || spec.head_dim_v == dv.dim, op, ": spec head_dim_v=", spec.head_dim_v,
            " but v has head dim ", dv.dim, ": v=", v.shape());
  if (spec.sink.defined()) check_attention_sink(spec.sink, dq.heads, q.dtype(), q.device(), op);
  CPF_CHECK(config.block_q > 0 && config.block_kv > 0, op, ": tile sizes must be positive: block_q=", config.block_q,
            " block_kv=", config.block_kv);
  const bool thd = spec.qkv_format == QkvFormat::thd;
  CPF_CHECK(!thd || seq.has_value(), op, ": qkv_format thd needs a SequenceInfo (cu_seqlens) to find its sequences");
  CPF_CHECK(!is_padding(spec.mask) || seq.has_value(), op, ": mask ", mask_type_name(spec.mask),
            " needs a SequenceInfo with the real lengths");
  return {dq, dk, dv};
}

// p.sequences and the positions of every storage token, from seq or one whole sequence per row;
// refuses sequences that do not fit the tensors' rows.
void resolve_sequences(AttentionProblem& p, const Tensor& q, const Tensor& k, const AttentionSpec& spec,
                       const std::optional<SequenceInfo>& seq, const char* op) {
  const bool thd = spec.qkv_format == QkvFormat::thd;
  // Read in place (a ring tile's info holds a position per token: no copy of it per call).
  std::optional<SequenceInfo> whole_rows;
  if (!seq) {
    whole_rows = SequenceInfo::from_lengths(std::vector<int64_t>(p.batch, p.s_q), std::vector<int64_t>(p.batch, p.s_kv),
                                            p.s_q, p.s_kv);
  }
  const SequenceInfo& info = seq ? *seq : *whole_rows;
  info.check();
  const int64_t q_tokens = p.batch * p.s_q, kv_tokens = p.batch * p.s_kv;
  if (thd) {
    CPF_CHECK(info.q_storage_tokens() <= q_tokens && info.kv_storage_tokens() <= kv_tokens, op, ": the sequences need ",
              info.q_storage_tokens(), " q and ", info.kv_storage_tokens(), " kv tokens of storage but q has ",
              q_tokens, " and k ", kv_tokens, ": q=", q.shape(), " k=", k.shape(),
              " cu_seqlens_q_padded=", info.cu_seqlens_q_padded, " cu_seqlens_kv_padded=", info.cu_seqlens_kv_padded);
  } else {
    CPF_CHECK(info.q_storage_tokens() == q_tokens && info.kv_storage_tokens() == kv_tokens, op, ": the sequences of a ",
              qkv_format_name(p.format), " call must cover batch x seq tokens (", q_tokens, " q, ", kv_tokens,
              " kv) but cover ", info.q_storage_tokens(), " q and ", info.kv_storage_tokens(),
              " kv (use SequenceInfo::from_lengths(lengths, seq) for one sequence per row): q=", q.shape(),
              " k=", k.shape(), " cu_seqlens_q_padded=", info.cu_seqlens_q_padded,
              " cu_seqlens_kv_padded=", info.cu_seqlens_kv_padded);
  }
  p.q_pos = info.resolved_q_positions();
  p.kv_pos = info.resolved_kv_positions();
  p.q_pos.resize(static_cast<size_t>(q_tokens), 0);  // thd storage past the last slot: never read
  p.kv_pos.resize(static_cast<size_t>(kv_tokens), 0);

  const int64_t row_q = thd ? q_tokens : p.s_q, row_kv = thd ? kv_tokens : p.s_kv;
  for (int64_t n = 0; n < info.num_sequences(); ++n) {
    AttentionSequence s;
    s.q_token = info.q_start(n);
    s.kv_token = info.kv_start(n);
    s.q_len = info.q_length(n);
    s.kv_len = info.kv_length(n);
    s.q_row = row_q == 0 ? 0 : s.q_token / row_q;
    s.q_col = s.q_token - s.q_row * row_q;
    s.kv_row = row_kv == 0 ? 0 : s.kv_token / row_kv;
    s.kv_col = s.kv_token - s.kv_row * row_kv;
    CPF_CHECK(s.q_col + s.q_len <= row_q && s.kv_col + s.kv_len <= row_kv, op, ": sequence ", n,
              " crosses a batch row: q tokens [", s.q_token, ", ", s.q_token + s.q_len, "), kv tokens [", s.kv_token,
              ", ", s.kv_token + s.kv_len, ") with rows of ", row_q, " q and ", row_kv, " kv tokens");
    CPF_CHECK(thd || s.q_row == s.kv_row, op, ": sequence ", n, " has its queries in batch row ", s.q_row,
              " but its keys in row ", s.kv_row);
    if (!thd && !is_padding(spec.mask)) {
      CPF_CHECK(s.q_col == 0 && s.q_len == p.s_q && s.kv_col == 0 && s.kv_len == p.s_kv, op, ": mask ",
                mask_type_name(spec.mask), " treats every ", qkv_format_name(p.format),
                " row as one whole sequence, but sequence ", n, " has ", s.q_len, " q and ", s.kv_len,
                " kv tokens in rows of ", p.s_q, " and ", p.s_kv, " (use a padding mask for shorter sequences)");
    }
    p.sequences.push_back(s);
  }
}

}  // namespace

Shape AttentionProblem::out_shape() const {
  switch (format) {
    case QkvFormat::bshd: return {batch, s_q, h_q, d_v};
    case QkvFormat::sbhd: return {s_q, batch, h_q, d_v};
    case QkvFormat::thd: return {s_q, h_q, d_v};
  }
  CPF_FAIL("unknown qkv_format");
}

Shape AttentionProblem::lse_shape() const {
  if (format == QkvFormat::thd) return {h_q, s_q};
  return {batch, h_q, s_q};
}

AttentionProblem check_attention_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionSpec& spec,
                                        const std::optional<SequenceInfo>& seq, const AttentionKernelConfig& config,
                                        const char* op) {
  const auto [dq, dk, dv] = check_shapes(q, k, v, spec, seq, config, op);
  AttentionProblem p;
  p.format = spec.qkv_format;
  p.batch = dq.batch;
  p.s_q = dq.seq;
  p.s_kv = dk.seq;
  p.h_q = dq.heads;
  p.h_kv = dk.heads;
  p.d_qk = dq.dim;
  p.d_v = dv.dim;
  p.scale = softmax_scale(spec, dq.dim);
  p.window = effective_window(spec);
  p.sink = spec.sink;
  p.config = config;

  resolve_sequences(p, q, k, spec, seq, op);
  return p;
}

}  // namespace cpf
