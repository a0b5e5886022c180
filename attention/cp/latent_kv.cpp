#include "attention/cp/latent_kv.h"

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

MlaLatentChoice choose_mla_latent(const MlaLatentShape& s, int64_t element_bytes, double link_bytes_per_s,
                                  double flops_per_s) {
  CPF_CHECK(link_bytes_per_s > 0 && flops_per_s > 0, "cp_mla_latent auto: link and compute rates must be positive: ",
            link_bytes_per_s, " B/s, ", flops_per_s, " FLOP/s");
  const int64_t expanded = s.num_heads * (s.head_dim_qk() + s.v_head_dim);
  const int64_t latent = s.latent_dim();
  // Per token that travels: K/V forward and again in backward (input dtype), dK/dV back (fp32).
  const double bytes_saved = static_cast<double>(expanded - latent) * static_cast<double>(2 * element_bytes + 4);
  // Per token received: the expansion GEMM forward, and in backward the re-expansion, d c_kv and dW.
  const double flops = 4.0 * 2.0 * static_cast<double>(s.kv_lora_rank) * s.num_heads *
                       static_cast<double>(s.qk_nope_head_dim + s.v_head_dim);
  const double saved_s = bytes_saved / link_bytes_per_s, cost_s = flops / flops_per_s;
  std::ostringstream why;
  why << "latent " << latent << " vs expanded K/V " << expanded << " values per token ("
      << static_cast<double>(expanded) / static_cast<double>(latent) << "x): saves " << bytes_saved
      << " B per token (" << saved_s * 1e9 << " ns at " << link_bytes_per_s / 1e9 << " GB/s), costs " << flops
      << " FLOP per token (" << cost_s * 1e9 << " ns at " << flops_per_s / 1e12 << " TFLOP/s)";
  return {saved_s > cost_s, why.str()};
}

LatentKv::LatentKv(const MlaLatentShape& shape, Tensor weight, Tensor bias)
    : shape_(shape), weight_(std::move(weight)), bias_(std::move(bias)) {
  const int64_t rows = shape.num_heads * (shape.qk_nope_head_dim + shape.v_head_dim);
  CPF_CHECK(weight_.dim() == 2 && weight_.size(0) == rows && weight_.size(1) == shape.kv_lora_rank,
            "cp_mla_latent: the up-projection weight must be (num_heads x (qk_nope_head_dim + v_head_dim), "
            "kv_lora_rank) = [", rows, ", ", shape.kv_lora_rank, "]: weight=", weight_.shape());
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
  const Tensor k_pe = raw::expand(raw::reshape(raw::contiguous(raw::narrow(flat, 1, s.kv_lora_rank, rope)), {t, 1, rope}),
                                  {t, s.num_heads, rope});
  const Tensor k = nope > 0 ? raw::cat({raw::narrow(kv, 2, 0, nope), k_pe}, 2) : raw::contiguous(k_pe);
  return {raw::contiguous(k), raw::contiguous(raw::narrow(kv, 2, nope, s.v_head_dim))};
}

Tensor LatentKv::project_grad(const Tensor& latent, const Tensor& dk, const Tensor& dv, DType acc) const {
  const MlaLatentShape& s = shape_;
  const int64_t t = latent.size(0), nope = s.qk_nope_head_dim, rope = s.qk_rope_head_dim;
  const Tensor dk_acc = raw::to(dk, acc), dv_acc = raw::to(dv, acc);
  const Tensor dkv_heads = nope > 0 ? raw::cat({raw::narrow(dk_acc, 2, 0, nope), dv_acc}, 2) : dv_acc;
  const Tensor dkv = raw::reshape(raw::contiguous(dkv_heads), {t, s.num_heads * (nope + s.v_head_dim)});
  const Tensor dc_kv = raw::matmul(dkv, raw::to(weight_, acc));                    // (t, kv_lora_rank)
  const Tensor dk_pe = raw::sum(raw::narrow(dk_acc, 2, nope, rope), {1});        // (t, rope)
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
                        const MlaLatentShape& shape, DType dtype, const Device& device) {
  if (mode != MlaLatentMode::automatic) return mode == MlaLatentMode::on;
  MlaLatentChoice choice;
  if (!strategy_moves_kv) {
    choice.why = strategy + " moves heads, not K/V blocks";
  } else {
    const bool gpu = !device.is_cpu();
    choice = choose_mla_latent(shape, static_cast<int64_t>(dtype_size(dtype)), gpu ? 100e9 : 10e9,
                               gpu ? 400e12 : 100e9);
  }
  std::ostringstream key;
  key << strategy << ' ' << device << ' ' << dtype_name(dtype) << ' ' << shape.num_heads << ' ' << shape.kv_lora_rank
      << ' ' << shape.qk_nope_head_dim << ' ' << shape.qk_rope_head_dim << ' ' << shape.v_head_dim;
  if (first_time_seen("cp_mla_latent", key.str())) {
    log_info("cp_mla_latent auto (", strategy, ", ", device.str(), "): ",
             choice.latent ? "the latent travels" : "expanded K/V travel", " (", choice.why, ")");
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
  Tensor bias = bias_.defined() ? raw::contiguous(raw::narrow(bias_, 0, first_head * per_head, heads * per_head))
                                : Tensor();
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
