// The cuda entries of the device kernel table (framework/tensor/device_ops.h): turn Tensors into the
// kernels' parameter blocks (kernels.cuh) and launch on the calling thread's current stream.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <vector>

#include "framework/tensor/cpu/strided_loop.h"
#include "framework/tensor/cuda/cuda_check.cuh"
#include "framework/tensor/cuda/cuda_ops.cuh"
#include "framework/tensor/cuda/device_errors.cuh"
#include "framework/tensor/cuda/kernels.cuh"
#include "framework/tensor/cuda/runtime.cuh"
#include "framework/tensor/device_ops.h"
#include "framework/tensor/shape_utils.h"
#include "framework/tensor/storage.h"

namespace cpf::cuda {
namespace {

namespace k = kernels;

static_assert(static_cast<int>(DType::f32) == k::kF32 && static_cast<int>(DType::f64) == k::kF64 &&
              static_cast<int>(DType::bf16) == k::kBF16 && static_cast<int>(DType::i32) == k::kI32 &&
              static_cast<int>(DType::i64) == k::kI64 && static_cast<int>(DType::boolean) == k::kBool);

int code(DType dtype) { return static_cast<int>(dtype); }

// The kernels switch on plain op codes (kernels.cuh); each must be its enum's value.
template <class Op>
constexpr int op_code(Op op) {
  return static_cast<int>(op);
}
static_assert(op_code(raw::UnaryOp::neg) == k::kNeg && op_code(raw::UnaryOp::exp) == k::kExp &&
              op_code(raw::UnaryOp::log) == k::kLog && op_code(raw::UnaryOp::sqrt) == k::kSqrt &&
              op_code(raw::UnaryOp::rsqrt) == k::kRsqrt && op_code(raw::UnaryOp::tanh) == k::kTanh &&
              op_code(raw::UnaryOp::gelu) == k::kGelu && op_code(raw::UnaryOp::silu) == k::kSilu &&
              op_code(raw::UnaryOp::relu) == k::kRelu && op_code(raw::UnaryOp::sigmoid) == k::kSigmoid &&
              op_code(raw::UnaryOp::abs) == k::kAbs && op_code(raw::UnaryOp::square) == k::kSquare &&
              op_code(raw::UnaryOp::reciprocal) == k::kReciprocal);
static_assert(op_code(raw::BinaryOp::add) == k::kAdd && op_code(raw::BinaryOp::sub) == k::kSub &&
              op_code(raw::BinaryOp::mul) == k::kMul && op_code(raw::BinaryOp::div) == k::kDiv &&
              op_code(raw::BinaryOp::pow) == k::kPow && op_code(raw::BinaryOp::maximum) == k::kMaximum &&
              op_code(raw::BinaryOp::minimum) == k::kMinimum && k::kAddScaled > k::kMinimum);
static_assert(op_code(raw::CompareOp::eq) == k::kEq && op_code(raw::CompareOp::ne) == k::kNe &&
              op_code(raw::CompareOp::lt) == k::kLt && op_code(raw::CompareOp::le) == k::kLe &&
              op_code(raw::CompareOp::gt) == k::kGt && op_code(raw::CompareOp::ge) == k::kGe);
static_assert(op_code(DeviceReduceOp::sum) == k::kSum && op_code(DeviceReduceOp::mean) == k::kMean &&
              op_code(DeviceReduceOp::amax) == k::kAmax && op_code(DeviceReduceOp::logsumexp) == k::kLogsumexp &&
              op_code(DeviceReduceOp::argmax) == k::kArgmax);
static_assert(op_code(DeviceSoftmaxOp::softmax) == k::kSoftmax &&
              op_code(DeviceSoftmaxOp::log_softmax) == k::kLogSoftmax &&
              op_code(DeviceSoftmaxOp::softmax_backward) == k::kSoftmaxBackward &&
              op_code(DeviceSoftmaxOp::log_softmax_backward) == k::kLogSoftmaxBackward);

k::FastDivmod make_divmod(uint32_t d) {
  k::FastDivmod f;
  f.divisor = d;
  while ((uint64_t(1) << f.shift) < d) ++f.shift;
  f.magic = static_cast<uint32_t>(((uint64_t(1) << 32) * ((uint64_t(1) << f.shift) - d)) / d + 1);
  return f;
}

// One operand of an iteration: base pointer, element size, dtype and strides over the full shape.
struct Operand {
  char* data;
  int64_t elem_size;
  int dtype;
  std::vector<int64_t> strides;
};

// The thread's device and stream for `device`, set for the scope.
struct Launch {
  explicit Launch(Device device)
      : guard(device.index), stream(current_cuda_stream(device.index)), sm_count(device_info(device.index).sm_count) {}
  DeviceGuard guard;
  cudaStream_t stream;
  int sm_count;
};

// Drops size-1 dims and merges dim d into d-1 when every operand is contiguous across them
// (the same coalescing as the CPU loop engine).
void coalesce(Shape& shape, std::vector<Operand>& ops) {
  Shape dims;
  std::vector<std::vector<int64_t>> st(ops.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!dims.empty()) {
      bool mergeable = true;
      for (size_t k = 0; k < ops.size(); ++k) mergeable &= st[k].back() == ops[k].strides[d] * shape[d];
      if (mergeable) {
        dims.back() *= shape[d];
        for (size_t k = 0; k < ops.size(); ++k) st[k].back() = ops[k].strides[d];
        continue;
      }
    }
    dims.push_back(shape[d]);
    for (size_t k = 0; k < ops.size(); ++k) st[k].push_back(ops[k].strides[d]);
  }
  if (dims.empty()) {
    dims.push_back(1);
    for (auto& s : st) s.push_back(0);
  }
  shape = std::move(dims);
  for (size_t k = 0; k < ops.size(); ++k) ops[k].strides = std::move(st[k]);
}

// Runs `launch(iter)` over the coalesced iteration; iterations of more than kMaxDims dims are split
// along their outermost dim (one launch per slice) until they fit.
template <class LaunchFn>
void for_each_iter(const Shape& shape, const std::vector<Operand>& ops, int sm_count, LaunchFn&& launch) {
  const int64_t numel = shape_numel(shape);
  if (numel == 0) return;
  if (static_cast<int>(shape.size()) > k::kMaxDims) {
    const Shape inner(shape.begin() + 1, shape.end());
    for (int64_t i = 0; i < shape[0]; ++i) {
      std::vector<Operand> sub = ops;
      for (auto& op : sub) {
        op.data += i * op.strides[0] * op.elem_size;
        op.strides.erase(op.strides.begin());
      }
      for_each_iter(inner, sub, sm_count, launch);
    }
    return;
  }
  k::Iter it;
  it.ndim = static_cast<int>(shape.size());
  it.nops = static_cast<int>(ops.size());
  it.numel = numel;
  it.index32 = numel <= INT32_MAX;
  int64_t max_size = 1;
  bool unit = it.ndim == 1;
  for (int d = 0; d < it.ndim; ++d) {
    it.sizes[d] = shape[d];
    if (it.index32) it.divs[d] = make_divmod(static_cast<uint32_t>(shape[d]));
  }
  for (size_t kk = 0; kk < ops.size(); ++kk) {
    it.data[kk] = ops[kk].data;
    it.dtype[kk] = ops[kk].dtype;
    max_size = std::max(max_size, ops[kk].elem_size);
    for (int d = 0; d < it.ndim; ++d) it.strides[kk][d] = ops[kk].strides[d];
    if (it.ndim == 1) unit &= ops[kk].strides[0] == 0 || ops[kk].strides[0] == 1;
  }
  it.linear = unit;
  // Vector accesses along the innermost dim (see k::Iter): every operand has stride 0 or 1 there, and
  // where it is 1 the base and every outer stride keep runs of `vec` elements 16-byte aligned.
  const int vec = k::vector_width(static_cast<int>(max_size));
  const int last = it.ndim - 1;
  if (vec > 1 && (it.linear || shape[last] % vec == 0)) {
    bool ok = true;
    for (const auto& op : ops) {
      const int64_t inner = op.strides[last];
      ok &= inner == 0 || inner == 1;
      if (inner != 1) continue;
      ok &= reinterpret_cast<uintptr_t>(op.data) % (op.elem_size * vec) == 0;
      for (int d = 0; d < last; ++d) ok &= op.strides[d] % vec == 0;
    }
    it.vectorize = ok;
  }
  const int64_t items = it.vectorize ? (numel + vec - 1) / vec : numel;
  const int64_t blocks = (items + k::kThreads - 1) / k::kThreads;
  it.grid = static_cast<int>(std::clamp<int64_t>(blocks, 1, 32 * static_cast<int64_t>(sm_count)));
  launch(it);
}

Operand operand(const Tensor& t, const Shape& shape) {
  return Operand{static_cast<char*>(t.raw_data()), static_cast<int64_t>(dtype_size(t.dtype())), code(t.dtype()),
                 cpu::broadcast_strides(t, shape)};
}

// out's iteration over its own shape with inputs broadcast to it.
template <class LaunchFn>
void run_elementwise(const Tensor& out, std::initializer_list<Tensor> inputs, LaunchFn&& launch_fn) {
  Launch launch(out.device());
  Shape shape = out.shape();
  std::vector<Operand> ops;
  ops.push_back(operand(out, shape));
  for (const Tensor& t : inputs) ops.push_back(operand(t, shape));
  coalesce(shape, ops);
  for_each_iter(shape, ops, launch.sm_count, [&](const k::Iter& it) { launch_fn(it, launch.stream); });
}

// ---- table entries ----

void copy(const Tensor& dst, const Tensor& src) {
  run_elementwise(dst, {src}, [](const k::Iter& it, cudaStream_t s) { k::launch_copy(it, s); });
}

void cast_many(const std::vector<Tensor>& dst, const std::vector<Tensor>& src) {
  if (dst.empty()) return;
  Launch launch(dst[0].device());
  std::vector<const void*> s(src.size());
  std::vector<void*> d(dst.size());
  std::vector<int64_t> n(dst.size());
  for (size_t i = 0; i < dst.size(); ++i) {
    s[i] = src[i].raw_data();
    d[i] = dst[i].raw_data();
    n[i] = dst[i].numel();
  }
  k::launch_cast_f32_bf16_many(s.data(), d.data(), n.data(), static_cast<int>(d.size()), launch.sm_count,
                               launch.stream);
}

void fill(const Tensor& dst, double value) {
  run_elementwise(dst, {}, [value](const k::Iter& it, cudaStream_t s) { k::launch_fill(it, value, s); });
}

void unary(raw::UnaryOp op, const Tensor& out, const Tensor& x) {
  run_elementwise(out, {x}, [op](const k::Iter& it, cudaStream_t s) { k::launch_unary(op_code(op), it, s); });
}

void unary_backward(raw::UnaryOp op, const Tensor& out, const Tensor& grad, const Tensor& x, const Tensor& y) {
  run_elementwise(out, {grad, x, y},
                  [op](const k::Iter& it, cudaStream_t s) { k::launch_unary_backward(op_code(op), it, s); });
}

void binary(raw::BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  const bool int_div = op == raw::BinaryOp::div && is_integral(a.dtype());
  Tensor flag;
  if (int_div) flag = zeros({1}, {.dtype = DType::i32, .device = out.device()});
  int* flag_ptr = int_div ? static_cast<int*>(flag.raw_data()) : nullptr;
  run_elementwise(out, {a, b}, [op, flag_ptr](const k::Iter& it, cudaStream_t s) {
    k::launch_binary(op_code(op), it, 0.0, flag_ptr, s);
  });
  if (int_div) {
    CPF_CHECK(flag.item<int32_t>() == 0, "div: integer division by zero (divisor of shape ", b.shape(), ")");
  }
}

void compare(raw::CompareOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  run_elementwise(out, {a, b}, [op](const k::Iter& it, cudaStream_t s) { k::launch_compare(op_code(op), it, s); });
}

void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  run_elementwise(out, {cond, a, b}, [](const k::Iter& it, cudaStream_t s) { k::launch_where(it, s); });
}

void add_(const Tensor& dst, const Tensor& src, double alpha) {
  run_elementwise(dst, {dst, src}, [alpha](const k::Iter& it, cudaStream_t s) {
    k::launch_binary(k::kAddScaled, it, alpha, nullptr, s);
  });
}

void mul_(const Tensor& dst, double value) {
  run_elementwise(dst, {dst}, [value](const k::Iter& it, cudaStream_t s) { k::launch_scale(it, value, s); });
}

void reduce_rows(DeviceReduceOp op, const Tensor& out, const Tensor& rows) {
  Launch launch(rows.device());
  const int64_t K = rows.size(0), R = rows.size(1);
  const size_t ws_bytes = k::reduce_workspace_bytes(code(rows.dtype()), K, R, launch.sm_count);
  // Workspace from the caching allocator: freed (stream-ordered) when `ws` goes out of scope.
  Tensor ws =
      ws_bytes ? empty({static_cast<int64_t>(ws_bytes)}, {.dtype = DType::boolean, .device = rows.device()}) : Tensor();
  k::launch_reduce_rows(op_code(op), code(rows.dtype()), rows.raw_data(), out.raw_data(), K, R,
                        ws_bytes ? ws.raw_data() : nullptr, launch.sm_count, launch.stream);
}

void reduce_cols(DeviceReduceOp op, const Tensor& out, const Tensor& cols) {
  CPF_CHECK(op == DeviceReduceOp::sum || op == DeviceReduceOp::mean || op == DeviceReduceOp::amax,
            "reduce_cols (cuda): only sum, mean and amax fold columns, got op ", static_cast<int>(op));
  Launch launch(cols.device());
  const int64_t R = cols.size(0), K = cols.size(1);
  const size_t ws_bytes = k::reduce_cols_workspace_bytes(code(cols.dtype()), R, K, launch.sm_count);
  Tensor ws =
      ws_bytes ? empty({static_cast<int64_t>(ws_bytes)}, {.dtype = DType::boolean, .device = cols.device()}) : Tensor();
  k::launch_reduce_cols(op_code(op), code(cols.dtype()), cols.raw_data(), out.raw_data(), R, K,
                        ws_bytes ? ws.raw_data() : nullptr, launch.sm_count, launch.stream);
}

void softmax(DeviceSoftmaxOp op, const Tensor& out, const Tensor& a, const Tensor& b, int64_t dim) {
  Launch launch(a.device());
  int64_t outer = 1, size = 1, inner = 1;
  for (int64_t d = 0; d < a.dim(); ++d) {
    if (d < dim)
      outer *= a.size(d);
    else if (d == dim)
      size = a.size(d);
    else
      inner *= a.size(d);
  }
  k::launch_softmax(op_code(op), code(a.dtype()), a.raw_data(), b.defined() ? b.raw_data() : nullptr, out.raw_data(),
                    outer, size, inner, launch.sm_count, launch.stream);
}

// ---- nn ops ----

const void* ptr_or_null(const Tensor& t) { return t.defined() ? t.raw_data() : nullptr; }
void* mut_ptr_or_null(const Tensor& t) { return t.defined() ? t.raw_data() : nullptr; }

void norm(bool centered, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x, const Tensor& weight,
          const Tensor& bias, double eps) {
  Launch launch(x.device());
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  k::launch_norm(centered, code(x.dtype()), x.raw_data(), ptr_or_null(weight), ptr_or_null(bias), y.raw_data(),
                 mut_ptr_or_null(mean), rstd.raw_data(), rows, cols, eps, launch.stream);
}

void norm_backward(bool centered, const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& grad_y,
                   const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
  Launch launch(x.device());
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  const bool params = dweight.defined() || dbias.defined();
  const size_t ws_bytes = params ? k::norm_backward_workspace_bytes(code(x.dtype()), rows, cols) : 0;
  Tensor ws =
      ws_bytes ? empty({static_cast<int64_t>(ws_bytes)}, {.dtype = DType::boolean, .device = x.device()}) : Tensor();
  k::launch_norm_backward(centered, code(x.dtype()), grad_y.raw_data(), x.raw_data(), ptr_or_null(weight),
                          ptr_or_null(mean), rstd.raw_data(), dx.raw_data(), mut_ptr_or_null(dweight),
                          mut_ptr_or_null(dbias), rows, cols, ws_bytes ? ws.raw_data() : nullptr, launch.stream);
}

void add_norm(bool centered, const Tensor& x1, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
              const Tensor& branch, const Tensor& weight, const Tensor& bias, double eps) {
  Launch launch(x.device());
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  k::launch_add_norm(centered, code(x.dtype()), branch.defined() ? code(branch.dtype()) : code(x.dtype()),
                     code(y.dtype()), x.raw_data(), ptr_or_null(branch), ptr_or_null(weight), ptr_or_null(bias),
                     mut_ptr_or_null(x1), y.raw_data(), mut_ptr_or_null(mean), rstd.raw_data(), rows, cols, eps,
                     launch.stream);
}

void add_norm_backward(bool centered, const Tensor& dx, const Tensor& dbranch, const Tensor& dweight,
                       const Tensor& dbias, const Tensor& grad_x1, const Tensor& grad_y, const Tensor& x1,
                       const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
  Launch launch(x1.device());
  const int64_t cols = x1.size(-1), rows = x1.numel() / cols;
  const bool params = dweight.defined() || dbias.defined();
  const size_t ws_bytes = params ? k::norm_backward_workspace_bytes(code(x1.dtype()), rows, cols) : 0;
  Tensor ws =
      ws_bytes ? empty({static_cast<int64_t>(ws_bytes)}, {.dtype = DType::boolean, .device = x1.device()}) : Tensor();
  k::launch_add_norm_backward(centered, code(x1.dtype()), code(grad_y.dtype()),
                              dbranch.defined() ? code(dbranch.dtype()) : code(x1.dtype()), grad_y.raw_data(),
                              x1.raw_data(), ptr_or_null(weight), ptr_or_null(mean), rstd.raw_data(),
                              ptr_or_null(grad_x1), dx.raw_data(), mut_ptr_or_null(dbranch), mut_ptr_or_null(dweight),
                              mut_ptr_or_null(dbias), rows, cols, ws_bytes ? ws.raw_data() : nullptr, launch.stream);
}

Shape without(const Shape& v, int64_t d) {
  Shape out = v;
  out.erase(out.begin() + d);
  return out;
}

void gather(const Tensor& out, const Tensor& x, int64_t dim, const Tensor& index, bool index_select) {
  Launch launch(out.device());
  Shape shape = out.shape();
  Shape index_strides(shape.size(), 0);
  if (index_select) {
    index_strides[dim] = index.stride(0);
  } else {
    index_strides = index.strides();
  }
  Shape x_strides = x.strides();
  x_strides[dim] = 0;  // the index supplies the offset along dim
  std::vector<Operand> ops{
      operand(out, shape),
      {static_cast<char*>(index.raw_data()), static_cast<int64_t>(dtype_size(index.dtype())), code(index.dtype()),
       index_strides},
      {static_cast<char*>(x.raw_data()), static_cast<int64_t>(dtype_size(x.dtype())), code(x.dtype()), x_strides}};
  coalesce(shape, ops);
  const int elem = static_cast<int>(dtype_size(x.dtype()));
  for_each_iter(shape, ops, launch.sm_count, [&](const k::Iter& it) {
    k::launch_gather(it, elem, code(index.dtype()), x.stride(dim), x.size(dim), launch.stream);
  });
}

void scatter_add(const Tensor& acc, int64_t dim, const Tensor& index, const Tensor& src, bool index_add) {
  Launch launch(acc.device());
  // Lines: every position outside dim; each is walked along dim by one thread.
  Shape lines = without(index_add ? src.shape() : index.shape(), dim);
  const Shape index_strides = index_add ? Shape(lines.size(), 0) : without(index.strides(), dim);
  const int64_t len = index_add ? index.numel() : index.size(dim);
  const int64_t index_step = index_add ? (index.numel() > 0 ? index.stride(0) : 0) : index.stride(dim);
  std::vector<Operand> ops{{static_cast<char*>(acc.raw_data()), static_cast<int64_t>(dtype_size(acc.dtype())),
                            code(acc.dtype()), without(acc.strides(), dim)},
                           {static_cast<char*>(index.raw_data()), static_cast<int64_t>(dtype_size(index.dtype())),
                            code(index.dtype()), index_strides},
                           {static_cast<char*>(src.raw_data()), static_cast<int64_t>(dtype_size(src.dtype())),
                            code(src.dtype()), without(src.strides(), dim)}};
  coalesce(lines, ops);
  for_each_iter(lines, ops, launch.sm_count, [&](const k::Iter& it) {
    k::launch_scatter_lines(it, code(acc.dtype()), code(src.dtype()), code(index.dtype()), len, acc.stride(dim),
                            index_step, src.stride(dim), acc.size(dim), launch.stream);
  });
}

void embedding_backward(const Tensor& out, const Tensor& grad, const Tensor& ids) {
  Launch launch(out.device());
  const int64_t n = ids.numel(), rows = out.size(0);
  // The sort works on 32-bit keys and positions (CUB takes an int count).
  CPF_CHECK(n <= std::numeric_limits<int32_t>::max(), "embedding_backward: at most 2^31 - 1 ids on cuda, got ", n,
            "; split the batch");
  CPF_CHECK(rows < std::numeric_limits<uint32_t>::max(),
            "embedding_backward: at most 2^32 - 2 table rows on cuda, got ", rows);
  // Stream-ordered scratch for the keys, positions and the sort; released (stream-ordered) on return.
  const auto bytes = static_cast<int64_t>(
      std::max<size_t>(k::embedding_backward_workspace(n, rows, out.size(1), code(grad.dtype())), 1));
  const Tensor workspace = empty({bytes}, {.dtype = DType::boolean, .device = out.device()});
  k::launch_embedding_backward(code(grad.dtype()), code(ids.dtype()), grad.raw_data(), ids.raw_data(), out.raw_data(),
                               n, rows, out.size(1), workspace.raw_data(), launch.stream);
}

void cross_entropy(const Tensor& lse, const Tensor& row_loss, const Tensor& logits, const Tensor& targets,
                   int64_t ignore_index) {
  Launch launch(logits.device());
  k::launch_cross_entropy(code(logits.dtype()), code(targets.dtype()), logits.raw_data(), targets.raw_data(),
                          lse.raw_data(), static_cast<double*>(row_loss.raw_data()), logits.size(0), logits.size(1),
                          ignore_index, launch.stream);
}

void cross_entropy_backward(const Tensor& out, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            double scale, int64_t ignore_index) {
  Launch launch(logits.device());
  k::launch_cross_entropy_backward(code(logits.dtype()), code(targets.dtype()), logits.raw_data(), targets.raw_data(),
                                   lse.raw_data(), out.raw_data(), logits.size(0), logits.size(1), scale, nullptr,
                                   nullptr, ignore_index, launch.stream);
}

void cross_entropy_loss(const Tensor& loss, const Tensor& count, const Tensor& row_loss, const Tensor& targets,
                        int64_t ignore_index) {
  Launch launch(row_loss.device());
  k::launch_cross_entropy_loss(code(loss.dtype()), code(targets.dtype()),
                               static_cast<const double*>(row_loss.raw_data()), targets.raw_data(), row_loss.numel(),
                               ignore_index, loss.raw_data(), static_cast<int64_t*>(count.raw_data()), launch.stream);
}

void cross_entropy_backward_counted(const Tensor& out, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                    const Tensor& grad_loss, const Tensor& count, int64_t ignore_index) {
  Launch launch(logits.device());
  k::launch_cross_entropy_backward(code(logits.dtype()), code(targets.dtype()), logits.raw_data(), targets.raw_data(),
                                   lse.raw_data(), out.raw_data(), logits.size(0), logits.size(1), 0.0,
                                   static_cast<const double*>(grad_loss.raw_data()),
                                   static_cast<const int64_t*>(count.raw_data()), ignore_index, launch.stream);
}

void classifier_rows(const Tensor& logits, const Tensor& row_loss, const Tensor& labels, double scale,
                     const Tensor& divisor, bool write_grad, int64_t ignore_index) {
  Launch launch(logits.device());
  k::launch_classifier_rows(code(logits.dtype()), code(labels.dtype()), logits.raw_data(), labels.raw_data(),
                            static_cast<double*>(row_loss.raw_data()), logits.size(0), logits.size(1), scale,
                            divisor.defined() ? static_cast<const double*>(divisor.raw_data()) : nullptr, write_grad,
                            ignore_index, launch.stream);
}

void check_indices(const DeviceIndexCheck& c) {
  const Tensor& index = c.index;
  if (index.numel() == 0) return;
  Launch launch(index.device());
  IndexCheck check;
  check.kind = static_cast<IndexErrorKind>(static_cast<int>(c.kind));
  check.op = c.op;
  check.index = index.raw_data();
  check.index_dtype = code(index.dtype());
  check.numel = index.numel();
  check.bound = c.bound;
  check.dim = c.dim;
  check.ignore = c.ignore_index;
  check.has_ignore = c.has_ignore ? 1 : 0;
  check.ndim = static_cast<int>(index.dim());
  CPF_CHECK(check.ndim <= kIndexCheckMaxDims, c.op, ": index tensors of more than ", kIndexCheckMaxDims,
            " dims are not supported on cuda, got shape ", index.shape());
  for (int d = 0; d < check.ndim; ++d) check.shape[d] = index.size(d);
  // Stream-ordered scratch for the first bad position; released (stream-ordered) on return.
  const Tensor slot = empty({1}, {.dtype = DType::i64, .device = index.device()});
  launch_index_check(check, slot.raw_data(), index.device().index, launch.sm_count, launch.stream);
}

void rope(const Tensor& out, const Tensor& x, const Tensor& positions, double base, int64_t rotary_dim, bool inverse) {
  Launch launch(x.device());
  const bool thd = x.dim() == 3;
  k::launch_rope(code(x.dtype()), code(positions.dtype()), x.raw_data(), positions.raw_data(), out.raw_data(),
                 thd ? 1 : x.size(0), x.size(-3), x.size(-2), x.size(-1), thd ? 0 : x.stride(0), x.stride(-3),
                 x.stride(-2), positions.dim() == 2, base, rotary_dim, inverse, launch.stream);
}

void swiglu(const Tensor& out, const Tensor& gate, const Tensor& up) {
  Launch launch(out.device());
  k::launch_swiglu(code(gate.dtype()), gate.raw_data(), gate.stride(0), up.raw_data(), up.stride(0), out.raw_data(),
                   gate.size(0), gate.size(1), launch.stream);
}

void swiglu_backward(const Tensor& d_gate, const Tensor& d_up, const Tensor& dy, const Tensor& gate, const Tensor& up) {
  Launch launch(gate.device());
  k::launch_swiglu_backward(code(gate.dtype()), dy.raw_data(), dy.stride(0), gate.raw_data(), gate.stride(0),
                            up.raw_data(), up.stride(0), d_gate.raw_data(), d_gate.stride(0), d_up.raw_data(),
                            d_up.stride(0), gate.size(0), gate.size(1), launch.stream);
}

// ---- random and multi-tensor optimizer entries ----

void philox(const DeviceRandom& r, const Tensor& out) {
  Launch launch(out.device());
  k::PhiloxParams p;
  p.op = static_cast<int>(r.op);
  p.dtype = code(r.dtype);
  p.seed = r.seed;
  p.first = r.first;
  p.a = r.a;
  p.b = r.b;
  p.low = r.low;
  p.span = r.span;
  k::launch_philox(p, static_cast<double*>(out.raw_data()), out.numel(), launch.sm_count, launch.stream);
}

// A device buffer holding `tensors` then `chunks`: the host tables go in one transfer by the backend on
// the current stream (`stream`), through pinned memory, so it returns once the host vectors may be
// freed, without waiting for the device. The buffer is released stream-ordered with the tensor.
template <class T>
Tensor upload_tables(Device device, cudaStream_t stream, const std::vector<T>& tensors,
                     const std::vector<k::ChunkRef>& chunks, size_t extra_bytes, size_t* chunks_at, size_t* extra_at,
                     const void* extra_data = nullptr) {
  const auto align = [](size_t n) { return (n + 15) / 16 * 16; };
  *chunks_at = align(tensors.size() * sizeof(T));
  *extra_at = align(*chunks_at + chunks.size() * sizeof(k::ChunkRef));
  const size_t total = *extra_at + extra_bytes;
  // The extra bytes travel too when given (AdamW's candidate scalars), else they are left for the kernel.
  std::vector<char> host(extra_data != nullptr ? total : *extra_at, 0);
  std::memcpy(host.data(), tensors.data(), tensors.size() * sizeof(T));
  std::memcpy(host.data() + *chunks_at, chunks.data(), chunks.size() * sizeof(k::ChunkRef));
  if (extra_data != nullptr) std::memcpy(host.data() + *extra_at, extra_data, extra_bytes);
  const auto bytes = static_cast<int64_t>(std::max<size_t>(total, 1));
  Tensor buffer = empty({bytes}, {.dtype = DType::boolean, .device = device});
  if (!host.empty()) {
    device_backend(DeviceType::cuda).copy(buffer.raw_data(), device, host.data(), Device::cpu(), host.size());
  }
  return buffer;
}

int aligned_to(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0 ? 1 : 0; }

void add_chunks(int32_t index, int64_t numel, std::vector<k::ChunkRef>& chunks, int64_t chunk = k::kChunk) {
  for (int64_t begin = 0; begin < numel; begin += chunk) chunks.push_back({index, begin});
}

void sum_squares(const Tensor& out, const std::vector<Tensor>& tensors) {
  Launch launch(out.device());
  std::vector<k::SquaresTensor> list;
  std::vector<k::ChunkRef> chunks;
  for (const Tensor& t : tensors) {
    if (t.numel() == 0) continue;
    add_chunks(static_cast<int32_t>(list.size()), t.numel(), chunks, k::kSquaresChunk);
    list.push_back({t.raw_data(), t.numel(), code(t.dtype()), aligned_to(t.raw_data(), 16)});
  }
  size_t chunks_at = 0, partials_at = 0;
  const Tensor buffer = upload_tables(out.device(), launch.stream, list, chunks, chunks.size() * sizeof(double),
                                      &chunks_at, &partials_at);
  char* base = static_cast<char*>(buffer.raw_data());
  k::launch_sum_squares(reinterpret_cast<const k::SquaresTensor*>(base),
                        reinterpret_cast<const k::ChunkRef*>(base + chunks_at), static_cast<int64_t>(chunks.size()),
                        reinterpret_cast<double*>(base + partials_at), static_cast<double*>(out.raw_data()),
                        launch.stream);
}

// The scalars of step t as AdamW::update computes them on the host: {step_size = -lr / bc1, 1 / sqrt(bc2)}.
std::pair<double, double> adamw_step_scalars(const DeviceAdamW& h, int64_t step) {
  const double t = static_cast<double>(step);
  const double bias_correction1 = 1.0 - std::pow(h.beta1, t);
  const double bias_correction2 = 1.0 - std::pow(h.beta2, t);
  return {-h.lr / bias_correction1, 1.0 / std::sqrt(bias_correction2)};
}

void adamw_step(const std::vector<DeviceAdamWParam>& params, const DeviceAdamW& h) {
  if (params.empty()) return;
  Launch launch(params.front().param.device());
  const bool deferred = h.applied_steps.defined();
  CPF_CHECK(h.candidates >= 1 && (deferred || h.candidates == 1), "adamw_step: ", h.candidates,
            " candidate steps need a device count of applied steps");
  const auto [step_size, inv_sqrt_bc2] = adamw_step_scalars(h, h.step);
  // Deferred: (candidates, 2) scalars for steps h.step .. h.step + candidates - 1, uploaded with the tables.
  std::vector<double> candidate_scalars;
  for (int64_t j = 0; deferred && j < h.candidates; ++j) {
    const auto [size_j, inv_j] = adamw_step_scalars(h, h.step + j);
    candidate_scalars.insert(candidate_scalars.end(), {size_j, inv_j});
  }
  // Padded to 32 candidates at a time (never read), so a window's steps allocate buffers of one size and
  // the caching allocator serves them all from its cache.
  candidate_scalars.resize((candidate_scalars.size() + 63) / 64 * 64, 0.0);
  auto* count = deferred ? static_cast<int64_t*>(h.applied_steps.raw_data()) : nullptr;
  if (deferred && h.reset_applied_steps) k::launch_set_applied_steps(count, h.step - 1, launch.stream);
  const auto* skip =
      h.skip_if_nonfinite.defined() ? static_cast<const double*>(h.skip_if_nonfinite.raw_data()) : nullptr;
  k::AdamWScalars scalars{.beta1 = h.beta1,
                          .one_minus_beta1 = 1.0 - h.beta1,
                          .beta2 = h.beta2,
                          .one_minus_beta2 = 1.0 - h.beta2,
                          .inv_sqrt_bc2 = inv_sqrt_bc2,
                          .eps = h.eps,
                          .step_size = step_size,
                          .skip_if_nonfinite = skip,
                          .applied_steps = count,
                          .candidate_scalars = nullptr,
                          .first_step = h.step,
                          .candidates = h.candidates};
  for (DType dtype : {DType::f32, DType::bf16, DType::f64}) {
    std::vector<k::AdamWTensor> list;
    std::vector<k::ChunkRef> chunks;
    for (const DeviceAdamWParam& p : params) {
      if (p.param.dtype() != dtype || p.param.numel() == 0) continue;
      add_chunks(static_cast<int32_t>(list.size()), p.param.numel(), chunks);
      // Vector accesses of 4 elements need each pointer aligned to 4 of its elements.
      const size_t pv = 4 * dtype_size(dtype), sv = 4 * dtype_size(p.exp_avg.dtype());
      const int aligned = aligned_to(p.param.raw_data(), pv) && aligned_to(p.grad.raw_data(), pv) &&
                          aligned_to(p.exp_avg.raw_data(), sv) && aligned_to(p.exp_avg_sq.raw_data(), sv);
      list.push_back({p.param.raw_data(), p.grad.raw_data(), p.exp_avg.raw_data(), p.exp_avg_sq.raw_data(),
                      p.param.numel(), 1.0 - h.lr * p.weight_decay, p.weight_decay != 0.0 ? 1 : 0, aligned});
    }
    if (list.empty()) continue;
    size_t chunks_at = 0, extra_at = 0;
    const Tensor buffer = upload_tables(params.front().param.device(), launch.stream, list, chunks,
                                        candidate_scalars.size() * sizeof(double), &chunks_at, &extra_at,
                                        deferred ? candidate_scalars.data() : nullptr);
    char* base = static_cast<char*>(buffer.raw_data());
    if (deferred) scalars.candidate_scalars = reinterpret_cast<const double*>(base + extra_at);
    k::launch_adamw(code(dtype), reinterpret_cast<const k::AdamWTensor*>(base),
                    reinterpret_cast<const k::ChunkRef*>(base + chunks_at), static_cast<int64_t>(chunks.size()),
                    scalars, launch.stream);
  }
  // After every dtype's launch read the count: the step is counted when applied.
  if (deferred) k::launch_count_applied(count, skip, launch.stream);
}

void clip_by_norm_(const std::vector<Tensor>& tensors, const Tensor& sum_squares, double max_norm) {
  Launch launch(sum_squares.device());
  std::vector<k::ScaleTensor> list;
  std::vector<k::ChunkRef> chunks;
  for (const Tensor& t : tensors) {
    if (t.numel() == 0) continue;
    add_chunks(static_cast<int32_t>(list.size()), t.numel(), chunks);
    list.push_back({t.raw_data(), t.numel(), code(t.dtype()), aligned_to(t.raw_data(), 4 * dtype_size(t.dtype()))});
  }
  if (list.empty()) return;
  size_t chunks_at = 0, end_at = 0;
  const Tensor buffer = upload_tables(sum_squares.device(), launch.stream, list, chunks, 0, &chunks_at, &end_at);
  const char* base = static_cast<const char*>(buffer.raw_data());
  k::launch_clip_by_norm(reinterpret_cast<const k::ScaleTensor*>(base),
                         reinterpret_cast<const k::ChunkRef*>(base + chunks_at), static_cast<int64_t>(chunks.size()),
                         static_cast<const double*>(sum_squares.raw_data()), max_norm, launch.stream);
}

}  // namespace

const DeviceOps& cuda_device_ops() {
  static const DeviceOps table = [] {
    DeviceOps t;
    t.copy = &copy;
    t.cast_many = &cast_many;
    t.fill = &fill;
    t.unary = &unary;
    t.unary_backward = &unary_backward;
    t.binary = &binary;
    t.compare = &compare;
    t.where = &where;
    t.add_ = &add_;
    t.mul_ = &mul_;
    t.reduce_rows = &reduce_rows;
    t.reduce_cols = &reduce_cols;
    t.softmax = &softmax;
    t.matmul = &matmul;
    t.matmul_bias = &matmul_bias;
    t.matmul_epilogue = &matmul_epilogue;
    t.norm = &norm;
    t.norm_backward = &norm_backward;
    t.add_norm = &add_norm;
    t.add_norm_backward = &add_norm_backward;
    t.gather = &gather;
    t.scatter_add = &scatter_add;
    t.embedding_backward = &embedding_backward;
    t.cross_entropy = &cross_entropy;
    t.cross_entropy_backward = &cross_entropy_backward;
    t.cross_entropy_loss = &cross_entropy_loss;
    t.cross_entropy_backward_counted = &cross_entropy_backward_counted;
    t.classifier_rows = &classifier_rows;
    t.check_indices = &check_indices;
    t.rope = &rope;
    t.swiglu = &swiglu;
    t.swiglu_backward = &swiglu_backward;
    t.philox = &philox;
    t.sum_squares = &sum_squares;
    t.adamw_step = &adamw_step;
    t.clip_by_norm_ = &clip_by_norm_;
    return t;
  }();
  return table;
}

}  // namespace cpf::cuda
