#include "apps/trainer/step/sync_check.h"

#if CPF_HAVE_CUDA
#include "framework/tensor/cuda/cuda.h"
#endif

namespace cpf::trainer {

#if CPF_HAVE_CUDA
namespace {

cuda::HostSyncCounts from_array(const uint64_t (&c)[5]) {
  return cuda::HostSyncCounts{
      .device_to_host = c[0], .upload_waits = c[1], .stream_syncs = c[2], .device_syncs = c[3], .device_mallocs = c[4]};
}

}  // namespace

SyncCheck::SyncCheck(Device device) : on_(device.is_cuda() && cuda::sync_check_enabled()) {
  if (!on_) return;
  const cuda::HostSyncCounts c = cuda::host_sync_counts();
  const uint64_t values[5] = {c.device_to_host, c.upload_waits, c.stream_syncs, c.device_syncs, c.device_mallocs};
  for (int i = 0; i < 5; ++i) counts_[i] = values[i];
}

std::optional<std::string> SyncCheck::line(int64_t step) const {
  if (!on_) return std::nullopt;
  return "step " + std::to_string(step) + ": host synchronisations " +
         cuda::to_string(cuda::host_sync_counts() - from_array(counts_));
}
#else
SyncCheck::SyncCheck(Device) {}
std::optional<std::string> SyncCheck::line(int64_t) const { return std::nullopt; }
#endif

}  // namespace cpf::trainer
