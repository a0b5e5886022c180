#pragma once
// Rendezvous of the thread backend: how the ranks of a group meet for one collective.
//
// The k-th collective a rank issues on a group is step k of that group. For each step:
//   1. arrive:  each rank posts a Slot (what it called, its tensors); the last to arrive checks that
//               the slots agree (same operation, dtype, shapes, parameters) and records either an
//               error, which every rank then throws, or a payload shared by all ranks;
//   2. compute: each rank does its share of the data movement, reading the other ranks' slots;
//   3. finish:  each rank marks its share done and waits for all shares, because the others read
//               its input and may write its output. The last to leave frees the step.
// Both waits are bounded by the group's timeout and end early when the world is aborted.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "framework/distributed/thread/group_sync.h"
#include "framework/tensor/tensor.h"

namespace cpf::dist::thread {

// What one rank called, for the cross-rank checks.
struct OpDesc {
  std::string kind;  // "all_reduce", "new_group", ...
  DType dtype = DType::f32;
  Shape shape;                  // the input's
  std::vector<int64_t> params;  // op parameters that must agree: reduce op, dim, root, ...
  std::vector<int64_t> splits;  // reduce_scatter: explicit splits (empty: none)
  int64_t piece = 0;            // reduce_scatter: this rank's piece size along dim
  Shape out_shape;              // the given out's shape, when one was given
  std::vector<int> ranks;       // new_group
  std::string name;             // new_group
};

struct Slot {
  bool arrived = false;
  bool done = false;
  OpDesc desc;
  Tensor input;   // as the data movement reads it
  Tensor output;  // where the other ranks may write (all_reduce), or undefined
};

struct Round {
  explicit Round(int n) : slots(static_cast<size_t>(n)) {}
  std::vector<Slot> slots;
  int arrived = 0;
  int done = 0;
  int left = 0;
  std::string error;              // set by the last arrival when the slots disagree
  std::shared_ptr<void> payload;  // set by the last arrival: offsets, a new group's state, ...
};

// Checks the arrived slots (called once, by the last rank to arrive, under the group's mutex).
// Returns an error message, or "" and may set round.payload.
using Validator = std::function<std::string(Round& round)>;

class Rendezvous {
 public:
  explicit Rendezvous(GroupSync& sync) : sync_(sync) {}

  // Posts `slot` for step `seq` and waits for every rank. Throws the round's error on every rank when
  // the slots disagree. The returned round's slots are read-only until finish().
  std::shared_ptr<Round> arrive(uint64_t seq, int rank, Slot slot, const Validator& validate, const std::string& what);
  // Marks this rank's share done and waits until every rank's is; the last rank frees the step.
  void finish(uint64_t seq, const std::shared_ptr<Round>& round, int rank, const std::string& what);

 private:
  GroupSync& sync_;
  std::map<uint64_t, std::shared_ptr<Round>> rounds_;  // guarded by sync_.mutex()
};

// Error text for slots whose field differs from rank 0's ("" when all agree). `field` names the
// thing compared in the message ("shape", "dtype", ...).
template <class Get>
std::string first_disagreement(const Round& round, const char* field, Get&& get) {
  const auto& first = get(round.slots[0].desc);
  for (size_t r = 1; r < round.slots.size(); ++r) {
    const auto& other = get(round.slots[r].desc);
    if (!(other == first)) {
      return str_cat("ranks disagree on the ", field, ": rank 0 has ", first, ", rank ", r, " has ", other);
    }
  }
  return "";
}

}  // namespace cpf::dist::thread
