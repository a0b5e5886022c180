// Index checks on the device (errors recorded there, raised at the next synchronisation with the
// CPU's message), the CPF_CUDA_SYNC debug mode, and record_stream.
#include <gtest/gtest.h>

#include <vector>

#include "framework/tensor/ops/cross_entropy.h"
#include "framework/tensor/ops/elementwise.h"
#include "framework/tensor/ops/embedding.h"
#include "framework/tensor/ops/index.h"
#include "framework/tensor/ops/matmul.h"
#include "tests/tensor/cuda/cuda_test_utils.h"

namespace cpf {
namespace {

using testing::on_cpu;
using testing::on_gpu;

class CudaDeviceErrorsTest : public testing::CudaTest {
 protected:
  void TearDown() override {
    if (cuda::is_available()) cuda::set_sync_debug(false);
  }
};

// Positions 3 and 6 are bad: the smallest flat position is reported, whichever thread found it first.
TEST_F(CudaDeviceErrorsTest, EmbeddingIdErrorIsRaisedAtTheNextSynchronisation) {
  Tensor weight = on_gpu(zeros({4, 8}));
  Tensor ids = on_gpu(from_vector<int64_t>({0, 1, 2, 9, 3, 0, -1, 2}, {2, 4}));
  Tensor out;
  // The call itself returns: nothing was read back.
  ASSERT_NO_THROW(out = raw::embedding(weight, ids));
  EXPECT_CPF_ERROR(cuda::synchronize(),
                   "embedding: id 9 at position [0,3] of ids [2,4] is out of range for a table of V=4 rows "
                   "(expected 0..3)");
  // Reported once; the device works on and a good call after it is clean.
  EXPECT_NO_THROW(cuda::synchronize());
  Tensor good = on_gpu(from_vector<int64_t>({3, 0}, {2}));
  EXPECT_NO_THROW(on_cpu(raw::embedding(weight, good)));
}

TEST_F(CudaDeviceErrorsTest, ErrorsAreRaisedByEveryWaitingCall) {
  Tensor x = on_gpu(from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2}));
  Tensor bad = on_gpu(from_vector<int32_t>({2, 0, 5}, {3}));
  const char* msg = "index_select: index 5 at position [2] is out of range for dim 0 of size 3";
  // A device->host copy (item, to_vector, printing go through it).
  EXPECT_CPF_ERROR(on_cpu(raw::index_select(x, 0, bad)), msg);
  EXPECT_CPF_ERROR(
      {
        (void)raw::index_select(x, 0, bad);
        (void)raw::add(x, x).to_vector<float>();
      },
      msg);
  EXPECT_CPF_ERROR(
      {
        (void)raw::index_select(x, 0, bad);
        cuda::current_stream().synchronize();
      },
      msg);
  // memory_stats waits for nothing: it raises once the check kernel has finished (microseconds).
  EXPECT_CPF_ERROR(
      {
        (void)raw::index_select(x, 0, bad);
        for (int i = 0; i < 1000000; ++i) (void)cuda::memory_stats();
      },
      msg);
  EXPECT_CPF_ERROR(
      {
        (void)raw::index_select(x, 0, bad);
        cuda::empty_cache();
      },
      msg);
  EXPECT_CPF_ERROR(
      {
        (void)raw::index_select(x, 0, bad);
        cuda::synchronize(0);
      },
      msg);
}

TEST_F(CudaDeviceErrorsTest, BadIndicesAreNeverAccessed) {
  // A far out-of-range index must not fault (that would lose the message): gathers give 0 for it,
  // scatters skip it, and the error comes with the CPU's text.
  Tensor x = on_gpu(from_vector<float>({1, 2, 3, 4}, {2, 2}));
  Tensor far = on_gpu(from_vector<int64_t>({1, int64_t(1) << 40}, {2}));
  EXPECT_CPF_ERROR(on_cpu(raw::index_select(x, 0, far)),
                   "index_select: index 1099511627776 at position [1] is out of range for dim 0 of size 2");
  Tensor acc = on_gpu(zeros({2, 2}));
  EXPECT_CPF_ERROR(
      {
        raw::scatter_add_(acc, 0, on_gpu(from_vector<int64_t>({0, -7, 1, 1}, {2, 2})), on_gpu(ones({2, 2})));
        cuda::synchronize();
      },
      "scatter_add_: index -7 at position [0,1] is out of range for dim 0 of size 2");
  EXPECT_CPF_ERROR(raw::cross_entropy(x, on_gpu(from_vector<int64_t>({1, -3}, {2}))).loss.item<float>(),
                   "cross_entropy: target -3 at row 1 is out of range for C=2 classes (expected 0..1 or "
                   "ignore_index=-100)");
  // ignore_index is not an error.
  EXPECT_NO_THROW(raw::cross_entropy(x, on_gpu(from_vector<int64_t>({1, -100}, {2}))).loss.item<float>());
}

TEST_F(CudaDeviceErrorsTest, TheFirstFailingCheckIsReported) {
  Tensor weight = on_gpu(zeros({4, 8}));
  (void)raw::embedding(weight, on_gpu(from_vector<int64_t>({7}, {1})));
  (void)raw::embedding(weight, on_gpu(from_vector<int64_t>({0, 8}, {2})));
  EXPECT_CPF_ERROR(cuda::synchronize(), "embedding: id 7 at position [0] of ids [1]");
}

TEST_F(CudaDeviceErrorsTest, SyncDebugModeRaisesInTheLaunchingOp) {
  cuda::set_sync_debug(true);
  EXPECT_TRUE(cuda::sync_debug());
  Tensor weight = on_gpu(zeros({4, 8}));
  // The error comes out of embedding itself, not a later synchronisation.
  EXPECT_CPF_ERROR((void)raw::embedding(weight, on_gpu(from_vector<int64_t>({1, 4}, {2}))),
                   "embedding: id 4 at position [1] of ids [2] is out of range");
  // Ordinary work runs (and is synchronised after each launch).
  EXPECT_EQ(on_cpu(raw::add(weight, weight)).to_vector<float>(), std::vector<float>(32, 0.0f));
  cuda::set_sync_debug(false);
  EXPECT_FALSE(cuda::sync_debug());
  Tensor out;
  ASSERT_NO_THROW(out = raw::embedding(weight, on_gpu(from_vector<int64_t>({1, 4}, {2}))));
  EXPECT_CPF_ERROR(cuda::synchronize(), "embedding: id 4 at position [1]");
}

// A block freed while another stream still has queued work on it must not be handed out before that
// work is done. Stream 2 runs a long chain of matmuls, then writes 7 into `a`; `a` is released right
// away (record_stream marks it as used on stream 2) and an allocation of the same size on the
// allocating stream is filled with 1. If it got a's block before stream 2 was done, stream 2's late
// write would leave 7s in it.
TEST_F(CudaDeviceErrorsTest, RecordStreamKeepsABlockUntilTheOtherStreamIsDone) {
  cuda::Stream s1 = cuda::Stream::create(), s2 = cuda::Stream::create();
  cuda::StreamGuard g1(s1);
  const int64_t n = int64_t(1) << 20;
  Tensor big = on_gpu(testing::random_cpu({4096, 4096}, DType::f32, 3));
  Tensor a = empty({n}, {.device = Device::cuda(0)});
  void* a_ptr = a.raw_data();
  s1.synchronize();  // a and big exist before stream 2 uses them
  {
    cuda::StreamGuard g2(s2);
    Tensor acc = big;
    for (int i = 0; i < 10; ++i) acc = raw::matmul(acc, big);  // ~30 ms of queued work (exact f32)
    raw::fill_(a, 7.0);
    cuda::record_stream(a, s2);
    cuda::record_stream(big, s2);
  }
  a = Tensor();  // released while stream 2 may still be working: the block waits for it
  Tensor b = empty({n}, {.device = Device::cuda(0)});
  const bool reused_early = b.raw_data() == a_ptr;
  raw::fill_(b, 1.0);
  s2.synchronize();
  s1.synchronize();
  const std::vector<float> got = on_cpu(b).to_vector<float>();
  int64_t sevens = 0;
  for (float v : got) sevens += v == 7.0f;
  EXPECT_EQ(sevens, 0) << "stream 2's write landed in a block handed out again on stream 1 (block reused "
                       << (reused_early ? "at once" : "later") << ")";
  // Once stream 2 is done the block is reused (no new cudaMalloc for the same size).
  b = Tensor();
  const auto before = cuda::memory_stats();
  Tensor c = empty({n}, {.device = Device::cuda(0)});
  Tensor d = empty({n}, {.device = Device::cuda(0)});
  EXPECT_EQ(cuda::memory_stats().device_mallocs, before.device_mallocs);
}

TEST_F(CudaDeviceErrorsTest, RecordStreamRejectsOtherDevicesAndUndefinedTensors) {
  cuda::Stream s = cuda::Stream::create();
  EXPECT_CPF_ERROR(cuda::record_stream(Tensor(), s), "record_stream: the tensor is undefined");
  EXPECT_CPF_ERROR(cuda::record_stream(zeros({2}), s),
                   "record_stream: the tensor is on cpu but the stream belongs to cuda:0");
  // Marking for the allocating stream, twice, or an empty tensor is harmless.
  Tensor t = on_gpu(ones({4}));
  EXPECT_NO_THROW(cuda::record_stream(t, cuda::current_stream()));
  EXPECT_NO_THROW(cuda::record_stream(t, s));
  EXPECT_NO_THROW(cuda::record_stream(t, s));
  EXPECT_NO_THROW(cuda::record_stream(on_gpu(zeros({0})), s));
}

}  // namespace
}  // namespace cpf
