#include "attention/cuda/device_tables.h"

#include <cstring>
#include <list>
#include <string>
#include <unordered_map>

#include "framework/tensor/device_stream.h"
#include "framework/tensor/ops/copy.h"

namespace cpf::attention_cuda {
namespace {

struct Cache {
  std::list<std::pair<std::string, Tensor>> entries;  // most recently used first
  std::unordered_map<std::string, std::list<std::pair<std::string, Tensor>>::iterator> index;
  DeviceTableStats stats;
};

Cache& thread_cache() {
  thread_local Cache cache;
  return cache;
}

// Device, stream, dtype and shape, then the bytes: equal keys are equal tables. The stream is part of
// the key because a table is uploaded (and, once evicted, freed) in the order of the stream current at
// its upload: served to work on another stream (the CP ring's side stream) it could be read before its
// copy landed, or after its memory went back to the allocator. So each stream gets its own copy.
std::string key_of(const Tensor& host, Device device) {
  const auto stream = reinterpret_cast<uintptr_t>(DeviceStream::current(device).handle());
  std::string key = std::to_string(static_cast<int>(device.type)) + ":" + std::to_string(device.index) + ":" +
                    std::to_string(stream) + ":" + std::to_string(static_cast<int>(host.dtype()));
  for (int64_t d : host.shape()) {
    key += ',';  // (not "," + to_string: GCC 12 warns of a false -Wrestrict overlap there)
    key += std::to_string(d);
  }
  key += "|";
  const size_t bytes = static_cast<size_t>(host.numel()) * dtype_size(host.dtype());
  const size_t at = key.size();
  key.resize(at + bytes);
  if (bytes > 0) std::memcpy(key.data() + at, host.raw_data(), bytes);
  return key;
}

}  // namespace

Tensor device_table(const Tensor& host, Device device) {
  CPF_CHECK(host.device().is_cpu() && host.is_contiguous(),
            "device_table: the table must be a contiguous CPU tensor, got one on ", host.device(),
            host.is_contiguous() ? "" : " (not contiguous)");
  Cache& cache = thread_cache();
  std::string key = key_of(host, device);
  if (auto it = cache.index.find(key); it != cache.index.end()) {
    cache.entries.splice(cache.entries.begin(), cache.entries, it->second);
    ++cache.stats.hits;
    return it->second->second;
  }
  Tensor table = raw::to(host, device);
  ++cache.stats.uploads;
  cache.entries.emplace_front(std::move(key), table);
  cache.index[cache.entries.front().first] = cache.entries.begin();
  if (cache.entries.size() > kDeviceTableMaxEntries) {
    cache.index.erase(cache.entries.back().first);
    cache.entries.pop_back();
  }
  return table;
}

DeviceTableStats device_table_stats() { return thread_cache().stats; }

}  // namespace cpf::attention_cuda
