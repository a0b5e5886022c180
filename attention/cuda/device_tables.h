#pragma once
// The small host tables a cuDNN attention call needs on the device (per-sequence lengths and ragged
// offsets, padding masks, Stats row indices), uploaded once and reused while the same contents come
// back: every layer of a batch, forward and backward, presents the same tables, and batches of static
// shapes present the same ones every step. Without it each call made up to six host->device copies
// from pageable memory, each of which may make the host wait for the device.
//
// The cache is per host thread (rank threads run on their own streams) and keyed by device, the current
// stream (a table is only ever read on the stream it was uploaded on), dtype,
// shape and the bytes themselves; it keeps the most recently used kMaxEntries tables (evicted tables
// are released stream-ordered, like any tensor). Device tables are never written: sharing is safe.
#include "framework/tensor/tensor.h"

namespace cpf::attention_cuda {

inline constexpr size_t kDeviceTableMaxEntries = 64;

// `host` (a contiguous CPU tensor) on `device`: a cached copy when one with the same contents exists.
Tensor device_table(const Tensor& host, Device device);

// Tables this thread uploaded / served from its cache since it started (for tests).
struct DeviceTableStats {
  uint64_t uploads = 0, hits = 0;
};
DeviceTableStats device_table_stats();

}  // namespace cpf::attention_cuda
