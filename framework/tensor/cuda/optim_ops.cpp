// The multi-tensor optimizer entries of the cuda kernel table (framework/tensor/device_ops.h): the gradient
// sum of squares, clipping by it and the fused AdamW step (kernels in optim.cu). Each lists its tensors and
// their chunks on the host and uploads the tables with one copy on the current stream.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "framework/tensor/cuda/cuda_ops.cuh"
#include "framework/tensor/cuda/kernels.cuh"
#include "framework/tensor/cuda/launch.cuh"
#include "framework/tensor/storage.h"

namespace cpf::cuda {
namespace {

namespace k = kernels;

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

}  // namespace

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

namespace {

// The scalars of step t as AdamW::update computes them on the host: {step_size = -lr / bc1, 1 / sqrt(bc2)}.
std::pair<double, double> adamw_step_scalars(const DeviceAdamW& h, int64_t step) {
  const double t = static_cast<double>(step);
  const double bias_correction1 = 1.0 - std::pow(h.beta1, t);
  const double bias_correction2 = 1.0 - std::pow(h.beta2, t);
  return {-h.lr / bias_correction1, 1.0 / std::sqrt(bias_correction2)};
}

}  // namespace

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

}  // namespace cpf::cuda
