// Multi-tensor optimizer kernels: the global sum of squares (gradient norm), clipping by it and the fused
// AdamW step. Clipping and AdamW read the sum from device memory and decide there (clip or not, skip the
// step or not), so the host enqueues the whole optimizer phase before it reads the norm back.
// The host (ops.cpp) lists the tensors and cuts them into chunks (kChunk elements for AdamW, kSquaresChunk for
// the sum of squares); one block per chunk, so a whole model's parameters take one launch whatever their
// number and sizes.
//
// AdamW rounds every operation as the raw-op sequence of optim::AdamW::update does on the CPU (mul_:
// product in f64 rounded to the type; add_: alpha rounded to the type, then x + alpha * y in the type;
// sqrt and division IEEE-rounded). The _rn intrinsics keep nvcc from fusing a multiply and an add into
// an FMA that the CPU does not use, so the device result is the CPU's bit for bit.
#include "framework/tensor/cuda/elementwise.cuh"

namespace cpf::cuda::kernels {
namespace {

constexpr int kOptThreads = 256;

// Sum over the block (blockDim.x == kOptThreads) in a fixed order (shuffle trees within the warps, then
// over the warps); the result is valid in thread 0. Two barriers instead of a shared-memory tree's nine.
__device__ double block_sum(double v) {
  __shared__ double warp_sums[kOptThreads / 32];
#pragma unroll
  for (int delta = 16; delta > 0; delta >>= 1) v += __shfl_down_sync(0xffffffffu, v, delta);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();  // warp_sums may still be read by a previous call
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kOptThreads / 32 ? warp_sums[lane] : 0.0;
#pragma unroll
    for (int delta = 16; delta > 0; delta >>= 1) v += __shfl_down_sync(0xffffffffu, v, delta);
  }
  return v;
}

// The chunk's sum of squares in f64. Aligned tensors are read with 16-byte vectors (chunks start at
// multiples of kSquaresChunk, so at vector boundaries); scalar 2-byte loads kept bf16 at half the bandwidth.
template <class T>
__device__ __forceinline__ double chunk_squares(const T* p, int64_t begin, int64_t end, bool aligned) {
  constexpr int V = 16 / static_cast<int>(sizeof(T));
  double acc = 0.0;
  int64_t tail = begin;
  if (aligned) {
    const int64_t nv = (end - begin) / V;
    const Vec<T, V>* pv = reinterpret_cast<const Vec<T, V>*>(p + begin);
#pragma unroll 4
    for (int64_t q = threadIdx.x; q < nv; q += kOptThreads) {
      const Vec<T, V> x = pv[q];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const double w = widen(x.v[j]);
        acc += w * w;
      }
    }
    tail = begin + nv * V;
  }
  for (int64_t i = tail + threadIdx.x; i < end; i += kOptThreads) {
    const double w = widen(p[i]);
    acc += w * w;
  }
  return acc;
}

__global__ void squares_kernel(const SquaresTensor* tensors, const ChunkRef* chunks, double* partials) {
  const ChunkRef c = chunks[blockIdx.x];
  const SquaresTensor t = tensors[c.tensor];
  const int64_t end = c.begin + kSquaresChunk < t.numel ? c.begin + kSquaresChunk : t.numel;
  double acc;
  switch (t.dtype) {
    case kF32: acc = chunk_squares(static_cast<const float*>(t.data), c.begin, end, t.aligned); break;
    case kF64: acc = chunk_squares(static_cast<const double*>(t.data), c.begin, end, t.aligned); break;
    default: acc = chunk_squares(static_cast<const bf16*>(t.data), c.begin, end, t.aligned); break;
  }
  const double total = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void combine_kernel(const double* partials, int64_t n, double* out) {
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += kOptThreads) acc += partials[i];
  const double total = block_sum(acc);
  if (threadIdx.x == 0) out[0] = total;
}

// x * value as mul_ does: the product in f64, rounded to the type.
__device__ __forceinline__ float mul_round(float x, double value) { return __double2float_rn(__dmul_rn(x, value)); }
__device__ __forceinline__ double mul_round(double x, double value) { return __dmul_rn(x, value); }
// x + alpha * y as add_ does, alpha already in the type.
__device__ __forceinline__ float add_scaled(float x, float alpha, float y) { return __fadd_rn(x, __fmul_rn(alpha, y)); }
__device__ __forceinline__ double add_scaled(double x, double alpha, double y) {
  return __dadd_rn(x, __dmul_rn(alpha, y));
}
__device__ __forceinline__ float sq(float x) { return __fmul_rn(x, x); }
__device__ __forceinline__ double sq(double x) { return __dmul_rn(x, x); }
__device__ __forceinline__ float root(float x) { return __fsqrt_rn(x); }
__device__ __forceinline__ double root(double x) { return __dsqrt_rn(x); }
__device__ __forceinline__ float quotient(float x, float y) { return __fdiv_rn(x, y); }
__device__ __forceinline__ double quotient(double x, double y) { return __ddiv_rn(x, y); }

// One element of the step: p (parameter, widened), g, m, v in the state type S; returns the new p.
template <class S>
__device__ __forceinline__ S adamw_element(S p, S g, S& m, S& v, const AdamWTensor& t, const AdamWScalars& s,
                                           double step_size_d, double inv_sqrt_bc2) {
  const S a1 = static_cast<S>(s.one_minus_beta1), a2 = static_cast<S>(s.one_minus_beta2);
  const S eps = static_cast<S>(s.eps), step_size = static_cast<S>(step_size_d);
  if (t.has_decay) p = mul_round(p, t.decay);
  m = add_scaled(mul_round(m, s.beta1), a1, g);
  v = add_scaled(mul_round(v, s.beta2), a2, sq(g));
  // denom = sqrt(v) * (1 / sqrt(bc2)) + eps (add_ of a 0-d eps with alpha 1).
  const S denom = add_scaled(mul_round(root(v), inv_sqrt_bc2), S(1), eps);
  return add_scaled(p, step_size, quotient(m, denom));
}

// P: parameter (and gradient) storage type; S: state and compute type. Aligned tensors move 4 elements
// per access (chunks start at multiples of kChunk); scalar 2-byte accesses left bf16 at 70% of the copy
// bandwidth.
template <class P, class S>
__global__ void adamw_kernel(const AdamWTensor* tensors, const ChunkRef* chunks, AdamWScalars s) {
  constexpr int V = 4;
  // The skip decided on the device: norm = sqrt(sum) as the host computes it; not finite: no change at all.
  if (s.skip_if_nonfinite != nullptr && !isfinite(__dsqrt_rn(*s.skip_if_nonfinite))) return;
  double step_size = s.step_size, inv_sqrt_bc2 = s.inv_sqrt_bc2;
  if (s.applied_steps != nullptr) {  // a deferred step: t decided here, its scalars computed on the host
    const int64_t j = *s.applied_steps + 1 - s.first_step;
    if (j < 0 || j >= s.candidates) __trap();  // the host's bookkeeping is broken: fail loudly, never guess t
    step_size = s.candidate_scalars[2 * j];
    inv_sqrt_bc2 = s.candidate_scalars[2 * j + 1];
  }
  const ChunkRef c = chunks[blockIdx.x];
  const AdamWTensor t = tensors[c.tensor];
  const int64_t end = c.begin + kChunk < t.numel ? c.begin + kChunk : t.numel;
  P* param = static_cast<P*>(t.param);
  const P* grad = static_cast<const P*>(t.grad);
  S* exp_avg = static_cast<S*>(t.exp_avg);
  S* exp_avg_sq = static_cast<S*>(t.exp_avg_sq);
  int64_t tail = c.begin;
  if (t.aligned) {
    tail = end - (end - c.begin) % V;
    for (int64_t i = c.begin + threadIdx.x * V; i < tail; i += kOptThreads * V) {
      Vec<P, V> pv = *reinterpret_cast<const Vec<P, V>*>(param + i);
      const Vec<P, V> gv = *reinterpret_cast<const Vec<P, V>*>(grad + i);
      Vec<S, V> mv = *reinterpret_cast<const Vec<S, V>*>(exp_avg + i);
      Vec<S, V> vv = *reinterpret_cast<const Vec<S, V>*>(exp_avg_sq + i);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        pv.v[j] = narrow<P>(
            adamw_element<S>(widen(pv.v[j]), widen(gv.v[j]), mv.v[j], vv.v[j], t, s, step_size, inv_sqrt_bc2));
      }
      *reinterpret_cast<Vec<S, V>*>(exp_avg + i) = mv;
      *reinterpret_cast<Vec<S, V>*>(exp_avg_sq + i) = vv;
      *reinterpret_cast<Vec<P, V>*>(param + i) = pv;
    }
  }
  for (int64_t i = tail + threadIdx.x; i < end; i += kOptThreads) {
    S m = exp_avg[i], v = exp_avg_sq[i];
    const S p = adamw_element<S>(widen(param[i]), widen(grad[i]), m, v, t, s, step_size, inv_sqrt_bc2);
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    param[i] = narrow<P>(p);
  }
}

// x * factor as mul_ does (binary.cu ScaleFn): bf16 in f32 with the factor rounded to f32, the others
// in f64 rounded to the type.
__device__ __forceinline__ bf16 scale_round(bf16 x, double factor) {
  return to_bf16(__fmul_rn(to_float(x), __double2float_rn(factor)));
}
__device__ __forceinline__ float scale_round(float x, double factor) { return mul_round(x, factor); }
__device__ __forceinline__ double scale_round(double x, double factor) { return mul_round(x, factor); }

template <class T>
__device__ void scale_chunk(T* p, int64_t begin, int64_t end, bool aligned, double factor) {
  constexpr int V = 4;
  int64_t tail = begin;
  if (aligned) {
    tail = end - (end - begin) % V;
    for (int64_t i = begin + threadIdx.x * V; i < tail; i += kOptThreads * V) {
      Vec<T, V> x = *reinterpret_cast<const Vec<T, V>*>(p + i);
#pragma unroll
      for (int j = 0; j < V; ++j) x.v[j] = scale_round(x.v[j], factor);
      *reinterpret_cast<Vec<T, V>*>(p + i) = x;
    }
  }
  for (int64_t i = tail + threadIdx.x; i < end; i += kOptThreads) p[i] = scale_round(p[i], factor);
}

// clip_grad_norm_'s rule on the device, with the host's rounding: norm = sqrt(sum) (std::sqrt), and the
// factor max_norm / (norm + 1e-6) only when the norm is finite and above max_norm.
__global__ void clip_kernel(const ScaleTensor* tensors, const ChunkRef* chunks, const double* sum_squares,
                            double max_norm) {
  const double norm = __dsqrt_rn(*sum_squares);
  if (!isfinite(norm) || !(norm > max_norm)) return;
  const double factor = __ddiv_rn(max_norm, __dadd_rn(norm, 1e-6));
  const ChunkRef c = chunks[blockIdx.x];
  const ScaleTensor t = tensors[c.tensor];
  const int64_t end = c.begin + kChunk < t.numel ? c.begin + kChunk : t.numel;
  switch (t.dtype) {
    case kF32: scale_chunk(static_cast<float*>(t.data), c.begin, end, t.aligned, factor); break;
    case kF64: scale_chunk(static_cast<double*>(t.data), c.begin, end, t.aligned, factor); break;
    default: scale_chunk(static_cast<bf16*>(t.data), c.begin, end, t.aligned, factor); break;
  }
}

__global__ void set_count_kernel(int64_t* count, int64_t value) { *count = value; }

__global__ void count_applied_kernel(int64_t* count, const double* skip_if_nonfinite) {
  if (skip_if_nonfinite == nullptr || isfinite(__dsqrt_rn(*skip_if_nonfinite))) *count += 1;
}

}  // namespace

void launch_set_applied_steps(int64_t* count, int64_t value, cudaStream_t stream) {
  set_count_kernel<<<1, 1, 0, stream>>>(count, value);
  CPF_CUDA_CHECK_LAUNCH("set applied steps kernel");
}

void launch_count_applied(int64_t* count, const double* skip_if_nonfinite, cudaStream_t stream) {
  count_applied_kernel<<<1, 1, 0, stream>>>(count, skip_if_nonfinite);
  CPF_CUDA_CHECK_LAUNCH("count applied steps kernel");
}

void launch_sum_squares(const SquaresTensor* tensors, const ChunkRef* chunks, int64_t nchunks, double* partials,
                        double* out, cudaStream_t stream) {
  if (nchunks > 0) {
    squares_kernel<<<static_cast<unsigned>(nchunks), kOptThreads, 0, stream>>>(tensors, chunks, partials);
    CPF_CUDA_CHECK_LAUNCH("sum_squares kernel");
  }
  combine_kernel<<<1, kOptThreads, 0, stream>>>(partials, nchunks, out);
  CPF_CUDA_CHECK_LAUNCH("sum_squares combine kernel");
}

void launch_adamw(int dtype, const AdamWTensor* tensors, const ChunkRef* chunks, int64_t nchunks, const AdamWScalars& s,
                  cudaStream_t stream) {
  if (nchunks == 0) return;
  const unsigned grid = static_cast<unsigned>(nchunks);
  switch (dtype) {
    case kF32: adamw_kernel<float, float><<<grid, kOptThreads, 0, stream>>>(tensors, chunks, s); break;
    case kF64: adamw_kernel<double, double><<<grid, kOptThreads, 0, stream>>>(tensors, chunks, s); break;
    default: adamw_kernel<bf16, float><<<grid, kOptThreads, 0, stream>>>(tensors, chunks, s); break;
  }
  CPF_CUDA_CHECK_LAUNCH("adamw kernel");
}

void launch_clip_by_norm(const ScaleTensor* tensors, const ChunkRef* chunks, int64_t nchunks, const double* sum_squares,
                         double max_norm, cudaStream_t stream) {
  if (nchunks == 0) return;
  clip_kernel<<<static_cast<unsigned>(nchunks), kOptThreads, 0, stream>>>(tensors, chunks, sum_squares, max_norm);
  CPF_CUDA_CHECK_LAUNCH("clip kernel");
}

}  // namespace cpf::cuda::kernels
