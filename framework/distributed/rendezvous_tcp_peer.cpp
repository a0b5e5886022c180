// A rank other than 0 joining: reach rank 0, answer its challenge, check that its answer proves the
// token, take the payload. Whatever the other end sends is bounded in size and time.
#include <algorithm>
#include <thread>

#include "framework/core/error.h"
#include "framework/distributed/rendezvous_tcp_auth.h"
#include "framework/distributed/rendezvous_tcp_join.h"

namespace cpf::dist::rdzv {
namespace {

using namespace std::chrono_literals;

double seconds_of(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Rank 0 reports missing ranks at its own deadline: a rank waits this much longer for that message.
constexpr auto kAnswerGrace = 10s;
// Once rank 0 has answered, its port taking no connection for this long means it is gone (a flooded rank
// 0 closes connections, but its port still accepts them).
constexpr auto kVanishedGrace = 3s;

enum class Attempt { joined, retry };

class PeerJoin {
 public:
  explicit PeerJoin(const JoinSetup& setup) : s_(setup), rank_(setup.options.rank) {}
  int run(std::string& payload, std::string& leftover);

 private:
  Attempt handshake(int fd, std::string& payload, std::string& leftover);
  std::optional<std::string> read_line(int fd, LineReader& reader, const char* waiting_for);
  // False (why_ says so) for an error line that may not abort the join: one without proof of the token.
  bool check_challenge(const std::string& line, std::string& server_nonce);
  // An "ERR ..." line: throws its text when it may abort the join (no token set, or its proof holds);
  // otherwise notes it in why_ and returns (the join retries).
  void on_error_line(const std::string& line, const std::string& server_nonce, const std::string& client_nonce);
  Attempt take_answer(int fd, LineReader& reader, const std::string& server_nonce, const std::string& client_nonce,
                      std::string& payload);

  const JoinSetup& s_;
  const int rank_;
  std::string why_ = "no attempt";  // the last reason an attempt did not join
  std::string closed_;              // set when rank 0 once closed a connection before answering (did it fail?)
  IoStatus last_status_ = IoStatus::ok;
  bool unproven_error_ = false;  // the last attempt ended on an error without proof: retry more slowly
  bool reached_ = false;         // rank 0 sent a challenge once: it was running
};

int PeerJoin::run(std::string& payload, std::string& leftover) {
  std::optional<Clock::time_point> unreachable_since;  // since when rank 0's port, once reached, takes nothing
  while (Clock::now() < s_.deadline) {
    int fd = try_connect(s_.endpoints, s_.deadline, why_);
    if (fd >= 0) {
      unreachable_since.reset();
      if (handshake(fd, payload, leftover) == Attempt::joined) return fd;
      close_fd(fd);
    } else if (reached_) {
      if (!unreachable_since) unreachable_since = Clock::now();
      CPF_CHECK(Clock::now() - *unreachable_since < kVanishedGrace, s_.where, ": rank ", rank_,
                ": rank 0 answered and then vanished: its port has taken no connection for ",
                std::chrono::duration_cast<std::chrono::seconds>(kVanishedGrace).count(), " s (", why_,
                closed_.empty() ? "" : "; before, " + closed_,
                "); did rank 0 fail? Its log says why; the other ranks stop the same way");
    }
    // An unproven error comes from a rank 0 with another token or from a stranger on the port: neither
    // answers differently at once, so the retries do not flood it.
    std::this_thread::sleep_for(unproven_error_ ? 500ms : 50ms);
    unproven_error_ = false;
  }
  CPF_FAIL(s_.where, ": rank ", rank_, " could not reach rank 0 within the timeout of ", seconds_of(s_.options.timeout),
           " s (last error: ", why_,
           closed_.empty() || closed_ == why_ ? "" : "; earlier, " + closed_ + ": did rank 0 fail?",
           "); is rank 0 running, and do all ranks use the same MASTER_ADDR and MASTER_PORT?");
}

// A closed connection before rank 0 answered is retried: rank 0 drops waiting connections when
// flooded, and its listener can outlive it for a moment. An answer that rank 0 gives is final.
Attempt PeerJoin::handshake(int fd, std::string& payload, std::string& leftover) {
  LineReader reader(kMaxAnswerLine);
  std::optional<std::string> line = read_line(fd, reader, "its challenge");
  if (!line) return Attempt::retry;
  std::string server_nonce;
  if (!check_challenge(*line, server_nonce)) return Attempt::retry;
  const std::string client_nonce = random_hex(kNonceHexDigits / 2);
  const std::string mac = hello_mac(s_.options.token, server_nonce, client_nonce, rank_, s_.options.world_size);
  const std::string hello = str_cat("HELLO ", rank_, " ", s_.options.world_size, " ", client_nonce, " ", mac, "\n");
  if (send_within(fd, hello, s_.deadline + kAnswerGrace) != IoStatus::ok) {
    why_ = "the connection broke while saying hello";
    closed_ = why_;
    return Attempt::retry;
  }
  const Attempt attempt = take_answer(fd, reader, server_nonce, client_nonce, payload);
  if (attempt == Attempt::joined) leftover = *reader.take_bytes(reader.buffered());
  return attempt;
}

std::optional<std::string> PeerJoin::read_line(int fd, LineReader& reader, const char* waiting_for) {
  bool overflowed = false;
  std::optional<std::string> line = read_line_within(fd, reader, s_.deadline + kAnswerGrace, last_status_, overflowed);
  CPF_CHECK(!overflowed, s_.where, ": rank ", rank_, " got more than ", kMaxAnswerLine,
            " bytes without a newline from the process on that port while waiting for ", waiting_for, ": '",
            escaped(reader.pending()), "' (is it a cpformer rendezvous?)");
  CPF_CHECK(last_status_ != IoStatus::timed_out, s_.where, ": rank ", rank_, " got no answer from rank 0 within ",
            seconds_of(s_.options.timeout + kAnswerGrace), " s (the timeout of ", seconds_of(s_.options.timeout),
            " s plus ", kAnswerGrace.count(), " s for rank 0's report) while waiting for ", waiting_for);
  if (!line) closed_ = why_ = str_cat("rank 0 closed the connection before ", waiting_for);
  return line;
}

bool PeerJoin::check_challenge(const std::string& line, std::string& server_nonce) {
  if (line.rfind("ERR ", 0) == 0) {
    // Before the challenge nothing can prove the token: with one set, such a line never aborts the join.
    if (s_.options.token.empty()) CPF_FAIL(escaped(std::string_view(line).substr(4), kMaxAnswerLine));
    why_ = str_cat("the process on rank 0's port sent '", escaped(line, kMaxAnswerLine),
                   "' before any challenge, which cannot prove the token (ignored)");
    unproven_error_ = true;
    return false;
  }
  const std::vector<std::string_view> w = split_words(line);
  const bool ok = w.size() == 3 && w[0] == "CHALLENGE" && w[1] == kProtocol && is_hex(w[2], kNonceHexDigits);
  CPF_CHECK(ok, s_.where, ": the process on that port is not a cpformer rendezvous of this version (it sent '",
            escaped(line), "'; expected 'CHALLENGE ", kProtocol, " <nonce>')");
  server_nonce = std::string(w[2]);
  reached_ = true;
  return true;
}

void PeerJoin::on_error_line(const std::string& line, const std::string& server_nonce,
                             const std::string& client_nonce) {
  const std::string_view rest = std::string_view(line).substr(4);
  if (s_.options.token.empty()) CPF_FAIL(escaped(rest, kMaxAnswerLine));
  // "ERR <proof> <text>": the proof covers this handshake's nonces (the client's "-" when rank 0 wrote it
  // before it read this rank's hello).
  const size_t space = rest.find(' ');
  const std::string_view proof = rest.substr(0, space);
  const std::string_view text = space == std::string_view::npos ? std::string_view() : rest.substr(space + 1);
  if (is_hex(proof, kMacHexDigits)) {
    for (const char* client : {client_nonce.c_str(), "-"}) {
      if (macs_equal(error_mac(s_.options.token, server_nonce, client, text), proof)) {
        CPF_FAIL(escaped(text, kMaxAnswerLine));
      }
    }
  }
  why_ = str_cat("rank 0's port answered '", escaped(line, kMaxAnswerLine),
                 "' without proving the token (a rank 0 with another CPF_RENDEZVOUS_TOKEN, or not this job's rank 0)");
  unproven_error_ = true;
}

Attempt PeerJoin::take_answer(int fd, LineReader& reader, const std::string& server_nonce,
                              const std::string& client_nonce, std::string& payload) {
  const std::optional<std::string> line = read_line(fd, reader, "the payload");
  if (!line) return Attempt::retry;
  if (line->rfind("ERR ", 0) == 0) {
    on_error_line(*line, server_nonce, client_nonce);
    return Attempt::retry;
  }
  const std::vector<std::string_view> w = split_words(*line);
  std::optional<long long> size;
  if (w.size() == 3 && w[0] == "OK" && is_hex(w[2], kMacHexDigits)) {
    size = parse_decimal(w[1], 0, static_cast<long long>(kMaxPayload));
  }
  CPF_CHECK(size.has_value(), s_.where, ": unexpected answer from rank 0: '", escaped(*line),
            "' (expected 'OK <size up to ", kMaxPayload, "> <proof>')");
  std::optional<std::string> bytes =
      read_bytes_within(fd, reader, static_cast<size_t>(*size), s_.deadline + kAnswerGrace, last_status_);
  CPF_CHECK(bytes.has_value(), s_.where, ": rank ", rank_,
            " lost the connection to rank 0 while receiving the payload");
  const std::string expected =
      answer_mac(s_.options.token, server_nonce, client_nonce, rank_, s_.options.world_size, *bytes);
  CPF_CHECK(macs_equal(expected, w[2]), s_.where,
            ": rank 0's answer does not prove the token: ", "CPF_RENDEZVOUS_TOKEN differs between rank ", rank_,
            " and rank 0 (or is set on one of them only), or the process on that port is not this job's rank 0");
  payload = std::move(*bytes);
  return Attempt::joined;
}

}  // namespace

int peer_join(const JoinSetup& setup, std::string& payload, std::string& leftover) {
  return PeerJoin(setup).run(payload, leftover);
}

}  // namespace cpf::dist::rdzv
