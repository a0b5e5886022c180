#pragma once
// TcpRendezvous: how the processes of one world meet before NCCL can connect them, and how they
// learn that one of them died.
//
//   // every rank (one process each):
//   auto rv = TcpRendezvous::join({.host = "node0", .port = 29500, .rank = r, .world_size = n,
//                                  .payload = r == 0 ? unique_id_bytes : "", .token = job_secret});
//   std::string id = rv->payload();   // rank 0's payload, on every rank
//
// Rank 0 listens on `port` of the address `host` resolves to (or of `bind`; "0.0.0.0", "::" or "*"
// for every interface); every other rank connects to host:port (retrying until rank 0 is up) and
// says hello with its rank, proving that it holds the job's `token` (HMAC over fresh nonces of both
// ends, rendezvous_tcp_auth.h); rank 0's answer proves the token in turn. Once all world_size - 1
// ranks said hello, rank 0 sends its payload to each. A connection that does not speak the protocol
// or fails the proof is closed and logged, and the join goes on; ranks that prove the token but
// disagree (world size, a rank twice) fail every rank at once, naming both. If the ranks do not all
// arrive within the timeout, every rank fails naming the ranks that never arrived; a rank that
// cannot reach rank 0 names host:port. The token may be empty only where every address involved is
// loopback (a single-host job); see docs/distributed.md for the trust model.
//
// Afterwards the connections stay open as a liveness channel (watch()): a process that ends without
// destroying its TcpRendezvous (a crash, a kill) closes its socket without saying goodbye; rank 0
// notices, tells the others, and every rank's callback gets the dead rank. A process that fails
// with an error says so instead of goodbye: report_failure(reason) (or report_failure_to_peers()
// from a catch that knows the message), or by itself when the rendezvous is destroyed while an
// exception propagates (the message is not visible there). Rank 0 relays it like a death, so the
// peers stop at once, naming the rank and the reason, instead of waiting for their op timeout.
// Destroying the rendezvous normally says goodbye, so ranks that finish at different times are not
// blamed. Watching ranks exchange heartbeats: a peer silent for heartbeat_timeout (a host that
// vanished without closing its connections, a stopped process) is reported like a death.
//
// Wire (one line each, all ranks run the same binary): CHALLENGE v nonce (rank 0, on accept) /
// HELLO r n nonce mac / OK size mac + payload, or ERR text, during join; afterwards BYE (clean end),
// PING (heartbeat), FAIL reason (rank r to rank 0), DEAD r and FAILED r reason (rank 0 to the
// others). Every read and write is bounded in time and size (rendezvous_tcp_wire.h), so no peer can
// hang or exhaust a rank. A failing rank closes without BYE, so a peer that missed the FAIL line
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
  std::string host = "127.0.0.1";  // rank 0's address (MASTER_ADDR, IPv4 or IPv6), for every rank
  int port = 0;                    // MASTER_PORT
  int rank = 0;
  int world_size = 1;
  std::string payload;  // rank 0's: delivered to every rank (e.g. the ncclUniqueId bytes); at most 4096 bytes
  std::chrono::milliseconds timeout = std::chrono::seconds(300);
  // The job's shared secret (CPF_RENDEZVOUS_TOKEN), at least 16 characters; the same on every rank.
  // Empty only when every address involved is loopback.
  std::string token{};
  // Where rank 0 listens (CPF_RENDEZVOUS_BIND): empty for `host`'s address; "0.0.0.0", "::" or "*" for
  // every interface (IPv4, IPv6, both).
  std::string bind{};
  // Watching ranks send a heartbeat this often, and report a peer silent for heartbeat_timeout.
  std::chrono::milliseconds heartbeat_interval = std::chrono::seconds(5);
  std::chrono::milliseconds heartbeat_timeout = std::chrono::seconds(60);
  // Where rank 0 tells about connections it closed during the join (garbage, failed proofs); default
  // cpf::log_warn.
  std::function<void(const std::string& message)> log = nullptr;
};

// A fresh random token (32 hex digits, 128 bits) for a launcher to give every rank of one job.
std::string generate_rendezvous_token();

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
  // on that thread, so it must be quick and thread-safe (e.g. abort the NCCL world). Call at most once,
  // on every rank, soon after join(): the thread also sends the heartbeat the peers expect, and names
  // a peer silent for heartbeat_timeout (its process stopped, or its host vanished).
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
  // One line from rank r's connection; true when the watcher has reported and stops.
  bool handle_line(int r, const std::string& line);
  // Rank r is gone or failing: rank 0 tells the others (`relay`: the line), then the callback.
  void peer_lost(int r, const std::string& reason, const std::string& relay);
  // Sends PING when it is due; false (after reporting) when a peer did not take it.
  bool send_heartbeat(std::chrono::steady_clock::time_point& next);
  // Sends this rank's failure notice once: FAIL to rank 0, or (on rank 0) FAILED 0 to every rank.
  void send_failure(const std::string& reason);
  // `line` to every rank whose connection is still open, except `except_rank`, each send bounded
  // (a peer that does not drain is skipped); takes send_mutex_. Returns the ranks it could not reach.
  std::vector<int> send_to_open_peers(const std::string& line, int except_rank);

  const int rank_;
  const int world_size_;
  std::string payload_;
  // On rank 0: the socket of each rank (index = rank; -1 for rank 0 and for ranks gone); elsewhere
  // peers_[0] is the connection to rank 0. Non-blocking sockets.
  std::vector<int> peers_;
  std::vector<bool> said_goodbye_;
  std::string leftover_;  // bytes rank 0 sent after the payload, read by the join (not rank 0)
  std::chrono::milliseconds heartbeat_interval_{0};
  std::chrono::milliseconds heartbeat_timeout_{0};
  int stop_pipe_[2] = {-1, -1};
  std::function<void(int, const std::string&)> on_failure_;
  std::thread watcher_;
  // Exceptions propagating on the thread that built this: more at destruction means it is unwound.
  const int uncaught_at_construction_;
  bool joined_ = false;              // join() returned it (a join that throws is not a member's failure)
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
