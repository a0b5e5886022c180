// The public CP entry: validation before any communication, the conversion of bshd/sbhd to the thd
// view every strategy works on, dispatch, and the autograd node.
#include "attention/cp/context_parallel.h"
#include "attention/cp/internal/unchecked_attention.h"

#include "attention/attention_sink.h"
#include "attention/cp/cp_support.h"
#include "attention/cp/strategy.h"
#include "framework/autograd/forward_stash.h"
#include "framework/autograd/node.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/views.h"
#include "framework/tensor/profile.h"

namespace cpf::cp {
namespace {

// The local shard viewed as thd (T, H, D): bshd rows are consecutive; sbhd is transposed first.
Tensor to_thd(const Tensor& t, QkvFormat format) {
  switch (format) {
    case QkvFormat::thd: return raw::contiguous(t);
    case QkvFormat::bshd: return raw::reshape(raw::contiguous(t), {t.size(0) * t.size(1), t.size(2), t.size(3)});
    case QkvFormat::sbhd: {
      Tensor bshd = raw::contiguous(raw::transpose(t, 0, 1));
      return raw::reshape(bshd, {t.size(0) * t.size(1), t.size(2), t.size(3)});
    }
  }
  return t;
}

// Inverse of to_thd for a tensor shaped like `like` (except the head dim).
Tensor from_thd(const Tensor& t, QkvFormat format, const Shape& like) {
  switch (format) {
    case QkvFormat::thd: return t;
    case QkvFormat::bshd: return raw::reshape(t, {like[0], like[1], t.size(1), t.size(2)});
    case QkvFormat::sbhd:
      return raw::contiguous(raw::transpose(raw::reshape(t, {like[1], like[0], t.size(1), t.size(2)}), 0, 1));
  }
  return t;
}

// lse (H, T) of the thd view <-> (B, H, S) for bshd/sbhd.
Tensor lse_from_thd(const Tensor& lse, QkvFormat format, int64_t batch, int64_t seq) {
  if (format == QkvFormat::thd) return lse;
  return raw::contiguous(raw::permute(raw::reshape(lse, {lse.size(0), batch, seq}), {1, 0, 2}));
}
Tensor lse_to_thd(const Tensor& lse, QkvFormat format) {
  if (format == QkvFormat::thd || !lse.defined()) return lse;
  Tensor hbs = raw::contiguous(raw::permute(lse, {1, 0, 2}));
  return raw::reshape(hbs, {hbs.size(0), hbs.size(1) * hbs.size(2)});
}

struct Resolved {
  CpContext ctx;
  QkvFormat format;
  int64_t batch = 1, local_seq = 0;  // bshd/sbhd
};

// thd: the global SequenceInfo is the batch; the local shard holds 1/P of its padded storage.
void resolve_thd(const Tensor& q, const std::optional<SequenceInfo>& seq, int64_t p, CpContext& ctx, CpQuery& query) {
  CPF_CHECK(seq.has_value(),
            "context parallel (thd): sequence info is required (global cu_seqlens and "
            "cu_seqlens_padded)");
  query.cross_attention =
      seq->cu_seqlens_q != seq->cu_seqlens_kv || seq->cu_seqlens_q_padded != seq->cu_seqlens_kv_padded;
  ctx.global = {seq->cu_seqlens_q, seq->cu_seqlens_q_padded, {}, {}};
  CPF_CHECK(seq->cu_seqlens_q_padded.size() == seq->cu_seqlens_q.size(),
            "context parallel (thd): padded cu_seqlens are required (cu_seqlens_q=", seq->cu_seqlens_q,
            ", cu_seqlens_q_padded=", seq->cu_seqlens_q_padded, "); pad every sequence to a multiple of 2*cp=", 2 * p,
            " with cp::pad_cu_seqlens");
  CPF_CHECK(seq->cu_seqlens_q_padded.back() == q.size(0) * p, "context parallel (thd): the local shard has ", q.size(0),
            " tokens but cu_seqlens_padded ", seq->cu_seqlens_q_padded, " over cp=", p, " needs ",
            seq->cu_seqlens_q_padded.back() / p);
}

// A SequenceInfo for bshd/sbhd must describe the rows of the global batch, as dot_product_attention
// requires: one slot per row starting at b * S, and without a padding mask whole rows. (It may be
// given without a padding mask to carry explicit positions.)
void check_row_sequences(const SequenceInfo& seq, const AttentionSpec& spec, int64_t batch, int64_t global_seq,
                         int64_t p) {
  CPF_CHECK(seq.num_sequences() == batch, "context parallel: sequence info describes ", seq.num_sequences(),
            " sequences for a batch of ", batch);
  for (int64_t b = 0; b <= batch; ++b) {
    CPF_CHECK(seq.cu_seqlens_q_padded[b] == b * global_seq && seq.cu_seqlens_kv_padded[b] == b * global_seq,
              "context parallel: the sequence info's slots (cu_seqlens_q_padded=", seq.cu_seqlens_q_padded,
              ", cu_seqlens_kv_padded=", seq.cu_seqlens_kv_padded, ") must be the ", batch,
              " rows of the global sequence length ", global_seq, " (local ", global_seq / p, " x cp ", p,
              "); build it with SequenceInfo::from_lengths(lengths, ", global_seq, ")");
  }
  if (is_padding(spec.mask)) return;
  for (int64_t b = 0; b < batch; ++b) {
    CPF_CHECK(seq.q_length(b) == global_seq && seq.kv_length(b) == global_seq, "context parallel: mask ",
              mask_type_name(spec.mask), " treats every ", qkv_format_name(spec.qkv_format),
              " row as one whole sequence, but the sequence info gives row ", b, " ", seq.q_length(b), " q and ",
              seq.kv_length(b), " kv tokens of ", global_seq, " (use a padding mask for shorter rows)");
  }
}

// bshd/sbhd: every row is one sequence whose slot is the row of local_seq * P tokens; a padding mask
// takes each row's real length from seq.
void resolve_rows(const Tensor& q, const AttentionSpec& spec, const std::optional<SequenceInfo>& seq, int64_t p,
                  Resolved& r, CpQuery& query) {
  const QkvFormat format = spec.qkv_format;
  r.batch = format == QkvFormat::bshd ? q.size(0) : q.size(1);
  r.local_seq = format == QkvFormat::bshd ? q.size(1) : q.size(0);
  CPF_CHECK(r.local_seq % 2 == 0, "context parallel: the local sequence length ", r.local_seq,
            " must be even: each rank holds two chunks of the 2*cp=", 2 * p, " chunk layout (q=", q.shape(), ")");
  const int64_t global_seq = r.local_seq * p;
  CPF_CHECK(!is_padding(spec.mask) || seq.has_value(), "context parallel: a ", mask_type_name(spec.mask),
            " mask needs sequence info with the real length of every row");
  if (seq) {
    query.cross_attention = seq->cu_seqlens_q != seq->cu_seqlens_kv;
    if (!query.cross_attention) check_row_sequences(*seq, spec, r.batch, global_seq, p);
  }
  GlobalSequences& global = r.ctx.global;
  global.cu_seqlens = {0};
  global.cu_seqlens_padded = {0};
  for (int64_t b = 0; b < r.batch; ++b) {
    const int64_t real = seq && is_padding(spec.mask) ? seq->q_length(b) : global_seq;
    CPF_CHECK(real <= global_seq, "context parallel: row ", b, " has real length ", real,
              " beyond the global sequence length ", global_seq, " (local ", r.local_seq, " x cp ", p, ")");
    global.cu_seqlens.push_back(global.cu_seqlens.back() + real);
    global.cu_seqlens_padded.push_back(global.cu_seqlens_padded.back() + global_seq);
  }
}

// The inputs every strategy needs, checked before any communication: a group, defined q/k/v of the
// format's rank, sharded alike along the sequence, of one dtype.
void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionSpec& spec,
                  const ContextParallel& cp, const std::string& name) {
  CPF_CHECK(cp.group != nullptr, "context parallel (", name,
            "): no CP group given (ContextParallel::group is null); pass the cp group of your DeviceMesh");
  CPF_CHECK(q.defined() && k.defined() && v.defined(), "context parallel: q, k and v must be defined");
  CPF_CHECK(cp.compute_streams == 1 || cp.compute_streams == 2, "context parallel (", name,
            "): compute_streams must be 1 or 2, got ", cp.compute_streams);
  const QkvFormat format = spec.qkv_format;
  const int64_t rank = format == QkvFormat::thd ? 3 : 4;
  CPF_CHECK(q.dim() == rank && k.dim() == rank && v.dim() == rank, "context parallel: q, k and v must be ", rank,
            "-D for ", qkv_format_name(format), ": q=", q.shape(), " k=", k.shape(), " v=", v.shape());
  const int64_t token_dims = format == QkvFormat::thd ? 1 : 2;
  for (int64_t d = 0; d < token_dims; ++d) {
    CPF_CHECK(q.size(d) == k.size(d) && k.size(d) == v.size(d),
              "context parallel: Q, K and V must be sharded the same way along the sequence: q=", q.shape(),
              " k=", k.shape(), " v=", v.shape());
  }
  CPF_CHECK(q.dtype() == k.dtype() && k.dtype() == v.dtype(), "context parallel: q, k and v dtypes differ: ", q.dtype(),
            ", ", k.dtype(), ", ", v.dtype());
}

// The support query (cp_support.h) of this call's shapes and spec; ctx.spec keeps the mask, window and
// scale and leaves heads and dims to the tensors.
CpQuery build_query(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionSpec& spec,
                    const ContextParallel& cp, CpContext& ctx) {
  CpQuery query;
  query.comm_type = cp.comm_type;
  query.cp_size = ctx.cp_size;
  query.a2a_size = cp.a2a_group ? cp.a2a_group->size() : 1;
  query.format = spec.qkv_format;
  query.mask = spec.mask;
  query.window = spec.window;
  query.num_heads = q.size(-2);
  query.num_kv_heads = k.size(-2);
  query.head_dim_qk = q.size(-1);
  query.head_dim_v = v.size(-1);
  CPF_CHECK(k.size(-1) == q.size(-1), "context parallel: head dims of q and k differ: q=", q.shape(), " k=", k.shape());
  // The spec's optional head counts describe these tensors; the strategies hand ctx.spec to per-rank
  // kernels that may see a subset of the heads (Ulysses), so check them here and let the tensors speak.
  CPF_CHECK((spec.num_heads == 0 || spec.num_heads == q.size(-2)) &&
                (spec.num_kv_heads == 0 || spec.num_kv_heads == k.size(-2)) &&
                (spec.head_dim_qk == 0 || spec.head_dim_qk == q.size(-1)) &&
                (spec.head_dim_v == 0 || spec.head_dim_v == v.size(-1)),
            "context parallel: the spec (", spec.str(), ") does not match q=", q.shape(), " k=", k.shape(),
            " v=", v.shape());
  ctx.spec.num_heads = ctx.spec.num_kv_heads = ctx.spec.head_dim_qk = ctx.spec.head_dim_v = 0;
  return query;
}

// The sink joins each merged row once (strategy.h, with_sink); no tile kernel sees it.
void take_sink(const Tensor& q, const AttentionSpec& spec, const std::string& name, CpContext& ctx, CpQuery& query) {
  if (spec.sink.defined()) {
    check_attention_sink(spec.sink, q.size(-2), q.dtype(), q.device(), ("context parallel (" + name + ")").c_str());
    ctx.sink = spec.sink.detach();
    query.attention_sink = true;
  }
  ctx.spec.sink = Tensor();
}

// The global sequences of the batch (thd: the SequenceInfo; bshd/sbhd: one slot per row).
void resolve_sequences(const Tensor& q, const AttentionSpec& spec, const std::optional<SequenceInfo>& seq, Resolved& r,
                       CpQuery& query) {
  if (seq) seq->check();  // positions of the right size, ordered slots
  if (spec.qkv_format == QkvFormat::thd) {
    resolve_thd(q, seq, r.ctx.cp_size, r.ctx, query);
  } else {
    resolve_rows(q, spec, seq, r.ctx.cp_size, r, query);
  }
}

// Global rank -> CP rank, -1 for ranks outside the group.
std::vector<int> cp_ranks_by_global_rank(const std::vector<int>& globals) {
  int max_global = 0;
  for (int g : globals) max_global = std::max(max_global, g);
  std::vector<int> cp_rank_of_global(static_cast<size_t>(max_global + 1), -1);
  for (size_t i = 0; i < globals.size(); ++i) cp_rank_of_global[globals[i]] = static_cast<int>(i);
  return cp_rank_of_global;
}

Resolved resolve(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionSpec& spec,
                 const std::optional<SequenceInfo>& seq, const ContextParallel& cp) {
  const std::string name = comm_type_name(cp.comm_type);
  check_inputs(q, k, v, spec, cp, name);
  Resolved r;
  r.format = spec.qkv_format;
  CpContext& ctx = r.ctx;
  ctx.cp_size = cp.group->size();
  ctx.cp_rank = cp.group->rank();
  ctx.config = cp;
  ctx.streams = cp.compute_streams;
  ctx.spec = spec;
  ctx.spec.qkv_format = QkvFormat::thd;
  CpQuery query = build_query(q, k, v, spec, cp, ctx);
  take_sink(q, spec, name, ctx, query);
  resolve_sequences(q, spec, seq, r, query);
  if (auto reason = unsupported_reason(query)) CPF_FAIL("context parallel: ", *reason);
  if (seq) {
    // Every token keeps the position the caller gave it (gaps, offsets): the layouts hand them on.
    ctx.global.q_positions = seq->q_positions;
    ctx.global.kv_positions = seq->kv_positions;
  }
  // Divisibility of every sequence by 2P, with the offending numbers.
  thd_shard(ctx.global.cu_seqlens, ctx.global.cu_seqlens_padded, ctx.cp_size, ctx.cp_rank);
  ctx.cp_rank_of_global = cp_ranks_by_global_rank(cp.group->global_ranks());
  return r;
}

CpForward run_forward(const CpContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v) {
  switch (ctx.config.comm_type) {
    case CommType::p2p: return p2p_forward(ctx, q, k, v);
    case CommType::all_gather: return all_gather_forward(ctx, q, k, v);
    case CommType::a2a: return a2a_forward(ctx, q, k, v);
    case CommType::a2a_p2p: return a2a_p2p_forward(ctx, q, k, v);
  }
  CPF_FAIL("context parallel: unknown comm type");
}

// run_forward, or inside a selectively recomputed region (framework/autograd/forward_stash.h) the result of
// the region's first forward on its recompute: the strategy's attention and messages do not run again.
CpForward run_or_replay_forward(const std::string& op, const CpContext& ctx, const Tensor& q, const Tensor& k,
                                const Tensor& v) {
  std::vector<Tensor> kept = autograd::stashed(op, [&] {
    CpForward f = run_forward(ctx, q, k, v);
    std::vector<Tensor> values{f.out, f.lse};
    values.insert(values.end(), f.extra.begin(), f.extra.end());
    return values;
  });
  return CpForward{kept[0], kept[1], std::vector<Tensor>(kept.begin() + 2, kept.end())};
}

CpGrads run_backward(const CpContext& ctx, const Tensor& dout, const Tensor& dlse, const Tensor& q, const Tensor& k,
                     const Tensor& v, const CpSaved& saved) {
  switch (ctx.config.comm_type) {
    case CommType::p2p: return p2p_backward(ctx, dout, dlse, q, k, v, saved);
    case CommType::all_gather: return all_gather_backward(ctx, dout, dlse, q, k, v, saved);
    case CommType::a2a: return a2a_backward(ctx, dout, dlse, q, k, v, saved);
    case CommType::a2a_p2p: return a2a_p2p_backward(ctx, dout, dlse, q, k, v, saved);
  }
  CPF_FAIL("context parallel: unknown comm type");
}

// d(sink) of the whole sequence on every rank, as one rank's attention gives it: each rank's rows give
// their share, summed over the CP group here (a collective of the backward, in the same place on every
// rank), so a caller of the API gets the full gradient. The attention modules hand the op a sink whose
// gradient is scaled by 1/cp (attention_layout.h, cp_sink), so a trainer's sum over the world still
// counts it once.
Tensor group_sink_grad(const CpContext& ctx, const Tensor& dout, const Tensor& dlse, const CpSaved& saved) {
  const Tensor mine = raw::attention_sink_grad(dout, dlse, saved.out, saved.lse, ctx.sink, QkvFormat::thd);  // (Hq)
  return ctx.config.group->all_reduce(mine, dist::ReduceOp::sum);
}

}  // namespace

namespace internal {

AttentionOutput context_parallel_attention_unchecked(const Tensor& q, const Tensor& k, const Tensor& v,
                                                     const AttentionSpec& spec, const std::optional<SequenceInfo>& seq,
                                                     const ContextParallel& cp, std::shared_ptr<CpStats> stats) {
  const profile::Scope scope("forward/cp_attention", q.defined() ? q.device() : Device::cpu());
  Resolved r = resolve(q, k, v, spec, seq, cp);
  if (!stats) stats = std::make_shared<CpStats>();
  r.ctx.stats = stats.get();
  const Tensor q_thd = to_thd(q, r.format), k_thd = to_thd(k, r.format), v_thd = to_thd(v, r.format);
  CpForward forward = run_or_replay_forward("context_parallel_attention", r.ctx, q_thd, k_thd, v_thd);
  Tensor out = from_thd(forward.out, r.format, q.shape());
  Tensor lse = lse_from_thd(forward.lse, r.format, r.batch, r.local_seq);

  using autograd::SavedTensor;
  std::vector<SavedTensor> extra;
  for (const Tensor& t : forward.extra) extra.emplace_back(t);
  const bool has_sink = spec.sink.defined();
  auto backward = [ctx = r.ctx, format = r.format, stats, has_sink, q_shape = q.shape(), k_shape = k.shape(),
                   v_shape = v.shape(), sq = SavedTensor(q_thd), sk = SavedTensor(k_thd), sv = SavedTensor(v_thd),
                   sout = SavedTensor(forward.out), slse = SavedTensor(forward.lse),
                   extra](const autograd::GradList& grads) mutable {
    ctx.stats = stats.get();
    ctx.backward = true;
    const Tensor& q_saved = sq.unpack();
    Tensor dout = grads[0].defined() ? to_thd(grads[0], format) : zeros_like(sout.unpack());
    dout = raw::to(dout, q_saved.dtype());
    const Tensor dlse = lse_to_thd(grads[1], format);
    CpSaved saved{sout.unpack(), slse.unpack(), {}};
    for (const auto& e : extra) saved.extra.push_back(e.unpack());
    const CpGrads g = run_backward(ctx, raw::contiguous(dout), dlse.defined() ? raw::contiguous(dlse) : dlse, q_saved,
                                   sk.unpack(), sv.unpack(), saved);
    autograd::GradList result{from_thd(g.dq, format, q_shape), from_thd(g.dk, format, k_shape),
                              from_thd(g.dv, format, v_shape)};
    if (has_sink) result.push_back(group_sink_grad(ctx, dout, dlse, saved));
    return result;
  };
  std::vector<Tensor> inputs{q, k, v};
  if (has_sink) inputs.push_back(spec.sink);
  auto outputs = autograd::record("context_parallel_attention[" + comm_type_name(cp.comm_type) + "]", {out, lse},
                                  inputs, backward);
  return {outputs[0], outputs[1]};
}

}  // namespace internal
}  // namespace cpf::cp

namespace cpf::cp {

ShardedTensor dual_chunk_of(const Tensor& t, const ContextParallel& cp) {
  CPF_CHECK(cp.group != nullptr, "cp::dual_chunk_of: no CP group given (ContextParallel::group is null)");
  return {t, Sharding::dual_chunk(cp.group->size(), cp.group->rank())};
}

AttentionOutput context_parallel_attention(const ShardedTensor& q, const ShardedTensor& k, const ShardedTensor& v,
                                           const AttentionSpec& spec, const std::optional<SequenceInfo>& seq,
                                           const ContextParallel& cp, std::shared_ptr<CpStats> stats) {
  const std::string who = "context parallel (" + comm_type_name(cp.comm_type) + ")";
  CPF_CHECK(cp.group != nullptr, who, ": no CP group given (ContextParallel::group is null); pass the cp group of ",
            "your DeviceMesh");
  check_attention_shardings(q.sharding, k.sharding, v.sharding, cp.group->size(), cp.group->rank(), who);
  return internal::context_parallel_attention_unchecked(q.tensor, k.tensor, v.tensor, spec, seq, cp, std::move(stats));
}

AttentionOutput context_parallel_mla_attention(const ShardedTensor& q, const ShardedTensor& latent,
                                               const Tensor& kv_b_weight, const Tensor& kv_b_bias,
                                               const MlaLatentShape& shape, const AttentionSpec& spec,
                                               const std::optional<SequenceInfo>& seq, const ContextParallel& cp,
                                               std::shared_ptr<CpStats> stats) {
  const std::string who = "context parallel MLA (" + comm_type_name(cp.comm_type) + ")";
  CPF_CHECK(cp.group != nullptr, who, ": no CP group given (ContextParallel::group is null); pass the cp group of ",
            "your DeviceMesh");
  // The latent stands for K and V: it must be cut as q is.
  check_attention_shardings(q.sharding, latent.sharding, latent.sharding, cp.group->size(), cp.group->rank(), who);
  return internal::context_parallel_mla_attention_unchecked(q.tensor, latent.tensor, kv_b_weight, kv_b_bias, shape,
                                                            spec, seq, cp, std::move(stats));
}

}  // namespace cpf::cp

namespace cpf::cp {
namespace {

// Checks what only the latent call has: the strategy, the latent's and q's shapes, the dtypes.
void check_mla_latent_inputs(const Tensor& q, const Tensor& latent, const Tensor& weight, const Tensor& bias,
                             const MlaLatentShape& shape, const ContextParallel& cp) {
  const std::string who = "context parallel (" + comm_type_name(cp.comm_type) + ")";
  if (auto reason = mla_latent_problem(cp.comm_type)) CPF_FAIL("context parallel: ", *reason);
  CPF_CHECK(q.defined() && latent.defined() && weight.defined(), who,
            ": q, the latent and the up-projection weight "
            "must be defined");
  CPF_CHECK(latent.dim() == q.dim() && latent.size(-2) == 1 && latent.size(-1) == shape.latent_dim(), who,
            ": the MLA latent must be q's layout with one head of kv_lora_rank + qk_rope_head_dim = ",
            shape.latent_dim(), " values: latent=", latent.shape(), " q=", q.shape());
  for (int64_t d = 0; d + 2 < q.dim(); ++d) {
    CPF_CHECK(latent.size(d) == q.size(d), who, ": q and the latent must hold the same tokens: q=", q.shape(),
              " latent=", latent.shape());
  }
  CPF_CHECK(q.size(-2) == shape.num_heads && q.size(-1) == shape.head_dim_qk(), who, ": q=", q.shape(),
            " must have num_heads=", shape.num_heads,
            " heads of qk_nope_head_dim + qk_rope_head_dim = ", shape.head_dim_qk());
  CPF_CHECK(
      latent.dtype() == q.dtype() && weight.dtype() == q.dtype() && (!bias.defined() || bias.dtype() == q.dtype()), who,
      ": q, the latent and the up-projection must share a dtype: q ", q.dtype(), ", latent ", latent.dtype(),
      ", weight ", weight.dtype());
}

}  // namespace

AttentionOutput internal::context_parallel_mla_attention_unchecked(
    const Tensor& q, const Tensor& latent, const Tensor& kv_b_weight, const Tensor& kv_b_bias,
    const MlaLatentShape& shape, const AttentionSpec& spec, const std::optional<SequenceInfo>& seq,
    const ContextParallel& cp, std::shared_ptr<CpStats> stats) {
  const profile::Scope scope("forward/cp_attention", q.defined() ? q.device() : Device::cpu());
  check_mla_latent_inputs(q, latent, kv_b_weight, kv_b_bias, shape, cp);
  // The expanded K and V as zero-stride views (no memory): the shared validation sees the call as it is.
  Shape v_shape = q.shape();
  v_shape.back() = shape.v_head_dim;
  const Tensor one = zeros(Shape(static_cast<size_t>(q.dim()), 1), {.dtype = q.dtype(), .device = q.device()});
  Resolved r = resolve(q, raw::expand(one, q.shape()), raw::expand(one, v_shape), spec, seq, cp);
  const Tensor weight = kv_b_weight.detach(), bias = kv_b_bias.defined() ? kv_b_bias.detach() : Tensor();
  r.ctx.latent = std::make_shared<LatentKv>(shape, weight, bias);
  if (!stats) stats = std::make_shared<CpStats>();
  r.ctx.stats = stats.get();
  const Tensor q_thd = to_thd(q, r.format), latent_thd = to_thd(latent, r.format);
  CpForward forward = run_or_replay_forward("context_parallel_mla_attention", r.ctx, q_thd, latent_thd, Tensor());

  using autograd::SavedTensor;
  const bool has_sink = spec.sink.defined(), has_bias = bias.defined();
  std::vector<SavedTensor> extra;  // a2a+p2p keeps its head-split state for the backward
  for (const Tensor& t : forward.extra) extra.emplace_back(t);
  auto backward = [ctx = r.ctx, format = r.format, stats, has_sink, has_bias, shape, weight, bias, q_shape = q.shape(),
                   latent_shape = latent.shape(), sq = SavedTensor(q_thd), slatent = SavedTensor(latent_thd),
                   sout = SavedTensor(forward.out), slse = SavedTensor(forward.lse),
                   extra](const autograd::GradList& grads) mutable {
    ctx.stats = stats.get();
    ctx.backward = true;
    auto latent_kv = std::make_shared<LatentKv>(shape, weight, bias);  // fresh dW/db accumulators
    ctx.latent = latent_kv;
    const Tensor& q_saved = sq.unpack();
    Tensor dout = grads[0].defined() ? to_thd(grads[0], format) : zeros_like(sout.unpack());
    dout = raw::contiguous(raw::to(dout, q_saved.dtype()));
    Tensor dlse = lse_to_thd(grads[1], format);
    if (dlse.defined()) dlse = raw::contiguous(dlse);
    CpSaved saved{sout.unpack(), slse.unpack(), {}};
    for (const auto& e : extra) saved.extra.push_back(e.unpack());
    const CpGrads g = run_backward(ctx, dout, dlse, q_saved, slatent.unpack(), Tensor(), saved);
    autograd::GradList result{from_thd(g.dq, format, q_shape), from_thd(g.dk, format, latent_shape),
                              latent_kv->weight_grad()};
    if (has_bias) result.push_back(latent_kv->bias_grad());
    if (has_sink) result.push_back(group_sink_grad(ctx, dout, dlse, saved));
    return result;
  };
  std::vector<Tensor> inputs{q, latent, kv_b_weight};
  if (has_bias) inputs.push_back(kv_b_bias);
  if (has_sink) inputs.push_back(spec.sink);
  auto outputs = autograd::record(
      "context_parallel_mla_attention[" + comm_type_name(cp.comm_type) + "]",
      {from_thd(forward.out, r.format, v_shape), lse_from_thd(forward.lse, r.format, r.batch, r.local_seq)}, inputs,
      backward);
  return {outputs[0], outputs[1]};
}

}  // namespace cpf::cp
