// Rank 0's side of the join: accept, challenge, check each hello, seat the ranks, deliver the payload.
// Nothing a connection sends can block rank 0 or end the join, except a hello that proves the token
// and conflicts with the job (then every rank fails, as it must).
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <optional>
#include <thread>

#include "framework/core/error.h"
#include "framework/distributed/rendezvous_tcp_auth.h"
#include "framework/distributed/rendezvous_tcp_join.h"

namespace cpf::dist::rdzv {
namespace {

using namespace std::chrono_literals;

double seconds_of(std::chrono::milliseconds ms) { return static_cast<double>(ms.count()) / 1000.0; }

// A flood of bad connections must not flood the log: the first ones one by one, then a count.
constexpr size_t kLoggedClosures = 20;
constexpr size_t kListedRejections = 8;

class HostJoin {
 public:
  explicit HostJoin(const JoinSetup& setup)
      : s_(setup), world_(setup.options.world_size), seats_(static_cast<size_t>(world_)) {}
  ~HostJoin();
  std::vector<int> run();

 private:
  struct Pending {
    int fd = -1;
    std::string peer;
    std::string nonce;  // the challenge this connection must answer
    LineReader reader{kMaxHelloLine};
    Clock::time_point since;
  };
  struct Seat {
    int fd = -1;
    std::string peer;
    std::string server_nonce, client_nonce;
  };

  void accept_new();
  bool accept_failed(int err);
  void admit(int fd);
  void serve(Pending& p);
  void on_hello(Pending& p, const std::string& line);
  void seat_or_fail(Pending& p, int rank, int size, const std::string& client_nonce);
  void drop(Pending& p, const std::string& what, bool tell);
  void log_closed(const std::string& message);
  // "ERR <text>", or with a token "ERR <proof> <text>" (error_mac: client_nonce "-" before the hello).
  std::string error_line(const std::string& server_nonce, const std::string& client_nonce,
                         const std::string& text) const;
  void expire_pending();
  std::string missing_message() const;
  void check_seat(int rank);  // a seated rank's connection turned readable during the join
  void deliver();
  [[noreturn]] void fail_everyone();

  const JoinSetup& s_;
  const int world_;
  int listener_ = -1;
  std::string bound_;  // the address rank 0 listens on
  std::vector<Pending> pending_;
  std::vector<Seat> seats_;
  int arrived_ = 1;
  std::string error_;
  std::vector<std::string> rejected_;  // the first hellos that failed the proof, for the timeout message
  size_t rejected_count_ = 0;
  size_t closed_count_ = 0;  // connections closed during the join, for the log's rate limit
  Clock::time_point accept_paused_until_{};
  std::string accept_trouble_;  // why accept() failed, for the log (once) and the timeout message
};

HostJoin::~HostJoin() {
  close_fd(listener_);
  for (Pending& p : pending_) close_fd(p.fd);
  for (Seat& seat : seats_) close_fd(seat.fd);
}

std::vector<int> HostJoin::run() {
  listener_ = listen_on(s_.endpoints, s_.where, bound_);
  while (arrived_ < world_ && error_.empty() && Clock::now() < s_.deadline) {
    const bool accepting = Clock::now() >= accept_paused_until_;
    std::vector<pollfd> polls{{accepting ? listener_ : -1, POLLIN, 0}};
    for (const Pending& p : pending_) polls.push_back({p.fd, POLLIN, 0});
    for (const Seat& seat : seats_) polls.push_back({seat.fd, POLLIN, 0});  // -1 (empty seats) is skipped
    const int ready = ::poll(polls.data(), polls.size(), std::min(remaining_ms(s_.deadline), 100));
    if (ready < 0 && errno != EINTR) CPF_FAIL(s_.where, ": poll failed: ", std::strerror(errno));
    for (size_t i = 1; i <= pending_.size() && error_.empty(); ++i) {
      if (polls[i].revents) serve(pending_[i - 1]);
    }
    for (size_t r = 0; r < seats_.size() && error_.empty(); ++r) {
      if (polls[1 + pending_.size() + r].revents) check_seat(static_cast<int>(r));
    }
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [](const Pending& p) { return p.fd < 0; }),
                   pending_.end());
    expire_pending();
    if (error_.empty() && (polls[0].revents & POLLIN)) accept_new();
  }
  if (error_.empty() && arrived_ < world_) error_ = missing_message();
  // Every seat still there before anyone gets the payload: a rank gone meanwhile fails the join for all.
  for (int r = 1; r < world_ && error_.empty(); ++r) check_seat(r);
  if (!error_.empty()) fail_everyone();
  deliver();
  close_fd(listener_);
  std::vector<int> fds(static_cast<size_t>(world_), -1);
  for (int r = 1; r < world_; ++r) std::swap(fds[static_cast<size_t>(r)], seats_[static_cast<size_t>(r)].fd);
  return fds;
}

void HostJoin::accept_new() {
  for (int i = 0; i < 16; ++i) {  // what waits in the backlog, a bounded batch per round
    const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) {
      admit(fd);
      continue;
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (!accept_failed(errno)) return;
  }
}

// False when accept() has nothing more now. Running out of descriptors leaves the connection in the
// backlog, so the listener stays readable: pause accepting rather than spin on it.
bool HostJoin::accept_failed(int err) {
  if (err == EAGAIN || err == EWOULDBLOCK) return false;
  accept_paused_until_ = Clock::now() + 100ms;
  if (accept_trouble_.empty()) {
    const bool fds = err == EMFILE || err == ENFILE;
    accept_trouble_ =
        str_cat("rank 0 could not accept connections: ", std::strerror(err),
                fds ? " (file descriptors exhausted: raise `ulimit -n`)" : "", "; it retried every 100 ms");
    s_.log(str_cat(s_.where, ": ", accept_trouble_));
  }
  return false;
}

void HostJoin::admit(int fd) {
  Pending p;
  p.fd = fd;
  p.peer = peer_name(fd);
  p.since = Clock::now();
  if (pending_.size() >= kMaxPending) {  // the oldest goes: a flood cannot keep a real rank out for long
    auto oldest = std::min_element(pending_.begin(), pending_.end(),
                                   [](const Pending& a, const Pending& b) { return a.since < b.since; });
    drop(*oldest, str_cat("had not said hello while ", kMaxPending, " connections waited"), false);
    pending_.erase(oldest);
  }
  p.nonce = random_hex(kNonceHexDigits / 2);
  const std::string challenge = str_cat("CHALLENGE ", kProtocol, " ", p.nonce, "\n");
  if (send_within(fd, challenge, Clock::now() + 1s) != IoStatus::ok) {
    close_fd(p.fd);
    return;
  }
  pending_.push_back(std::move(p));
}

void HostJoin::serve(Pending& p) {
  if (!p.reader.fill(p.fd)) {  // gone before saying hello
    close_fd(p.fd);
    return;
  }
  if (p.reader.overflowed()) {
    drop(p, str_cat("sent more than ", kMaxHelloLine, " bytes without a newline: '", escaped(p.reader.pending()), "'"),
         true);
    return;
  }
  if (std::optional<std::string> line = p.reader.next_line()) on_hello(p, *line);
}

void HostJoin::on_hello(Pending& p, const std::string& line) {
  const std::vector<std::string_view> w = split_words(line);
  std::optional<long long> rank, size;
  if (w.size() == 5 && w[0] == "HELLO") {
    rank = parse_decimal(w[1], 0, INT_MAX);
    size = parse_decimal(w[2], 1, INT_MAX);
  }
  if (!rank || !size || !is_hex(w[3], kNonceHexDigits) || !is_hex(w[4], kMacHexDigits)) {
    drop(p, str_cat("sent '", escaped(line), "' instead of a hello"), true);
    return;
  }
  const std::string client_nonce(w[3]);
  const std::string expected = hello_mac(s_.options.token, p.nonce, client_nonce, int(*rank), int(*size));
  if (!macs_equal(expected, w[4])) {
    const std::string what = str_cat("rank ", *rank, " from ", p.peer);
    if (rejected_.size() < kListedRejections) rejected_.push_back(what);
    ++rejected_count_;
    const std::string why =
        str_cat(s_.where, ": rank 0 rejected the hello of ", what,
                ": its proof of the token does not match (CPF_RENDEZVOUS_TOKEN differs between that rank and rank 0, "
                "or is set on one of them only)");
    log_closed(why);
    send_within(p.fd, error_line(p.nonce, client_nonce, why), Clock::now() + 200ms);
    close_fd(p.fd);
    return;
  }
  seat_or_fail(p, static_cast<int>(*rank), static_cast<int>(*size), client_nonce);
}

// A hello that proves the token comes from this job: a conflict is a launch error, fatal to all.
void HostJoin::seat_or_fail(Pending& p, int rank, int size, const std::string& client_nonce) {
  if (size != world_) {
    error_ = str_cat(s_.where, ": rank ", rank, " (", p.peer, ") says the world has ", size, " ranks but rank 0 has ",
                     world_, " (WORLD_SIZE differs between processes)");
  } else if (rank <= 0 || rank >= world_) {
    error_ = str_cat(s_.where, ": a peer (", p.peer, ") says it is rank ", rank, ", not in 1..", world_ - 1);
  } else if (seats_[static_cast<size_t>(rank)].fd >= 0) {
    error_ = str_cat(s_.where, ": two processes say they are rank ", rank, ": ", seats_[static_cast<size_t>(rank)].peer,
                     " and ", p.peer, " (RANK differs between them?)");
  } else {
    seats_[static_cast<size_t>(rank)] = {p.fd, p.peer, p.nonce, client_nonce};
    p.fd = -1;
    ++arrived_;
  }
}

// Closes a connection that is not a rank of this job; the join goes on.
void HostJoin::drop(Pending& p, const std::string& what, bool tell) {
  log_closed(str_cat(s_.where, ": closed the connection from ", p.peer, ", which ", what, "; the rendezvous goes on"));
  if (tell) send_within(p.fd, error_line(p.nonce, "-", "not a cpformer rendezvous hello"), Clock::now());
  close_fd(p.fd);
}

std::string HostJoin::error_line(const std::string& server_nonce, const std::string& client_nonce,
                                 const std::string& text) const {
  if (s_.options.token.empty()) return "ERR " + text + "\n";
  return str_cat("ERR ", error_mac(s_.options.token, server_nonce, client_nonce, text), " ", text, "\n");
}

void HostJoin::log_closed(const std::string& message) {
  ++closed_count_;
  if (closed_count_ <= kLoggedClosures) {
    s_.log(message);
  } else if (closed_count_ % 100 == 0) {
    s_.log(str_cat(s_.where, ": ", closed_count_, " connections closed so far (the first ", kLoggedClosures,
                   " were logged one by one)"));
  }
}

void HostJoin::expire_pending() {
  const auto now = Clock::now();
  const auto limit = std::clamp<std::chrono::milliseconds>(s_.options.timeout / 3, 1s, kMaxPendingTime);
  for (Pending& p : pending_) {
    if (p.fd >= 0 && now - p.since > limit) {
      drop(p, str_cat("sent no hello within ", seconds_of(limit), " s"), false);
    }
  }
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [](const Pending& p) { return p.fd < 0; }),
                 pending_.end());
}

std::string HostJoin::missing_message() const {
  std::vector<int> missing;
  for (int r = 1; r < world_; ++r) {
    if (seats_[static_cast<size_t>(r)].fd < 0) missing.push_back(r);
  }
  std::string text = str_cat(s_.where, ": ranks ", missing, " of ", world_, " did not arrive within the timeout of ",
                             seconds_of(s_.options.timeout), " s (rank 0 listened on ", bound_,
                             "; did they start, with the same MASTER_ADDR and MASTER_PORT?)");
  const bool local_name =
      s_.options.host == "localhost" || s_.options.host.rfind("127.", 0) == 0 || s_.options.host == "::1";
  if (s_.endpoints.front().loopback && !local_name && s_.options.bind.empty()) {
    text += str_cat("; '", s_.options.host, "' resolves to a loopback address on rank 0's host, which ",
                    "ranks on other hosts cannot reach: set MASTER_ADDR to an address they reach, or ",
                    "CPF_RENDEZVOUS_BIND=0.0.0.0");
  }
  if (!rejected_.empty()) {
    text += "; hellos rejected for a token that does not match: ";
    for (size_t i = 0; i < rejected_.size(); ++i) text += (i ? ", " : "") + rejected_[i];
    if (rejected_count_ > rejected_.size()) text += str_cat(" and ", rejected_count_ - rejected_.size(), " more");
  }
  if (!accept_trouble_.empty()) text += "; " + accept_trouble_;
  return text;
}

// A seated rank says nothing until the payload: its connection turning readable means it closed (its
// process ended) or it misbehaves. Either is fatal to the join, and every rank is told (fail_everyone).
void HostJoin::check_seat(int rank) {
  Seat& seat = seats_[static_cast<size_t>(rank)];
  if (seat.fd < 0) return;
  char byte = 0;
  const ssize_t got = ::recv(seat.fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  error_ = got > 0 ? str_cat(s_.where, ": rank ", rank, " (", seat.peer,
                             ") sent data after its hello, before rank 0 sent the payload (not a cpformer rank?)")
                   : str_cat(s_.where, ": rank ", rank, " (", seat.peer,
                             ") closed its connection after its hello, before rank 0 sent the payload (did its "
                             "process fail? see its log)");
  close_fd(seat.fd);
}

void HostJoin::deliver() {
  // Sends are bounded: past the deadline a rank still gets a moment, since it waits a little longer.
  const auto until = std::max(s_.deadline, Clock::now() + 2s);
  const std::string& payload = s_.options.payload;
  for (int r = 1; r < world_; ++r) {
    Seat& seat = seats_[static_cast<size_t>(r)];
    const std::string mac = answer_mac(s_.options.token, seat.server_nonce, seat.client_nonce, r, world_, payload);
    const std::string message = str_cat("OK ", payload.size(), " ", mac, "\n") + payload;
    const IoStatus sent = send_within(seat.fd, message, until);
    CPF_CHECK(sent == IoStatus::ok, s_.where, ": rank ", r, " (", seat.peer, ") did not take the payload: ",
              sent == IoStatus::closed ? "its connection closed" : "it does not read its connection");
  }
}

void HostJoin::fail_everyone() {
  // Each connection gets the error in one bounded try (a peer that does not read is not waited for).
  std::string text = error_.substr(0, kMaxAnswerLine - 64);
  std::replace(text.begin(), text.end(), '\n', ' ');
  const auto until = Clock::now() + 500ms;
  for (Seat& seat : seats_) {
    if (seat.fd >= 0) send_within(seat.fd, error_line(seat.server_nonce, seat.client_nonce, text), until);
  }
  for (Pending& p : pending_) {
    if (p.fd >= 0) send_within(p.fd, error_line(p.nonce, "-", text), until);
  }
  CPF_FAIL(error_);
}

}  // namespace

std::vector<int> host_join(const JoinSetup& setup) { return HostJoin(setup).run(); }

}  // namespace cpf::dist::rdzv
