// The rendezvous' proofs of the token (framework/distributed/rendezvous_tcp_auth.h): HMAC-SHA256 against
// RFC 4231's known answers; a hello recorded from one handshake is refused by a server with a fresh
// challenge; an error line without proof, from a stranger on rank 0's port, never aborts a join, while
// rank 0's proven errors still do; and bind "*" listens on IPv4 and IPv6 at once.
#include <gtest/gtest.h>

#include "rendezvous_test_utils.h"
#include "support/test_utils.h"

namespace cpf::testing {
namespace {

using namespace rv;
using dist::rdzv::hmac_sha256_hex;

// RFC 4231, section 4: test cases 1-4, 6 and 7 (case 5 truncates the output).
TEST(RendezvousAuth, HmacSha256KnownAnswers) {
  EXPECT_EQ(hmac_sha256_hex(std::string(20, '\x0b'), "Hi There"),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(hmac_sha256_hex("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(hmac_sha256_hex(std::string(20, '\xaa'), std::string(50, '\xdd')),
            "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  std::string key4;
  for (int b = 1; b <= 25; ++b) key4 += static_cast<char>(b);
  EXPECT_EQ(hmac_sha256_hex(key4, std::string(50, '\xcd')),
            "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  const std::string long_key(131, '\xaa');
  EXPECT_EQ(hmac_sha256_hex(long_key, "Test Using Larger Than Block-Size Key - Hash Key First"),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  EXPECT_EQ(hmac_sha256_hex(long_key,
                            "This is a test using a larger than block-size key and a larger than block-size data. The "
                            "key needs to be hashed before being used by the HMAC algorithm."),
            "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

// A hello that proved the token on one connection proves nothing on another: the challenge differs.
TEST(RendezvousAuth, ARecordedHelloIsRefusedByANewChallenge) {
  const int port = dist::find_free_port();
  LogCapture log;
  JoinThread root;
  dist::RendezvousOptions o = options(port, 0, 2, 5s);
  o.log = log.sink();
  root.start(o);
  const int first = raw_connect(port);
  ASSERT_GE(first, 0);
  const std::string recorded = hello_for(raw_line(first), 1, 2, kToken);  // valid for the first challenge
  ::close(first);
  const int replay = raw_connect(port);
  ASSERT_GE(replay, 0);
  raw_line(replay);
  raw_send(replay, recorded);
  const std::string answer = raw_line(replay);
  EXPECT_NE(answer.find("rank 0 rejected the hello of rank 1 from 127.0.0.1:"), std::string::npos) << answer;
  EXPECT_NE(answer.find("its proof of the token does not match"), std::string::npos) << answer;
  ::close(replay);
  JoinThread one;  // the real rank 1 still takes its seat
  one.start(options(port, 1, 2, 5s));
  root.wait();
  one.wait();
  EXPECT_EQ(root.error + one.error, "");
  EXPECT_NE(log.all().find("rejected the hello of rank 1"), std::string::npos) << log.all();
}

// A stranger on rank 0's port says ERR before any challenge, then after a hello with a made-up proof:
// the rank ignores both, and joins the real rank 0 once it listens there.
TEST(RendezvousAuth, AnErrorWithoutProofDoesNotAbortTheJoin) {
  const int port = dist::find_free_port();
  int listener = -1;
  ASSERT_NO_FATAL_FAILURE(listen_as_rank_zero(port, listener));
  JoinThread one;
  one.start(options(port, 1, 2, 8s));
  int fd = ::accept(listener, nullptr, nullptr);
  ASSERT_GE(fd, 0);
  raw_send(fd, "ERR you are all aborted\n");
  ::close(fd);
  fd = ::accept(listener, nullptr, nullptr);
  ASSERT_GE(fd, 0);
  raw_send(fd, "CHALLENGE cpf-rendezvous-v1 " + std::string(32, '1') + "\n");
  raw_line(fd);  // the hello
  raw_send(fd, "ERR " + std::string(64, 'a') + " abort now\n");
  ::close(fd);
  ::close(listener);
  JoinThread root;
  root.start(options(port, 0, 2, 8s));
  root.wait();
  one.wait();
  EXPECT_EQ(root.error + one.error, "");
  ASSERT_TRUE(one.handle);
  EXPECT_EQ(one.handle->payload(), "the-id");
}

// Without a token nothing can be proven: an error line aborts as before (loopback only).
TEST(RendezvousAuth, WithoutATokenAnErrorLineStillAborts) {
  const int port = dist::find_free_port();
  int listener = -1;
  ASSERT_NO_FATAL_FAILURE(listen_as_rank_zero(port, listener));
  JoinThread one;
  one.start(options(port, 1, 2, 5s, ""));
  const int fd = ::accept(listener, nullptr, nullptr);
  ASSERT_GE(fd, 0);
  raw_send(fd, "ERR rank 0 gave up\n");
  one.wait();
  EXPECT_EQ(one.error.rfind("rank 0 gave up", 0), 0u) << one.error;
  EXPECT_LT(one.seconds, 2.0);
  ::close(fd);
  ::close(listener);
}

// bind "*": one dual-stack socket, reachable over IPv4 and IPv6 (the first resolved address only, before).
TEST(RendezvousAuth, StarListensOnIPv4AndIPv6) {
  if (!has_ipv6_loopback()) GTEST_SKIP() << "no IPv6 loopback on this machine";
  const int port = dist::find_free_port();
  dist::RendezvousOptions o = options(port, 0, 2, 1500ms);
  o.bind = "*";
  JoinThread root;
  root.start(o);
  for (const char* host : {"127.0.0.1", "::1"}) {
    const int fd = raw_connect(port, host);
    ASSERT_GE(fd, 0) << host;
    EXPECT_NE(challenge_nonce(raw_line(fd)), "") << host;
    ::close(fd);
  }
  root.wait();
}

}  // namespace
}  // namespace cpf::testing
