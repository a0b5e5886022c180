// Rotary position embedding (framework/tensor/ops/rope.h): one thread per output element. The angle
// pos * base^(-2i / R) and its sin/cos are computed in double, as on the CPU, then applied in the
// compute type (f32 for f32/bf16).
#include "framework/tensor/cuda/elementwise.cuh"

namespace cpf::cuda::kernels {
namespace {

template <class T, class I>
__global__ void __launch_bounds__(kThreads) rope_kernel(const T* x, const I* positions, T* out, int64_t batch,
                                                        int64_t seq, int64_t heads, int64_t dim, int64_t sb,
                                                        int64_t st, int64_t sh, bool per_batch, double base,
                                                        int64_t rot, double sign) {
  using C = compute_t<T>;
  const int64_t n = batch * seq * heads * dim;
  const int64_t half = rot / 2;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t d = i % dim;
    const int64_t h = (i / dim) % heads;
    const int64_t bt = i / (dim * heads);
    const int64_t b = bt / seq, t = bt - b * seq;
    const T* xi = x + b * sb + t * st + h * sh;
    if (d >= rot) {
      out[i] = xi[d];
      continue;
    }
    const int64_t k = d < half ? d : d - half;
    const double position = static_cast<double>(positions[per_batch ? bt : t]);
    const double angle = position * pow(base, -2.0 * static_cast<double>(k) / static_cast<double>(rot));
    double sd, cd;
    sincos(angle, &sd, &cd);
    const C c = static_cast<C>(cd), s = static_cast<C>(sign * sd);
    const C x1 = widen(xi[k]), x2 = widen(xi[k + half]);
    out[i] = narrow<T>(d < half ? x1 * c - x2 * s : x2 * c + x1 * s);
  }
}

}  // namespace

void launch_rope(int dtype, int pos_dtype, const void* x, const void* positions, void* out, int64_t batch,
                 int64_t seq, int64_t heads, int64_t dim, int64_t sb, int64_t st, int64_t sh, bool per_batch,
                 double base, int64_t rotary_dim, bool inverse, cudaStream_t stream) {
  const int64_t n = batch * seq * heads * dim;
  if (n == 0) return;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  const unsigned grid = static_cast<unsigned>(blocks < 65535 * 32 ? blocks : 65535 * 32);
  visit_floating(dtype, [&]<class T>() {
    const auto go = [&]<class I>() {
      rope_kernel<T, I><<<grid, kThreads, 0, stream>>>(static_cast<const T*>(x), static_cast<const I*>(positions),
                                                       static_cast<T*>(out), batch, seq, heads, dim, sb, st, sh,
                                                       per_batch, base, rotary_dim, inverse ? -1.0 : 1.0);
    };
    if (pos_dtype == kI32) {
      go.template operator()<int32_t>();
    } else {
      go.template operator()<int64_t>();
    }
    CPF_CUDA_CHECK_LAUNCH("rope kernel");
  });
}

}  // namespace cpf::cuda::kernels
