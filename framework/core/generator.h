#pragma once
// A random stream: a seed plus an offset that advances by the number of elements drawn. Reserving
// a range is atomic, so rank threads can share a generator; results depend only on (seed, offset).
#include <atomic>
#include <cstdint>

namespace cpf {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0x5eed) : seed_(seed), offset_(0) {}
  uint64_t seed() const noexcept { return seed_; }
  uint64_t offset() const noexcept { return offset_.load(); }
  void set_state(uint64_t seed, uint64_t offset) noexcept {
    seed_ = seed;
    offset_.store(offset);
  }
  // Reserves `count` elements and returns the offset of the first.
  uint64_t reserve(uint64_t count) noexcept { return offset_.fetch_add(count); }

 private:
  uint64_t seed_;
  std::atomic<uint64_t> offset_;
};

// The process-wide default generator (used when a creation function gets no generator).
Generator& default_generator();
void manual_seed(uint64_t seed);

}  // namespace cpf
