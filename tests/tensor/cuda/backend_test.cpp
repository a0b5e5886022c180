// The CUDA backend itself: registration, device checks, the caching allocator, streams and host <->
// device copies (small ones direct, large ones through the pinned staging buffers).
#include <thread>

#include "cuda_test_utils.h"
#include "framework/tensor/device_ops.h"
#include "framework/tensor/device_stream.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/matmul.h"
#include "framework/tensor/ops/reduce.h"
#include "framework/tensor/ops/softmax.h"
#include "framework/tensor/ops/views.h"

namespace cpf {
namespace {

using testing::CudaTest;
using testing::on_cpu;
using testing::on_gpu;
using testing::random_cpu;

// These run everywhere, GPU or not: linking cpf_tensor_cuda is what registers the backend.
TEST(CudaRegistration, LinkingTheLibraryRegistersBackendAndKernels) {
  EXPECT_TRUE(has_device_backend(DeviceType::cuda));
  const DeviceOps* ops = find_device_ops(DeviceType::cuda);
  ASSERT_NE(ops, nullptr);
  EXPECT_NE(ops->copy, nullptr);
  EXPECT_NE(ops->matmul, nullptr);
  EXPECT_NE(ops->softmax, nullptr);
  EXPECT_EQ(device_backend(DeviceType::cuda).device_count(), cuda::device_count());
  cuda::register_backend();  // idempotent
  EXPECT_EQ(find_device_ops(DeviceType::cuda), ops);
}

TEST(CudaRegistration, AMissingDeviceIsReportedWithTheCount) {
  const int count = cuda::device_count();
  const std::string expected = "cuda:" + std::to_string(count) + " is not available: this machine has " +
                               std::to_string(count) + " visible CUDA device";
  EXPECT_CPF_ERROR(empty({2, 3}, {.device = Device::cuda(count)}), expected);
  EXPECT_CPF_ERROR(cuda::memory_stats(count), expected);
  EXPECT_CPF_ERROR(cuda::Stream::create(-1), "cuda:-1 is not available");
  if (count == 0) {
    EXPECT_CPF_ERROR(raw::to(ones({2}), Device::cuda()), "(no GPU or no NVIDIA driver; check nvidia-smi");
  }
}

class CudaBackendTest : public CudaTest {};

TEST_F(CudaBackendTest, RoundTripsEveryDtypeSmallAndLarge) {
  // 1000 elements go straight through cudaMemcpy; 3M f32 (12 MB) go through the pinned staging buffers
  // in 8 MB chunks, the last one partial.
  for (int64_t n : {int64_t(1000), int64_t(3 << 20)}) {
    for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::i32, DType::i64}) {
      Tensor host = random_cpu({n}, dtype, 7, -100, 100);
      Tensor dev = on_gpu(host);
      EXPECT_EQ(dev.device(), Device::cuda(0));
      EXPECT_EQ(dev.dtype(), dtype);
      EXPECT_TRUE(testing::all_close(on_cpu(dev), host, 0, 0)) << dtype_name(dtype) << " n=" << n;
    }
  }
  Tensor flags = from_vector<bool>({true, false, true}, {3}, Device::cuda());
  EXPECT_EQ(on_cpu(flags).to_vector<bool>(), (std::vector<bool>{true, false, true}));
}

TEST_F(CudaBackendTest, CopiesConvertBroadcastAndFollowStridesOnTheDevice) {
  Tensor x = random_cpu({4, 5, 6}, DType::f32, 3);
  Tensor gx = on_gpu(x);
  // Transposed source into a contiguous destination, and a strided destination.
  Tensor t = raw::contiguous(raw::transpose(gx, 0, 2));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_TRUE(testing::all_close(on_cpu(t), raw::contiguous(raw::transpose(x, 0, 2)), 0, 0));
  Tensor dst = zeros({6, 5, 4}, {.device = Device::cuda()});
  raw::copy_(raw::transpose(dst, 0, 2), gx);
  EXPECT_TRUE(testing::all_close(on_cpu(dst), raw::contiguous(raw::transpose(x, 0, 2)), 0, 0));
  // Broadcast from a row, and from a host scalar.
  Tensor row = random_cpu({6}, DType::f32, 4);
  Tensor b = empty({4, 5, 6}, {.device = Device::cuda()});
  raw::copy_(b, on_gpu(row));
  EXPECT_TRUE(testing::all_close(on_cpu(b), raw::expand(row, {4, 5, 6}), 0, 0));
  Tensor wide = empty({4, 64}, {.dtype = DType::bf16, .device = Device::cuda()});  // vectorised broadcast
  Tensor wide_row = random_cpu({64}, DType::bf16, 6);
  raw::copy_(wide, on_gpu(wide_row));
  EXPECT_TRUE(testing::all_close(on_cpu(wide), raw::expand(wide_row, {4, 64}), 0, 0));
  raw::copy_(b, scalar_tensor(2.5));
  EXPECT_EQ(on_cpu(b).to_vector<float>(), std::vector<float>(120, 2.5f));
  // Every dtype pair converts as the CPU does (bf16 rounds to nearest even, to-bool is "non-zero").
  const std::vector<DType> all{DType::f32, DType::f64, DType::bf16, DType::i32, DType::i64, DType::boolean};
  Tensor src64 = random_cpu({257}, DType::f64, 5, -3, 3);
  raw::copy_(raw::narrow(src64, 0, 0, 16), zeros({16}, {.dtype = DType::f64}));  // exact zeros too
  for (DType from : all) {
    Tensor src = raw::to(src64, from);
    for (DType to : all) {
      Tensor expected = raw::to(src, to);
      Tensor got = raw::to(on_gpu(src), to);
      EXPECT_TRUE(testing::all_close(on_cpu(got), expected, 0, 0)) << dtype_name(from) << " -> " << dtype_name(to);
      // A strided (every other element) source takes the generic strided kernels.
      Tensor sliced = raw::slice(on_gpu(src), 0, 1, 257, 2);
      EXPECT_TRUE(testing::all_close(on_cpu(raw::to(sliced, to)), raw::to(raw::slice(src, 0, 1, 257, 2), to), 0, 0))
          << dtype_name(from) << " -> " << dtype_name(to) << " (strided)";
    }
  }
}

TEST_F(CudaBackendTest, FillsZerosAndFullOnTheDevice) {
  for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::i32, DType::i64, DType::boolean}) {
    Tensor z = zeros({3, 7}, {.dtype = dtype, .device = Device::cuda()});
    EXPECT_TRUE(testing::all_close(on_cpu(z), zeros({3, 7}, {.dtype = dtype}), 0, 0));
    Tensor f = full({3, 7}, 1.7, {.dtype = dtype, .device = Device::cuda()});
    EXPECT_TRUE(testing::all_close(on_cpu(f), full({3, 7}, 1.7, {.dtype = dtype}), 0, 0)) << dtype_name(dtype);
  }
  // fill_ through a strided view writes only the view.
  Tensor g = zeros({4, 4}, {.device = Device::cuda()});
  raw::fill_(raw::select(g, 1, 2), 3.0);
  Tensor expected = zeros({4, 4});
  raw::fill_(raw::select(expected, 1, 2), 3.0);
  EXPECT_TRUE(testing::all_close(on_cpu(g), expected, 0, 0));
}

TEST_F(CudaBackendTest, IterationsOfMoreThanTwelveDimsAreSplit) {
  // 14 dims of size 2 with reversed strides: nothing merges, so the copy is split into launches.
  Shape shape(14, 2);
  Tensor x = random_cpu(shape, DType::f32, 11);
  std::vector<int64_t> perm(14);
  for (int64_t i = 0; i < 14; ++i) perm[i] = 13 - i;
  Tensor expected = raw::contiguous(raw::permute(x, perm));
  Tensor got = raw::contiguous(raw::permute(on_gpu(x), perm));
  EXPECT_TRUE(testing::all_close(on_cpu(got), expected, 0, 0));
}

TEST_F(CudaBackendTest, AllocatorReusesFreedBlocksAndCountsBytes) {
  cuda::synchronize();
  cuda::empty_cache();
  const cuda::MemoryStats before = cuda::memory_stats();
  EXPECT_EQ(before.reserved, before.allocated);  // nothing cached after empty_cache
  {
    Tensor a = empty({1000}, {.device = Device::cuda()});  // 4000 bytes -> the 4096-byte class
    const cuda::MemoryStats s = cuda::memory_stats();
    EXPECT_EQ(s.allocated, before.allocated + 4096);
    EXPECT_EQ(s.device_mallocs, before.device_mallocs + 1);
  }
  const cuda::MemoryStats freed = cuda::memory_stats();
  EXPECT_EQ(freed.allocated, before.allocated);
  EXPECT_EQ(freed.reserved, before.reserved + 4096);  // cached, not returned
  // The steady state: the same sizes again and again cost no cudaMalloc.
  for (int i = 0; i < 100; ++i) {
    Tensor a = empty({1000}, {.device = Device::cuda()});
    Tensor b = empty({900}, {.device = Device::cuda()});  // 3600 bytes: the same 4096-byte class
  }
  const cuda::MemoryStats steady = cuda::memory_stats();
  EXPECT_EQ(steady.device_mallocs, freed.device_mallocs + 1);  // b needed a second block once
  EXPECT_EQ(steady.cache_hits, freed.cache_hits + 199);
  EXPECT_GE(steady.peak_allocated, before.allocated + 2 * 4096);
  cuda::reset_peak_memory_stats();
  EXPECT_EQ(cuda::memory_stats().peak_allocated, steady.allocated);
  cuda::empty_cache();
  const cuda::MemoryStats emptied = cuda::memory_stats();
  EXPECT_EQ(emptied.reserved, emptied.allocated);
  EXPECT_EQ(emptied.device_frees, steady.device_frees + 2);
}

TEST_F(CudaBackendTest, SizeClassesRoundUpWithBoundedWaste) {
  const size_t before = cuda::memory_stats().allocated;
  Tensor small = empty({1}, {.dtype = DType::boolean, .device = Device::cuda()});
  EXPECT_EQ(cuda::memory_stats().allocated, before + 512);
  // 3 MiB + 1 byte: classes of 256 KiB between 2 and 4 MiB -> 3.25 MiB.
  Tensor big = empty({(3 << 20) + 1}, {.dtype = DType::boolean, .device = Device::cuda()});
  EXPECT_EQ(cuda::memory_stats().allocated, before + 512 + (13u << 18));
}

TEST_F(CudaBackendTest, OutOfMemoryNamesRequestedSizeAndFigures) {
  // 1 PiB: more than any GPU has, after the cache was released and the allocation retried.
  EXPECT_CPF_ERROR(empty({int64_t(1) << 50}, {.dtype = DType::boolean, .device = Device::cuda()}),
                   "cuda:0 out of memory: tried to allocate 1048576.00 GiB (1125899906842624 bytes requested); "
                   "allocated ");
  EXPECT_CPF_ERROR(empty({int64_t(1) << 50}, {.dtype = DType::boolean, .device = Device::cuda()}), " free of ");
  // The allocator still works afterwards.
  Tensor ok = ones({10}, {.device = Device::cuda()});
  EXPECT_EQ(on_cpu(ok).to_vector<float>(), std::vector<float>(10, 1.0f));
}

TEST_F(CudaBackendTest, StreamsArePerThreadAndGuarded) {
  EXPECT_EQ(cuda::current_stream().handle(), nullptr);  // the default stream until set
  cuda::Stream s = cuda::Stream::create();
  EXPECT_NE(s.handle(), nullptr);
  {
    cuda::StreamGuard guard(s);
    EXPECT_EQ(cuda::current_stream().handle(), s.handle());
    // Another thread still has its own (default) stream.
    void* other = reinterpret_cast<void*>(1);
    std::thread([&] { other = cuda::current_stream().handle(); }).join();
    EXPECT_EQ(other, nullptr);
    // Work on the stream: allocation, kernels and copies all follow it.
    Tensor x = random_cpu({1 << 16}, DType::f32, 9);
    Tensor y = raw::mul(on_gpu(x), 2.0);
    EXPECT_TRUE(testing::all_close(on_cpu(y), raw::mul(x, 2.0), 0, 0));
    s.synchronize();
  }
  EXPECT_EQ(cuda::current_stream().handle(), nullptr);
}

// The device-agnostic stream handle (framework/tensor/device_stream.h) the CP ring alternates with.
TEST_F(CudaBackendTest, DeviceStreamsOrderWorkAcrossStreams) {
  const Device gpu = Device::cuda(0);
  const DeviceStream main_stream = DeviceStream::current(gpu);
  const DeviceStream side = DeviceStream::create(gpu);
  EXPECT_NE(side.handle(), nullptr);
  EXPECT_FALSE(side == main_stream);
  const Tensor x = random_cpu({1 << 22}, DType::f32, 5);
  Tensor a = on_gpu(x);  // queued on the main stream
  side.wait_for(main_stream);
  Tensor b;
  {
    const DeviceStreamScope scope(side);
    EXPECT_EQ(DeviceStream::current(gpu), side);
    for (int i = 0; i < 20; ++i) b = raw::add(i == 0 ? a : b, a);  // long enough to race without the wait below
  }
  EXPECT_EQ(DeviceStream::current(gpu), main_stream);
  main_stream.wait_for(side);
  main_stream.record_use(b);  // b's memory came from the side stream's pool
  const Tensor got = on_cpu(raw::mul(b, 1.0));
  EXPECT_TRUE(testing::all_close(got, raw::mul(x, 21.0), 1e-5, 1e-5));
  EXPECT_CPF_ERROR(side.wait_for(DeviceStream::current(Device::cpu())),
                   "DeviceStream::wait_for: a stream of cuda:0 cannot wait for one of cpu");
}

TEST_F(CudaBackendTest, RankThreadsOnOwnStreamsComputeIndependently) {
  constexpr int kThreads = 4;
  std::vector<double> sums(kThreads, 0.0);
  std::vector<std::thread> threads;
  for (int r = 0; r < kThreads; ++r) {
    threads.emplace_back([r, &sums] {
      cuda::Stream s = cuda::Stream::create();
      cuda::StreamGuard guard(s);
      for (int step = 0; step < 20; ++step) {
        Tensor x = full({4096}, static_cast<double>(r + 1), {.device = Device::cuda()});
        sums[r] = raw::sum(raw::mul(x, x)).item<double>();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kThreads; ++r) EXPECT_EQ(sums[r], 4096.0 * (r + 1) * (r + 1));
}

TEST_F(CudaBackendTest, DeviceTensorsReportErrorsOfTheOps) {
  Tensor g = ones({2, 3}, {.device = Device::cuda()});
  EXPECT_CPF_ERROR(raw::add(g, ones({2, 3})), "add: tensors are on different devices: cuda:0 vs cpu");
  EXPECT_CPF_ERROR(raw::matmul(g, ones({3, 2})), "matmul: tensors are on different devices: cuda:0 vs cpu");
  EXPECT_CPF_ERROR(raw::softmax_backward(g, ones({2, 3}), 1),
                   "softmax_backward: tensors are on different devices: cuda:0 vs cpu");
  EXPECT_CPF_ERROR(raw::unary_backward(raw::UnaryOp::exp, g, ones({2, 3}), g),
                   "exp: tensors are on different devices: cuda:0 vs cpu");
  Tensor gi = ones({2, 3}, {.dtype = DType::i32, .device = Device::cuda()});
  EXPECT_CPF_ERROR(raw::unary_backward(raw::UnaryOp::neg, gi, gi, gi), "neg backward: needs floating tensors, got i32");
  EXPECT_CPF_ERROR(raw::div(gi, zeros({3}, {.dtype = DType::i32, .device = Device::cuda()})),
                   "div: integer division by zero (divisor of shape [3])");
  Tensor gb = ones({2}, {.dtype = DType::boolean, .device = Device::cuda()});
  EXPECT_CPF_ERROR(raw::add_(gb, gb), "add_: not defined for bool tensors");
  EXPECT_CPF_ERROR(raw::mul_(gb, 2.0), "mul_: not defined for bool tensors");
  EXPECT_CPF_ERROR(raw::add_(gi, gi, 0.5), "add_: alpha=0.5 must be a whole number for a i32 tensor");
}

}  // namespace
}  // namespace cpf
