#pragma once
// The socket layer under TcpRendezvous: every read and write bounded by a deadline and a size, the
// listening and connecting sockets (IPv4 and IPv6), strict parsing of protocol words, and the escaping
// of bytes that came from the network before they reach a log or an error message.
//
// Every socket here is non-blocking: a peer that stops reading or writing can cost at most the
// deadline of the call, never a hang.
#include <sys/socket.h>

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cpf::dist::rdzv {

using Clock = std::chrono::steady_clock;

// Milliseconds left until `deadline` (0 when passed), for poll().
int remaining_ms(Clock::time_point deadline);
void close_fd(int& fd);

enum class IoStatus { ok, closed, timed_out };

// Sends every byte of `data`, waiting for the socket to take them at most until `deadline`.
IoStatus send_within(int fd, std::string_view data, Clock::time_point deadline);

// Lines off a socket, at most `max_line` bytes each (newline excluded). Scans each byte once.
class LineReader {
 public:
  explicit LineReader(size_t max_line) : max_line_(max_line) {}
  // One recv of whatever is available (the socket is non-blocking): false once the peer closed or
  // the connection broke; true otherwise, also when nothing was there.
  bool fill(int fd);
  // The next complete line, if any.
  std::optional<std::string> next_line();
  // The next line is longer than max_line bytes: the peer is not speaking the protocol.
  bool overflowed() const { return overflowed_; }
  // The first bytes of the unfinished line, for a log.
  std::string_view pending() const { return buffer_; }
  // Takes exactly n raw bytes off the front (after a header line announced them); nullopt until there.
  std::optional<std::string> take_bytes(size_t n);
  size_t buffered() const { return buffer_.size(); }
  // Bytes read from the socket earlier (by the join's reader), ahead of anything recv gives.
  void append(std::string_view bytes) {
    buffer_.append(bytes);
    scan();
  }

 private:
  void scan();
  std::string buffer_;
  size_t scanned_ = 0;  // bytes already searched for a newline
  size_t newline_ = std::string::npos;
  bool overflowed_ = false;
  size_t max_line_;
};

// Reads one line within the deadline; nullopt with `status` set when there is none.
std::optional<std::string> read_line_within(int fd, LineReader& reader, Clock::time_point deadline, IoStatus& status,
                                            bool& overflowed);
// Reads n raw bytes within the deadline.
std::optional<std::string> read_bytes_within(int fd, LineReader& reader, size_t n, Clock::time_point deadline,
                                             IoStatus& status);

// One resolved address.
struct Endpoint {
  sockaddr_storage address{};
  socklen_t length = 0;
  std::string text;  // "127.0.0.1:29500", "[::1]:29500"
  bool loopback = false;
};

// The addresses `host` resolves to (IPv4 and IPv6), with `port`; an error names the host.
std::vector<Endpoint> resolve(const std::string& host, int port, const std::string& context);
// A listening socket on the first of `endpoints` that binds; throws naming each failure.
int listen_on(const std::vector<Endpoint>& endpoints, const std::string& context, std::string& bound);
// One connection attempt to any of `endpoints`, each bounded; -1 (and `why`) when none answered.
int try_connect(const std::vector<Endpoint>& endpoints, Clock::time_point deadline, std::string& why);
// The address at the other end of a connected socket, "1.2.3.4:5678".
std::string peer_name(int fd);

// TCP keepalive and a bound on unacknowledged data, so a host that vanishes without closing its
// connections (power loss, a cut cable) is noticed by the kernel too, within about `within`.
void set_liveness_options(int fd, std::chrono::seconds within);
void set_nonblocking(int fd);

// Bytes from the network, safe to print: at most `max` of them, non-printable ones as \xHH.
std::string escaped(std::string_view bytes, size_t max = 80);
// The words of a line separated by single spaces (empty words kept, so "A  B" is three words).
std::vector<std::string_view> split_words(std::string_view line);
// A decimal integer in [low, high] with nothing else around it (no sign, spaces or overflow tricks).
std::optional<long long> parse_decimal(std::string_view text, long long low, long long high);
// Exactly `digits` lowercase hexadecimal digits.
bool is_hex(std::string_view text, size_t digits);

}  // namespace cpf::dist::rdzv
