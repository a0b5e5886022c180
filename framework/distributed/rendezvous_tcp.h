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
// destroying its TcpRendezvous (a crash, a kill) closes its socket without saying goodbye; rank 0
// notices, tells the others, and every rank's callback gets the dead rank. A process that fails
// with an error says so instead of goodbye: report_failure(reason) (or report_failure_to_peers()
// from a catch that knows the message), or by itself when the rendezvous is destroyed while an
// exception propagates (the message is not visible there). Rank 0 relays it like a death, so the
// peers stop at once, naming the rank and the reason, instead of waiting for their op timeout.
// Destroying the rendezvous normally says goodbye, so ranks that finish at different times are not
// blamed.
//
// Wire (one line each, all ranks run the same binary): HELLO r n / OK size + payload / ERR text
// during join; BYE (clean end), FAIL reason (rank r to rank 0), DEAD r and FAILED r reason (rank 0
// to the others) afterwards. A failing rank closes without BYE, so a peer that missed the FAIL line
// still sees a death.
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
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

  // Starts a thread that calls on_failure(rank, reason) once, for the first peer whose process ends
  // without saying goodbye or reports its failure (rank 0 relays what it sees to the others). Runs
  // on that thread, so it must be quick and thread-safe (e.g. abort the NCCL world). Call at most once.
  void watch(std::function<void(int rank, const std::string& reason)> on_failure);

  // Tells the peers that this process is failing (their callbacks get this rank and "its process
  // reported: <reason>"; newlines become spaces), before anything is torn down: call it where the
  // error is caught while the world still exists. Afterwards this rank's own callback stays quiet
  // (the peers' reactions are not news) and destroying the rendezvous sends no goodbye. Only the
  // first call sends; callable from any thread, with or without watch().
  void report_failure(const std::string& reason);

 private:
  TcpRendezvous(int rank, int world_size);
  void watch_loop();
  // Sends this rank's failure notice once: FAIL to rank 0, or (on rank 0) FAILED 0 to every rank.
  void send_failure(const std::string& reason);
  // `line` to every rank whose connection is still open, except `except_rank`; takes send_mutex_.
  void send_to_open_peers(const std::string& line, int except_rank);

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
  // Exceptions propagating on the thread that built this: more at destruction means it is unwound.
  const int uncaught_at_construction_;
  bool joined_ = false;  // join() returned it (a join that throws is not a member's failure)
  std::atomic<bool> failed_{false};  // this process sent its failure notice
  // Serialises sends from report_failure() and the watcher, and the watcher's closing of peers_.
  std::mutex send_mutex_;
};

// report_failure(reason) on every TcpRendezvous alive in this process (normally the world group's);
// returns how many. For an error handler that cannot reach the rendezvous, e.g.
//   try { run(ctx); } catch (const std::exception& e) { dist::report_failure_to_peers(e.what()); throw; }
int report_failure_to_peers(const std::string& reason);

// A TCP port that was free a moment ago on this host (the kernel picks it); for tests and local launches.
int find_free_port();

}  // namespace cpf::dist
