#pragma once
// The two sides of TcpRendezvous::join's handshake: rank 0 seating the ranks (host_join), and any
// other rank reaching rank 0 (peer_join). Internal to the rendezvous.
#include <functional>
#include <string>
#include <vector>

#include "framework/distributed/rendezvous_tcp.h"
#include "framework/distributed/rendezvous_tcp_wire.h"

namespace cpf::dist::rdzv {

// Bounds on what a peer may send or hold during the join.
constexpr size_t kMaxHelloLine = 256;         // a HELLO is about 125 bytes
constexpr size_t kMaxAnswerLine = 16 * 1024;  // rank 0's ERR names ranks; OK is short
constexpr size_t kMaxPayload = 4096;          // an ncclUniqueId is 128 bytes
constexpr size_t kMaxPending = 64;            // connections accepted but not yet seated
// A connection must say hello within timeout / 3, between 1 and 10 s of its challenge (a real rank
// answers at once).
constexpr std::chrono::seconds kMaxPendingTime{10};
constexpr const char* kProtocol = "cpf-rendezvous-v1";

struct JoinSetup {
  const RendezvousOptions& options;
  std::string where;  // "rendezvous on node0:29500", the start of every message
  Clock::time_point deadline;
  std::vector<Endpoint> endpoints;  // rank 0: where to listen; others: where rank 0 is
  std::function<void(const std::string&)> log;
};

// Rank 0: the connection of every rank (index = rank; -1 for rank 0), each rank authenticated and
// holding the payload. Throws naming what failed, after telling every rank that is connected.
std::vector<int> host_join(const JoinSetup& setup);

// Any other rank: the connection to rank 0; `payload` gets rank 0's payload, `leftover` what rank 0
// sent after it (the liveness channel's first bytes).
int peer_join(const JoinSetup& setup, std::string& payload, std::string& leftover);

}  // namespace cpf::dist::rdzv
