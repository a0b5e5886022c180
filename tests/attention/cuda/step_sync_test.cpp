// Host synchronisations inside a training step on the GPU, counted by the CUDA backend
// (cuda::host_sync_counts(), framework/tensor/cuda/cuda.h). Once warm (the allocator's cache, cuDNN's
// plans and the attention tables of the batch exist), the forward and backward of a GPT on a batch
// already on the device must not make the host wait: no device->host copy (the embedding gradient
// sorts its ids on the device), no upload that waits (attention's sequence tables come from
// attention/cuda/device_tables.h, uploads go through pinned memory), no cudaMalloc. A failure prints
// the counts by kind.
#include <gtest/gtest.h>

#include "attention/cuda/device_tables.h"
#include "framework/autograd/ops.h"
#include "framework/tensor/cuda/cuda.h"
#include "models/data/cp_shard.h"
#include "models/gpt.h"
#include "models/gpt_input.h"
#include "tests/tensor/cuda/cuda_test_utils.h"

namespace cpf::models {
namespace {

class StepSyncTest : public testing::CudaTest {};

// Four documents of 64 tokens: thd (RoPE) packed back to back, or bshd rows of 128 (learned positions).
GPTBatch device_batch(models::data::Layout layout) {
  models::data::Batch batch;
  batch.layout = layout;
  std::vector<int64_t> tokens(256), labels(256), positions(256);
  for (int64_t i = 0; i < 256; ++i) {
    tokens[static_cast<size_t>(i)] = (i * 37 + 5) % 97;
    labels[static_cast<size_t>(i)] = i % 64 == 63 ? -100 : (i * 37 + 42) % 97;
    positions[static_cast<size_t>(i)] = i % (layout == models::data::Layout::bshd ? 128 : 64);
  }
  const Shape shape = layout == models::data::Layout::bshd ? Shape{2, 128} : Shape{256};
  batch.tokens = from_vector(tokens, shape);
  batch.labels = from_vector(labels, shape);
  batch.positions = from_vector(positions, shape);
  if (layout == models::data::Layout::thd) batch.cu_seqlens = batch.cu_seqlens_padded = {0, 64, 128, 192, 256};
  batch.num_valid_labels = 252;
  return to_device(make_gpt_batch(models::data::shard_for_rank(batch, 1, 0)), Device::cuda(0));
}

GPTOptions options(PositionType positions, std::optional<DType> compute) {
  GPTOptions o;
  o.vocab_size = 97;
  o.hidden_size = 64;
  o.num_layers = 2;
  o.num_heads = 4;
  o.positions = positions;
  o.max_positions = 128;
  o.compute_dtype = compute;
  return o;
}

// The counts of one forward + loss + backward after two warm-up iterations on the same batch.
cuda::HostSyncCounts warm_step_syncs(const GPTOptions& o, const GPTBatch& b) {
  GPT model(o);
  model.to(Device::cuda(0));
  auto step = [&] {
    const Tensor logits = model.forward(b.input);  // (T, V)
    backward(GPT::loss(logits, b.labels, b.num_valid_labels, b.num_valid_labels));
  };
  step();
  step();
  cuda::synchronize();
  const cuda::HostSyncCounts before = cuda::host_sync_counts();
  step();
  const cuda::HostSyncCounts during = cuda::host_sync_counts() - before;
  cuda::synchronize();  // reports a device-side error of the step, if any
  return during;
}

TEST_F(StepSyncTest, WarmForwardAndBackwardDoNotWaitForTheDevice) {
  struct Case {
    const char* name;
    PositionType positions;
    std::optional<DType> compute;
    models::data::Layout layout;
  };
  for (const Case& c :
       {Case{"learned bshd f32 (unfused attention)", PositionType::learned, std::nullopt, models::data::Layout::bshd},
        Case{"rope thd bf16 (cuDNN)", PositionType::rope, DType::bf16, models::data::Layout::thd}}) {
    const cuda::HostSyncCounts n = warm_step_syncs(options(c.positions, c.compute), device_batch(c.layout));
    EXPECT_EQ(n.total(), 0u) << c.name << ": " << cuda::to_string(n);
  }
}

TEST_F(StepSyncTest, TheCounterSeesEachKindOfSynchronisation) {
  // The counter itself: a read-back, a stream and a device synchronisation each count; a small upload
  // goes through the pinned ring and does not wait.
  const Tensor x = testing::on_gpu(from_vector<float>({1, 2, 3}, {3}));
  const cuda::HostSyncCounts before = cuda::host_sync_counts();
  (void)x.to_vector<float>();
  (void)testing::on_gpu(from_vector<float>({4}, {1}));
  cuda::current_stream().synchronize();
  cuda::synchronize();
  const cuda::HostSyncCounts n = cuda::host_sync_counts() - before;
  EXPECT_EQ(n.device_to_host, 1u) << cuda::to_string(n);
  EXPECT_EQ(n.upload_waits, 0u) << cuda::to_string(n);
  EXPECT_EQ(n.stream_syncs, 1u) << cuda::to_string(n);
  EXPECT_EQ(n.device_syncs, 1u) << cuda::to_string(n);
}

}  // namespace
}  // namespace cpf::models
