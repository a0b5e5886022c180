#include "framework/distributed/rendezvous_tcp_wire.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

#include "framework/core/error.h"

namespace cpf::dist::rdzv {

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  // Rounded up, so a deadline less than 1 ms away is still waited for rather than spun on.
  return static_cast<int>(std::clamp<long long>(left + 1, 0, 1'000'000));
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

IoStatus send_within(int fd, std::string_view data, Clock::time_point deadline) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return IoStatus::closed;
    if (Clock::now() >= deadline) return IoStatus::timed_out;
    pollfd p{fd, POLLOUT, 0};
    const int ready = ::poll(&p, 1, remaining_ms(deadline));
    if (ready < 0 && errno != EINTR) return IoStatus::closed;
    if (ready > 0 && (p.revents & (POLLERR | POLLHUP | POLLNVAL))) return IoStatus::closed;
  }
  return IoStatus::ok;
}

bool LineReader::fill(int fd) {
  char chunk[4096];
  while (true) {
    const ssize_t n = ::recv(fd, chunk, sizeof chunk, MSG_DONTWAIT);
    if (n > 0) {
      buffer_.append(chunk, static_cast<size_t>(n));
      scan();
      return true;
    }
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
}

void LineReader::scan() {
  if (newline_ != std::string::npos) return;
  const size_t found = buffer_.find('\n', scanned_);
  if (found == std::string::npos) {
    scanned_ = buffer_.size();
    overflowed_ = buffer_.size() > max_line_;
  } else {
    newline_ = found;
    overflowed_ = found > max_line_;
  }
}

std::optional<std::string> LineReader::next_line() {
  if (newline_ == std::string::npos || overflowed_) return std::nullopt;
  std::string line = buffer_.substr(0, newline_);
  buffer_.erase(0, newline_ + 1);
  scanned_ = 0;
  newline_ = std::string::npos;
  scan();
  return line;
}

std::optional<std::string> LineReader::take_bytes(size_t n) {
  if (buffer_.size() < n) return std::nullopt;
  std::string bytes = buffer_.substr(0, n);
  buffer_.erase(0, n);
  scanned_ = 0;
  newline_ = std::string::npos;
  overflowed_ = false;
  scan();
  return bytes;
}

// Waits until `fd` is readable or the deadline passes; false on timeout.
static bool wait_readable(int fd, Clock::time_point deadline) {
  while (true) {
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, remaining_ms(deadline));
    if (ready < 0 && errno == EINTR) continue;
    return ready > 0;
  }
}

// Waits for bytes and reads them into `reader`; false (status timed_out or closed) when none can come.
static bool fill_within(int fd, LineReader& reader, Clock::time_point deadline, IoStatus& status) {
  if (!wait_readable(fd, deadline)) {
    status = IoStatus::timed_out;
    return false;
  }
  if (!reader.fill(fd)) {
    status = IoStatus::closed;
    return false;
  }
  return true;
}

std::optional<std::string> read_line_within(int fd, LineReader& reader, Clock::time_point deadline, IoStatus& status,
                                            bool& overflowed) {
  overflowed = false;
  while (true) {
    if (auto line = reader.next_line()) {
      status = IoStatus::ok;
      return line;
    }
    if (reader.overflowed()) {
      overflowed = true;
      status = IoStatus::ok;
      return std::nullopt;
    }
    if (!fill_within(fd, reader, deadline, status)) return std::nullopt;
  }
}

std::optional<std::string> read_bytes_within(int fd, LineReader& reader, size_t n, Clock::time_point deadline,
                                             IoStatus& status) {
  while (true) {
    if (auto bytes = reader.take_bytes(n)) {
      status = IoStatus::ok;
      return bytes;
    }
    if (!fill_within(fd, reader, deadline, status)) return std::nullopt;
  }
}

static std::string address_text(const sockaddr* a) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (a->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(a);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    port = ntohs(in->sin_port);
    return str_cat(host, ":", port);
  }
  if (a->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(a);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
    port = ntohs(in6->sin6_port);
    return str_cat("[", host, "]:", port);
  }
  return "?";
}

static bool is_loopback(const sockaddr* a) {
  if (a->sa_family == AF_INET) {
    return (ntohl(reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr) >> 24) == 127;
  }
  if (a->sa_family == AF_INET6) {
    const in6_addr& v6 = reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

std::vector<Endpoint> resolve(const std::string& host, int port, const std::string& context) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  // "*" means every interface; getaddrinfo's passive form gives both wildcards.
  const bool any = host == "*";
  if (any) hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int gai = ::getaddrinfo(any ? nullptr : host.c_str(), service.c_str(), &hints, &found);
  CPF_CHECK(gai == 0, context, ": cannot resolve '", host, "': ", gai_strerror(gai),
            " (check MASTER_ADDR; IPv6 addresses are written without brackets, e.g. ::1)");
  std::vector<Endpoint> endpoints;
  for (addrinfo* a = found; a; a = a->ai_next) {
    if (a->ai_family != AF_INET && a->ai_family != AF_INET6) continue;
    Endpoint e;
    std::memcpy(&e.address, a->ai_addr, a->ai_addrlen);
    e.length = a->ai_addrlen;
    e.text = address_text(a->ai_addr);
    e.loopback = is_loopback(a->ai_addr);
    endpoints.push_back(e);
  }
  ::freeaddrinfo(found);
  CPF_CHECK(!endpoints.empty(), context, ": '", host, "' resolves to no IPv4 or IPv6 address");
  return endpoints;
}

// The IPv6 wildcard (::), which a dual-stack socket turns into every IPv4 and IPv6 interface.
bool is_ipv6_any(const Endpoint& e) {
  if (e.address.ss_family != AF_INET6) return false;
  const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&e.address);
  return std::memcmp(&in6->sin6_addr, &in6addr_any, sizeof in6addr_any) == 0;
}

int listen_on(const std::vector<Endpoint>& endpoints_in, const std::string& context, std::string& bound) {
  // "*" resolves to 0.0.0.0 and :: (in the resolver's order): the dual-stack :: first, so one socket
  // listens on both families; 0.0.0.0 stays the fallback on a host without IPv6.
  std::vector<Endpoint> endpoints = endpoints_in;
  std::stable_partition(endpoints.begin(), endpoints.end(), is_ipv6_any);
  std::string failures;
  for (const Endpoint& e : endpoints) {
    const int fd = ::socket(e.address.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      failures += str_cat(failures.empty() ? "" : "; ", e.text, ": socket: ", std::strerror(errno));
      continue;
    }
    const int one = 1, zero = 0;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (is_ipv6_any(e)) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    if (::bind(fd, reinterpret_cast<const sockaddr*>(&e.address), e.length) == 0 && ::listen(fd, 128) == 0) {
      bound = e.text;
      return fd;
    }
    const int err = errno;
    ::close(fd);
    failures += str_cat(failures.empty() ? "" : "; ", e.text, ": ", std::strerror(err),
                        err == EADDRINUSE ? " (another job uses it: pick another MASTER_PORT)" : "",
                        err == EADDRNOTAVAIL ? " (not an address of this host: check MASTER_ADDR)" : "");
  }
  CPF_FAIL(context, ": rank 0 cannot listen: ", failures);
}

int try_connect(const std::vector<Endpoint>& endpoints, Clock::time_point deadline, std::string& why) {
  for (const Endpoint& e : endpoints) {
    int fd = ::socket(e.address.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&e.address), e.length);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      rc = ::poll(&p, 1, std::min(remaining_ms(deadline), 2000)) == 1 ? 0 : -1;
      if (rc != 0) errno = ETIMEDOUT;
      int err = 0;
      socklen_t len = sizeof err;
      if (rc == 0 && (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0)) {
        errno = err;
        rc = -1;
      }
    }
    if (rc == 0) {
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return fd;
    }
    why = str_cat(e.text, ": ", std::strerror(errno));
    ::close(fd);
  }
  return -1;
}

std::string peer_name(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return "(unknown peer)";
  return address_text(reinterpret_cast<const sockaddr*>(&a));
}

void set_liveness_options(int fd, std::chrono::seconds within) {
  const int total = static_cast<int>(std::max<long long>(within.count(), 3));
  const int one = 1, idle = std::max(1, total / 3), interval = std::max(1, total / 6), count = 4;
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
  // Data sent but unacknowledged this long breaks the connection (keepalive alone waits for idleness).
  const unsigned user_timeout_ms = static_cast<unsigned>(total) * 1000u;
  ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof user_timeout_ms);
}

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

std::string escaped(std::string_view bytes, size_t max) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < bytes.size() && i < max; ++i) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  if (bytes.size() > max) out += str_cat("... (", bytes.size(), " bytes)");
  return out;
}

std::vector<std::string_view> split_words(std::string_view line) {
  std::vector<std::string_view> words;
  size_t start = 0;
  while (true) {
    const size_t space = line.find(' ', start);
    words.push_back(line.substr(start, space == std::string_view::npos ? std::string_view::npos : space - start));
    if (space == std::string_view::npos) return words;
    start = space + 1;
  }
}

std::optional<long long> parse_decimal(std::string_view text, long long low, long long high) {
  if (text.empty() || text.size() > 18 || text[0] < '0' || text[0] > '9') return std::nullopt;
  if (text.size() > 1 && text[0] == '0') return std::nullopt;  // one spelling per number
  long long value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value < low || value > high) return std::nullopt;
  return value;
}

bool is_hex(std::string_view text, size_t digits) {
  return text.size() == digits &&
         std::all_of(text.begin(), text.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

}  // namespace cpf::dist::rdzv
