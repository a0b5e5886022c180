// The host-synchronisation counters (host_sync.cuh, cuda.h): one relaxed atomic per kind, process-wide.
#include <array>
#include <atomic>
#include <cstdlib>
#include <string>

#include "framework/tensor/cuda/cuda.h"
#include "framework/tensor/cuda/host_sync.cuh"

namespace cpf::cuda {
namespace {

std::array<std::atomic<uint64_t>, 5> g_counts{};

}  // namespace

void count_host_sync(HostSyncKind kind) { g_counts[static_cast<size_t>(kind)].fetch_add(1, std::memory_order_relaxed); }

HostSyncCounts host_sync_counts() {
  const auto get = [](HostSyncKind k) { return g_counts[static_cast<size_t>(k)].load(std::memory_order_relaxed); };
  return HostSyncCounts{.device_to_host = get(HostSyncKind::device_to_host),
                        .upload_waits = get(HostSyncKind::upload_waits),
                        .stream_syncs = get(HostSyncKind::stream_sync),
                        .device_syncs = get(HostSyncKind::device_sync),
                        .device_mallocs = get(HostSyncKind::device_malloc)};
}

HostSyncCounts operator-(const HostSyncCounts& a, const HostSyncCounts& b) {
  return HostSyncCounts{.device_to_host = a.device_to_host - b.device_to_host,
                        .upload_waits = a.upload_waits - b.upload_waits,
                        .stream_syncs = a.stream_syncs - b.stream_syncs,
                        .device_syncs = a.device_syncs - b.device_syncs,
                        .device_mallocs = a.device_mallocs - b.device_mallocs};
}

std::string to_string(const HostSyncCounts& c) {
  return std::to_string(c.total()) + " (device->host copies " + std::to_string(c.device_to_host) +
         ", waits for upload room " + std::to_string(c.upload_waits) + ", stream syncs " +
         std::to_string(c.stream_syncs) + ", device syncs " + std::to_string(c.device_syncs) +
         ", cudaMalloc/cudaFree " + std::to_string(c.device_mallocs) + ")";
}

bool sync_check_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("CPF_SYNC_CHECK");
    return v != nullptr && std::string(v) != "" && std::string(v) != "0";
  }();
  return enabled;
}

}  // namespace cpf::cuda
