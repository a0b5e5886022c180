// The cpformer command line as a new user meets it: --version, --help for every command, "did you
// mean" for mistyped commands, options and config keys, and messages that say how to fix a config.
#include <gtest/gtest.h>

#include "models/data/bpe_pretokenizer.h"

#include "apps/cli/command_table.h"
#include "framework/config/did_you_mean.h"
#include "tests/apps/cli_support.h"

namespace cpf::trainer {
namespace {

using testing::run;
using testing::scratch_dir;
using testing::write_file;

bool starts_with(const std::string& text, const std::string& prefix) { return text.rfind(prefix, 0) == 0; }

void expect_usage_error(const std::vector<std::string>& args, const std::string& first_line) {
  const auto r = run(args);
  EXPECT_EQ(r.code, kExitConfig) << r.out << r.err;
  EXPECT_TRUE(starts_with(r.err, "cpformer: " + first_line + "\nusage: cpformer")) << r.err;
}

TEST(CliHelp, VersionNamesTheProjectVersion) {
  for (const char* flag : {"--version", "-V", "version"}) {
    const auto r = run({flag});
    EXPECT_EQ(r.code, kExitOk) << flag;
    EXPECT_TRUE(starts_with(r.out, "cpformer 0.1.0 (")) << r.out;
    EXPECT_NE(r.out.find("tokenizer character classes: Unicode " + models::data::pretokenizer_unicode_version() +
                         " (bundled table)"),
              std::string::npos)
        << r.out;
    EXPECT_TRUE(r.err.empty());
  }
}

TEST(CliHelp, OverviewListsEveryCommandWithItsSummary) {
  const auto r = run({"--help"});
  EXPECT_EQ(r.code, kExitOk);
  ASSERT_GE(all_commands().size(), 5u);
  for (const auto& spec : all_commands()) {
    EXPECT_NE(r.out.find("  " + spec.name + " "), std::string::npos) << spec.name << "\n" << r.out;
    EXPECT_NE(r.out.find(spec.summary), std::string::npos) << spec.name;
  }
  EXPECT_NE(r.out.find("exit codes: 0 ok"), std::string::npos);
  EXPECT_EQ(run({"help"}).out, r.out);
  EXPECT_EQ(run({"-h"}).out, r.out);
}

TEST(CliHelp, EveryCommandHasHelpListingEveryOption) {
  for (const auto& spec : all_commands()) {
    for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
             {spec.name, "--help"}, {spec.name, "-h"}, {"help", spec.name}, {spec.name, "whatever", "--help"}}) {
      const auto r = run(args);
      EXPECT_EQ(r.code, kExitOk) << spec.name << ": " << r.err;
      EXPECT_TRUE(starts_with(r.out, "usage: cpformer " + spec.name)) << r.out;
      EXPECT_NE(r.out.find(spec.summary), std::string::npos) << r.out;
      for (const auto& option : spec.options) {
        EXPECT_NE(r.out.find("  " + option.name), std::string::npos) << spec.name << " " << option.name << "\n"
                                                                     << r.out;
      }
      EXPECT_NE(r.out.find("-h, --help"), std::string::npos);
      EXPECT_TRUE(r.err.empty()) << r.err;
    }
  }
  // --help wins over a bad line: nothing is run or checked.
  EXPECT_EQ(run({"train", "/nonexistent.yaml", "--bogus", "--help"}).code, kExitOk);
  EXPECT_EQ(run({"generate", "--tokens", "0", "-h"}).code, kExitOk);
}

TEST(CliHelp, MistypedCommandsSuggestTheNearestOne) {
  expect_usage_error({"trian", "x.yaml"}, "unknown command 'trian'; did you mean 'train'?");
  expect_usage_error({"genrate"}, "unknown command 'genrate'; did you mean 'generate'?");
  expect_usage_error({"check-confg"}, "unknown command 'check-confg'; did you mean 'check-config'?");
  expect_usage_error({"plto"}, "unknown command 'plto'; did you mean 'plot'?");
  expect_usage_error({"fly"}, "unknown command 'fly'");  // nothing close: no guess
  EXPECT_EQ(run({"fly"}).err.find("did you mean"), std::string::npos);
  expect_usage_error({"help", "trian"}, "unknown command 'trian'; did you mean 'train'?");
  expect_usage_error({"--verison"},
                     "'--verison' before a command: options follow the command (cpformer COMMAND "
                     "--verison); did you mean '--version'?");
}

TEST(CliHelp, MistypedOptionsSuggestTheNearestOptionOfTheCommand) {
  expect_usage_error({"train", "a.yaml", "--gpu", "2"}, "unknown option '--gpu'; did you mean '--gpus'?");
  expect_usage_error({"train", "a.yaml", "--sett", "run.steps=2"}, "unknown option '--sett'; did you mean '--set'?");
  expect_usage_error({"generate", "dir", "--temprature", "0.5"},
                     "unknown option '--temprature'; did you mean '--temperature'?");
  expect_usage_error({"plot", "run", "--no-pgn"}, "unknown option '--no-pgn'; did you mean '--no-png'?");
  // The usage that follows is the command's own.
  const auto r = run({"generate", "dir", "--temprature", "0.5"});
  EXPECT_NE(r.err.find("\nusage: cpformer generate CHECKPOINT_DIR [options]\n(all options: cpformer generate --help)"),
            std::string::npos)
      << r.err;
}

TEST(CliHelp, OptionsOfAnotherCommandNameThatCommand) {
  expect_usage_error({"train", "a.yaml", "--tokens", "3"}, "'train' takes no --tokens (an option of 'generate')");
  expect_usage_error({"plot", "run", "--set", "a=b"}, "'plot' takes no --set (an option of 'train', 'check-config')");
  // Other commands may share an option name: every command that takes it is listed.
  const auto r = run({"check-config", "a.yaml", "--no-png"});
  EXPECT_EQ(r.code, kExitConfig);
  EXPECT_TRUE(starts_with(r.err, "cpformer: 'check-config' takes no --no-png (an option of ")) << r.err;
  EXPECT_NE(r.err.find("'plot'"), std::string::npos) << r.err;
}

TEST(CliHelp, AfterDoubleDashEverythingIsPositional) {
  const CommandSpec* plot = find_command("plot");
  ASSERT_NE(plot, nullptr);
  const CommandLine line = parse_command_line(*plot, {"a", "--no-png", "--", "--out", "-h"});
  EXPECT_EQ(line.positional, (std::vector<std::string>{"a", "--out", "-h"}));
  EXPECT_TRUE(line.has("--no-png"));
  EXPECT_FALSE(line.has("--out"));
  // --help after "--" is a file name, not a request for help.
  const auto r = run({"plot", "--no-png", "--", "--help"});
  EXPECT_EQ(r.code, kExitData);
  EXPECT_EQ(r.err, "cpformer: data error: --help: no such run folder or metrics file\n");
}

TEST(CliHelp, OptionValuesAreCheckedUniformly) {
  expect_usage_error({"generate", "dir", "--tokens"}, "--tokens needs a value");
  expect_usage_error({"generate", "dir", "--tokens", "3", "--tokens", "4"},
                     "--tokens is given twice ('3' and '4'); give it once");
  expect_usage_error({"plot", "run", "--no-png=yes"}, "--no-png takes no value (got '--no-png=yes')");
  expect_usage_error({"generate", "dir", "--tokens=x"}, "--tokens x: expected a number");
  expect_usage_error({"train", "a.yaml", "--gpus="}, "--gpus : expected a number");
}

// Writes a config and runs check-config on it: exit 2 and one line.
std::string config_error(const std::string& yaml, const std::vector<std::string>& extra = {}) {
  const auto dir = scratch_dir("config");
  write_file(dir / "x.yaml", yaml);
  std::vector<std::string> args{"check-config", (dir / "x.yaml").string()};
  args.insert(args.end(), extra.begin(), extra.end());
  const auto r = run(args);
  EXPECT_EQ(r.code, kExitConfig) << r.out;
  return r.err;
}

TEST(CliHelp, MistypedConfigKeysSuggestTheKey) {
  EXPECT_NE(config_error("model:\n  hiden_size: 32\n").find("; did you mean 'model.hidden_size'?\n"),
            std::string::npos);
  EXPECT_NE(config_error("run:\n  stpes: 5\n").find("unknown key 'run.stpes' (valid keys here: "), std::string::npos);
  EXPECT_NE(config_error("run:\n  stpes: 5\n").find("; did you mean 'run.steps'?"), std::string::npos);
  EXPECT_NE(config_error("optimzer:\n  lr: 0.1\n").find("unknown key 'optimzer' (valid keys here: "),
            std::string::npos);
  EXPECT_NE(config_error("optimzer:\n  lr: 0.1\n").find("; did you mean 'optimizer'?"), std::string::npos);
  EXPECT_NE(config_error("run:\n  steps: 5\n", {"--set", "run.stpes=5"})
                .find("--set run.stpes=5: unknown key 'run.stpes' (valid keys here: "),
            std::string::npos);
  EXPECT_NE(config_error("run:\n  steps: 5\n", {"--set", "run.stpes=5"}).find("did you mean 'run.steps'?"),
            std::string::npos);
  // Nothing near: no guess.
  EXPECT_EQ(config_error("model:\n  zzzzzzzz: 1\n").find("did you mean"), std::string::npos);
}

TEST(CliHelp, StepsBelowWarmupSuggestTheFix) {
  const std::string err = config_error("schedule:\n  warmup_steps: 20\n", {"--set", "run.steps=10"});
  EXPECT_EQ(
      err,
      "--set run.steps=10: schedule.warmup_steps=20 must not exceed the decay length of 10 steps; lower it (--set "
      "schedule.warmup_steps=10 or less), raise run.steps (or schedule.total_steps), or use schedule.decay: "
      "constant\n");
  // The suggested fix works.
  const auto dir = scratch_dir("fixed");
  write_file(dir / "x.yaml", "schedule:\n  warmup_steps: 20\n");
  EXPECT_EQ(
      run({"check-config", (dir / "x.yaml").string(), "--set", "run.steps=10", "--set", "schedule.warmup_steps=10"})
          .code,
      kExitOk);
}

TEST(DidYouMean, EditDistanceCountsTranspositionsAsOneEdit) {
  EXPECT_EQ(config::edit_distance("steps", "steps"), 0u);
  EXPECT_EQ(config::edit_distance("stpes", "steps"), 1u);
  EXPECT_EQ(config::edit_distance("step", "steps"), 1u);
  EXPECT_EQ(config::edit_distance("", "abc"), 3u);
  EXPECT_EQ(config::edit_distance("kitten", "sitting"), 3u);
}

TEST(DidYouMean, OnlyCloseAndUnambiguousGuesses) {
  EXPECT_EQ(config::closest_match("trian", {"train", "generate"}), "train");
  EXPECT_EQ(config::closest_match("xyz", {"train", "generate"}), std::nullopt);
  // "lr" is as near to "l1" as to "l2": no guess rather than a coin toss.
  EXPECT_EQ(config::closest_match("lx", {"l1", "l2"}), std::nullopt);
  EXPECT_EQ(config::closest_match("a", {"b"}), "b");  // a one-letter name: one edit allowed
  EXPECT_EQ(config::did_you_mean_suffix("--gpu", {"--gpus", "--set"}), "; did you mean '--gpus'?");
  EXPECT_EQ(config::did_you_mean_suffix("--zzz", {"--gpus", "--set"}), "");
}

}  // namespace
}  // namespace cpf::trainer
