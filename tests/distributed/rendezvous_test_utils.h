#pragma once
// Helpers for the rendezvous tests: ranks joining on threads, and raw loopback sockets that play a
// buggy peer, an attacker or a fake rank 0. Every wait is bounded; only 127.0.0.1 and ::1 are used.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "framework/distributed/rendezvous_tcp.h"
#include "framework/distributed/rendezvous_tcp_auth.h"
#include "framework/distributed/rendezvous_tcp_wire.h"

namespace cpf::testing::rv {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

inline const std::string kToken = "0123456789abcdef0123456789abcdef";

// What rank 0 logged (connections it closed during the join).
class LogCapture {
 public:
  std::function<void(const std::string&)> sink() {
    return [this](const std::string& m) {
      std::lock_guard lock(mutex_);
      lines_.push_back(m);
    };
  }
  std::string all() {
    std::lock_guard lock(mutex_);
    std::string s;
    for (const auto& l : lines_) s += l + "\n";
    return s;
  }
  size_t size() {
    std::lock_guard lock(mutex_);
    return lines_.size();
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> lines_;
};

// A join on its own thread: `error` is "" when it succeeded.
struct JoinThread {
  std::string error;
  std::unique_ptr<dist::TcpRendezvous> handle;
  double seconds = 0;
  std::thread thread;
  void start(dist::RendezvousOptions options) {
    thread = std::thread([this, options] {
      const auto t0 = Clock::now();
      try {
        handle = dist::TcpRendezvous::join(options);
      } catch (const std::exception& e) {
        error = e.what();
      }
      seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    });
  }
  void wait() {
    if (thread.joinable()) thread.join();
  }
  ~JoinThread() { wait(); }
};

inline dist::RendezvousOptions options(int port, int rank, int world, std::chrono::milliseconds timeout,
                                       const std::string& token = kToken) {
  return {.host = "127.0.0.1",
          .port = port,
          .rank = rank,
          .world_size = world,
          .payload = rank == 0 ? "the-id" : "",
          .timeout = timeout,
          .token = token};
}

// A TCP connection to host:port, retried for up to 3 s (rank 0 may not listen yet); -1 if none.
inline int raw_connect(int port, const std::string& host = "127.0.0.1") {
  const auto endpoints = dist::rdzv::resolve(host, port, "test");
  const auto until = Clock::now() + 3s;
  std::string why;
  while (Clock::now() < until) {
    const int fd = dist::rdzv::try_connect(endpoints, until, why);
    if (fd >= 0) return fd;
    std::this_thread::sleep_for(20ms);
  }
  return -1;
}

// One line (without the newline) within `wait`, or "" when none came.
inline std::string raw_line(int fd, std::chrono::milliseconds wait = 2000ms) {
  dist::rdzv::LineReader reader(64 * 1024);
  dist::rdzv::IoStatus status;
  bool overflowed = false;
  auto line = dist::rdzv::read_line_within(fd, reader, Clock::now() + wait, status, overflowed);
  return line ? *line : "";
}

// Everything that arrives within `wait` (until the peer closes), at most `max` bytes.
inline std::string raw_drain(int fd, std::chrono::milliseconds wait, size_t max = 1 << 20) {
  std::string all;
  const auto until = Clock::now() + wait;
  char chunk[4096];
  while (all.size() < max) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, dist::rdzv::remaining_ms(until)) <= 0) break;
    const ssize_t n = ::recv(fd, chunk, sizeof chunk, MSG_DONTWAIT);
    if (n <= 0) break;
    all.append(chunk, static_cast<size_t>(n));
  }
  return all;
}

inline bool raw_send(int fd, const std::string& bytes, std::chrono::milliseconds wait = 2000ms) {
  dist::rdzv::set_nonblocking(fd);
  return dist::rdzv::send_within(fd, bytes, Clock::now() + wait) == dist::rdzv::IoStatus::ok;
}

// The nonce of rank 0's challenge line, or "" when the line is not one.
inline std::string challenge_nonce(const std::string& line) {
  const std::string prefix = "CHALLENGE cpf-rendezvous-v1 ";
  return line.rfind(prefix, 0) == 0 ? line.substr(prefix.size()) : "";
}

// A hello for `rank` of `world` answering `challenge_line`, proven with `token`.
inline std::string hello_for(const std::string& challenge_line, int rank, int world, const std::string& token) {
  const std::string client_nonce = "00112233445566778899aabbccddeeff";
  return "HELLO " + std::to_string(rank) + " " + std::to_string(world) + " " + client_nonce + " " +
         dist::rdzv::hello_mac(token, challenge_nonce(challenge_line), client_nonce, rank, world) + "\n";
}

// A raw connection that takes seat `rank` properly (knows the token) and reads the answer line.
inline int raw_seat(int port, int rank, int world, const std::string& token = kToken) {
  const int fd = raw_connect(port);
  if (fd < 0) return -1;
  const std::string challenge = raw_line(fd);
  raw_send(fd, hello_for(challenge, rank, world, token));
  return fd;
}

// Whether this machine can bind ::1 (IPv6 tests skip without it).
inline bool has_ipv6_loopback() {
  const int probe = ::socket(AF_INET6, SOCK_STREAM, 0);
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  const bool ok = probe >= 0 && ::bind(probe, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  if (probe >= 0) ::close(probe);
  return ok;
}

// A listener on loopback `port` posing as rank 0 (the caller accepts and closes).
inline void listen_as_rank_zero(int port, int& listener) {
  listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;  // the real rank 0 may listen on the port after this one closed
  ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
}

// Whether `line` is rank 0's "ERR <proof> <text>" proven with kToken for the connection of
// `challenge_line`, before a hello (client nonce "-").
inline bool is_proven_error(const std::string& line, const std::string& challenge_line, const std::string& text) {
  const std::string proof = dist::rdzv::error_mac(kToken, challenge_nonce(challenge_line), "-", text);
  return line == "ERR " + proof + " " + text;
}

}  // namespace cpf::testing::rv
