// One thread per (token, rotation pair k) computes the angle pos * base^(-2k / R) and its sin/cos once,
// in double as on the CPU, and applies them in the compute type (f32 for f32/bf16) to that pair of
// every head; threads past the pairs copy the unrotated dims (D > R) of every head. The trigonometry
// per element was what kept the kernel far from bandwidth (a double pow and sincos for each of the
// 2 x H elements that share one angle); the results are bit for bit those of the per-element form.
#include "framework/tensor/cuda/elementwise.cuh"

namespace cpf::cuda::kernels {
namespace {

template <class T, class I>
__global__ void __launch_bounds__(kThreads)
    rope_kernel(const T* x, const I* positions, T* out, int64_t batch, int64_t seq, int64_t heads, int64_t dim,
                int64_t sb, int64_t st, int64_t sh, bool per_batch, RopeFrequencies frequencies, int64_t rot,
                double sign) {
  using C = compute_t<T>;
  const int64_t half = rot / 2;
  const int64_t jobs = half + (dim - rot);  // per token: the pairs, then the copied dims
  const int64_t n = batch * seq * jobs;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t j = i % jobs;
    const int64_t bt = i / jobs;
    const int64_t b = bt / seq, t = bt - b * seq;
    const T* xt = x + b * sb + t * st;
    T* ot = out + bt * heads * dim;
    if (j >= half) {
      const int64_t d = rot + (j - half);
      for (int64_t h = 0; h < heads; ++h) ot[h * dim + d] = xt[h * sh + d];
      continue;
    }
    const double position = static_cast<double>(positions[per_batch ? bt : t]);
    const double angle = position * frequencies.of_pair(j, rot);
    double sd, cd;
    sincos(angle, &sd, &cd);
    const C c = static_cast<C>(cd), s = static_cast<C>(sign * sd);
    for (int64_t h = 0; h < heads; ++h) {
      const C x1 = widen(xt[h * sh + j]), x2 = widen(xt[h * sh + j + half]);
      ot[h * dim + j] = narrow<T>(x1 * c - x2 * s);
      ot[h * dim + j + half] = narrow<T>(x2 * c + x1 * s);
    }
  }
}

}  // namespace

void launch_rope(int dtype, int pos_dtype, const void* x, const void* positions, void* out, int64_t batch, int64_t seq,
                 int64_t heads, int64_t dim, int64_t sb, int64_t st, int64_t sh, bool per_batch,
                 const RopeFrequencies& frequencies, int64_t rotary_dim, bool inverse, cudaStream_t stream) {
  const int64_t n = batch * seq * (rotary_dim / 2 + (dim - rotary_dim));
  if (n == 0 || heads == 0) return;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  const unsigned grid = static_cast<unsigned>(blocks < 65535 * 32 ? blocks : 65535 * 32);
  visit_floating(dtype, [&]<class T>() {
    visit_index(pos_dtype, [&]<class I>() {
      rope_kernel<T, I><<<grid, kThreads, 0, stream>>>(static_cast<const T*>(x), static_cast<const I*>(positions),
                                                       static_cast<T*>(out), batch, seq, heads, dim, sb, st, sh,
                                                       per_batch, frequencies, rotary_dim, inverse ? -1.0 : 1.0);
    });
    CPF_CUDA_CHECK_LAUNCH("rope kernel");
  });
}

}  // namespace cpf::cuda::kernels
