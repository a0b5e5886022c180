// A token shard cut short while `cpformer train` reads it: the run stops with an error naming the
// shard (memory-mapped reads used to end the process with SIGBUS and no message).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <future>
#include <thread>
#include <vector>

#include "tests/apps/cli_support.h"

namespace cpf::trainer {
namespace {

namespace fs = std::filesystem;
using testing::run;
using testing::scratch_dir;
using testing::write_file;

// An llm.c shard of 2000 documents of 49 tokens and an end-of-text each (200 KB of tokens).
void write_big_shard(const fs::path& path) {
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = 1;
  std::vector<uint16_t> tokens;
  for (int d = 0; d < 2000; ++d) {
    for (int t = 0; t < 49; ++t) tokens.push_back(static_cast<uint16_t>(1 + (d * 7 + t) % 250));
    tokens.push_back(50256);
  }
  header[2] = static_cast<int32_t>(tokens.size());
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fwrite(header.data(), 4, header.size(), f);
  std::fwrite(tokens.data(), 2, tokens.size(), f);
  std::fclose(f);
}

TEST(ShardTruncationCli, AShardTruncatedDuringTrainingStopsTheRunWithAnErrorNamingIt) {
  const auto dir = scratch_dir("d");
  const fs::path shard = dir / "train_000.bin";
  write_big_shard(shard);
  // Far more steps than it takes to reach a lost document: the run can only end by the error.
  write_file(dir / "c.yaml", "run:\n  out_dir: " + (dir / "run").string() +
                                 "\n  steps: 1000000\n  log_every: 1\n  eval_every: 0\n  threads: 1\n"
                                 "model:\n  hidden_size: 16\n  num_layers: 1\n  num_heads: 2\n"
                                 "data:\n  source: shards\n  path: " +
                                 shard.string() + "\n  seq_len: 16\n  batch_size: 4\n");
  auto training = std::async(std::launch::async, [&] { return run({"train", (dir / "c.yaml").string()}); });
  // Wait for the first logged step: the source is open and batches are being read.
  const fs::path metrics = dir / "run" / "metrics.jsonl";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::error_code ec;
  bool started = false;
  while (!started && std::chrono::steady_clock::now() < deadline &&
         training.wait_for(std::chrono::milliseconds(5)) != std::future_status::ready) {
    const auto size = fs::file_size(metrics, ec);
    started = !ec && size > 0;
  }
  // Truncated whatever happened, so the run (which this test's future waits for) always ends.
  fs::resize_file(shard, 1024 + 2 * 50 * 10);  // ten documents remain
  EXPECT_TRUE(started) << "training never logged a step";
  const testing::CliResult r = training.get();
  EXPECT_EQ(r.code, kExitData) << r.out;  // a data error, as documented (it was 1)
  EXPECT_NE(r.err.find("token shard '" + shard.string() + "': cannot read tokens ["), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" of the 100000 its header announced (" + shard.string() + ": unexpected end of file at byte "),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("the file shrank while in use (truncated or rewritten)"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace cpf::trainer
