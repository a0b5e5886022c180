#include "attention/cp/lse_merge.h"

#include <cmath>
#include <limits>

#include "framework/tensor/ops/copy.h"

namespace cpf::cp {

PartialMerge::PartialMerge(int64_t tokens, int64_t heads, int64_t head_dim, DType input_dtype) {
  const DType acc = input_dtype == DType::f64 ? DType::f64 : DType::f32;
  out_ = zeros({tokens, heads, head_dim}, {.dtype = acc});
  lse_ = full({heads, tokens}, -std::numeric_limits<double>::infinity(), {.dtype = acc});
}

void PartialMerge::add(const Tensor& out_i, const Tensor& lse_i) {
  CPF_CHECK(out_i.shape() == out_.shape() && lse_i.shape() == lse_.shape(), "cp merge: partial out ", out_i.shape(),
            " / lse ", lse_i.shape(), " do not match the accumulator ", out_.shape(), " / ", lse_.shape());
  const Tensor o = raw::contiguous(raw::to(out_i, out_.dtype()));
  const Tensor l = raw::contiguous(raw::to(lse_i, lse_.dtype()));
  visit_compute_dtype(out_.dtype(), "cp merge", [&]<class T>() {
    const int64_t tokens = out_.size(0), heads = out_.size(1), dim = out_.size(2);
    T* acc_out = out_.data<T>();
    T* acc_lse = lse_.data<T>();
    const T* part_out = o.data<T>();
    const T* part_lse = l.data<T>();
    const T neg_inf = -std::numeric_limits<T>::infinity();
#if defined(CPF_WITH_OPENMP)
#pragma omp parallel for if (tokens * heads * dim > (1 << 16)) schedule(static)
#endif
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const T li = part_lse[h * tokens + t];
        if (li == neg_inf) continue;  // this part saw no key for the row
        T& la = acc_lse[h * tokens + t];
        const T hi = std::max(la, li);
        const T merged = hi + std::log(std::exp(la - hi) + std::exp(li - hi));
        const T keep = la == neg_inf ? T(0) : std::exp(la - merged);
        const T take = std::exp(li - merged);
        T* row = acc_out + (t * heads + h) * dim;
        const T* part = part_out + (t * heads + h) * dim;
        for (int64_t d = 0; d < dim; ++d) row[d] = keep * row[d] + take * part[d];
        la = merged;
      }
    }
  });
}

Tensor PartialMerge::out(DType dtype) const { return raw::to(out_, dtype); }

}  // namespace cpf::cp
