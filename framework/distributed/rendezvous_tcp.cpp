#include "framework/distributed/rendezvous_tcp.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>

#include "framework/core/error.h"
#include "framework/core/logging.h"
#include "framework/distributed/rendezvous_tcp_auth.h"
#include "framework/distributed/rendezvous_tcp_join.h"
#include "framework/distributed/rendezvous_tcp_wire.h"

namespace cpf::dist {
namespace {

using namespace std::chrono_literals;
using rdzv::Clock;
using rdzv::close_fd;

double seconds(std::chrono::milliseconds ms) { return static_cast<double>(ms.count()) / 1000.0; }

constexpr size_t kMaxReason = 1000;     // a failure reason, as sent
constexpr size_t kMaxWatchLine = 1200;  // FAILED r + a reason
// A send on the liveness channel; a peer whose socket cannot take a short line in this time has not
// read for a long while (stopped, or hung), and is not waited for.
constexpr auto kWatchSendTime = 2s;

// A reason fits on one protocol line: newlines become spaces, and it is kept short.
std::string one_line(std::string text) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  std::replace(text.begin(), text.end(), '\r', ' ');
  if (text.size() > kMaxReason) text = text.substr(0, kMaxReason) + "...";
  return text;
}

// The rendezvous alive in this process, for report_failure_to_peers().
std::mutex& registry_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::vector<TcpRendezvous*>& registry() {
  static std::vector<TcpRendezvous*> alive;
  return alive;
}

constexpr const char* kUnwindingReason =
    "its process left the world while an exception was propagating (that rank's log has the error)";
constexpr const char* kEndedReason =
    "its process ended without leaving the world (crashed or was killed): its rendezvous connection closed";

void validate(const RendezvousOptions& o) {
  CPF_CHECK(o.world_size >= 1, "rendezvous: world_size must be at least 1, got ", o.world_size);
  CPF_CHECK(o.rank >= 0 && o.rank < o.world_size, "rendezvous: rank ", o.rank, " is not in 0..", o.world_size - 1);
  CPF_CHECK(o.port >= 1 && o.port <= 65535, "rendezvous: port ", o.port, " is not a TCP port (1..65535)");
  CPF_CHECK(o.timeout.count() > 0, "rendezvous: the timeout must be positive");
  CPF_CHECK(o.payload.size() <= rdzv::kMaxPayload, "rendezvous: rank 0's payload has ", o.payload.size(),
            " bytes; at most ", rdzv::kMaxPayload, " are sent");
  CPF_CHECK(o.token.empty() || o.token.size() >= rdzv::kMinTokenLength, "rendezvous: CPF_RENDEZVOUS_TOKEN has ",
            o.token.size(), " characters; use at least ", rdzv::kMinTokenLength,
            " random ones (e.g. `openssl rand -hex 16`), the same on every rank");
  CPF_CHECK(!o.host.empty(), "rendezvous: the host of rank 0 (MASTER_ADDR) is empty");
  CPF_CHECK(o.heartbeat_interval.count() > 0 && o.heartbeat_timeout >= 2 * o.heartbeat_interval,
            "rendezvous: heartbeat_timeout (", seconds(o.heartbeat_timeout), " s) must be at least twice ",
            "heartbeat_interval (", seconds(o.heartbeat_interval), " s), which must be positive");
}

// Without a token anyone who reaches the port could take a seat: allowed only on loopback.
void require_token_off_loopback(const RendezvousOptions& o, const rdzv::JoinSetup& setup) {
  if (!o.token.empty()) return;
  for (const rdzv::Endpoint& e : setup.endpoints) {
    CPF_CHECK(e.loopback, setup.where, ": CPF_RENDEZVOUS_TOKEN is not set and ",
              o.rank == 0 ? "rank 0 would listen on " : "rank 0 is at ", e.text,
              ", which is not loopback: any process that reaches it could join the job. Export the same secret to ",
              "every rank (e.g. CPF_RENDEZVOUS_TOKEN=$(openssl rand -hex 16)); `cpformer` launches and ",
              "spawn_local_processes generate one");
  }
}

}  // namespace

std::string generate_rendezvous_token() { return rdzv::random_hex(16); }

TcpRendezvous::TcpRendezvous(int rank, int world_size)
    : rank_(rank),
      world_size_(world_size),
      peers_(static_cast<size_t>(world_size), -1),
      said_goodbye_(static_cast<size_t>(world_size), false),
      uncaught_at_construction_(std::uncaught_exceptions()) {}

std::unique_ptr<TcpRendezvous> TcpRendezvous::join(const RendezvousOptions& o) {
  validate(o);
  std::unique_ptr<TcpRendezvous> rv(new TcpRendezvous(o.rank, o.world_size));
  rv->heartbeat_interval_ = o.heartbeat_interval;
  rv->heartbeat_timeout_ = o.heartbeat_timeout;
  if (o.world_size == 1) {
    rv->payload_ = o.payload;
    return rv;
  }
  const std::string where = str_cat("rendezvous on ", o.host, ":", o.port);
  auto log = o.log ? o.log : [](const std::string& message) { log_warn(message); };
  const std::string& listen_host = o.rank == 0 && !o.bind.empty() ? o.bind : o.host;
  rdzv::JoinSetup setup{o, where, Clock::now() + o.timeout, rdzv::resolve(listen_host, o.port, where), log};
  require_token_off_loopback(o, setup);
  if (o.rank == 0) {
    rv->peers_ = rdzv::host_join(setup);
    rv->payload_ = o.payload;
  } else {
    rv->peers_[0] = rdzv::peer_join(setup, rv->payload_, rv->leftover_);
  }
  const auto within = std::chrono::duration_cast<std::chrono::seconds>(o.heartbeat_timeout);
  for (int fd : rv->peers_) {
    if (fd >= 0) rdzv::set_liveness_options(fd, std::max(within, std::chrono::seconds(3)));
  }
  rv->joined_ = true;
  std::lock_guard lock(registry_mutex());
  registry().push_back(rv.get());
  return rv;
}

void TcpRendezvous::watch(std::function<void(int, const std::string&)> on_failure) {
  CPF_CHECK(!watcher_.joinable(), "rendezvous: watch() was already called");
  if (world_size_ == 1) return;
  CPF_CHECK(::pipe2(stop_pipe_, O_CLOEXEC) == 0, "rendezvous: pipe2 failed: ", std::strerror(errno));
  on_failure_ = std::move(on_failure);
  watcher_ = std::thread([this] { watch_loop(); });
}

void TcpRendezvous::watch_loop() {
  std::vector<rdzv::LineReader> readers(peers_.size(), rdzv::LineReader(kMaxWatchLine));
  std::vector<Clock::time_point> heard(peers_.size(), Clock::now());
  if (rank_ != 0) {  // what rank 0 sent right after the payload, read by the join
    readers[0].append(leftover_);
    while (auto line = readers[0].next_line()) {
      if (handle_line(0, *line)) return;
    }
  }
  auto next_ping = Clock::now();
  while (true) {
    if (!send_heartbeat(next_ping)) return;
    std::vector<pollfd> polls{{stop_pipe_[0], POLLIN, 0}};
    std::vector<int> ranks;
    auto wake = next_ping;
    for (size_t r = 0; r < peers_.size(); ++r) {
      if (peers_[r] < 0) continue;
      if (Clock::now() - heard[r] > heartbeat_timeout_) {
        const int silent = static_cast<int>(r);
        const std::string reason =
            str_cat("nothing arrived on its rendezvous connection for ", seconds(heartbeat_timeout_),
                    " s while watching ranks send a heartbeat every ", seconds(heartbeat_interval_),
                    " s: its host vanished or its process stopped");
        peer_lost(silent, reason, str_cat("FAILED ", silent, " ", reason, "\n"));
        return;
      }
      wake = std::min(wake, heard[r] + heartbeat_timeout_);
      polls.push_back({peers_[r], POLLIN, 0});
      ranks.push_back(static_cast<int>(r));
    }
    if (ranks.empty()) return;
    const int ready = ::poll(polls.data(), polls.size(), rdzv::remaining_ms(wake));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0 || polls[0].revents) return;  // stopping
    for (size_t i = 1; i < polls.size(); ++i) {
      if (!polls[i].revents) continue;
      const int r = ranks[i - 1];
      const auto ur = static_cast<size_t>(r);
      heard[ur] = Clock::now();
      const bool open = readers[ur].fill(peers_[ur]);
      while (auto line = readers[ur].next_line()) {
        if (handle_line(r, *line)) return;
      }
      if (readers[ur].overflowed()) {
        const std::string reason = str_cat("its rendezvous connection sent more than ", kMaxWatchLine,
                                           " bytes without a newline: '", rdzv::escaped(readers[ur].pending()), "'");
        peer_lost(r, reason, str_cat("FAILED ", r, " ", reason, "\n"));
        return;
      }
      if (open && !said_goodbye_[ur]) continue;
      {
        std::lock_guard lock(send_mutex_);
        close_fd(peers_[ur]);
      }
      if (said_goodbye_[ur]) continue;
      // Closed without a goodbye: that process is gone.
      peer_lost(r, kEndedReason, str_cat("DEAD ", r, "\n"));
      return;
    }
  }
}

bool TcpRendezvous::handle_line(int r, const std::string& line) {
  if (line == "BYE") {
    said_goodbye_[static_cast<size_t>(r)] = true;
    return false;
  }
  if (line == "PING") return false;
  if (rank_ == 0 && line.rfind("FAIL ", 0) == 0) {  // rank r's process is failing: relay, then stop
    const std::string reason = rdzv::escaped(std::string_view(line).substr(5), kMaxReason);
    peer_lost(r, reason, str_cat("FAILED ", r, " ", reason, "\n"));
    return true;
  }
  const std::vector<std::string_view> w = rdzv::split_words(line);
  const std::optional<long long> who =
      w.size() >= 2 ? rdzv::parse_decimal(w[1], 0, world_size_ - 1) : std::optional<long long>();
  if (rank_ != 0 && who && w[0] == "DEAD" && w.size() == 2) {
    peer_lost(static_cast<int>(*who),
              "its process ended without leaving the world (crashed or was killed); rank 0 noticed its "
              "rendezvous connection close",
              "");
    return true;
  }
  if (rank_ != 0 && who && w[0] == "FAILED" && w.size() >= 3) {
    const size_t reason_at = w[0].size() + w[1].size() + 2;
    peer_lost(static_cast<int>(*who), rdzv::escaped(std::string_view(line).substr(reason_at), kMaxReason), "");
    return true;
  }
  // Not the protocol: that process is broken (an authenticated peer), so it counts as failed.
  const std::string reason =
      str_cat("its rendezvous connection sent a line that is not part of the protocol: '", rdzv::escaped(line), "'");
  peer_lost(r, reason, str_cat("FAILED ", r, " ", reason, "\n"));
  return true;
}

void TcpRendezvous::peer_lost(int r, const std::string& reason, const std::string& relay) {
  // After this process reported its own failure, the peers' reactions are not news.
  if (failed_.load()) return;
  if (rank_ == 0 && !relay.empty()) send_to_open_peers(relay, r);
  on_failure_(r, reason);
}

bool TcpRendezvous::send_heartbeat(Clock::time_point& next) {
  if (Clock::now() < next) return true;
  next = Clock::now() + heartbeat_interval_;
  const std::vector<int> stuck = send_to_open_peers("PING\n", -1);
  if (stuck.empty()) return true;
  const int r = stuck.front();
  const std::string reason = str_cat("its process does not read its rendezvous connection (a heartbeat ",
                                     "could not be sent within ", seconds(kWatchSendTime), " s)");
  peer_lost(r, reason, str_cat("FAILED ", r, " ", reason, "\n"));
  return false;
}

std::vector<int> TcpRendezvous::send_to_open_peers(const std::string& line, int except_rank) {
  std::lock_guard lock(send_mutex_);
  const auto until = Clock::now() + kWatchSendTime;  // for all of them: a stuck peer delays the rest once
  std::vector<int> stuck;
  for (size_t r = 0; r < peers_.size(); ++r) {
    if (peers_[r] < 0 || static_cast<int>(r) == except_rank) continue;
    if (rdzv::send_within(peers_[r], line, until) == rdzv::IoStatus::timed_out) {
      stuck.push_back(static_cast<int>(r));
      log_warn("rendezvous (rank ", rank_, "): rank ", r, " does not read its connection; a message to it was ",
               "dropped");
    }
  }
  return stuck;
}

void TcpRendezvous::send_failure(const std::string& reason) {
  if (failed_.exchange(true)) return;  // told them already
  const std::string text = one_line(reason);
  // Rank 0 tells everyone itself; any other rank tells rank 0, which relays it.
  send_to_open_peers(rank_ == 0 ? str_cat("FAILED 0 ", text, "\n") : "FAIL " + text + "\n", -1);
}

void TcpRendezvous::report_failure(const std::string& reason) { send_failure("its process reported: " + reason); }

TcpRendezvous::~TcpRendezvous() {
  {
    std::lock_guard lock(registry_mutex());
    auto& alive = registry();
    alive.erase(std::remove(alive.begin(), alive.end(), this), alive.end());
  }
  // Destroyed by an exception's unwinding (the world group dropped while its process fails): the
  // peers hear it now instead of waiting in their next collective until the op timeout. The
  // exception's message is not reachable here; report_failure() carries it.
  if (joined_ && std::uncaught_exceptions() > uncaught_at_construction_) send_failure(kUnwindingReason);
  if (watcher_.joinable()) {
    const char stop = 1;
    (void)!::write(stop_pipe_[1], &stop, 1);
    watcher_.join();
  }
  const auto until = Clock::now() + 1s;  // a goodbye is best effort: a peer that does not read misses it
  for (int& fd : peers_) {
    // A failing process closes without a goodbye: a peer that missed its notice still sees a death.
    if (fd >= 0 && !failed_.load()) rdzv::send_within(fd, "BYE\n", until);
    close_fd(fd);
  }
  close_fd(stop_pipe_[0]);
  close_fd(stop_pipe_[1]);
}

int report_failure_to_peers(const std::string& reason) {
  std::lock_guard lock(registry_mutex());
  for (TcpRendezvous* rv : registry()) rv->report_failure(reason);
  return static_cast<int>(registry().size());
}

int find_free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  CPF_CHECK(fd >= 0, "find_free_port: socket() failed: ", std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  const int err = errno;
  ::close(fd);
  CPF_CHECK(ok, "find_free_port: ", std::strerror(err));
  return ntohs(addr.sin_port);
}

}  // namespace cpf::dist
