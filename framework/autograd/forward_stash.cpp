#include "framework/autograd/forward_stash.h"

#include "framework/core/error.h"

namespace cpf::autograd {
namespace {
thread_local ForwardStash* active_stash = nullptr;
}  // namespace

void ForwardStash::keep(const std::string& op, const std::vector<Tensor>& values) {
  CPF_CHECK(phase_ == Phase::keep, "recompute: '", op, "' tried to keep values while the region replays");
  Entry entry{op, {}, {}};
  for (const Tensor& t : values) {
    // Detached: the stash must not hold the first run's graph (that is what recomputation frees).
    entry.values.push_back(t.defined() ? t.detach() : Tensor());
    entry.versions.push_back(t.defined() ? t.version() : 0);
  }
  entries_.push_back(std::move(entry));
}

std::vector<Tensor> ForwardStash::take(const std::string& op) {
  CPF_CHECK(phase_ == Phase::replay, "recompute: '", op, "' tried to take kept values outside a replay");
  CPF_CHECK(next_ < entries_.size(), "recompute: the recomputed region calls '", op, "' after the ", entries_.size(),
            " kept op(s) of its first forward ran out: the region must run the same ops on recompute");
  Entry& entry = entries_[next_];
  CPF_CHECK(entry.op == op, "recompute: op ", next_, " of the region was '", entry.op,
            "' in the first forward but is '", op,
            "' on recompute: the region must run the same ops in the same order");
  for (size_t i = 0; i < entry.values.size(); ++i) {
    const Tensor& t = entry.values[i];
    CPF_CHECK(!t.defined() || t.version() == entry.versions[i], "recompute: output ", i, " of '", op, "' (shape ",
              t.shape(), ") was modified in place after the first forward kept it (version ", t.version(), ", kept at ",
              entry.versions[i], ")");
  }
  ++next_;
  return std::move(entry.values);  // the entry no longer holds them: freed as the backward goes on
}

void ForwardStash::start_replay() {
  phase_ = Phase::replay;
  next_ = 0;
}

void ForwardStash::check_consumed(const std::string& region) const {
  CPF_CHECK(next_ == entries_.size(), "recompute: the recompute of '", region, "' used ", next_, " of the ",
            entries_.size(), " ops its first forward kept (next: '",
            next_ < entries_.size() ? entries_[next_].op : std::string(), "'): the region must run the same ops");
}

size_t ForwardStash::bytes() const {
  size_t total = 0;
  for (size_t e = next_; e < entries_.size(); ++e) {
    for (const Tensor& t : entries_[e].values) {
      if (t.defined()) total += static_cast<size_t>(t.numel()) * dtype_size(t.dtype());
    }
  }
  return total;
}

ForwardStash* active_forward_stash() { return active_stash; }

ForwardStashScope::ForwardStashScope(ForwardStash* stash) : previous_(active_stash) { active_stash = stash; }
ForwardStashScope::~ForwardStashScope() { active_stash = previous_; }

}  // namespace cpf::autograd
