// The rendezvous against what a buggy peer or an attacker on the network could send, played from
// loopback: nothing may hang rank 0, take a seat without the token, or abort the join; conflicts
// between real ranks still fail fast. Every case is bounded in time.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <fstream>

#include "rendezvous_test_utils.h"
#include "support/test_utils.h"

namespace cpf::testing {
namespace {

using namespace rv;

// Rank 0 of `world` on a thread, logging into `log`.
void start_root(JoinThread& root, int port, int world, LogCapture& log, std::chrono::milliseconds timeout = 5s,
                const std::string& token = kToken) {
  dist::RendezvousOptions o = options(port, 0, world, timeout, token);
  o.log = log.sink();
  root.start(o);
}

TEST(TcpRendezvousHostile, AHugeLineThatIsNeverReadCannotHoldRankZero) {
  const int port = dist::find_free_port();
  LogCapture log;
  JoinThread root, one;
  start_root(root, port, 2, log);
  const int bad = raw_connect(port);
  ASSERT_GE(bad, 0);
  EXPECT_NE(challenge_nonce(raw_line(bad)), "");
  // 8 MiB of one line; this client never reads again. Rank 0 closes it after a few KB.
  raw_send(bad, std::string(8 << 20, 'A') + "\n", 1000ms);
  one.start(options(port, 1, 2, 5s));
  root.wait();
  one.wait();
  EXPECT_EQ(root.error, "");
  EXPECT_EQ(one.error, "");
  EXPECT_LT(root.seconds, 3.0);
  const std::string logged = log.all();
  EXPECT_NE(logged.find("sent more than 256 bytes without a newline: 'AAAA"), std::string::npos) << logged;
  EXPECT_LT(logged.size(), 600u) << "the log quotes at most 80 bytes of what a connection sent";
  ::close(bad);
}

TEST(TcpRendezvousHostile, GarbageProbesAndEscapeCodesAreClosedAndTheJoinGoesOn) {
  const int port = dist::find_free_port();
  LogCapture log;
  JoinThread root;
  start_root(root, port, 3, log);
  const std::vector<std::string> junk = {"GET / HTTP/1.1\r\nHost: node0\r\n\r\n", "\x1b[2J\x1b]0;owned\x07\n",
                                         std::string("\0\xff\x01 binary\n", 11), "HELLO\n", "PING\n"};
  for (const std::string& bytes : junk) {
    const int fd = raw_connect(port);
    ASSERT_GE(fd, 0);
    const std::string challenge = raw_line(fd);
    raw_send(fd, bytes);
    EXPECT_TRUE(is_proven_error(raw_line(fd), challenge, "not a cpformer rendezvous hello"))
        << dist::rdzv::escaped(bytes);
    ::close(fd);
  }
  JoinThread one, two;
  one.start(options(port, 1, 3, 5s));
  two.start(options(port, 2, 3, 5s));
  root.wait();
  one.wait();
  two.wait();
  EXPECT_EQ(root.error, "");
  EXPECT_EQ(one.error + two.error, "");
  EXPECT_EQ(one.handle->payload(), "the-id");
  const std::string logged = log.all();
  EXPECT_EQ(log.size(), junk.size()) << logged;
  EXPECT_NE(logged.find("sent 'GET / HTTP/1.1\\x0d' instead of a hello"), std::string::npos) << logged;
  EXPECT_NE(logged.find("sent '\\x1b[2J\\x1b]0;owned\\x07' instead of a hello"), std::string::npos) << logged;
  EXPECT_EQ(logged.find('\x1b'), std::string::npos) << "raw escape codes reached the log";
}

TEST(TcpRendezvousHostile, NoSeatWithoutTheToken) {
  const int port = dist::find_free_port();
  LogCapture log;
  JoinThread root;
  start_root(root, port, 3, log);
  // An attacker claims rank 2 first, with a guessed token, and would say FAIL through the seat.
  const int attacker = raw_connect(port);
  ASSERT_GE(attacker, 0);
  const std::string challenge = raw_line(attacker);
  raw_send(attacker, hello_for(challenge, 2, 3, "not-the-token-of-this-job"));
  const std::string answer = raw_line(attacker);
  EXPECT_NE(answer.find("rank 0 rejected the hello of rank 2 from 127.0.0.1:"), std::string::npos) << answer;
  EXPECT_NE(answer.find("CPF_RENDEZVOUS_TOKEN differs"), std::string::npos) << answer;
  raw_send(attacker, "FAIL you are all aborted\n");
  JoinThread one, two;
  one.start(options(port, 1, 3, 5s));
  two.start(options(port, 2, 3, 5s));
  root.wait();
  one.wait();
  two.wait();
  EXPECT_EQ(root.error + one.error + two.error, "");
  EXPECT_EQ(two.handle->payload(), "the-id");
  EXPECT_NE(log.all().find("rejected the hello of rank 2"), std::string::npos) << log.all();
  ::close(attacker);
}

// Rank 0 cannot prove its rejection to a rank with another token (nor could a stranger on the port): the
// rank retries until its timeout and then quotes what rank 0 said; rank 0 names the rejected hellos.
TEST(TcpRendezvousHostile, RanksWithDifferentTokensAreToldWhy) {
  const int port = dist::find_free_port();
  LogCapture log;
  JoinThread root, one;
  start_root(root, port, 2, log, 1500ms);
  one.start(options(port, 1, 2, 1500ms, "another-token-of-sixteen"));
  one.wait();
  root.wait();
  EXPECT_NE(one.error.find("rank 1 could not reach rank 0 within the timeout of 1.5 s (last error: rank 0's port "
                           "answered 'ERR "),
            std::string::npos)
      << one.error;
  EXPECT_NE(one.error.find("rank 0 rejected the hello of rank 1"), std::string::npos) << one.error;
  EXPECT_NE(one.error.find("without proving the token (a rank 0 with another CPF_RENDEZVOUS_TOKEN"), std::string::npos)
      << one.error;
  EXPECT_LT(one.seconds, 12.0);
  EXPECT_NE(root.error.find("ranks [1] of 2 did not arrive within the timeout of 1.5 s"), std::string::npos)
      << root.error;
  EXPECT_NE(root.error.find("hellos rejected for a token that does not match: rank 1 from 127.0.0.1:"),
            std::string::npos)
      << root.error;
}

TEST(TcpRendezvousHostile, WrappedOrOddlySpelledNumbersAreNotAHello) {
  const int port = dist::find_free_port();
  LogCapture log;
  JoinThread root;
  start_root(root, port, 2, log);
  // 4294967297 wraps to 1 through a 32-bit int; the proof is even right for rank 1 of 3.
  for (const std::string& numbers : {"4294967297 4294967299", "+1 2", "01 2", "1  2", "-1 2", "1 2 "}) {
    const int fd = raw_connect(port);
    ASSERT_GE(fd, 0);
    const std::string challenge = raw_line(fd);
    std::string hello = hello_for(challenge, 1, 3, kToken);
    hello = "HELLO " + numbers + hello.substr(hello.find(' ', hello.find(' ', 6) + 1));
    raw_send(fd, hello);
    EXPECT_TRUE(is_proven_error(raw_line(fd), challenge, "not a cpformer rendezvous hello")) << hello;
    ::close(fd);
  }
  JoinThread one;
  one.start(options(port, 1, 2, 5s));
  root.wait();
  one.wait();
  EXPECT_EQ(root.error + one.error, "");
  EXPECT_NE(log.all().find("sent 'HELLO 4294967297 4294967299 "), std::string::npos) << log.all();
}

TEST(TcpRendezvousHostile, ConflictingProvenHellosFailFastNamingBoth) {
  const int port = dist::find_free_port();
  LogCapture log;
  JoinThread root;
  start_root(root, port, 3, log);
  const int first = raw_seat(port, 1, 3);
  const int second = raw_seat(port, 1, 3);
  root.wait();
  EXPECT_LT(root.seconds, 2.0);
  EXPECT_NE(root.error.find("two processes say they are rank 1: 127.0.0.1:"), std::string::npos) << root.error;
  EXPECT_NE(root.error.find(" and 127.0.0.1:"), std::string::npos) << root.error;
  EXPECT_NE(raw_line(second).find("two processes say they are rank 1"), std::string::npos);
  ::close(first);
  ::close(second);
}

// A pending connection costs rank 0 nothing for long: at most 64 wait, the oldest go first, and the
// log does not grow with the flood.
TEST(TcpRendezvousHostile, AFloodOfSilentConnectionsDoesNotKeepARankOut) {
  const int port = dist::find_free_port();
  LogCapture log;
  JoinThread root;
  start_root(root, port, 2, log, 10s);  // pending connections may wait 3.3 s
  std::vector<int> silent;
  for (int i = 0; i < 200; ++i) silent.push_back(raw_connect(port));
  std::this_thread::sleep_for(200ms);  // rank 0 accepts them all
  JoinThread one;
  one.start(options(port, 1, 2, 5s));
  root.wait();
  one.wait();
  EXPECT_EQ(root.error + one.error, "");
  EXPECT_NE(log.all().find("had not said hello while 64 connections waited"), std::string::npos) << log.all();
  // 136 closed: the first 20 logged one by one, then a count.
  EXPECT_GE(log.size(), 21u) << log.all();
  EXPECT_LE(log.size(), 22u) << log.all();
  EXPECT_NE(log.all().find("100 connections closed so far (the first 20 were logged one by one)"), std::string::npos);
  for (int fd : silent) ::close(fd);
}

TEST(TcpRendezvousHostile, ASilentConnectionIsClosedAfterItsTime) {
  const int port = dist::find_free_port();
  LogCapture log;
  JoinThread root;
  start_root(root, port, 2, log, 3s);  // a hello is due within timeout / 3 = 1 s
  const int fd = raw_connect(port);
  ASSERT_GE(fd, 0);
  const auto t0 = Clock::now();
  raw_drain(fd, 2500ms);  // the challenge, then the close
  const double closed_after = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_GT(closed_after, 0.9);
  EXPECT_LT(closed_after, 2.0);
  root.wait();
  EXPECT_NE(log.all().find("sent no hello within 1 s"), std::string::npos) << log.all();
  ::close(fd);
}

// A process on rank 0's port that is not this job's rank 0 cannot hand out a payload.
TEST(TcpRendezvousHostile, AFakeRankZeroIsRefusedQuickly) {
  struct Case {
    std::string answer, expected;
  };
  const std::vector<Case> cases = {
      {"OK 9223372036854775807 " + std::string(64, 'a') + "\n" + std::string(1 << 20, 'x'),
       "unexpected answer from rank 0: 'OK 9223372036854775807"},
      {"OK 6 " + std::string(64, 'a') + "\nhello!", "rank 0's answer does not prove the token"},
      {std::string(1 << 20, 'y'), "bytes without a newline from the process on that port"},
  };
  for (const Case& c : cases) {
    const int port = dist::find_free_port();
    int listener = -1;
    ASSERT_NO_FATAL_FAILURE(listen_as_rank_zero(port, listener));
    JoinThread one;
    one.start(options(port, 1, 2, 5s));
    const int fd = ::accept(listener, nullptr, nullptr);
    ASSERT_GE(fd, 0);
    raw_send(fd, "CHALLENGE cpf-rendezvous-v1 " + std::string(32, '1') + "\n");
    raw_line(fd);  // the hello
    raw_send(fd, c.answer, 1000ms);
    one.wait();
    EXPECT_NE(one.error.find(c.expected), std::string::npos) << one.error;
    EXPECT_LT(one.error.size(), 1000u);
    EXPECT_LT(one.seconds, 2.0);
    ::close(fd);
    ::close(listener);
  }
}

// Rank 0 takes the hello and vanishes (its port closed): the rank fails within a few seconds, not at its
// timeout, naming rank 0's address and what it saw.
TEST(TcpRendezvousHostile, ARankZeroThatVanishesMidJoinFailsTheRankFast) {
  const int port = dist::find_free_port();
  int listener = -1;
  ASSERT_NO_FATAL_FAILURE(listen_as_rank_zero(port, listener));
  JoinThread one;
  one.start(options(port, 1, 2, 60s));
  const int fd = ::accept(listener, nullptr, nullptr);
  ASSERT_GE(fd, 0);
  raw_send(fd, "CHALLENGE cpf-rendezvous-v1 " + std::string(32, '1') + "\n");
  raw_line(fd);  // the hello
  ::close(fd);
  ::close(listener);
  one.wait();
  EXPECT_NE(one.error.find("rendezvous on 127.0.0.1:" + std::to_string(port) +
                           ": rank 1: rank 0 answered and then vanished: its port has taken no connection for 3 s"),
            std::string::npos)
      << one.error;
  EXPECT_NE(one.error.find("before, rank 0 closed the connection before the payload"), std::string::npos) << one.error;
  EXPECT_LT(one.seconds, 6.0);
}

// A rank whose process ends after its hello, while rank 4 is still to come: rank 0 notices during the join
// and every rank seated so far is told at once (before, they waited for rank 0's timeout).
TEST(TcpRendezvousHostile, ARankThatDiesAfterItsHelloFailsEveryRank) {
  const int port = dist::find_free_port();
  LogCapture log;
  JoinThread root, one, three;
  start_root(root, port, 5, log, 20s);
  one.start(options(port, 1, 5, 20s));
  three.start(options(port, 3, 5, 20s));
  const int dying = raw_seat(port, 2, 5);  // rank 2 says hello, then its process ends
  ASSERT_GE(dying, 0);
  std::this_thread::sleep_for(500ms);
  ::close(dying);
  root.wait();
  one.wait();
  three.wait();
  const std::string expected = "rank 2 (127.0.0.1:";
  for (const std::string* error : {&root.error, &one.error, &three.error}) {
    EXPECT_NE(error->find(expected), std::string::npos) << *error;
    EXPECT_NE(error->find("closed its connection after its hello, before rank 0 sent the payload"), std::string::npos)
        << *error;
  }
  EXPECT_LT(root.seconds + one.seconds + three.seconds, 15.0);
}

}  // namespace
}  // namespace cpf::testing
