// cpformer generate on checkpoints of synthetic and byte-level text models.
#include <gtest/gtest.h>

#include "apps/generate/generate.h"
#include "support/test_utils.h"
#include "tests/apps/cli_support.h"

namespace cpf::trainer {
namespace {

using testing::repo_root;
using testing::run;
using testing::scratch_dir;
using testing::write_file;

TEST(Generate, SyntheticModelCompletesAPrompt) {
  const auto dir = scratch_dir("run");
  ASSERT_EQ(run({"train", (repo_root() / "configs" / "tiny.yaml").string(), "--set", "run.out_dir=" + dir.string(),
                 "--set", "run.threads=1"})
                .code,
            0);
  // A run folder, its checkpoints folder and a checkpoint all resolve to the same checkpoint.
  const auto a = run({"generate", dir.string(), "--prompt", "3+4=", "--tokens", "4"});
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_EQ(a.out.rfind("3+4=", 0), 0u) << a.out;
  EXPECT_EQ(run({"generate", (dir / "checkpoints").string(), "--prompt", "3+4=", "--tokens", "4"}).out, a.out);
  EXPECT_EQ(
      run({"generate", (dir / "checkpoints" / "step_00000020").string(), "--prompt", "3+4=", "--tokens", "4"}).out,
      a.out);
  // Without a prompt: the first held-out example's prompt. Sampling is seeded.
  GenerateOptions o;
  o.checkpoint = dir.string();
  o.temperature = 1.0;
  o.seed = 7;
  o.max_new_tokens = 6;
  const GenerateResult r1 = generate(o), r2 = generate(o);
  EXPECT_EQ(r1.completion, r2.completion);
  EXPECT_FALSE(r1.prompt_text.empty());
  EXPECT_EQ(r1.prompt_text.back(), '=');
  EXPECT_LE(r1.completion.size(), 6u);
  if (r1.ended) EXPECT_EQ(r1.completion.back(), 13);
}

TEST(Generate, TextModelNeedsAPromptAndSamplesBytes) {
  const auto dir = scratch_dir("run");
  write_file(dir / "corpus.txt", "hello world\n\nhello there\n\nworld of text\n");
  write_file(dir / "c.yaml", "run:\n  out_dir: " + (dir / "run").string() +
                                 "\n  steps: 2\n  threads: 1\n  eval_path: " + (dir / "corpus.txt").string() +
                                 "\nmodel:\n  hidden_size: 16\n  num_layers: 1\n  num_heads: 2\n"
                                 "data:\n  source: text\n  path: " +
                                 (dir / "corpus.txt").string() + "\n  seq_len: 16\n  batch_size: 2\n");
  const auto t = run({"train", (dir / "c.yaml").string()});
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.out.find("eval 2/2 | loss "), std::string::npos) << t.out;
  const auto g = run({"generate", (dir / "run").string(), "--prompt", "hel", "--tokens", "5", "--temperature", "0.8"});
  EXPECT_EQ(g.code, 0) << g.err;
  EXPECT_EQ(g.out.rfind("hel", 0), 0u);
  const auto none = run({"generate", (dir / "run").string()});
  EXPECT_EQ(none.code, kExitConfig);  // a missing argument: a usage error
  EXPECT_NE(none.err.find("generate: a text model needs a prompt (--prompt TEXT)"), std::string::npos) << none.err;
}

TEST(Generate, RejectsBadArguments) {
  const auto empty = scratch_dir("empty");
  auto r = run({"generate", empty.string()});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("holds no checkpoint (no meta.json, no step_* folder, no checkpoints/ folder)"),
            std::string::npos)
      << r.err;
  r = run({"generate", (empty / "missing").string()});
  EXPECT_NE(r.err.find("is not a folder"), std::string::npos) << r.err;
  GenerateOptions o;
  o.checkpoint = empty.string();
  o.max_new_tokens = 0;
  EXPECT_CPF_ERROR(generate(o), "generate: --tokens 0 must be at least 1");
  o.max_new_tokens = 1;
  o.temperature = -1;
  EXPECT_CPF_ERROR(generate(o), "generate: --temperature -1 must be >= 0 (0 = greedy)");
}

TEST(Generate, SyntheticPromptsMustUseTheTaskAlphabet) {
  const auto dir = scratch_dir("run");
  ASSERT_EQ(run({"train", (repo_root() / "configs" / "tiny.yaml").string(), "--set", "run.out_dir=" + dir.string(),
                 "--set", "run.steps=2", "--set", "run.threads=1"})
                .code,
            0);
  const auto r = run({"generate", dir.string(), "--prompt", "1+x="});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("synthetic_encode: character 'x' at 2"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace cpf::trainer
