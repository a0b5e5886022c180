#pragma once
// TcpRendezvous: how the processes of one world meet before NCCL can connect them, and how they
// learn that one of them died.
//
//   // every rank (one process each):
//   auto rv = TcpRendezvous::join({.host = "node0", .port = 29500, .rank = r, .world_size = n,
//                                  .payload = r == 0 ? unique_id_bytes : ""});
//   std::string id = rv->payload();   // rank 0's payload, on every rank
//
// Rank 0 listens on `port` (all interfaces); every other rank connects to host:port (retrying until
// rank 0 is up) and says hello with its rank. Once all world_size - 1 ranks said hello, rank 0 sends
// its payload to each. If they do not all arrive within the timeout, every rank fails with a
// message naming the ranks that never arrived; a rank that cannot reach rank 0 names host:port.
//
// Afterwards the connections stay open as a liveness channel (watch()): a process that ends without
// destroying its TcpRendezvous (a crash, a kill, an uncaught exception) closes its socket without
// saying goodbye; rank 0 notices, tells the others, and every rank's callback gets the dead rank.
// Destroying the rendezvous says goodbye, so ranks that finish at different times are not blamed.
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace cpf::dist {

struct RendezvousOptions {
  std::string host = "127.0.0.1";  // rank 0's address (MASTER_ADDR), for the other ranks
  int port = 0;                    // MASTER_PORT
  int rank = 0;
  int world_size = 1;
  std::string payload;  // rank 0's: delivered to every rank (e.g. the ncclUniqueId bytes)
  std::chrono::milliseconds timeout = std::chrono::seconds(300);
};

class TcpRendezvous {
 public:
  // Collective over world_size processes (or threads); blocks until every rank has rank 0's payload.
  static std::unique_ptr<TcpRendezvous> join(const RendezvousOptions& options);
  ~TcpRendezvous();  // says goodbye to the peers, stops watching, closes the sockets
  TcpRendezvous(const TcpRendezvous&) = delete;
  TcpRendezvous& operator=(const TcpRendezvous&) = delete;

  const std::string& payload() const { return payload_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }

  // Starts a thread that calls on_failure(rank, reason) once when a peer's process ends without
  // saying goodbye (rank 0 relays what it sees to the others). Call at most once.
  void watch(std::function<void(int rank, const std::string& reason)> on_failure);

 private:
  TcpRendezvous(int rank, int world_size);
  void watch_loop();

  const int rank_;
  const int world_size_;
  std::string payload_;
  // On rank 0: the socket of each rank (index = rank; -1 for rank 0 and for ranks gone); elsewhere
  // peers_[0] is the connection to rank 0.
  std::vector<int> peers_;
  std::vector<bool> said_goodbye_;
  int stop_pipe_[2] = {-1, -1};
  std::function<void(int, const std::string&)> on_failure_;
  std::thread watcher_;
};

// A TCP port that was free a moment ago on this host (the kernel picks it); for tests and local launches.
int find_free_port();

}  // namespace cpf::dist
