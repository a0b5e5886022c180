#include "attention/cp/latent_kv.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "framework/core/error.h"
#include "framework/core/logging.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/join.h"
#include "framework/tensor/ops/matmul.h"
#include "framework/tensor/ops/reduce.h"
#include "framework/tensor/ops/views.h"

namespace cpf::cp {

std::string mla_latent_mode_name(MlaLatentMode mode) {
  switch (mode) {
    case MlaLatentMode::automatic: return "auto";
    case MlaLatentMode::on: return "on";
    case MlaLatentMode::off: return "off";
  }
  return "?";
}

MlaLatentMode parse_mla_latent_mode(const std::string& name) {
  for (MlaLatentMode m : {MlaLatentMode::automatic, MlaLatentMode::on, MlaLatentMode::off}) {
    if (mla_latent_mode_name(m) == name) return m;
  }
  CPF_FAIL("unknown cp_mla_latent '", name, "' (valid: auto, on, off)");
}

namespace {

// Exposed seconds of one pass pair (forward + backward) when each token of a block is `bytes` on the
// wire: per window the part of the transfer its compute does not hide, plus the unhidden transfers.
double exposed_s(const MlaLatentCall& c, double bytes, double link, double fwd_tile_s, double bwd_tile_s) {
  const double block_s = static_cast<double>(c.tokens_per_rank) * bytes / link;
  const double others = static_cast<double>(c.ranks - 1);
  if (c.ring) {  // P - 1 forward steps; backward: K/V and the gradient sum per step, the last hop after all tiles
    return others * std::max(0.0, block_s - fwd_tile_s) + others * std::max(0.0, 2 * block_s - bwd_tile_s) + block_s;
  }
  // all_gather: each gather behind the own-keys tile; the reduce-scatter follows the compute
  const double gather_s = others * block_s;
  return std::max(0.0, gather_s - fwd_tile_s) + std::max(0.0, gather_s - bwd_tile_s) + gather_s;
}

}  // namespace

MlaLatentChoice choose_mla_latent(const MlaLatentShape& s, const MlaLatentCall& c, const MlaLatentRates& r) {
  CPF_CHECK(r.link_bytes_per_s > 0 && r.flops_per_s > 0 && r.accumulate_flops_per_s > 0,
            "cp_mla_latent auto: link and compute rates must be positive: ", r.link_bytes_per_s, " B/s, ",
            r.flops_per_s, " and ", r.accumulate_flops_per_s, " FLOP/s");
  CPF_CHECK(c.ranks >= 2 && c.tokens_per_rank > 0 && c.tile_pairs > 0 && c.element_bytes > 0,
            "cp_mla_latent auto: the call needs ranks >= 2 and positive tokens per rank, tile pairs and element "
            "bytes: ranks=",
            c.ranks, " tokens_per_rank=", c.tokens_per_rank, " tile_pairs=", c.tile_pairs,
            " element_bytes=", c.element_bytes);
  const int64_t expanded = s.num_heads * (s.head_dim_qk() + s.v_head_dim), latent = s.latent_dim();
  // One causal (load-balanced) tile is half the pairs; backward is 2.5 times the forward's GEMM work.
  const double fwd_tile_s = 0.5 * 2.0 * c.tile_pairs * static_cast<double>(expanded) / r.flops_per_s;
  const double bwd_tile_s = 2.5 * fwd_tile_s;
  const double eb = static_cast<double>(c.element_bytes);
  const double exposed_kv =
      exposed_s(c, static_cast<double>(expanded) * eb, r.link_bytes_per_s, fwd_tile_s, bwd_tile_s);
  const double exposed_latent =
      exposed_s(c, static_cast<double>(latent) * eb, r.link_bytes_per_s, fwd_tile_s, bwd_tile_s);
  // One expansion GEMM per token: kv_lora_rank -> H (nope + d_v).
  const double gemm = 2.0 * static_cast<double>(s.kv_lora_rank) * static_cast<double>(s.num_heads) *
                      static_cast<double>(s.qk_nope_head_dim + s.v_head_dim);
  const double t = static_cast<double>(c.tokens_per_rank);
  const double received_s =
      static_cast<double>(c.ranks - 1) * t * (2 * gemm / r.flops_per_s + 2 * gemm / r.accumulate_flops_per_s);
  const double own_s = std::max(0.0, t * (2 * gemm / r.accumulate_flops_per_s - gemm / r.flops_per_s));
  const double cost_s = received_s + own_s, saved_s = exposed_kv - exposed_latent;
  std::ostringstream why;
  why << "latent " << latent << " vs expanded K/V " << expanded << " values per token ("
      << static_cast<double>(expanded) / static_cast<double>(latent) << "x); " << c.tokens_per_rank
      << " tokens per rank over " << c.ranks << " ranks: exposed communication " << exposed_kv * 1e3
      << " ms expanded vs " << exposed_latent * 1e3 << " ms latent at " << r.link_bytes_per_s / 1e9
      << " GB/s (the attention hides the rest), saves " << saved_s * 1e3 << " ms; the expansion costs " << cost_s * 1e3
      << " ms";
  return {saved_s > cost_s, why.str()};
}

double cp_link_bytes_per_s(double fallback) {
  const char* env = std::getenv("CPF_CP_LINK_GBPS");
  if (env == nullptr || *env == '\0') return fallback;
  char* end = nullptr;
  const double gbps = std::strtod(env, &end);
  CPF_CHECK(end != env && *end == '\0' && std::isfinite(gbps) && gbps > 0, "CPF_CP_LINK_GBPS='", env,
            "' is not a positive number of GB/s (e.g. 150 for NVLink peers, 25 for a 200 Gb/s NIC)");
  return gbps * 1e9;
}

MlaLatentRates mla_latent_rates(const Device& device, DType dtype) {
  if (device.is_cpu()) return {.link_bytes_per_s = 10e9, .flops_per_s = 100e9, .accumulate_flops_per_s = 100e9};
  const bool half = dtype == DType::bf16;
  return {.link_bytes_per_s = cp_link_bytes_per_s(150e9),
          .flops_per_s = half ? 400e12 : 50e12,
          .accumulate_flops_per_s = 50e12};
}

double mla_tile_pairs(const std::optional<SequenceInfo>& seq, int64_t tokens_per_rank, int64_t batch, int64_t ranks) {
  CPF_CHECK(ranks > 0 && batch > 0 && tokens_per_rank % batch == 0, "cp_mla_latent auto: ", tokens_per_rank,
            " tokens per rank do not split into ", batch, " sequences over ", ranks, " ranks");
  if (seq && seq->num_sequences() > 0 && batch == 1) {
    double pairs = 0;
    for (int64_t n = 0; n < seq->num_sequences(); ++n) {
      const double local = static_cast<double>(seq->cu_seqlens_q_padded[n + 1] - seq->cu_seqlens_q_padded[n]) /
                           static_cast<double>(ranks);
      pairs += local * local;
    }
    return pairs;
  }
  const double per_sequence = static_cast<double>(tokens_per_rank / batch);
  return static_cast<double>(batch) * per_sequence * per_sequence;
}

LatentKv::LatentKv(const MlaLatentShape& shape, Tensor weight, Tensor bias)
    : shape_(shape), weight_(std::move(weight)), bias_(std::move(bias)) {
  const int64_t rows = shape.num_heads * (shape.qk_nope_head_dim + shape.v_head_dim);
  CPF_CHECK(weight_.dim() == 2 && weight_.size(0) == rows && weight_.size(1) == shape.kv_lora_rank,
            "cp_mla_latent: the up-projection weight must be (num_heads x (qk_nope_head_dim + v_head_dim), "
            "kv_lora_rank) = [",
            rows, ", ", shape.kv_lora_rank, "]: weight=", weight_.shape());
  CPF_CHECK(!bias_.defined() || (bias_.dim() == 1 && bias_.size(0) == rows),
            "cp_mla_latent: the up-projection bias must be [", rows, "]: bias=", bias_.shape());
}

std::pair<Tensor, Tensor> LatentKv::expand(const Tensor& latent) const {
  const MlaLatentShape& s = shape_;
  const int64_t t = latent.size(0), nope = s.qk_nope_head_dim, rope = s.qk_rope_head_dim;
  const Tensor flat = raw::reshape(raw::contiguous(latent), {t, s.latent_dim()});
  const Tensor c_kv = raw::contiguous(raw::narrow(flat, 1, 0, s.kv_lora_rank));
  Tensor kv = raw::matmul(c_kv, raw::contiguous(raw::transpose(weight_, 0, 1)));  // (t, H (nope + d_v))
  if (bias_.defined()) kv = raw::binary(raw::BinaryOp::add, kv, bias_);
  kv = raw::reshape(kv, {t, s.num_heads, nope + s.v_head_dim});
  // The RoPE key is shared by every head.
  const Tensor k_pe = raw::expand(
      raw::reshape(raw::contiguous(raw::narrow(flat, 1, s.kv_lora_rank, rope)), {t, 1, rope}), {t, s.num_heads, rope});
  const Tensor k = nope > 0 ? raw::cat({raw::narrow(kv, 2, 0, nope), k_pe}, 2) : raw::contiguous(k_pe);
  return {raw::contiguous(k), raw::contiguous(raw::narrow(kv, 2, nope, s.v_head_dim))};
}

Tensor LatentKv::project_grad(const Tensor& latent, const Tensor& dk, const Tensor& dv, DType acc) const {
  const MlaLatentShape& s = shape_;
  const int64_t t = latent.size(0), nope = s.qk_nope_head_dim, rope = s.qk_rope_head_dim;
  const Tensor dk_acc = raw::to(dk, acc), dv_acc = raw::to(dv, acc);
  const Tensor dkv_heads = nope > 0 ? raw::cat({raw::narrow(dk_acc, 2, 0, nope), dv_acc}, 2) : dv_acc;
  const Tensor dkv = raw::reshape(raw::contiguous(dkv_heads), {t, s.num_heads * (nope + s.v_head_dim)});
  const Tensor dc_kv = raw::matmul(dkv, raw::to(weight_, acc));            // (t, kv_lora_rank)
  const Tensor dk_pe = raw::sum(raw::narrow(dk_acc, 2, nope, rope), {1});  // (t, rope)
  const Tensor flat = raw::reshape(raw::to(raw::contiguous(latent), acc), {t, s.latent_dim()});
  const Tensor c_kv = raw::contiguous(raw::narrow(flat, 1, 0, s.kv_lora_rank));
  const Tensor dweight = raw::matmul(raw::contiguous(raw::transpose(dkv, 0, 1)), c_kv);
  if (dweight_->defined()) {
    raw::add_(*dweight_, dweight);
  } else {
    *dweight_ = dweight;
  }
  if (bias_.defined()) {
    const Tensor dbias = raw::sum(dkv, {0});
    if (dbias_->defined()) {
      raw::add_(*dbias_, dbias);
    } else {
      *dbias_ = dbias;
    }
  }
  return raw::reshape(raw::cat({dc_kv, dk_pe}, 1), {t, 1, s.latent_dim()});
}

Tensor LatentKv::weight_grad() const {
  return dweight_->defined() ? raw::to(*dweight_, weight_.dtype()) : zeros_like(weight_);
}

Tensor LatentKv::bias_grad() const {
  if (!bias_.defined()) return Tensor();
  return dbias_->defined() ? raw::to(*dbias_, bias_.dtype()) : zeros_like(bias_);
}

}  // namespace cpf::cp

namespace cpf::cp {

bool resolve_mla_latent(MlaLatentMode mode, const std::string& strategy, bool strategy_moves_kv,
                        const MlaLatentShape& shape, const MlaLatentCall& call, DType dtype, const Device& device) {
  if (mode != MlaLatentMode::automatic) return mode == MlaLatentMode::on;
  MlaLatentChoice choice;
  if (!strategy_moves_kv) {
    choice.why = strategy + " moves heads, not K/V blocks";
  } else if (call.ranks < 2) {
    choice.why = "one rank: no block travels";
  } else {
    choice = choose_mla_latent(shape, call, mla_latent_rates(device, dtype));
  }
  std::ostringstream key;
  key << strategy << ' ' << device << ' ' << dtype_name(dtype) << ' ' << shape.num_heads << ' ' << shape.kv_lora_rank
      << ' ' << shape.qk_nope_head_dim << ' ' << shape.qk_rope_head_dim << ' ' << shape.v_head_dim << ' ' << call.ranks
      << ' ' << choice.latent;  // logged again when the choice changes, not per batch shape
  if (first_time_seen("cp_mla_latent", key.str())) {
    log_info("cp_mla_latent auto (", strategy, ", ", device.str(),
             "): ", choice.latent ? "the latent travels" : "expanded K/V travel", " (", choice.why, ")");
  }
  return choice.latent;
}

}  // namespace cpf::cp

namespace cpf::cp {

LatentKv LatentKv::head_slice(int64_t first_head, int64_t heads) const {
  CPF_CHECK(first_head >= 0 && heads > 0 && first_head + heads <= shape_.num_heads, "cp_mla_latent: head slice [",
            first_head, ", ", first_head + heads, ") is outside the ", shape_.num_heads, " heads");
  MlaLatentShape shape = shape_;
  shape.num_heads = heads;
  const int64_t per_head = shape_.qk_nope_head_dim + shape_.v_head_dim;
  Tensor weight = raw::contiguous(raw::narrow(weight_, 0, first_head * per_head, heads * per_head));
  Tensor bias =
      bias_.defined() ? raw::contiguous(raw::narrow(bias_, 0, first_head * per_head, heads * per_head)) : Tensor();
  return LatentKv(shape, std::move(weight), std::move(bias));
}

void LatentKv::add_slice_grads(const LatentKv& slice, int64_t first_head) const {
  const int64_t per_head = shape_.qk_nope_head_dim + shape_.v_head_dim;
  const int64_t row0 = first_head * per_head, rows = slice.shape().num_heads * per_head;
  // The accumulators are shared pointers: a const expansion still collects its backward's gradients.
  auto fold = [&](const std::shared_ptr<Tensor>& into, const Tensor& like, const std::shared_ptr<Tensor>& part) {
    if (!part->defined()) return;
    if (!into->defined()) *into = zeros(like.shape(), {.dtype = part->dtype(), .device = part->device()});
    Tensor rows_view = raw::narrow(*into, 0, row0, rows);
    raw::add_(rows_view, *part);
  };
  fold(dweight_, weight_, slice.dweight_);
  if (bias_.defined()) fold(dbias_, bias_, slice.dbias_);
}

}  // namespace cpf::cp
