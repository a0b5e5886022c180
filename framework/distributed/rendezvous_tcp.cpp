#include "framework/distributed/rendezvous_tcp.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>

#include "framework/core/error.h"

namespace cpf::dist {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(std::chrono::milliseconds ms) { return static_cast<double>(ms.count()) / 1000.0; }

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1'000'000));
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

bool send_all(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

// Reads whatever is available into `buffer`; false on end of stream or error.
bool read_some(int fd, std::string& buffer) {
  char chunk[4096];
  while (true) {
    const ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    buffer.append(chunk, static_cast<size_t>(n));
    return true;
  }
}

// Takes one '\n'-terminated line off the front of `buffer`.
std::optional<std::string> take_line(std::string& buffer) {
  const size_t end = buffer.find('\n');
  if (end == std::string::npos) return std::nullopt;
  std::string line = buffer.substr(0, end);
  buffer.erase(0, end + 1);
  return line;
}

enum class ReadStatus { ok, closed, timed_out };

// Reads until `buffer` holds at least `bytes` bytes (or a line, when bytes < 0).
ReadStatus read_until(int fd, std::string& buffer, long bytes, Clock::time_point deadline) {
  auto done = [&] { return bytes < 0 ? buffer.find('\n') != std::string::npos : buffer.size() >= size_t(bytes); };
  while (!done()) {
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, remaining_ms(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) return ReadStatus::timed_out;
    if (!read_some(fd, buffer)) return ReadStatus::closed;
  }
  return ReadStatus::ok;
}

int listen_on(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  CPF_CHECK(fd >= 0, "rendezvous: socket() failed: ", std::strerror(errno));
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 128) != 0) {
    const int err = errno;
    ::close(fd);
    CPF_FAIL("rendezvous: rank 0 cannot listen on port ", port, ": ", std::strerror(err),
             err == EADDRINUSE ? " (another job uses it: pick another MASTER_PORT)" : "");
  }
  return fd;
}

// One connection attempt with a bounded wait; -1 when it failed (the caller retries).
int try_connect(const std::string& host, int port, Clock::time_point deadline, std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int gai = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  if (gai != 0) {
    why = detail::str_cat("cannot resolve '", host, "': ", gai_strerror(gai));
    return -1;
  }
  int result = -1;
  for (addrinfo* a = found; a && result < 0; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      rc = ::poll(&p, 1, std::min(remaining_ms(deadline), 2000)) == 1 ? 0 : -1;
      int err = 0;
      socklen_t len = sizeof err;
      if (rc == 0 && (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0)) {
        errno = err;
        rc = -1;
      }
    }
    if (rc == 0) {
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      result = fd;
    } else {
      why = std::strerror(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(found);
  return result;
}

std::string join_ints(const std::vector<int>& v) { return detail::str_cat(v); }

// A reason fits on one protocol line: newlines become spaces, and it is kept short.
std::string one_line(std::string text) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  std::replace(text.begin(), text.end(), '\r', ' ');
  constexpr size_t kMaxReason = 2000;
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

}  // namespace

TcpRendezvous::TcpRendezvous(int rank, int world_size)
    : rank_(rank),
      world_size_(world_size),
      peers_(static_cast<size_t>(world_size), -1),
      said_goodbye_(static_cast<size_t>(world_size), false),
      uncaught_at_construction_(std::uncaught_exceptions()) {}

std::unique_ptr<TcpRendezvous> TcpRendezvous::join(const RendezvousOptions& o) {
  CPF_CHECK(o.world_size >= 1, "rendezvous: world_size must be at least 1, got ", o.world_size);
  CPF_CHECK(o.rank >= 0 && o.rank < o.world_size, "rendezvous: rank ", o.rank, " is not in 0..", o.world_size - 1);
  CPF_CHECK(o.port >= 1 && o.port <= 65535, "rendezvous: port ", o.port, " is not a TCP port (1..65535)");
  CPF_CHECK(o.timeout.count() > 0, "rendezvous: the timeout must be positive");
  std::unique_ptr<TcpRendezvous> rv(new TcpRendezvous(o.rank, o.world_size));
  const auto deadline = Clock::now() + o.timeout;
  const std::string where = detail::str_cat("rendezvous on ", o.host, ":", o.port);
  if (o.world_size == 1) {
    rv->payload_ = o.payload;
    return rv;
  }
  if (o.rank == 0) {
    int listener = listen_on(o.port);
    struct Pending {
      int fd;
      std::string buffer;
    };
    std::vector<Pending> pending;
    std::string error;
    int arrived = 1;
    while (arrived < o.world_size && error.empty() && remaining_ms(deadline) > 0) {
      std::vector<pollfd> polls{{listener, POLLIN, 0}};
      for (const Pending& p : pending) polls.push_back({p.fd, POLLIN, 0});
      const int ready = ::poll(polls.data(), polls.size(), std::min(remaining_ms(deadline), 200));
      if (ready <= 0) continue;
      for (size_t i = 1; i < polls.size(); ++i) {
        if (!polls[i].revents) continue;
        Pending& p = pending[i - 1];
        if (!read_some(p.fd, p.buffer)) {  // gone before saying hello
          close_fd(p.fd);
          continue;
        }
        const std::optional<std::string> line = take_line(p.buffer);
        if (!line) continue;
        int rank = -1, size = -1;
        const size_t errors_before = error.size();
        if (std::sscanf(line->c_str(), "HELLO %d %d", &rank, &size) != 2) {
          error =
              detail::str_cat(where, ": a peer sent '", *line, "' instead of a hello (another program on this port?)");
        } else if (size != o.world_size) {
          error = detail::str_cat(where, ": rank ", rank, " says the world has ", size, " ranks but rank 0 has ",
                                  o.world_size, " (WORLD_SIZE differs between processes)");
        } else if (rank <= 0 || rank >= o.world_size) {
          error = detail::str_cat(where, ": a peer says it is rank ", rank, ", not in 1..", o.world_size - 1);
        } else if (rv->peers_[static_cast<size_t>(rank)] >= 0) {
          error = detail::str_cat(where, ": two processes say they are rank ", rank, " (RANK differs between them?)");
        } else {
          rv->peers_[static_cast<size_t>(rank)] = p.fd;
          p.fd = -1;
          ++arrived;
        }
        if (error.size() != errors_before) send_all(p.fd, "ERR " + error + "\n");  // the peer at fault hears it too
      }
      pending.erase(std::remove_if(pending.begin(), pending.end(), [](const Pending& p) { return p.fd < 0; }),
                    pending.end());
      if (polls[0].revents & POLLIN) {
        const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd >= 0) pending.push_back({fd, ""});
      }
    }
    close_fd(listener);
    for (Pending& p : pending) close_fd(p.fd);
    if (error.empty() && arrived < o.world_size) {
      std::vector<int> missing;
      for (int r = 1; r < o.world_size; ++r) {
        if (rv->peers_[static_cast<size_t>(r)] < 0) missing.push_back(r);
      }
      error = detail::str_cat(where, ": ranks ", join_ints(missing), " of ", o.world_size,
                              " did not arrive within the timeout of ", seconds(o.timeout),
                              " s (did they start, with the same MASTER_ADDR and MASTER_PORT?)");
    }
    if (!error.empty()) {
      for (int& fd : rv->peers_) {
        if (fd >= 0) send_all(fd, "ERR " + error + "\n");
        close_fd(fd);
      }
      CPF_FAIL(error);
    }
    const std::string message = detail::str_cat("OK ", o.payload.size(), "\n") + o.payload;
    for (int r = 1; r < o.world_size; ++r) {
      CPF_CHECK(send_all(rv->peers_[static_cast<size_t>(r)], message), where, ": rank ", r,
                " went away before it got the payload");
    }
    rv->payload_ = o.payload;
    rv->joined_ = true;
    std::lock_guard lock(registry_mutex());
    registry().push_back(rv.get());
    return rv;
  }
  // Any other rank: reach rank 0, say hello, wait for the payload (or rank 0's error).
  int fd = -1;
  std::string why = "no attempt";
  while (fd < 0 && remaining_ms(deadline) > 0) {
    fd = try_connect(o.host, o.port, deadline, why);
    if (fd < 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CPF_CHECK(fd >= 0, where, ": rank ", o.rank, " could not reach rank 0 within the timeout of ", seconds(o.timeout),
            " s (last error: ", why,
            "); is rank 0 running, and do all ranks use the same MASTER_ADDR and MASTER_PORT?");
  rv->peers_[0] = fd;
  CPF_CHECK(send_all(fd, detail::str_cat("HELLO ", o.rank, " ", o.world_size, "\n")), where, ": rank ", o.rank,
            " lost the connection to rank 0 while saying hello");
  // Rank 0 reports missing ranks at its own deadline: wait a little longer for its message.
  const auto answer_deadline = deadline + std::chrono::seconds(10);
  std::string buffer;
  const ReadStatus status = read_until(fd, buffer, -1, answer_deadline);
  CPF_CHECK(status != ReadStatus::timed_out, where, ": rank ", o.rank, " got no answer from rank 0 within ",
            seconds(o.timeout), " s");
  CPF_CHECK(status != ReadStatus::closed, where, ": rank 0 closed the connection before sending the payload (did ",
            "rank 0 fail?)");
  const std::string line = *take_line(buffer);
  CPF_CHECK(line.rfind("ERR ", 0) != 0, line.substr(4));
  long size = -1;
  CPF_CHECK(std::sscanf(line.c_str(), "OK %ld", &size) == 1 && size >= 0, where, ": unexpected answer from rank 0: '",
            line, "'");
  CPF_CHECK(read_until(fd, buffer, size, answer_deadline) == ReadStatus::ok, where, ": rank ", o.rank,
            " lost the connection to rank 0 while receiving the payload");
  rv->payload_ = buffer.substr(0, static_cast<size_t>(size));
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
  std::vector<std::string> buffers(peers_.size());
  // The callback, unless this process reported its own failure (then the peers' reactions are not news).
  auto report = [&](int rank, const std::string& reason) {
    if (!failed_.load()) on_failure_(rank, reason);
  };
  while (true) {
    std::vector<pollfd> polls{{stop_pipe_[0], POLLIN, 0}};
    std::vector<int> ranks;
    for (size_t r = 0; r < peers_.size(); ++r) {
      if (peers_[r] >= 0) {
        polls.push_back({peers_[r], POLLIN, 0});
        ranks.push_back(static_cast<int>(r));
      }
    }
    if (ranks.empty()) return;
    const int ready = ::poll(polls.data(), polls.size(), -1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0 || polls[0].revents) return;  // stopping
    for (size_t i = 1; i < polls.size(); ++i) {
      if (!polls[i].revents) continue;
      const int r = ranks[i - 1];
      std::string& buffer = buffers[static_cast<size_t>(r)];
      const bool open = read_some(peers_[static_cast<size_t>(r)], buffer);
      while (auto line = take_line(buffer)) {
        if (*line == "BYE") said_goodbye_[static_cast<size_t>(r)] = true;
        if (rank_ == 0 && line->rfind("FAIL ", 0) == 0) {  // rank r's process is failing: relay, then stop
          const std::string reason = line->substr(5);
          if (failed_.load()) return;
          send_to_open_peers(detail::str_cat("FAILED ", r, " ", reason, "\n"), r);
          report(r, reason);
          return;
        }
        int dead = -1, offset = -1;
        if (rank_ != 0 && std::sscanf(line->c_str(), "FAILED %d %n", &dead, &offset) == 1 && offset >= 0) {
          report(dead, line->substr(static_cast<size_t>(offset)));
          return;
        }
        if (rank_ != 0 && std::sscanf(line->c_str(), "DEAD %d", &dead) == 1) {
          report(dead, detail::str_cat("its process ended without leaving the world (crashed or was killed); ",
                                       "rank 0 noticed its rendezvous connection close"));
          return;
        }
      }
      if (open && !said_goodbye_[static_cast<size_t>(r)]) continue;
      {
        std::lock_guard lock(send_mutex_);
        close_fd(peers_[static_cast<size_t>(r)]);
      }
      if (said_goodbye_[static_cast<size_t>(r)]) continue;
      // Closed without a goodbye: that process is gone.
      if (failed_.load()) return;
      if (rank_ == 0) send_to_open_peers(detail::str_cat("DEAD ", r, "\n"), r);
      report(r,
             "its process ended without leaving the world (crashed or was killed): its rendezvous "
             "connection closed");
      return;
    }
  }
}

void TcpRendezvous::send_to_open_peers(const std::string& line, int except_rank) {
  std::lock_guard lock(send_mutex_);
  for (size_t r = 0; r < peers_.size(); ++r) {
    if (peers_[r] >= 0 && static_cast<int>(r) != except_rank) send_all(peers_[r], line);
  }
}

void TcpRendezvous::send_failure(const std::string& reason) {
  if (failed_.exchange(true)) return;  // told them already
  const std::string text = one_line(reason);
  // Rank 0 tells everyone itself; any other rank tells rank 0, which relays it.
  send_to_open_peers(rank_ == 0 ? detail::str_cat("FAILED 0 ", text, "\n") : "FAIL " + text + "\n", -1);
}

void TcpRendezvous::report_failure(const std::string& reason) {
  send_failure("its process reported: " + reason);
}

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
  for (int& fd : peers_) {
    // A failing process closes without a goodbye: a peer that missed its notice still sees a death.
    if (fd >= 0 && !failed_.load()) send_all(fd, "BYE\n");
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
