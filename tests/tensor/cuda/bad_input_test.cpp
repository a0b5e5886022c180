// Bad input across devices: a CUDA tensor where a CPU one is expected (and the reverse), tensors on
// two GPUs, and dtypes a kernel does not take. Each must be a cpf::Error naming the op and the devices
// (with dtypes and shapes) or the dtype, raised before any kernel runs; never a crash or a silent host
// read of device memory. The CPU-only writers that accept device tensors (safetensors) copy them.
#include <unistd.h>

#include <filesystem>
#include <string>

#include "attention/attention_op.h"
#include "cuda_test_utils.h"
#include "framework/autograd/gradcheck.h"
#include "framework/autograd/ops.h"
#include "framework/distributed/gradcheck.h"
#include "framework/distributed/launcher.h"
#include "framework/io/safetensors.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/join.h"
#include "framework/tensor/ops/matmul.h"
#include "framework/tensor/ops/softmax.h"
#include "framework/tensor/ops/views.h"

namespace cpf {
namespace {

using testing::CudaTest;
using testing::on_cpu;
using testing::on_gpu;
using testing::random_cpu;

class CudaBadInput : public CudaTest {};

TEST_F(CudaBadInput, MixedCpuAndCudaOperandsNameTheOpDevicesAndDtypes) {
  const Tensor g = on_gpu(random_cpu({2, 3}, DType::f32, 1));
  const Tensor h = random_cpu({2, 3}, DType::f32, 2);
  EXPECT_CPF_ERROR(raw::add(g, h), "add: tensors are on different devices: cuda:0 vs cpu (f32 [2,3] vs f32 [2,3])");
  EXPECT_CPF_ERROR(raw::mul(h, g), "mul: tensors are on different devices: cpu vs cuda:0 (f32 [2,3] vs f32 [2,3])");
  EXPECT_CPF_ERROR(raw::matmul(g, random_cpu({3, 4}, DType::f32, 3)),
                   "matmul: tensors are on different devices: cuda:0 vs cpu (f32 [2,3] vs f32 [3,4])");
  EXPECT_CPF_ERROR(raw::cat({g, h}, 0), "cat: tensor 1 is on cpu but tensor 0 is on cuda:0");
  EXPECT_CPF_ERROR(raw::stack({h, g}, 0), "stack: tensor 1 is on cuda:0 but tensor 0 is on cpu");
  EXPECT_CPF_ERROR(raw::where(raw::compare(raw::CompareOp::gt, h, 0.0), g, g),
                   "where: tensors are on different devices: cpu vs cuda:0 (bool [2,3] vs f32 [2,3])");
  EXPECT_CPF_ERROR(raw::add_(g, h, 1.0), "add_: tensors are on different devices: cuda:0 vs cpu");
  // The differentiable API reaches the same checks (and records nothing).
  Tensor leaf = on_gpu(random_cpu({2, 3}, DType::f64, 4));
  leaf.set_requires_grad(true);
  EXPECT_CPF_ERROR(cpf::sub(leaf, random_cpu({3}, DType::f64, 5)),
                   "sub: tensors are on different devices: cuda:0 vs cpu (f64 [2,3] vs f64 [3])");
  EXPECT_CPF_ERROR(cpf::cat({leaf, random_cpu({1, 3}, DType::f64, 6)}, 0),
                   "cat: tensor 1 is on cpu but tensor 0 is on cuda:0");
}

TEST_F(CudaBadInput, MixedDevicesInNnAndIndexOps) {
  const Tensor x = on_gpu(random_cpu({4, 6}, DType::f32, 1));
  EXPECT_CPF_ERROR(cpf::layer_norm(x, ones({6}), Tensor()), "layer_norm: weight is on cpu but x is on cuda:0");
  EXPECT_CPF_ERROR(cpf::rms_norm(x, ones({6})), "rms_norm: weight is on cpu but x is on cuda:0");
  EXPECT_CPF_ERROR(cpf::cross_entropy(x, from_vector<int64_t>({0, 1, 2, 3}, {4})),
                   "cross_entropy: targets are on cpu but logits are on cuda:0");
  EXPECT_CPF_ERROR(cpf::embedding(x, from_vector<int64_t>({0, 3}, {2})),
                   "embedding: tensors are on different devices: cuda:0 vs cpu (f32 [4,6] vs i64 [2])");
  EXPECT_CPF_ERROR(cpf::index_select(x, 0, from_vector<int64_t>({1}, {1})),
                   "index_select: tensors are on different devices: cuda:0 vs cpu");
  EXPECT_CPF_ERROR(cpf::gather(x, 1, from_vector<int64_t>({0, 0, 0, 0}, {4, 1})),
                   "gather: tensors are on different devices: cuda:0 vs cpu");
  EXPECT_CPF_ERROR(cpf::masked_fill(x, raw::to(ones({6}), DType::boolean), 0.0),
                   "masked_fill: tensors are on different devices: cuda:0 vs cpu");
  const Tensor rope_x = on_gpu(random_cpu({2, 3, 2, 4}, DType::f32, 2));
  EXPECT_CPF_ERROR(cpf::rope(rope_x, from_vector<int64_t>({0, 1, 2}, {3})),
                   "rope: positions are on cpu but x is on cuda:0");
}

// The validation (attention/attention_problem.cpp) names the op "dot_product_attention" even when
// raw::attention_forward is called directly, so only the rest of the message is checked here.
TEST_F(CudaBadInput, AttentionWithQkvOnDifferentDevices) {
  const Tensor q = on_gpu(random_cpu({1, 4, 2, 8}, DType::f32, 1));
  const Tensor k = random_cpu({1, 4, 2, 8}, DType::f32, 2);
  const Tensor v = random_cpu({1, 4, 2, 8}, DType::f32, 3);
  EXPECT_CPF_ERROR(raw::attention_forward(q, k, v, AttentionSpec{}),
                   "Q, K and V must be on the same device: q=cuda:0 k=cpu v=cpu");
  EXPECT_CPF_ERROR(raw::attention_forward(k, q, on_gpu(v), AttentionSpec{}),
                   "Q, K and V must be on the same device: q=cpu k=cuda:0 v=cuda:0");
}

TEST_F(CudaBadInput, UnsupportedDtypesNameTheOpAndDtype) {
  const Tensor ints = on_gpu(from_vector<int64_t>({1, 2, 3, 4, 5, 6}, {2, 3}));
  const Tensor flags = on_gpu(raw::to(from_vector<int32_t>({1, 0, 1, 1, 0, 0}, {2, 3}), DType::boolean));
  EXPECT_CPF_ERROR(raw::softmax(ints, -1), "softmax: 'x' must be a floating tensor (f32, f64 or bf16), got i64");
  EXPECT_CPF_ERROR(raw::matmul(flags, raw::transpose(flags, 0, 1)), "matmul: needs floating tensors, got bool");
  EXPECT_CPF_ERROR(raw::unary(raw::UnaryOp::exp, on_gpu(raw::to(ints, DType::i32))),
                   "exp: needs a floating tensor, got i32");
  EXPECT_CPF_ERROR(raw::add(flags, flags), "add: not defined for bool tensors");
  EXPECT_CPF_ERROR(cpf::layer_norm(ints, Tensor(), Tensor()),
                   "layer_norm: x must be a floating tensor (f32, f64 or bf16), got i64");
  EXPECT_CPF_ERROR(cpf::cross_entropy(ints, on_gpu(from_vector<int64_t>({0, 1}, {2}))),
                   "cross_entropy: logits must be a floating tensor, got i64");
  EXPECT_CPF_ERROR(raw::matmul(on_gpu(random_cpu({2, 3}, DType::f32, 1)), on_gpu(random_cpu({3, 2}, DType::bf16, 2))),
                   "matmul: dtypes differ: f32 [2,3] vs bf16 [3,2]");
  // gradcheck takes device inputs, but only in f64.
  Tensor f32_leaf = on_gpu(random_cpu({2}, DType::f32, 3));
  f32_leaf.set_requires_grad(true);
  EXPECT_CPF_ERROR(gradcheck([](const std::vector<Tensor>& in) { return cpf::sum(in[0]); }, {f32_leaf}),
                   "gradcheck: input 0 of shape [2] is f32; finite differences need f64 inputs");
}

TEST_F(CudaBadInput, DistributedGradcheckRejectsDeviceInputs) {
  // It perturbs elements through host pointers: a device input must be refused, not written to.
  dist::launch(1, [](dist::RankContext& ctx) {
    Tensor x = on_gpu(random_cpu({3}, DType::f64, 1));
    x.set_requires_grad(true);
    const GradcheckFn fn = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{cpf::mul(in[0], 2.0)}; };
    EXPECT_CPF_ERROR(dist::gradcheck(*ctx.world, fn, {x}), "dist::gradcheck: input 0 of shape [3] is on cuda:0");
  });
}

TEST_F(CudaBadInput, TensorsOnTwoGpus) {
  if (cuda::device_count() < 2) {
    GTEST_SKIP() << "needs 2 visible GPUs, this machine has " << cuda::device_count()
                 << " (run on nvidia-h200-x2 to cover it)";
  }
  const Tensor a = on_gpu(random_cpu({2, 3}, DType::f32, 1));
  const Tensor b = raw::to(random_cpu({2, 3}, DType::f32, 2), Device::cuda(1));
  EXPECT_CPF_ERROR(raw::add(a, b), "add: tensors are on different devices: cuda:0 vs cuda:1");
  EXPECT_CPF_ERROR(raw::matmul(a, raw::transpose(b, 0, 1)),
                   "matmul: tensors are on different devices: cuda:0 vs cuda:1");
  EXPECT_CPF_ERROR(raw::cat({a, b}, 0), "cat: tensor 1 is on cuda:1 but tensor 0 is on cuda:0");
  EXPECT_CPF_ERROR(raw::attention_forward(raw::view(a, {1, 2, 1, 3}), raw::view(b, {1, 2, 1, 3}),
                                          raw::view(b, {1, 2, 1, 3}), AttentionSpec{}),
                   "Q, K and V must be on the same device: q=cuda:0 k=cuda:1 v=cuda:1");
  // Explicit moves between GPUs are allowed and exact.
  EXPECT_TRUE(testing::all_close(on_cpu(raw::to(b, Device::cuda(0))), on_cpu(b), 0, 0));
}

TEST_F(CudaBadInput, SafetensorsWritesDeviceTensorsThroughTheHost) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("cpf_bad_input_" + std::to_string(::getpid()) + ".safetensors"))
          .string();
  const Tensor host = random_cpu({3, 4}, DType::f32, 1);
  const Tensor strided_device = raw::transpose(on_gpu(host), 0, 1);  // (4, 3), non-contiguous on the GPU
  io::save_safetensors(path, {{"w", strided_device}, {"b", on_gpu(random_cpu({5}, DType::bf16, 2))}});
  const io::NamedTensors loaded = io::load_safetensors(path);
  std::filesystem::remove(path);
  ASSERT_EQ(loaded.size(), 2u);
  EXPECT_EQ(loaded[0].second.device(), Device::cpu());
  EXPECT_TRUE(testing::all_close(loaded[0].second, raw::contiguous(raw::transpose(host, 0, 1)), 0, 0));
  EXPECT_TRUE(testing::all_close(loaded[1].second, random_cpu({5}, DType::bf16, 2), 0, 0));
}

}  // namespace
}  // namespace cpf
