// cpformer generate with several prompts, the KV cache, top-k/top-p and the throughput figure, on a
// checkpoint of configs/tiny.yaml (trained once for the suite; seq_len 16, so long completions slide the
// window past the context).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "apps/generate/generate.h"
#include "framework/core/error.h"
#include "framework/tensor/storage.h"
#include "support/test_utils.h"
#include "tests/apps/cli_support.h"

namespace cpf::trainer {
namespace {

using ::testing::HasSubstr;
using testing::repo_root;
using testing::run;
using testing::write_file;

class GenerateBatch : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // One folder per process: ctest runs each test of the suite as its own process, in parallel.
    dir_ = new std::filesystem::path(std::filesystem::temp_directory_path() / "cpformer_tests" /
                                     ("GenerateBatch.run." + std::to_string(::getpid())));
    std::filesystem::remove_all(*dir_);
    std::filesystem::create_directories(*dir_);
    const auto t = run({"train", (repo_root() / "configs" / "tiny.yaml").string(), "--set",
                        "run.out_dir=" + dir_->string(), "--set", "run.threads=1"});
    ASSERT_EQ(t.code, 0) << t.err;
    write_file(*dir_ / "prompts.txt", "3+4=\n\n12+9=\r\n7+7=\n");
  }
  static void TearDownTestSuite() {
    std::error_code ignored;
    std::filesystem::remove_all(*dir_, ignored);
    delete dir_;
  }

  static GenerateOptions options() {
    GenerateOptions o;
    o.checkpoint = dir_->string();
    o.prompts_file = (*dir_ / "prompts.txt").string();
    o.max_new_tokens = 20;
    return o;
  }
  static std::filesystem::path* dir_;
};
std::filesystem::path* GenerateBatch::dir_ = nullptr;

std::vector<std::vector<int64_t>> completions(const GenerateBatchResult& b) {
  std::vector<std::vector<int64_t>> out;
  for (const auto& r : b.results) out.push_back(r.completion);
  return out;
}

TEST_F(GenerateBatch, KvCacheGivesTheTokensOfFullWindowDecoding) {
  GenerateOptions o = options();
  o.max_new_tokens = 24;  // 4-5 prompt tokens + 24 > seq_len 16: the window slides
  const GenerateBatchResult cached = generate_batch(o);
  o.kv_cache = false;
  const GenerateBatchResult full = generate_batch(o);
  ASSERT_EQ(cached.results.size(), 3u);  // the empty line is skipped, "\r\n" is a line end
  EXPECT_EQ(cached.results[1].prompt_text, "12+9=");
  EXPECT_EQ(completions(cached), completions(full));
  EXPECT_LT(cached.tokens_fed, full.tokens_fed);
  // Sampled with every filter: the same seeded draws from the same logits.
  o.temperature = 0.9;
  o.top_k = 5;
  o.top_p = 0.9;
  o.seed = 11;
  const GenerateBatchResult sampled_full = generate_batch(o);
  o.kv_cache = true;
  EXPECT_EQ(completions(generate_batch(o)), completions(sampled_full));
}

TEST_F(GenerateBatch, EachPromptCompletesAsItWouldAlone) {
  GenerateOptions o = options();
  o.temperature = 1.0;
  o.top_k = 4;
  const GenerateBatchResult batch = generate_batch(o);
  const std::vector<std::string> prompts{"3+4=", "12+9=", "7+7="};
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateOptions one = o;
    one.prompts_file.reset();
    one.prompt = prompts[i];
    one.seed = o.seed + i;  // prompt i of a batch samples from stream seed + i
    const GenerateResult alone = generate(one);
    EXPECT_EQ(alone.prompt_text, batch.results[i].prompt_text);
    EXPECT_EQ(alone.completion, batch.results[i].completion) << prompts[i];
  }
}

TEST_F(GenerateBatch, ReportsThroughput) {
  const GenerateBatchResult b = generate_batch(options());
  int64_t produced = 0;
  for (const auto& r : b.results) {
    produced += static_cast<int64_t>(r.completion.size());
    EXPECT_LE(r.completion.size(), 20u);
    if (r.ended) EXPECT_EQ(r.completion.back(), 13);  // end-of-text stops a prompt
  }
  EXPECT_EQ(b.new_tokens, produced);
  EXPECT_GT(b.seconds, 0);
  EXPECT_NEAR(b.tokens_per_second, static_cast<double>(produced) / b.seconds, 1e-6 * b.tokens_per_second);
  EXPECT_EQ(b.device, "cpu");
  EXPECT_EQ(b.precision, "fp32");
  EXPECT_THAT(throughput_line(b), ::testing::MatchesRegex("[0-9]+ tokens in [0-9.]+ s: [0-9.]+ tokens/s "
                                                          "\\(cpu, fp32, kv cache\\)"));
}

TEST_F(GenerateBatch, CliPrintsOneLinePerPrompt) {
  const auto r = run({"generate", dir_->string(), "--prompts", (*dir_ / "prompts.txt").string(), "--tokens", "6",
                      "--temperature", "0.7", "--top-k", "3", "--top-p", "0.95", "--seed", "5"});
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<std::string> lines;
  std::stringstream s(r.out);
  for (std::string line; std::getline(s, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 3u) << r.out;
  EXPECT_EQ(lines[0].rfind("3+4=", 0), 0u);
  EXPECT_EQ(lines[1].rfind("12+9=", 0), 0u);
  EXPECT_EQ(lines[2].rfind("7+7=", 0), 0u);
  // The cache changes only the cost.
  EXPECT_EQ(run({"generate", dir_->string(), "--prompts", (*dir_ / "prompts.txt").string(), "--tokens", "6",
                 "--temperature", "0.7", "--top-k", "3", "--top-p", "0.95", "--seed", "5", "--no-kv-cache"})
                .out,
            r.out);
}

TEST_F(GenerateBatch, CliRefusesBadSamplingOptionsAsUsageErrors) {
  const std::string d = dir_->string();
  auto r = run({"generate", d, "--prompt", "1+1=", "--top-k", "5"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("but --temperature 0 is greedy decoding"));
  r = run({"generate", d, "--prompt", "1+1=", "--temperature", "1", "--top-p", "1.5"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--top-p 1.5 must be in (0, 1]"));
  r = run({"generate", d, "--prompt", "1+1=", "--temperature", "1", "--top-k", "-2"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--top-k -2"));
  r = run({"generate", d, "--prompt", "1+1=", "--prompts", (*dir_ / "prompts.txt").string()});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("give either --prompt or --prompts FILE, not both"));
  r = run({"generate", d, "--prompt", "1+1=", "--precision", "fp16"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--precision fp16 is not one of fp32, bf16"));
  r = run({"generate", d, "--prompt", "1+1=", "--device", "tpu"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("invalid device 'tpu'"));
}

TEST_F(GenerateBatch, PromptsFileProblemsAreNamed) {
  GenerateOptions o = options();
  o.prompts_file = (*dir_ / "missing.txt").string();
  EXPECT_CPF_ERROR(generate_batch(o), "generate: cannot read the prompts file " + *o.prompts_file);
  write_file(*dir_ / "blank.txt", "\n\r\n\n");
  o.prompts_file = (*dir_ / "blank.txt").string();
  EXPECT_CPF_ERROR(generate_batch(o), "holds no prompt (one prompt per line; empty lines are skipped)");
  o.prompts_file = (*dir_ / "prompts.txt").string();
  EXPECT_CPF_ERROR(generate(o), "generate: a prompts file gives several completions; call generate_batch");
}

TEST_F(GenerateBatch, CudaWithoutABackendOrDeviceNamesTheFix) {
  GenerateOptions o = options();
  o.device = "cuda:7";
  if (!has_device_backend(DeviceType::cuda)) {
    EXPECT_CPF_ERROR(generate_batch(o), "generate: --device cuda:7: this build has no CUDA backend");
  } else if (device_backend(DeviceType::cuda).device_count() <= 7) {
    EXPECT_CPF_ERROR(generate_batch(o), "visible CUDA device(s) (check nvidia-smi and CUDA_VISIBLE_DEVICES)");
  }
}

}  // namespace
}  // namespace cpf::trainer
