// What a training run tells its user: train.log (the console with timestamps and rank), heartbeat
// lines during long quiet stretches, the progress bar's ETA and rate, tokens seen and resident
// memory in step lines and metrics.jsonl, and a summary whose train loss is the last step line's.
#include <gtest/gtest.h>

#include <tuple>

#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "apps/report/metrics.h"
#include "apps/report/process_memory.h"
#include "apps/report/train_log.h"
#include "tests/apps/cli_support.h"

namespace cpf::trainer {
namespace {

using testing::read_file;
using testing::repo_root;
using testing::run;
using testing::scratch_dir;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

testing::CliResult train_tiny(const std::filesystem::path& dir, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args{"train", (repo_root() / "configs" / "tiny.yaml").string(), "--set",
                                "run.out_dir=" + dir.string()};
  args.insert(args.end(), extra.begin(), extra.end());
  return run(args);
}

// "loss 1.2345" of a step or summary line.
std::string loss_field(const std::string& line, const std::string& label) {
  const size_t at = line.find(label);
  return at == std::string::npos ? "" : line.substr(at + label.size(), 6);
}

TEST(TrainLog, HoldsEveryConsoleLineStampedWithTimeAndRank) {
  const auto dir = scratch_dir("run");
  const auto r = train_tiny(dir);
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const auto console = lines_of(r.out);
  const auto logged = lines_of(read_file(dir / "train.log"));
  ASSERT_EQ(logged.size(), console.size()) << read_file(dir / "train.log");
  const std::regex stamp(R"(^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z \[rank 0\] )");
  for (size_t i = 0; i < console.size(); ++i) {
    std::smatch m;
    ASSERT_TRUE(std::regex_search(logged[i], m, stamp)) << logged[i];
    EXPECT_EQ(logged[i].substr(m.length()), console[i]);
  }
  EXPECT_TRUE(logged.back().find("] done: step 20/20") != std::string::npos) << logged.back();
}

TEST(TrainLog, ResumedSessionsAppendAndReplaceStartsOver) {
  const auto dir = scratch_dir("run");
  ASSERT_EQ(train_tiny(dir, {"--set", "run.steps=10"}).code, kExitOk);
  ASSERT_EQ(train_tiny(dir).code, kExitOk);  // resumes at step 10
  std::string log = read_file(dir / "train.log");
  auto count = [](const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count(log, "] cpformer train: "), 2u) << log;
  EXPECT_EQ(count(log, "] resumed from "), 1u) << log;
  EXPECT_EQ(count(log, "] done: step "), 2u) << log;
  ASSERT_EQ(train_tiny(dir, {"--set", "run.resume=replace"}).code, kExitOk);
  log = read_file(dir / "train.log");
  EXPECT_EQ(count(log, "] cpformer train: "), 1u) << log;
}

TEST(TrainLog, AnUnwritableLogStopsTheRunNamingIt) {
  const auto dir = scratch_dir("run");
  std::filesystem::create_directories(dir / "train.log");  // a folder where the log goes
  const auto r = train_tiny(dir);
  EXPECT_EQ(r.code, kExitError) << r.out;
  EXPECT_NE(r.err.find("cannot open " + (dir / "train.log").string() + " for writing: Is a directory"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.out.find("step "), std::string::npos) << "nothing was trained: " << r.out;
}

TEST(TrainLog, ADeviceInPlaceOfTheMetricsIsNotReadBack) {
  // Reading /dev/zero back for the tokens seen would never end (it once read /dev/full for a minute).
  const auto dir = scratch_dir("run");
  std::filesystem::create_symlink("/dev/zero", dir / "metrics.jsonl");
  const auto r = train_tiny(dir, {"--set", "run.steps=5", "--set", "run.eval_every=0"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_NE(r.out.find(" | 640 tok | "), std::string::npos) << r.out;
}

TEST(TrainLog, StepLinesAndMetricsCountTokensAndShowResidentMemory) {
  const auto dir = scratch_dir("run");
  const auto r = train_tiny(dir);
  ASSERT_EQ(r.code, kExitOk) << r.err;
  // tiny.yaml: 128 tokens per step, a line every 5 steps.
  EXPECT_NE(r.out.find("step  5/20 | "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" | 640 tok | rss "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" | 2.6k tok | rss "), std::string::npos) << r.out;
  int64_t records = 0;
  for (const auto& line : lines_of(read_file(dir / "metrics.jsonl"))) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("loss")) continue;
    ++records;
    EXPECT_EQ(j["tokens"].get<int64_t>(), 128 * j["step"].get<int64_t>()) << line;
    EXPECT_GT(j["rss_bytes"].get<double>(), 1e6) << line;
  }
  EXPECT_EQ(records, 4);
  EXPECT_NE(r.out.find(" | 2.6k tok | "), std::string::npos) << "the summary counts tokens: " << r.out;
  EXPECT_NE(r.out.find(" tok/s | /"), std::string::npos) << "and gives their rate: " << r.out;
}

// GPU runs: MFU against the bf16 peak, and for run.precision: fp8 also against the FP8 peak, in the step
// line and in metrics.jsonl.
TEST(TrainLog, StepLinesShowMfuAndItsFp8Share) {
  const auto dir = scratch_dir("run");
  std::ostringstream out;
  {
    MetricsLogger logger(out, {.metrics_path = (dir / "metrics.jsonl").string(), .total_steps = 20});
    logger.start_metrics(0);
    logger.step({.step = 10, .loss = 2.5, .tokens_per_second = 5e4, .tokens_seen = 1000, .mfu = 0.412}, true);
    logger.step({.step = 20, .loss = 2.0, .tokens_per_second = 5e4, .tokens_seen = 2000, .mfu = 0.5, .mfu_fp8 = 0.25},
                true);
  }
  EXPECT_NE(out.str().find("tok/s | MFU 41.2% | 1.0k tok"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("tok/s | MFU 50.0% (25.0% of FP8 peak) | 2.0k tok"), std::string::npos) << out.str();
  const auto lines = lines_of(read_file(dir / "metrics.jsonl"));
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_FALSE(nlohmann::json::parse(lines[0]).contains("mfu_fp8"));
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(lines[1])["mfu_fp8"].get<double>(), 0.25);
}

// fp8.recipe: delayed: the window's clipped casts in metrics.jsonl always, in the step line only when
// some cast clipped.
TEST(TrainLog, StepLinesShowClippedFp8CastsWhenThereAreAny) {
  const auto dir = scratch_dir("run");
  std::ostringstream out;
  {
    MetricsLogger logger(out, {.metrics_path = (dir / "metrics.jsonl").string(), .total_steps = 20});
    logger.start_metrics(0);
    logger.step({.step = 10, .loss = 2.5, .tokens_per_second = 5e4, .tokens_seen = 1000, .fp8_clipped = 0}, true);
    logger.step({.step = 20, .loss = 2.0, .tokens_per_second = 5e4, .tokens_seen = 2000, .fp8_clipped = 7}, true);
  }
  EXPECT_EQ(out.str().find("fp8 clipped 0"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("2.0k tok | fp8 clipped 7 | "), std::string::npos) << out.str();
  const auto lines = lines_of(read_file(dir / "metrics.jsonl"));
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(nlohmann::json::parse(lines[0])["fp8_clipped"].get<int64_t>(), 0);
  EXPECT_EQ(nlohmann::json::parse(lines[1])["fp8_clipped"].get<int64_t>(), 7);
}

TEST(TrainLog, TokensSeenContinueAcrossAResume) {
  const auto dir = scratch_dir("run");
  ASSERT_EQ(train_tiny(dir, {"--set", "run.steps=10"}).code, kExitOk);
  ASSERT_EQ(train_tiny(dir).code, kExitOk);
  std::vector<int64_t> tokens;
  for (const auto& line : lines_of(read_file(dir / "metrics.jsonl"))) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("tokens")) tokens.push_back(j["tokens"].get<int64_t>());
  }
  EXPECT_EQ(tokens, (std::vector<int64_t>{640, 1280, 1920, 2560}));
}

// The step lines of metrics.jsonl: (step, loss, tokens), evaluations left out.
std::vector<std::tuple<int64_t, double, int64_t>> step_rows(const std::filesystem::path& dir) {
  std::vector<std::tuple<int64_t, double, int64_t>> rows;
  for (const auto& line : lines_of(read_file(dir / "metrics.jsonl"))) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("loss")) continue;
    rows.emplace_back(j["step"].get<int64_t>(), j["loss"].get<double>(), j["tokens"].get<int64_t>());
  }
  return rows;
}

// A run stopped at step 7 (a line off the log_every grid, lines every 5 steps) and resumed: metrics.jsonl
// holds one line per logging step, each averaging the same steps with the same tokens as an
// uninterrupted run's (the checkpoint carries steps 6-7 to the resumed line of step 10).
TEST(TrainLog, AResumedRunLogsTheSameWindowsAsAnUninterruptedOne) {
  const std::vector<std::string> lr = {"--set", "schedule.total_steps=20"};  // the same schedule in both
  const auto whole = scratch_dir("whole"), split = scratch_dir("split");
  ASSERT_EQ(train_tiny(whole, lr).code, kExitOk);
  std::vector<std::string> first = lr;
  first.insert(first.end(), {"--set", "run.steps=7"});
  ASSERT_EQ(train_tiny(split, first).code, kExitOk);
  ASSERT_EQ(std::get<0>(step_rows(split).back()), 7) << "the stopped run's last line is step 7";
  const auto resumed = train_tiny(split, lr);
  ASSERT_EQ(resumed.code, kExitOk) << resumed.err;
  const auto expected = step_rows(whole), got = step_rows(split);
  ASSERT_EQ(got.size(), expected.size()) << read_file(split / "metrics.jsonl");
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(std::get<0>(got[i]), std::get<0>(expected[i]));
    EXPECT_NEAR(std::get<1>(got[i]), std::get<1>(expected[i]), 1e-12) << "step " << std::get<0>(got[i]);
    EXPECT_EQ(std::get<2>(got[i]), std::get<2>(expected[i])) << "step " << std::get<0>(got[i]);
  }
  EXPECT_NE(resumed.out.find("step 10/20 | loss "), std::string::npos) << resumed.out;
}

TEST(TrainLog, SummaryTrainLossIsTheLastStepLinesLoss) {
  const auto dir = scratch_dir("run");
  const auto r = train_tiny(dir);
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const auto lines = lines_of(r.out);
  std::string last_step, summary;
  for (const auto& l : lines) {
    if (l.rfind("step ", 0) == 0) last_step = l;
    if (l.rfind("done: ", 0) == 0) summary = l;
  }
  ASSERT_FALSE(last_step.empty());
  EXPECT_EQ(loss_field(summary, "train loss "), loss_field(last_step, "| loss ")) << last_step << "\n" << summary;
  EXPECT_NE(summary.find("(mean of steps 16-20)"), std::string::npos) << summary;
}

TEST(TrainLog, ARunStoppedAtItsTargetBetweenStepLinesPrintsItsLastSteps) {
  const auto dir = scratch_dir("run");
  // Exact match >= 1% is reached at the first evaluation (step 10, 1/20 right); lines every 7 steps.
  const auto r = train_tiny(dir, {"--set", "run.log_every=7", "--set", "run.target_accuracy=0.01"});
  ASSERT_EQ(r.code, kExitOk) << r.err << r.out;
  EXPECT_NE(r.out.find("step  7/20 | "), std::string::npos) << r.out;
  const size_t at = r.out.find("step 10/20 | loss ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string step10 = r.out.substr(at, r.out.find('\n', at) - at);
  const std::string summary = lines_of(r.out).back();
  EXPECT_NE(summary.find("train loss " + loss_field(step10, "| loss ") + " (mean of steps 8-10)"), std::string::npos)
      << step10 << "\n"
      << summary;
}

TEST(TrainLog, TheTrainerDrawsLossSvgInTheRunFolder) {
  const auto dir = scratch_dir("run");
  ASSERT_EQ(train_tiny(dir).code, kExitOk);
  const std::string svg = read_file(dir / "loss.svg");
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("<polyline"), std::string::npos);
  EXPECT_NE(svg.find(">" + dir.filename().string() + "</text>"), std::string::npos) << "the legend names the run";
}

TEST(TrainLogLine, StampsUtcMillisecondsAndRank) {
  const auto when = std::chrono::system_clock::time_point(std::chrono::milliseconds(1764121203125));
  EXPECT_EQ(train_log_line("step 1/2", 3, when), "2025-11-26T01:40:03.125Z [rank 3] step 1/2");
}

TEST(Heartbeat, AQuietStretchGetsALineEveryInterval) {
  const auto dir = scratch_dir("log");
  std::ostringstream out;
  {
    MetricsLogger logger(out, LoggerOptions{.metrics_path = "",
                                            .train_log_path = (dir / "train.log").string(),
                                            .total_steps = 10,
                                            .progress_bar = false,
                                            .rank = 0,
                                            .heartbeat_seconds = 0.05});
    logger.start_metrics(0);
    logger.activity("step 3/10");
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
  }
  const auto lines = lines_of(out.str());
  ASSERT_GE(lines.size(), 3u) << out.str();
  for (const auto& l : lines) {
    EXPECT_TRUE(
        std::regex_match(l, std::regex(R"(heartbeat: step 3/10 running for 0:00 \| 0:00 elapsed( \| rss \d+ MiB)?)")))
        << l;
  }
  EXPECT_EQ(lines_of(read_file(dir / "train.log")).size(), lines.size()) << "heartbeats go to train.log too";
}

TEST(Heartbeat, SilentWhileLinesKeepComingAndOffWhenZero) {
  std::ostringstream busy, off;
  {
    MetricsLogger logger(busy, LoggerOptions{.total_steps = 10, .heartbeat_seconds = 1.0});
    for (int i = 0; i < 60; ++i) {
      logger.note("line " + std::to_string(i));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  EXPECT_EQ(busy.str().find("heartbeat"), std::string::npos) << busy.str();
  {
    MetricsLogger logger(off, LoggerOptions{.total_steps = 10, .heartbeat_seconds = 0});
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(off.str().empty());
}

TEST(ProgressBar, ShowsPercentEtaAndTokensPerSecond) {
  std::ostringstream out;
  MetricsLogger logger(out, LoggerOptions{.total_steps = 200, .progress_bar = true});
  logger.progress(50, 65, 195, 12345);
  EXPECT_EQ(out.str(), "\r[#######.......................] 25% step 50/200 | 12.3k tok/s | 1:05 elapsed | ETA 3:15");
  logger.note("checkpoint x");  // a log line clears the bar first
  EXPECT_NE(out.str().find("\r\033[Kcheckpoint x\n"), std::string::npos);
  std::ostringstream plain;
  MetricsLogger no_bar(plain, LoggerOptions{.total_steps = 200, .progress_bar = false});
  no_bar.progress(50, 65, 195, 12345);
  EXPECT_TRUE(plain.str().empty());
}

TEST(ProcessMemory, ParsesProcStatusAndReadsItsOwn) {
  const auto m = parse_proc_status_memory("Name:\tcpformer\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\n");
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->current_bytes, 102400u * 1024);
  EXPECT_EQ(m->peak_bytes, 204800u * 1024);
  EXPECT_FALSE(parse_proc_status_memory("Name:\tx\n").has_value());
  EXPECT_FALSE(parse_proc_status_memory("VmRSS:\tlots\n").has_value());
  const auto own = resident_memory();
  ASSERT_TRUE(own.has_value());
  EXPECT_GT(own->current_bytes, 1u << 20);
  EXPECT_EQ(format_memory(512.0 * 1048576), "512 MiB");
  EXPECT_EQ(format_memory(1.5 * 1073741824), "1.5 GiB");
}

}  // namespace
}  // namespace cpf::trainer
