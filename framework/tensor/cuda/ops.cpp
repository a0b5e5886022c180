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
#include "framework/tensor/cuda/launch.cuh"
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

// ---- nn ops (norms and losses: nn_ops.cpp) ----

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

void index_copy(const Tensor& dst, int64_t dim, const Tensor& index, const Tensor& src) {
  Launch launch(dst.device());
  // Lines as in scatter_add: one thread walks a line along dim in index order, so the last row wins.
  Shape lines = without(src.shape(), dim);
  std::vector<Operand> ops{{static_cast<char*>(dst.raw_data()), static_cast<int64_t>(dtype_size(dst.dtype())),
                            code(dst.dtype()), without(dst.strides(), dim)},
                           {static_cast<char*>(index.raw_data()), static_cast<int64_t>(dtype_size(index.dtype())),
                            code(index.dtype()), Shape(lines.size(), 0)},
                           {static_cast<char*>(src.raw_data()), static_cast<int64_t>(dtype_size(src.dtype())),
                            code(src.dtype()), without(src.strides(), dim)}};
  coalesce(lines, ops);
  for_each_iter(lines, ops, launch.sm_count, [&](const k::Iter& it) {
    k::launch_copy_lines(it, static_cast<int>(dtype_size(dst.dtype())), code(index.dtype()), index.numel(),
                         dst.stride(dim), index.stride(0), src.stride(dim), dst.size(dim), launch.stream);
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

void rope(const Tensor& out, const Tensor& x, const Tensor& positions, const RopeFrequencies& frequencies,
          int64_t rotary_dim, bool inverse) {
  Launch launch(x.device());
  const bool thd = x.dim() == 3;
  k::launch_rope(code(x.dtype()), code(positions.dtype()), x.raw_data(), positions.raw_data(), out.raw_data(),
                 thd ? 1 : x.size(0), x.size(-3), x.size(-2), x.size(-1), thd ? 0 : x.stride(0), x.stride(-3),
                 x.stride(-2), positions.dim() == 2, frequencies, rotary_dim, inverse, launch.stream);
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

// ---- random (the multi-tensor optimizer entries: optim_ops.cpp) ----

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
    t.index_copy = &index_copy;
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
    t.fp8_amax = &fp8_amax;
    t.fp8_scale = &fp8_scale;
    t.quantize_fp8 = &quantize_fp8;
    t.dequantize_fp8 = &dequantize_fp8;
    t.fp8_activation_amax = &fp8_activation_amax;
    t.quantize_fp8_activation = &quantize_fp8_activation;
    t.fp8_amax_rows = &fp8_amax_rows;
    t.quantize_fp8_rows = &quantize_fp8_rows;
    t.fp8_matmul_nt = &fp8_matmul_nt;
    t.fp8_update_scales = &fp8_update_scales;
    return t;
  }();
  return table;
}

}  // namespace cpf::cuda
