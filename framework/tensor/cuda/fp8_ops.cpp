// DeviceOps' FP8 entries (device_ops.h; the op contracts are framework/tensor/ops/fp8.h): the casts run
// fp8.cu's kernels, the GEMM is cuBLASLt's FP8 matmul.
//
// The GEMM: out (M, N) = (a (M, K) * sa) @ (b (N, K) * sb)^T + bias. In cuBLASLt's column-major terms
// (cublaslt.cuh) out is D (N, M) = op(A) op(B) with A = our b read transposed (op T: (K, N) with leading
// dimension K) and B = our a (op N: (K, M), leading dimension K): the "TN" layout, the only one FP8
// kernels take. A's scale is b's inverse scale, B's is a's; the bias is one value per D row (our column).
#include <cuda_runtime.h>

#include <functional>
#include <vector>

#include "framework/tensor/cuda/cublaslt.cuh"
#include "framework/tensor/cuda/cuda_check.cuh"
#include "framework/tensor/cuda/cuda_ops.cuh"
#include "framework/tensor/cuda/fp8_kernels.cuh"
#include "framework/tensor/cuda/launch.cuh"
#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/fp8.h"

namespace cpf::cuda {
namespace {

namespace k = kernels;

const float* f32_ptr(const Tensor& t) { return t.defined() ? static_cast<const float*>(t.raw_data()) : nullptr; }
float* f32_mut(const Tensor& t) { return t.defined() ? static_cast<float*>(t.raw_data()) : nullptr; }

cudaDataType_t lt_type(DType dtype) {
  switch (dtype) {
    case DType::f8e4m3: return CUDA_R_8F_E4M3;
    case DType::f8e5m2: return CUDA_R_8F_E5M2;
    case DType::bf16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
  }
}

// FP8 tensor cores exist from compute capability 8.9 (Ada) on; Hopper is 9.0.
void check_fp8_device(int device, const char* op) {
  int major = 0, minor = 0;
  CPF_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CPF_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  CPF_CHECK(major * 10 + minor >= 89, op, " (cuda): cuda:", device, " has compute capability ", major, ".", minor,
            "; FP8 GEMMs need 8.9 or later (Ada, Hopper)");
}

}  // namespace

void fp8_amax(const Tensor& out, const Tensor& x) {
  Launch launch(x.device());
  CPF_CUDA_CHECK(cudaMemsetAsync(out.raw_data(), 0, sizeof(float), launch.stream));
  k::launch_fp8_amax(code(x.dtype()), x.raw_data(), x.numel(), f32_mut(out), launch.sm_count, launch.stream);
}

void fp8_scale(const Tensor& out, const Tensor& amax, double fp8_max, int64_t margin, const Tensor& fallback) {
  Launch launch(out.device());
  k::launch_fp8_scale(f32_ptr(amax), fp8_max, margin, f32_ptr(fallback), f32_mut(out), launch.stream);
}

void quantize_fp8(const Tensor& q, const Tensor& qt, const Tensor& x, const Tensor& scale, const Tensor& amax_out,
                  const Tensor& column_sums) {
  Launch launch(x.device());
  const bool e4m3 = (q.defined() ? q : qt).dtype() == DType::f8e4m3;
  if (!qt.defined()) {
    k::launch_quantize_fp8(code(x.dtype()), e4m3, x.raw_data(), x.numel(), f32_ptr(scale),
                           static_cast<uint8_t*>(q.raw_data()), f32_mut(amax_out), launch.sm_count, launch.stream);
    return;
  }
  const int64_t rows = x.size(0), cols = x.size(1);
  CPF_CHECK((rows + 31) / 32 <= 65535, "quantize_fp8 (cuda): ", rows,
            " rows are more than a transposing cast's grid takes (", int64_t{65535} * 32, ")");
  // The column sums' scratch: one f32 row per 64 rows of x, summed by a second kernel in a fixed order.
  const Tensor partials = column_sums.defined()
                              ? empty({k::column_sum_blocks(rows), cols}, {.dtype = DType::f32, .device = x.device()})
                              : Tensor();
  k::launch_quantize_fp8_transposed(code(x.dtype()), e4m3, x.raw_data(), rows, cols, f32_ptr(scale),
                                    q.defined() ? static_cast<uint8_t*>(q.raw_data()) : nullptr,
                                    static_cast<uint8_t*>(qt.raw_data()), f32_mut(amax_out), launch.stream,
                                    f32_mut(partials), f32_mut(column_sums));
}

// The activation codes are raw::CastActivation's values plus one (fp8_activation.h): gelu 1, swiglu 2.
bool fp8_activation_amax(const Tensor& out, const Tensor& pre, int activation) {
  Launch launch(pre.device());
  const int64_t cols = activation == k::kFp8Swiglu ? pre.size(1) / 2 : pre.size(1);
  CPF_CUDA_CHECK(cudaMemsetAsync(out.raw_data(), 0, sizeof(float), launch.stream));
  return k::launch_fp8_activation_amax(activation, pre.raw_data(), pre.size(0), cols, f32_mut(out), launch.sm_count,
                                       launch.stream);
}

bool quantize_fp8_activation(const Tensor& q, const Tensor& qt, const Tensor& pre, int activation, const Tensor& scale,
                             const Tensor& amax_out) {
  Launch launch(pre.device());
  const int64_t cols = activation == k::kFp8Swiglu ? pre.size(1) / 2 : pre.size(1);
  return k::launch_quantize_fp8_activation(activation, qt.dtype() == DType::f8e4m3, pre.raw_data(), pre.size(0), cols,
                                           f32_ptr(scale), q.defined() ? static_cast<uint8_t*>(q.raw_data()) : nullptr,
                                           static_cast<uint8_t*>(qt.raw_data()), f32_mut(amax_out), launch.stream);
}

namespace {

// The row jobs of weight i (fp8_rows.cu): its parts at their rows of q and columns of qt, or none when a part
// does not fit the kernel (the caller casts that weight itself).
std::vector<k::Fp8RowJob> row_jobs(const std::vector<Tensor>& parts, const Tensor& q, const Tensor& qt,
                                   const Tensor& scale, const Tensor& amax) {
  std::vector<k::Fp8RowJob> jobs;
  const int64_t n = qt.defined() ? qt.size(1) : 0;
  int64_t row = 0;
  for (const Tensor& p : parts) {
    const int64_t cols = p.size(1);
    const k::Fp8RowJob job{.x = p.raw_data(),
                           .q = q.defined() ? static_cast<uint8_t*>(q.raw_data()) + row * cols : nullptr,
                           .qt = qt.defined() ? static_cast<uint8_t*>(qt.raw_data()) + row : nullptr,
                           .scale = f32_ptr(scale),
                           .amax = f32_mut(amax),
                           .rows = p.size(0),
                           .cols = cols,
                           .qt_ld = n};
    if (!k::fp8_row_job_fits(job)) return {};
    jobs.push_back(job);
    row += p.size(0);
  }
  return jobs;
}

// Runs launch(dtype, jobs) once per dtype over the jobs of every weight that fits; returns which did.
template <class Launch>
std::vector<bool> run_row_jobs(const std::vector<std::vector<Tensor>>& weights, Launch&& launch,
                               const std::function<std::vector<k::Fp8RowJob>(size_t)>& jobs_of) {
  std::vector<bool> done(weights.size(), false);
  for (const DType dtype : {DType::f32, DType::bf16}) {
    std::vector<k::Fp8RowJob> jobs;
    for (size_t i = 0; i < weights.size(); ++i) {
      if (weights[i][0].dtype() != dtype) continue;
      const std::vector<k::Fp8RowJob> mine = jobs_of(i);
      done[i] = !mine.empty();
      jobs.insert(jobs.end(), mine.begin(), mine.end());
    }
    if (!jobs.empty()) launch(code(dtype), jobs);
  }
  return done;
}

}  // namespace

std::vector<bool> fp8_amax_rows(const std::vector<Tensor>& out, const std::vector<std::vector<Tensor>>& weights) {
  Launch launch(out[0].device());
  return run_row_jobs(
      weights,
      [&](int dtype, const std::vector<k::Fp8RowJob>& jobs) {
        k::launch_fp8_rows_amax(dtype, jobs.data(), static_cast<int>(jobs.size()), launch.stream);
      },
      [&](size_t i) { return row_jobs(weights[i], Tensor(), Tensor(), Tensor(), out[i]); });
}

std::vector<bool> quantize_fp8_rows(const std::vector<Tensor>& q, const std::vector<Tensor>& qt,
                                    const std::vector<std::vector<Tensor>>& weights, const std::vector<Tensor>& scale,
                                    const std::vector<Tensor>& amax_out) {
  Launch launch(qt[0].device());
  const bool e4m3 = qt[0].dtype() == DType::f8e4m3;
  return run_row_jobs(
      weights,
      [&](int dtype, const std::vector<k::Fp8RowJob>& jobs) {
        k::launch_fp8_rows_cast(dtype, e4m3, jobs.data(), static_cast<int>(jobs.size()), launch.stream);
      },
      [&](size_t i) { return row_jobs(weights[i], q[i], qt[i], scale[i], amax_out[i]); });
}

void dequantize_fp8(const Tensor& out, const Tensor& q, const Tensor& scale_inv) {
  Launch launch(q.device());
  k::launch_dequantize_fp8(code(out.dtype()), q.dtype() == DType::f8e4m3, static_cast<const uint8_t*>(q.raw_data()),
                           q.numel(), f32_ptr(scale_inv), out.raw_data(), launch.sm_count, launch.stream);
}

void fp8_matmul_nt(const Tensor& out, const Tensor& a, const Tensor& a_scale_inv, const Tensor& b,
                   const Tensor& b_scale_inv, const Tensor& bias, bool fast_accumulation) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(0);
  check_fp8_device(a.device().index, "fp8_matmul_nt");
  // cuBLASLt's FP8 rules: leading dimensions (K for a and b, N for out) multiples of 16, 16-byte aligned data.
  CPF_CHECK(k % 16 == 0 && n % 16 == 0, "fp8_matmul_nt (cuda): K = ", k, " and N = ", n,
            " must be multiples of 16 (cuBLASLt's FP8 GEMM; pad the layer's dimensions)");
  Launch launch(a.device());
  lt::LtGemm g;
  g.device = a.device().index;
  g.ab_type = lt_type(b.dtype());  // cuBLASLt's A is our b
  g.b_type = lt_type(a.dtype());
  g.cd_type = lt_type(out.dtype());
  g.opa = CUBLAS_OP_T;
  g.opb = CUBLAS_OP_N;
  g.m = static_cast<uint64_t>(n);
  g.n = static_cast<uint64_t>(m);
  g.k = static_cast<uint64_t>(k);
  g.lda = k;
  g.ldb = k;
  g.ldc = n;
  g.align_a = lt::alignment_of({reinterpret_cast<uintptr_t>(b.raw_data()), static_cast<uint64_t>(k)});
  g.align_b = lt::alignment_of({reinterpret_cast<uintptr_t>(a.raw_data()), static_cast<uint64_t>(k)});
  g.align_c = lt::alignment_of(
      {reinterpret_cast<uintptr_t>(out.raw_data()), static_cast<uint64_t>(n) * dtype_size(out.dtype())});
  g.fp8_scales = true;
  g.fp8_fast_accumulation = fast_accumulation;
  lt::LtPointers p;
  p.a = b.raw_data();
  p.b = a.raw_data();
  p.d = out.raw_data();
  p.a_scale = f32_ptr(b_scale_inv);
  p.b_scale = f32_ptr(a_scale_inv);
  // cuBLASLt's FP8 kernels with an f32 output read the bias as bf16 (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE's
  // FP8 exception): an f32 bias there gave garbage on an H100. So an f32 output adds its bias after the GEMM.
  const bool bias_after = bias.defined() && out.dtype() == DType::f32;
  if (bias.defined() && !bias_after) {
    g.epilogue = lt::Epilogue::bias;
    g.has_bias = true;
    p.bias = bias.raw_data();
  }
  g.align_epilogue = lt::epilogue_alignment(p);
  CPF_CHECK(lt::supported(g), "fp8_matmul_nt (cuda): cuBLASLt has no FP8 algorithm for M = ", m, ", N = ", n,
            ", K = ", k, " (", dtype_name(a.dtype()), " x ", dtype_name(b.dtype()), " -> ", dtype_name(out.dtype()),
            bias.defined() ? ", with bias" : "", ")");
  const Tensor workspace =
      empty({static_cast<int64_t>(lt::kWorkspaceBytes)}, {.dtype = DType::boolean, .device = out.device()});
  lt::run(g, p, workspace.raw_data(), launch.stream);
  if (bias_after) raw::copy_(out, raw::add(out, bias));  // (M, N) + (N)
}

void fp8_update_scales(const Tensor& history, const Tensor& amax, const Tensor& scale, const Tensor& fp8_max,
                       int64_t margin, bool most_recent, const Tensor& skip, const Tensor& clipped) {
  Launch launch(history.device());
  k::launch_fp8_update_scales(f32_mut(history), f32_mut(amax), f32_mut(scale), f32_ptr(fp8_max), history.size(0),
                              history.size(1), margin, most_recent, skip.defined() ? skip.raw_data() : nullptr,
                              skip.defined() && skip.dtype() == DType::f64,
                              clipped.defined() ? f32_mut(clipped) : nullptr, launch.stream);
}

}  // namespace cpf::cuda
