#pragma once
// A phase that can fail on one rank while the others succeed (writing or reading that rank's share of a
// checkpoint), made collective: every rank learns whether any rank failed before it goes on, so no rank
// is left waiting in the next collective for one that threw alone.
#include <functional>
#include <string>

#include "framework/distributed/process_group.h"

namespace cpf::trainer {

// Runs `phase` on this rank (when `mine`), then all-reduces a failure flag over `group` (on `device`).
// Where the phase threw, that rank throws its own message; every other rank throws Error(`elsewhere`),
// which should name the phase and say that another rank's log names why. Returns when no rank failed.
void run_collective_phase(dist::ProcessGroup& group, Device device, bool mine, const std::function<void()>& phase,
                          const std::string& elsewhere);

}  // namespace cpf::trainer
