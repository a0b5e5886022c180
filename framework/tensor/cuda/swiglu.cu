// SwiGLU's gate (framework/tensor/ops/swiglu.h): one grid-stride pass over (rows, cols) element blocks of
// V consecutive columns. The inputs are row-strided views (the two halves of a fused gate/up GEMM output
// are), and so may the gradients be (the halves of the fused projection's gradient). V = 16 bytes of the
// storage type when every row start is 16-byte aligned and cols is a multiple of V, else 1: the op is
// bandwidth-bound, and whole-vector loads halve the bf16 instructions per byte.
#include "framework/tensor/cuda/activation_math.cuh"
#include "framework/tensor/cuda/elementwise.cuh"

namespace cpf::cuda::kernels {
namespace {

template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

struct SwigluArgs {
  const void* g;
  const void* u;
  const void* dy;       // null: forward
  void* out;            // forward: out; backward: d_gate
  void* du;             // backward only
  int64_t gs, us, dys;  // input row strides in elements
  int64_t os, dus;      // output row strides: out (or d_gate), d_up
  int64_t rows, cols;
};

template <class T, int V>
__global__ void __launch_bounds__(kThreads) swiglu_kernel(SwigluArgs a) {
  using C = compute_t<T>;
  using P = Pack<T, V>;
  const int64_t per_row = a.cols / V;
  const int64_t n = a.rows * per_row;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t r = i / per_row, c = (i - r * per_row) * V;
    const P g = *reinterpret_cast<const P*>(static_cast<const T*>(a.g) + r * a.gs + c);
    const P u = *reinterpret_cast<const P*>(static_cast<const T*>(a.u) + r * a.us + c);
    P o;
    if (a.dy == nullptr) {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const C gv = widen(g.v[k]);
        o.v[k] = narrow<T>(swiglu_value(gv, widen(u.v[k])));  // activation_math.cuh
      }
      *reinterpret_cast<P*>(static_cast<T*>(a.out) + r * a.os + c) = o;
      continue;
    }
    const P d = *reinterpret_cast<const P*>(static_cast<const T*>(a.dy) + r * a.dys + c);
    P du;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const C gv = widen(g.v[k]), uv = widen(u.v[k]), dv = widen(d.v[k]);
      const C s = swiglu_sigmoid(gv);
      du.v[k] = narrow<T>(dv * gv * s);
      o.v[k] = narrow<T>(dv * uv * s * (C(1) + gv * (C(1) - s)));
    }
    *reinterpret_cast<P*>(static_cast<T*>(a.out) + r * a.os + c) = o;
    *reinterpret_cast<P*>(static_cast<T*>(a.du) + r * a.dus + c) = du;
  }
}

bool aligned16(const void* p, int64_t row_stride, int64_t elem) {
  return p == nullptr || (reinterpret_cast<uintptr_t>(p) % 16 == 0 && (row_stride * elem) % 16 == 0);
}

template <class T>
void launch(const SwigluArgs& a, cudaStream_t stream) {
  constexpr int V = static_cast<int>(16 / sizeof(T));
  const auto e = static_cast<int64_t>(sizeof(T));
  const bool vec = a.cols % V == 0 && aligned16(a.g, a.gs, e) && aligned16(a.u, a.us, e) && aligned16(a.dy, a.dys, e) &&
                   aligned16(a.out, a.os, e) && aligned16(a.du, a.dus, e);
  const int64_t n = a.rows * (vec ? a.cols / V : a.cols);
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  const unsigned grid = static_cast<unsigned>(blocks < 65535 * 32 ? blocks : 65535 * 32);
  if (vec) {
    swiglu_kernel<T, V><<<grid, kThreads, 0, stream>>>(a);
  } else {
    swiglu_kernel<T, 1><<<grid, kThreads, 0, stream>>>(a);
  }
  CPF_CUDA_CHECK_LAUNCH(a.dy == nullptr ? "swiglu kernel" : "swiglu backward kernel");
}

}  // namespace

void launch_swiglu(int dtype, const void* g, int64_t gs, const void* u, int64_t us, void* out, int64_t rows,
                   int64_t cols, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const SwigluArgs a{g, u, nullptr, out, nullptr, gs, us, 0, cols, 0, rows, cols};
  visit_floating(dtype, [&]<class T>() { launch<T>(a, stream); });
}

void launch_swiglu_backward(int dtype, const void* dy, int64_t dys, const void* g, int64_t gs, const void* u,
                            int64_t us, void* dg, int64_t dgs, void* du, int64_t dus, int64_t rows, int64_t cols,
                            cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const SwigluArgs a{g, u, dy, dg, du, gs, us, dys, dgs, dus, rows, cols};
  visit_floating(dtype, [&]<class T>() { launch<T>(a, stream); });
}

}  // namespace cpf::cuda::kernels
