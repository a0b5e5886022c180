// The rendezvous's bounds after the join and around it: a seat that floods or never reads cannot hold
// rank 0's watcher or destructor, a stopped peer is noticed by the heartbeat, rank 0 listens only
// where asked (IPv4 and IPv6), running out of descriptors backs off, and the wire primitives keep
// their limits. Loopback only; every case is bounded in time.
#include <gtest/gtest.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <fcntl.h>

#include <fstream>
#include <map>

#include "rendezvous_test_utils.h"
#include "support/sanitizers.h"
#include "support/test_utils.h"

namespace cpf::testing {
namespace {

using namespace rv;
namespace wire = dist::rdzv;

TEST(TcpRendezvousWire, SendsAreBoundedByTheDeadline) {
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, pair), 0);
  const auto t0 = Clock::now();
  // Nobody reads pair[1]: 8 MiB cannot fit in the socket buffers.
  EXPECT_EQ(wire::send_within(pair[0], std::string(8 << 20, 'x'), Clock::now() + 200ms), wire::IoStatus::timed_out);
  const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_GT(waited, 0.15);
  EXPECT_LT(waited, 1.0);
  ::close(pair[1]);
  EXPECT_EQ(wire::send_within(pair[0], "x", Clock::now() + 200ms), wire::IoStatus::closed);
  ::close(pair[0]);
}

TEST(TcpRendezvousWire, LinesAreCappedAndNumbersStrict) {
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, pair), 0);
  wire::LineReader reader(8);
  ASSERT_TRUE(wire::send_within(pair[1], "12345678\n123456789", Clock::now() + 1s) == wire::IoStatus::ok);
  ASSERT_TRUE(reader.fill(pair[0]));
  EXPECT_EQ(reader.next_line().value_or("none"), "12345678");
  EXPECT_FALSE(reader.next_line().has_value());
  EXPECT_TRUE(reader.overflowed());
  ::close(pair[0]);
  ::close(pair[1]);
  EXPECT_EQ(wire::parse_decimal("2147483647", 0, INT32_MAX).value_or(-1), INT32_MAX);
  for (const char* bad : {"2147483648", "4294967297", "+1", "-1", "01", " 1", "1 ", "", "1e3", "0x10"}) {
    EXPECT_FALSE(wire::parse_decimal(bad, 0, INT32_MAX).has_value()) << bad;
  }
  EXPECT_EQ(wire::escaped("a\x1b[0m\n\xff"), "a\\x1b[0m\\x0a\\xff");
  EXPECT_EQ(wire::escaped(std::string(100, 'z'), 4), "zzzz... (100 bytes)");
}

// Seat 1 says FAIL with 8 MiB of reason, seat 2 never reads: rank 0 names rank 1 at once, tells rank
// 2 in one bounded line, and its destructor returns (before: the relay blocked it for good).
TEST(TcpRendezvousLiveness, AFloodingSeatAndANonReadingSeatCannotHoldRankZero) {
  const int port = dist::find_free_port();
  JoinThread root;
  root.start(options(port, 0, 3, 5s));
  const int flooder = raw_seat(port, 1, 3);
  const int sleeper = raw_seat(port, 2, 3);
  root.wait();
  ASSERT_EQ(root.error, "");
  std::mutex mutex;
  std::map<int, std::string> seen;
  root.handle->watch([&](int rank, const std::string& reason) {
    std::lock_guard lock(mutex);
    seen[rank] = reason;
  });
  raw_send(flooder, "FAIL " + std::string(8 << 20, 'F') + "\n", 1000ms);
  for (int i = 0; i < 100 &&
                  [&] {
                    std::lock_guard l(mutex);
                    return seen.empty();
                  }();
       ++i) {
    std::this_thread::sleep_for(20ms);
  }
  const auto t0 = Clock::now();
  root.handle.reset();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 3.0) << "rank 0's destructor must return";
  std::lock_guard lock(mutex);
  ASSERT_EQ(seen.count(1), 1u);
  EXPECT_NE(seen[1].find("more than 1200 bytes without a newline: 'FAIL FFFF"), std::string::npos) << seen[1];
  EXPECT_LT(seen[1].size(), 300u);
  const std::string told = raw_drain(sleeper, 1000ms);
  EXPECT_NE(told.find("FAILED 1 its rendezvous connection sent more than 1200 bytes"), std::string::npos)
      << wire::escaped(told, 400);
  EXPECT_LT(told.size(), 2000u);
  ::close(flooder);
  ::close(sleeper);
}

// Rank 2 is a forked process that stops (SIGSTOP: its connections stay open, the kernel still
// acknowledges, as for a host that vanished without a word): the heartbeat names it.
TEST(TcpRendezvousLiveness, APeerThatFallsSilentIsNamed) {
  const int port = dist::find_free_port();
  auto fast = [&](int rank) {
    dist::RendezvousOptions o = options(port, rank, 3, 10s);
    o.heartbeat_interval = 100ms;
    o.heartbeat_timeout = 600ms;
    return o;
  };
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    try {
      auto rv = dist::TcpRendezvous::join(fast(2));
      rv->watch([](int, const std::string&) {});
      std::this_thread::sleep_for(10s);
      ::_exit(0);
    } catch (...) {
      ::_exit(1);
    }
  }
  JoinThread root, one;
  root.start(fast(0));
  one.start(fast(1));
  root.wait();
  one.wait();
  ASSERT_EQ(root.error + one.error, "");
  std::mutex mutex;
  std::map<int, std::pair<int, std::string>> seen;
  for (JoinThread* j : {&root, &one}) {
    const int me = j->handle->rank();
    j->handle->watch([&, me](int rank, const std::string& reason) {
      std::lock_guard lock(mutex);
      seen[me] = {rank, reason};
    });
  }
  std::this_thread::sleep_for(1000ms);  // heartbeats flow: no false alarm
  EXPECT_EQ(
      [&] {
        std::lock_guard l(mutex);
        return seen.size();
      }(),
      0u);
  ::kill(child, SIGSTOP);
  const auto stopped = Clock::now();
  for (int i = 0; i < 150 &&
                  [&] {
                    std::lock_guard l(mutex);
                    return seen.size();
                  }() < 2;
       ++i) {
    std::this_thread::sleep_for(20ms);
  }
  const double noticed = std::chrono::duration<double>(Clock::now() - stopped).count();
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  std::lock_guard lock(mutex);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_LT(noticed, 2.0);
  for (int r : {0, 1}) {
    EXPECT_EQ(seen[r].first, 2) << "watcher " << r;
    EXPECT_NE(seen[r].second.find("nothing arrived on its rendezvous connection for 0.6 s"), std::string::npos)
        << seen[r].second;
  }
}

// Whether some socket of this machine listens on `hex_address`:`port` (/proc/net/tcp or tcp6).
bool listens_on(const std::string& table, const std::string& hex_address, int port) {
  char wanted[64];
  std::snprintf(wanted, sizeof wanted, "%s:%04X", hex_address.c_str(), port);
  std::ifstream in(table);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find(wanted) != std::string::npos && line.find(" 0A ") != std::string::npos) return true;
  }
  return false;
}

TEST(TcpRendezvousLiveness, RankZeroListensOnlyWhereAsked) {
  const int port = dist::find_free_port();
  JoinThread root;
  root.start(options(port, 0, 2, 1500ms));
  std::this_thread::sleep_for(200ms);
  EXPECT_TRUE(listens_on("/proc/net/tcp", "0100007F", port)) << "rank 0 should listen on 127.0.0.1";
  EXPECT_FALSE(listens_on("/proc/net/tcp", "00000000", port)) << "not on every interface";
  EXPECT_LT(raw_connect(port, "127.0.0.2"), 0) << "another loopback address is not where it listens";
  root.wait();
  EXPECT_NE(root.error.find("rank 0 listened on 127.0.0.1:" + std::to_string(port)), std::string::npos) << root.error;

  // Every interface only when asked, and never without a token.
  EXPECT_CPF_ERROR(dist::TcpRendezvous::join({.port = port, .rank = 0, .world_size = 2, .bind = "0.0.0.0"}),
                   "CPF_RENDEZVOUS_TOKEN is not set and rank 0 would listen on 0.0.0.0:");
  const int port2 = dist::find_free_port();
  JoinThread wide;
  dist::RendezvousOptions o = options(port2, 0, 2, 1000ms);
  o.bind = "0.0.0.0";
  wide.start(o);
  std::this_thread::sleep_for(200ms);
  EXPECT_TRUE(listens_on("/proc/net/tcp", "00000000", port2));
  wide.wait();
}

TEST(TcpRendezvousLiveness, IPv6Loopback) {
  if (!has_ipv6_loopback()) GTEST_SKIP() << "no IPv6 loopback on this machine";
  const int port = dist::find_free_port();
  JoinThread root, one;
  dist::RendezvousOptions o0 = options(port, 0, 2, 5s, ""), o1 = options(port, 1, 2, 5s, "");
  o0.host = o1.host = "::1";  // loopback: no token needed
  root.start(o0);
  one.start(o1);
  root.wait();
  one.wait();
  EXPECT_EQ(root.error + one.error, "");
  ASSERT_TRUE(one.handle);
  EXPECT_EQ(one.handle->payload(), "the-id");
}

// Rank 0 in a forked process whose descriptors are used up: accept() fails with EMFILE; it backs off
// (no spinning: little CPU over the 1.5 s) and says so when the ranks do not arrive.
TEST(TcpRendezvousLiveness, DescriptorExhaustionBacksOffAndSaysSo) {
  // UBSan's vptr check probes memory through a pipe: with no descriptor left it reports a false
  // "invalid vptr" in any virtual call, so the sanitizer runtime itself cannot run this case.
  if (kSanitized) GTEST_SKIP() << "the sanitizer runtime needs file descriptors this test uses up";
  const int port = dist::find_free_port();
  int out[2];
  ASSERT_EQ(::pipe2(out, O_CLOEXEC), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(out[0]);
    dist::generate_rendezvous_token();  // OpenSSL set up while descriptors remain
    const rlimit low{64, 64};
    ::setrlimit(RLIMIT_NOFILE, &low);
    int last = -1;
    while (true) {
      const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      if (fd < 0) break;
      last = fd;
    }
    ::close(last);  // one left: the listening socket
    std::string error = "joined";
    try {
      dist::RendezvousOptions o = options(port, 0, 2, 1500ms);
      o.log = [](const std::string&) {};
      dist::TcpRendezvous::join(o);
    } catch (const std::exception& e) {
      error = e.what();
    }
    (void)!::write(out[1], error.data(), error.size());
    ::_exit(0);
  }
  ::close(out[1]);
  const int knocking = raw_connect(port);  // waits in rank 0's backlog
  EXPECT_GE(knocking, 0);
  int status = 0;
  rusage usage{};
  ASSERT_EQ(::wait4(child, &status, 0, &usage), child);
  std::string error;
  char chunk[4096];
  for (ssize_t n; (n = ::read(out[0], chunk, sizeof chunk)) > 0;) error.append(chunk, static_cast<size_t>(n));
  ::close(out[0]);
  if (knocking >= 0) ::close(knocking);
  const double cpu = static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
                     static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
  EXPECT_LT(cpu, 0.5) << "rank 0 spun on the listener";
  EXPECT_NE(error.find("ranks [1] of 2 did not arrive within the timeout of 1.5 s"), std::string::npos) << error;
  EXPECT_NE(error.find("rank 0 could not accept connections: Too many open files (file descriptors exhausted"),
            std::string::npos)
      << error;
}

TEST(TcpRendezvousLiveness, RejectsBadOptions) {
  EXPECT_CPF_ERROR(dist::TcpRendezvous::join({.port = 1234, .rank = 0, .world_size = 2, .token = "short"}),
                   "CPF_RENDEZVOUS_TOKEN has 5 characters; use at least 16");
  EXPECT_CPF_ERROR(
      dist::TcpRendezvous::join({.port = 1234, .rank = 0, .world_size = 2, .payload = std::string(4097, 'p')}),
      "rank 0's payload has 4097 bytes; at most 4096");
  EXPECT_CPF_ERROR(dist::TcpRendezvous::join({.port = 1234,
                                              .rank = 1,
                                              .world_size = 2,
                                              .heartbeat_interval = std::chrono::seconds(5),
                                              .heartbeat_timeout = std::chrono::seconds(6)}),
                   "heartbeat_timeout (6 s) must be at least twice heartbeat_interval (5 s)");
  EXPECT_CPF_ERROR(dist::TcpRendezvous::join({.host = "", .port = 1234, .rank = 1, .world_size = 2}),
                   "the host of rank 0 (MASTER_ADDR) is empty");
  // Off loopback a rank refuses to join without a token, before connecting anywhere.
  EXPECT_CPF_ERROR(dist::TcpRendezvous::join({.host = "0.0.0.0", .port = 1234, .rank = 1, .world_size = 2}),
                   "CPF_RENDEZVOUS_TOKEN is not set and rank 0 is at 0.0.0.0:1234, which is not loopback");
  const std::string token = dist::generate_rendezvous_token();
  EXPECT_EQ(token.size(), 32u);
  EXPECT_NE(token, dist::generate_rendezvous_token());
}

// The joined connections carry TCP keepalive and TCP_USER_TIMEOUT on the heartbeat's scale, so the
// kernel too breaks a connection to a host that vanished. Found among this process's sockets by port.
TEST(TcpRendezvousLiveness, JoinedConnectionsUseKeepalive) {
  const int port = dist::find_free_port();
  JoinThread root, one;
  dist::RendezvousOptions o0 = options(port, 0, 2, 5s), o1 = options(port, 1, 2, 5s);
  o0.heartbeat_timeout = o1.heartbeat_timeout = 12s;
  root.start(o0);
  one.start(o1);
  root.wait();
  one.wait();
  ASSERT_EQ(root.error + one.error, "");
  int found = 0;
  for (int fd = 3; fd < 4096; ++fd) {
    sockaddr_in mine{}, theirs{};
    socklen_t a = sizeof mine, b = sizeof theirs;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &a) != 0 || mine.sin_family != AF_INET) continue;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&theirs), &b) != 0) continue;
    if (ntohs(mine.sin_port) != port && ntohs(theirs.sin_port) != port) continue;
    int keepalive = 0, idle = 0;
    unsigned user_timeout = 0;
    socklen_t n = sizeof keepalive;
    ::getsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &keepalive, &n);
    n = sizeof idle;
    ::getsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, &n);
    n = sizeof user_timeout;
    ::getsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, &n);
    EXPECT_EQ(keepalive, 1) << "fd " << fd;
    EXPECT_EQ(idle, 4) << "fd " << fd;  // a third of 12 s
    EXPECT_EQ(user_timeout, 12000u) << "fd " << fd;
    ++found;
  }
  EXPECT_EQ(found, 2) << "rank 0's accepted socket and rank 1's connection";
}

}  // namespace
}  // namespace cpf::testing
