#include "framework/tensor/ops/index.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "framework/tensor/cpu/strided_loop.h"
#include "framework/tensor/device_ops.h"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/views.h"
#include "framework/tensor/shape_utils.h"

namespace cpf::raw {
namespace {

void check_cpu(const Tensor& t, const char* op) {
  CPF_CHECK(has_kernel(t.device(), &DeviceOps::gather) && has_kernel(t.device(), &DeviceOps::scatter_add), op,
            ": no kernel for device ", t.device(), " in this build");
}

void check_index_dtype(const Tensor& index, const char* op) {
  CPF_CHECK(index.dtype() == DType::i32 || index.dtype() == DType::i64, op, ": index must be i32 or i64, got ",
            index.dtype());
}

// Calls fn.template operator()<I>() with I the C++ type of an index dtype (checked before).
template <class Fn>
void visit_index_dtype(DType dtype, Fn&& fn) {
  if (dtype == DType::i32) {
    fn.template operator()<int32_t>();
  } else {
    fn.template operator()<int64_t>();
  }
}

// The dtypes an accumulating op adds in.
void check_accumulate_dtype(const Tensor& t, const char* op) {
  CPF_CHECK(t.dtype() != DType::boolean, op, ": dtype ", t.dtype(),
            " is not supported (expected f32, f64, bf16, i32 or i64)");
}

Shape drop_dim(const Shape& values, int64_t d) {
  Shape out = values;
  out.erase(out.begin() + d);
  return out;
}

// Every index value must lie in [0, size). Walks `index` in row-major order and reports the first
// offender with its multi-index, before anything is written.
void check_index_range(const Tensor& index, int64_t size, int64_t dim, const char* op) {
  if (index.numel() == 0) return;
  if (!index.device().is_cpu()) {
    if (!has_kernel(index.device(), &DeviceOps::check_indices)) {
      return check_index_range(to(index, Device::cpu()), size, dim, op);
    }
    // Checked on the device: an error is raised at the next synchronisation (framework/tensor/cuda/cuda.h).
    DeviceIndexCheck check;
    check.kind = DeviceIndexKind::index;
    check.op = op;
    check.index = contiguous(index);
    check.bound = size;
    check.dim = dim;
    return device_kernel(index.device(), &DeviceOps::check_indices, op)(check);
  }
  visit_index_dtype(index.dtype(), [&]<class I>() {
    const I* base = index.data<I>();
    const Shape& shape = index.shape();
    const Shape& strides = index.strides();
    const int64_t ndim = index.dim();
    Shape pos(static_cast<size_t>(ndim), 0);
    int64_t off = 0;
    const int64_t numel = index.numel();
    for (int64_t flat = 0; flat < numel; ++flat) {
      const int64_t v = static_cast<int64_t>(base[off]);
      CPF_CHECK(v >= 0 && v < size, op, ": index ", v, " at position ", pos, " is out of range for dim ", dim,
                " of size ", size, " (expected 0 <= index < ", size, ")");
      for (int64_t d = ndim - 1; d >= 0; --d) {  // odometer step
        if (++pos[d] < shape[d]) {
          off += strides[d];
          break;
        }
        off -= strides[d] * (shape[d] - 1);
        pos[d] = 0;
      }
    }
  });
}

// A sufficient test that no two elements of t share memory: with dims sorted by stride, each stride
// must step over the whole extent of the smaller ones. Expanded (stride 0) views fail it.
bool non_overlapping(const Tensor& t) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size)
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.shape()[d] > 1) dims.emplace_back(t.strides()[d], t.shape()[d]);
  }
  std::sort(dims.begin(), dims.end());
  int64_t extent = 1;
  for (const auto& [stride, size] : dims) {
    if (stride < extent) return false;
    extent = stride * size;
  }
  return true;
}

void check_non_overlapping(const Tensor& dst, const char* op) {
  CPF_CHECK(non_overlapping(dst), op, ": destination of shape ", dst.shape(), " with strides ", dst.strides(),
            " has elements that share memory (an expanded view?); accumulate into a contiguous tensor instead");
}

// Runs fn(i) for i in [0, count). Each call touches `work_per_call` elements; calls run on several
// threads only when each is too small to be split internally and all of them together are big.
template <class Fn>
void parallel_calls(int64_t count, int64_t work_per_call, Fn&& fn) {
#if defined(CPF_WITH_OPENMP)
  if (cpu::max_threads() > 1 && work_per_call < cpu::kParallelGrain && count > 1 &&
      count * work_per_call >= cpu::kParallelGrain) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < count; ++i) fn(i);
    return;
  }
#endif
  for (int64_t i = 0; i < count; ++i) fn(i);
}

// Walks two equally shaped strided slices (out, in) described by `it`; calls op(out_elem, in_elem).
template <class Out, class In, class Op>
void walk_slice(const cpu::StridedIteration<2>& it, Out* out, const In* in, Op op) {
  cpu::for_each_row<2>(it, {reinterpret_cast<char*>(out), reinterpret_cast<char*>(const_cast<In*>(in))},
                       {static_cast<int64_t>(sizeof(Out)), static_cast<int64_t>(sizeof(In))},
                       [&](const std::array<char*, 2>& p, int64_t n, const std::array<int64_t, 2>& s) {
                         Out* o = reinterpret_cast<Out*>(p[0]);
                         const In* x = reinterpret_cast<const In*>(p[1]);
                         if (s[0] == 1 && s[1] == 1) {
                           for (int64_t j = 0; j < n; ++j) op(o[j], x[j]);
                         } else {
                           for (int64_t j = 0; j < n; ++j) op(o[j * s[0]], x[j * s[1]]);
                         }
                       });
}

// Accumulating ops write into `dst` directly, or for bf16 into an f32 copy that is rounded back
// once at the end. fn.template operator()<Acc, Src>(acc) does the accumulation.
template <class Fn>
void accumulate_into(const Tensor& dst, Fn&& fn) {
  if (dst.dtype() == DType::bf16) {
    Tensor acc = to(dst, DType::f32);
    fn.template operator()<float, bfloat16>(acc);
    copy_(dst, acc);  // bumps dst's version
    return;
  }
  visit_dtype(dst.dtype(), [&]<class T>() {
    if constexpr (!std::is_same_v<T, bool> && !std::is_same_v<T, bfloat16>) fn.template operator()<T, T>(dst);
  });
  dst.bump_version();
}

// ---- index_add_ ----------------------------------------------------------------------------------

// acc.select(d, idx[i]) += src.select(d, i). Each destination slice receives its sources in
// increasing i whether the loop runs over i (large slices, split inside) or over destinations.
template <class Acc, class Src>
void index_add_kernel(const Tensor& acc, int64_t d, const std::vector<int64_t>& idx, const Tensor& src) {
  const auto it =
      cpu::make_iteration<2>(drop_dim(acc.shape(), d), {drop_dim(acc.strides(), d), drop_dim(src.strides(), d)});
  Acc* acc_base = acc.data<Acc>();
  const Src* src_base = src.data<Src>();
  const int64_t acc_step = acc.strides()[d], src_step = src.strides()[d];
  const auto add_slice = [&](int64_t target, int64_t i) {
    walk_slice(it, acc_base + target * acc_step, src_base + i * src_step,
               [](Acc& a, const Src& s) { a += static_cast<Acc>(s); });
  };
  const int64_t m = static_cast<int64_t>(idx.size());
  const int64_t n = acc.shape()[d];
  const bool by_destination =
      cpu::max_threads() > 1 && it.numel < cpu::kParallelGrain && m * it.numel >= cpu::kParallelGrain && n > 1;
  if (!by_destination) {
    for (int64_t i = 0; i < m; ++i) add_slice(idx[i], i);
    return;
  }
  // Small slices (e.g. an embedding gradient): bucket the positions by destination with a stable
  // counting sort, then give each thread whole destinations.
  std::vector<int64_t> begin(static_cast<size_t>(n + 1), 0);
  for (int64_t t : idx) ++begin[t + 1];
  for (int64_t t = 0; t < n; ++t) begin[t + 1] += begin[t];
  std::vector<int64_t> order(static_cast<size_t>(m));
  std::vector<int64_t> next(begin.begin(), begin.end() - 1);
  for (int64_t i = 0; i < m; ++i) order[next[idx[i]]++] = i;
#if defined(CPF_WITH_OPENMP)
#pragma omp parallel for schedule(dynamic, 16)
#endif
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t k = begin[t]; k < begin[t + 1]; ++k) add_slice(t, order[k]);
  }
}

// ---- gather / scatter ----------------------------------------------------------------------------

// Checks shared by gather and scatter: `x` (the tensor indexed along d) and `index` have one rank and
// equal sizes outside d. Returns the normalised dim.
int64_t check_along_dim(const Tensor& x, const char* x_name, int64_t dim, const Tensor& index, const char* op) {
  CPF_CHECK(x.dim() > 0, op, ": ", x_name, " must have at least one dimension, got a zero-dimensional tensor");
  const int64_t d = normalize_dim(dim, x.dim(), op);
  check_index_dtype(index, op);
  CPF_CHECK(index.dim() == x.dim(), op, ": index of shape ", index.shape(), " must have the rank of ", x_name,
            " of shape ", x.shape());
  for (int64_t k = 0; k < x.dim(); ++k) {
    CPF_CHECK(k == d || index.shape()[k] == x.shape()[k], op, ": index of shape ", index.shape(), " does not match ",
              x_name, " of shape ", x.shape(), " outside dim ", d, " (sizes differ at dim ", k,
              "; expand the index to broadcast it)");
  }
  return d;
}

void check_scatter_inputs(const Tensor& dst, int64_t d, const Tensor& index, const Tensor& src, const char* op) {
  check_same_dtype(dst, src, op);
  check_accumulate_dtype(dst, op);
  CPF_CHECK(src.shape() == index.shape(), op, ": src of shape ", src.shape(), " must have the shape of index ",
            index.shape());
  check_same_device(dst, index, op);
  check_same_device(dst, src, op);
  check_cpu(dst, op);
  check_index_range(index, dst.shape()[d], d, op);
}

// acc[p with p[d] = index[p]] += src[p]. Iterates with d innermost, so the elements that meet in one
// destination share a row: rows run in parallel, each row in order.
template <class Acc, class Src>
void scatter_add_kernel(const Tensor& acc, int64_t d, const Tensor& index, const Tensor& src) {
  if (index.numel() == 0) return;
  std::vector<int64_t> perm;
  for (int64_t k = 0; k < acc.dim(); ++k) {
    if (k != d) perm.push_back(k);
  }
  perm.push_back(d);
  const auto permuted = [&](const Shape& v) {
    Shape out;
    for (int64_t k : perm) out.push_back(v[k]);
    return out;
  };
  Shape acc_strides = permuted(acc.strides());
  acc_strides.back() = 0;  // the index supplies the offset along d
  const auto it = cpu::make_iteration<3>(permuted(index.shape()),
                                         {acc_strides, permuted(index.strides()), permuted(src.strides())});
  const int64_t acc_step = acc.strides()[d];
  visit_index_dtype(index.dtype(), [&]<class I>() {
    cpu::for_each_row<3>(
        it,
        {static_cast<char*>(acc.raw_data()), static_cast<char*>(index.raw_data()), static_cast<char*>(src.raw_data())},
        {static_cast<int64_t>(sizeof(Acc)), static_cast<int64_t>(sizeof(I)), static_cast<int64_t>(sizeof(Src))},
        [&](const std::array<char*, 3>& p, int64_t n, const std::array<int64_t, 3>& s) {
          Acc* a = reinterpret_cast<Acc*>(p[0]);
          const I* ix = reinterpret_cast<const I*>(p[1]);
          const Src* v = reinterpret_cast<const Src*>(p[2]);
          for (int64_t j = 0; j < n; ++j) {
            a[j * s[0] + static_cast<int64_t>(ix[j * s[1]]) * acc_step] += static_cast<Acc>(v[j * s[2]]);
          }
        },
        /*split_rows=*/false);
  });
}

bool representable(double value, DType dtype) {
  switch (dtype) {
    case DType::boolean: return value == 0.0 || value == 1.0;
    case DType::i32:
      return std::trunc(value) == value && value >= std::numeric_limits<int32_t>::min() &&
             value <= std::numeric_limits<int32_t>::max();
    case DType::i64: return std::trunc(value) == value && value >= -0x1p63 && value < 0x1p63;
    default: return true;  // floating types take any double (rounded, or +-inf)
  }
}

}  // namespace

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  check_defined(x, "index_select", "x");
  check_defined(index, "index_select", "index");
  CPF_CHECK(x.dim() > 0, "index_select: x must have at least one dimension, got a zero-dimensional tensor");
  const int64_t d = normalize_dim(dim, x.dim(), "index_select");
  check_index_dtype(index, "index_select");
  CPF_CHECK(index.dim() == 1, "index_select: index must be 1-D, got shape ", index.shape());
  check_same_device(x, index, "index_select");
  check_cpu(x, "index_select");
  check_index_range(index, x.size(d), d, "index_select");
  if (!x.device().is_cpu()) {
    Shape shape = x.shape();
    shape[d] = index.numel();
    Tensor out = empty(shape, {.dtype = x.dtype(), .device = x.device()});
    if (out.numel() > 0) device_kernel(x.device(), &DeviceOps::gather, "index_select")(out, x, d, index, true);
    return out;
  }

  const std::vector<int64_t> idx = index.to_vector<int64_t>();
  const int64_t m = static_cast<int64_t>(idx.size());
  Shape out_shape = x.shape();
  out_shape[d] = m;
  Tensor out = empty(out_shape, {.dtype = x.dtype(), .device = x.device()});
  if (out.numel() == 0) return out;
  // One strided slice copy per index; every slice shares the iteration, only the bases move.
  const auto it =
      cpu::make_iteration<2>(drop_dim(out_shape, d), {drop_dim(out.strides(), d), drop_dim(x.strides(), d)});
  visit_dtype(x.dtype(), [&]<class T>() {
    T* out_base = out.data<T>();
    const T* x_base = x.data<T>();
    const int64_t out_step = out.strides()[d], x_step = x.strides()[d];
    parallel_calls(m, it.numel, [&](int64_t i) {
      walk_slice(it, out_base + i * out_step, x_base + idx[i] * x_step, [](T& o, const T& v) { o = v; });
    });
  });
  return out;
}

namespace {

// The checks index_add_ and index_copy_ share (src holds one slice of dst along `dim` per index);
// returns the normalised dim. The index range is checked by the caller, last.
int64_t check_index_rows(const Tensor& dst, int64_t dim, const Tensor& index, const Tensor& src, const char* op) {
  check_defined(dst, op, "dst");
  check_defined(index, op, "index");
  check_defined(src, op, "src");
  CPF_CHECK(dst.dim() > 0, op, ": dst must have at least one dimension, got a zero-dimensional tensor");
  const int64_t d = normalize_dim(dim, dst.dim(), op);
  check_index_dtype(index, op);
  CPF_CHECK(index.dim() == 1, op, ": index must be 1-D, got shape ", index.shape());
  check_same_dtype(dst, src, op);
  Shape expected = dst.shape();
  expected[d] = index.numel();
  CPF_CHECK(src.shape() == expected, op, ": src of shape ", src.shape(), " does not fit dst of shape ", dst.shape(),
            " with ", index.numel(), " indices along dim ", d, " (expected ", expected, ")");
  check_same_device(dst, index, op);
  check_same_device(dst, src, op);
  check_cpu(dst, op);
  check_non_overlapping(dst, op);
  return d;
}

}  // namespace

void index_add_(const Tensor& dst, int64_t dim, const Tensor& index, const Tensor& src) {
  const int64_t d = check_index_rows(dst, dim, index, src, "index_add_");
  check_accumulate_dtype(dst, "index_add_");
  check_index_range(index, dst.size(d), d, "index_add_");
  if (!dst.device().is_cpu()) {
    accumulate_into(dst, [&]<class Acc, class Src>(const Tensor& acc) {
      if (src.numel() > 0) device_kernel(dst.device(), &DeviceOps::scatter_add, "index_add_")(acc, d, index, src, true);
    });
    return;
  }

  const std::vector<int64_t> idx = index.to_vector<int64_t>();
  accumulate_into(dst, [&]<class Acc, class Src>(const Tensor& acc) {
    if (src.numel() > 0) index_add_kernel<Acc, Src>(acc, d, idx, src);
  });
}

void index_copy_(const Tensor& dst, int64_t dim, const Tensor& index, const Tensor& src) {
  const int64_t d = check_index_rows(dst, dim, index, src, "index_copy_");
  check_index_range(index, dst.size(d), d, "index_copy_");
  if (src.numel() == 0) return;
  if (!dst.device().is_cpu()) {
    device_kernel(dst.device(), &DeviceOps::index_copy, "index_copy_")(dst, d, index, src);
  } else {
    const std::vector<int64_t> idx = index.to_vector<int64_t>();
    for (size_t i = 0; i < idx.size(); ++i) {
      copy_(narrow(dst, d, idx[i], 1), narrow(src, d, static_cast<int64_t>(i), 1));  // in order: the last wins
    }
  }
  dst.bump_version();
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  check_defined(x, "gather", "x");
  check_defined(index, "gather", "index");
  const int64_t d = check_along_dim(x, "x", dim, index, "gather");
  check_same_device(x, index, "gather");
  check_cpu(x, "gather");
  check_index_range(index, x.size(d), d, "gather");

  Tensor out = empty(index.shape(), {.dtype = x.dtype(), .device = x.device()});
  if (out.numel() == 0) return out;
  if (!x.device().is_cpu()) {
    device_kernel(x.device(), &DeviceOps::gather, "gather")(out, x, d, index, false);
    return out;
  }
  // x's stride along d is 0 in the iteration: the index supplies that offset per element.
  Shape x_strides = x.strides();
  const int64_t x_step = x_strides[d];
  x_strides[d] = 0;
  const auto it = cpu::make_iteration<3>(index.shape(), {out.strides(), index.strides(), x_strides});
  visit_dtype(x.dtype(), [&]<class T>() {
    visit_index_dtype(index.dtype(), [&]<class I>() {
      cpu::for_each_row<3>(
          it,
          {static_cast<char*>(out.raw_data()), static_cast<char*>(index.raw_data()), static_cast<char*>(x.raw_data())},
          {static_cast<int64_t>(sizeof(T)), static_cast<int64_t>(sizeof(I)), static_cast<int64_t>(sizeof(T))},
          [&](const std::array<char*, 3>& p, int64_t n, const std::array<int64_t, 3>& s) {
            T* o = reinterpret_cast<T*>(p[0]);
            const I* ix = reinterpret_cast<const I*>(p[1]);
            const T* v = reinterpret_cast<const T*>(p[2]);
            for (int64_t j = 0; j < n; ++j) o[j * s[0]] = v[j * s[2] + static_cast<int64_t>(ix[j * s[1]]) * x_step];
          });
    });
  });
  return out;
}

void scatter_add_(const Tensor& dst, int64_t dim, const Tensor& index, const Tensor& src) {
  check_defined(dst, "scatter_add_", "dst");
  check_defined(index, "scatter_add_", "index");
  check_defined(src, "scatter_add_", "src");
  const int64_t d = check_along_dim(dst, "dst", dim, index, "scatter_add_");
  check_non_overlapping(dst, "scatter_add_");
  check_scatter_inputs(dst, d, index, src, "scatter_add_");
  if (!dst.device().is_cpu()) {
    accumulate_into(dst, [&]<class Acc, class Src>(const Tensor& acc) {
      device_kernel(dst.device(), &DeviceOps::scatter_add, "scatter_add_")(acc, d, index, src, false);
    });
    return;
  }
  accumulate_into(dst,
                  [&]<class Acc, class Src>(const Tensor& acc) { scatter_add_kernel<Acc, Src>(acc, d, index, src); });
}

Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  check_defined(x, "scatter_add", "x");
  check_defined(index, "scatter_add", "index");
  check_defined(src, "scatter_add", "src");
  const int64_t d = check_along_dim(x, "x", dim, index, "scatter_add");
  check_scatter_inputs(x, d, index, src, "scatter_add");
  if (!x.device().is_cpu()) {
    // A fresh accumulator (f32 for bf16, rounded once at the end) scattered into on the device.
    Tensor acc = x.dtype() == DType::bf16 ? to(x, DType::f32) : clone(x);
    device_kernel(x.device(), &DeviceOps::scatter_add, "scatter_add")(acc, d, index, src, false);
    return to(acc, x.dtype());
  }
  if (x.dtype() == DType::bf16) {
    Tensor acc = to(x, DType::f32);  // a fresh f32 copy, rounded once at the end
    scatter_add_kernel<float, bfloat16>(acc, d, index, src);
    return to(acc, DType::bf16);
  }
  Tensor out = clone(x);
  visit_dtype(x.dtype(), [&]<class T>() {
    if constexpr (!std::is_same_v<T, bool> && !std::is_same_v<T, bfloat16>)
      scatter_add_kernel<T, T>(out, d, index, src);
  });
  return out;
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  check_defined(x, "masked_fill", "x");
  check_defined(mask, "masked_fill", "mask");
  CPF_CHECK(mask.dtype() == DType::boolean, "masked_fill: mask must be bool, got ", mask.dtype());
  const Shape shape = broadcast_shapes(mask.shape(), x.shape(), "masked_fill");
  CPF_CHECK(shape == x.shape(), "masked_fill: mask of shape ", mask.shape(), " cannot be broadcast to x of shape ",
            x.shape());
  CPF_CHECK(representable(value, x.dtype()), "masked_fill: value ", value, " is not representable in ", x.dtype());
  check_same_device(x, mask, "masked_fill");
  check_cpu(x, "masked_fill");
  if (!x.device().is_cpu()) {
    Tensor out = empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});
    const Tensor fill = full({}, value, {.dtype = x.dtype(), .device = x.device()});
    device_kernel(x.device(), &DeviceOps::where, "masked_fill")(out, mask, fill, x);
    return out;
  }
  Tensor out = empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});
  visit_dtype(x.dtype(), [&]<class T>() {
    T fill;
    if constexpr (std::is_same_v<T, bfloat16>) {
      fill = T(static_cast<float>(value));
    } else {
      fill = static_cast<T>(value);
    }
    cpu::map_elements<T, bool, T>(
        out, [fill](bool m, T v) { return m ? fill : v; }, mask, x);
  });
  return out;
}

}  // namespace cpf::raw
