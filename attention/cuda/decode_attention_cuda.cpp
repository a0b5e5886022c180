// The glue of the decoding attention kernel (decode_attention_kernel.cu): the contract of
// raw::DeviceDecodeAttention (attention/decode_attention.h), launched on the current stream.
#include "attention/cuda/decode_attention_cuda.h"

#include "attention/cuda/decode_attention_kernel.cuh"
#include "framework/core/error.h"
#include "framework/tensor/cuda/runtime.cuh"
#include "framework/tensor/ops/copy.h"

namespace cpf::attention_cuda {

void decode_attention(const Tensor& out, const Tensor& q, const Tensor& keys, const Tensor& values,
                      const Tensor& lengths, const raw::DecodeAttentionParams& params) {
  const int64_t dim_qk = q.size(2), dim_v = values.size(2);
  CPF_CHECK(dim_qk <= decode::kMaxHeadDim && dim_v <= decode::kMaxHeadDim, "decode_attention (cuda): head dims ",
            dim_qk, " / ", dim_v, " exceed the kernel's ", decode::kMaxHeadDim,
            "; decode without the CUDA graph (GPTDecoderOptions::cuda_graph = false) to use the general kernels");
  CPF_CHECK(
      out.is_contiguous() && keys.is_contiguous() && values.is_contiguous() && lengths.is_contiguous() &&
          q.stride(2) == 1 && (!params.k_new.defined() || (params.k_new.stride(2) == 1 && params.v_new.stride(2) == 1)),
      "decode_attention (cuda): out, keys, values and lengths must be contiguous, q / k_new / v_new in their last dim");
  const Tensor sink = params.sink.defined() ? raw::contiguous(params.sink) : Tensor();
  const int device = q.device().index;
  cuda::DeviceGuard guard(device);
  const Tensor& kn = params.k_new;
  const Tensor& vn = params.v_new;
  // Few sequences x heads: several blocks share each row's positions, their partial rows merged after.
  const int splits = decode::decode_splits(q.size(0), q.size(1), params.capacity, cuda::device_info(device).sm_count);
  const DType partial_dtype = q.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const Tensor partials =
      splits > 1 ? empty({q.size(0), q.size(1), splits, dim_v + 2}, {.dtype = partial_dtype, .device = q.device()})
                 : Tensor();  // (S, H, splits, D_v + 2)
  decode::launch_decode_attention({.dtype = static_cast<int>(q.dtype()),
                                   .length_dtype = static_cast<int>(lengths.dtype()),
                                   .out = out.raw_data(),
                                   .q = q.raw_data(),
                                   .keys = keys.raw_data(),
                                   .values = values.raw_data(),
                                   .lengths = lengths.raw_data(),
                                   .sink = sink.defined() ? sink.raw_data() : nullptr,
                                   .k_new = kn.defined() ? kn.raw_data() : nullptr,
                                   .v_new = vn.defined() ? vn.raw_data() : nullptr,
                                   .q_stride = {q.stride(0), q.stride(1)},
                                   .k_new_stride = {kn.defined() ? kn.stride(0) : 0, kn.defined() ? kn.stride(1) : 0},
                                   .v_new_stride = {vn.defined() ? vn.stride(0) : 0, vn.defined() ? vn.stride(1) : 0},
                                   .seqs = q.size(0),
                                   .heads = q.size(1),
                                   .kv_heads = keys.size(1),
                                   .dim_qk = dim_qk,
                                   .dim_v = dim_v,
                                   .capacity = params.capacity,
                                   .window_left = params.window_left,
                                   .scale = params.scale,
                                   .splits = splits,
                                   .partials = partials.defined() ? partials.raw_data() : nullptr},
                                  cuda::current_cuda_stream(device));
  out.bump_version();
}

}  // namespace cpf::attention_cuda
