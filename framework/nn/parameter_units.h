#pragma once
// Parameters that are not always resident: a model whose parameters are sharded over ranks (ZeRO-3,
// framework/distributed/zero_shards.h) holds each parameter whole only between acquire and release of
// the unit it belongs to, and calls these around every use.
//
//   units->acquire(i, i + 1);   // block i's parameters whole (waits for its gather); starts block i+1's
//   ... block i's forward ...
//   units->release(i);          // back to this rank's shard: the whole values are freed
//
// A unit is a group of parameters used together (a transformer block; the model's "root": embeddings,
// final norm, head). Every rank calls the same acquire/release sequence (they are collectives); the
// prefetch hint names the unit the caller acquires next, so its gather overlaps the current unit's work.
// Reading a parameter outside its unit's acquire/release fails: its storage is released
// (Tensor::raw_data throws), never a silently stale value.
#include <cstddef>
#include <optional>

namespace cpf::nn {

class ParameterUnits {
 public:
  virtual ~ParameterUnits() = default;
  // Unit `unit`'s parameters hold their whole current values until release(unit); with `next`, that
  // unit's gather starts now (overlapping the caller's work). Acquiring a held unit is a no-op.
  virtual void acquire(size_t unit, std::optional<size_t> next) const = 0;
  // Frees unit `unit`'s whole values (a no-op when not held).
  virtual void release(size_t unit) const = 0;
};

}  // namespace cpf::nn
