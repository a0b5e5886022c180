// Config text that yaml-cpp accepts but that does not mean what it says is refused with file:line and
// the reason (framework/config/yaml_strict.h); --set mistakes name the --set.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "config/config_read.h"
#include "framework/config/schema.h"

namespace strict_demo {

struct Run {
  int64_t steps = 10;
  double lr = 0.5;
  std::string name = "run";
};
struct Options {
  Run run;
};

template <class V>
void describe(V& v, Run& o) {
  v.field("steps", o.steps, "steps", cpf::config::Range{1, 1e12});
  v.field("lr", o.lr, "learning rate");
  v.field("name", o.name, "run name");
}
template <class V>
void describe(V& v, Options& o) {
  v.section("run", o.run, "run");
}

}  // namespace strict_demo

namespace cpf::config {
namespace {

strict_demo::Options read(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return testing::read_options<strict_demo::Options>(yaml, "x.yaml", overrides);
}

// The whole message, so a wrong line or a changed reason both fail.
void expect_error(const std::string& yaml, const std::string& expected,
                  const std::vector<std::string>& overrides = {}) {
  const auto error = testing::config_error<strict_demo::Options>(yaml, "x.yaml", overrides);
  if (!error) {
    ADD_FAILURE() << "accepted; expected: " << expected;
  } else {
    EXPECT_EQ(*error, expected);
  }
}

TEST(ConfigStrictYaml, EmptyTextIsRefusedAndBracesTrainTheDefaults) {
  const std::string empty =
      "x.yaml:1: the config is empty (no keys), so every default would train without a word; write the keys to "
      "set, or {} to train the defaults on purpose";
  expect_error("", empty);
  expect_error("# only a comment\n\n", empty);
  expect_error("---\n", empty);
  EXPECT_EQ(read("{}\n").run.steps, 10);
}

TEST(ConfigStrictYaml, DuplicateKeysNameBothLines) {
  expect_error("run:\n  steps: 5\n  lr: 0.1\n  steps: 7\n",
               "x.yaml:4:3: duplicate key 'run.steps' (first at line 2); YAML keeps one of them silently, so keep only "
               "the one you mean");
  expect_error("run:\n  steps: 5\nrun:\n  lr: 0.1\n",
               "x.yaml:3:1: duplicate key 'run' (first at line 1); YAML keeps one of them silently, so keep only the "
               "one you mean");
  expect_error("run: {steps: 5, steps: 6}\n",
               "x.yaml:1:17: duplicate key 'run.steps' (first at line 1); YAML keeps one of them silently, so keep "
               "only the one you mean");
}

TEST(ConfigStrictYaml, SecondDocumentIsRefusedAtItsSeparator) {
  const std::string second =
      ": a second YAML document starts here; a config is one document (YAML readers drop or ignore the rest), so "
      "merge it into the first or remove it";
  expect_error("run:\n  steps: 5\n---\nrun:\n  steps: 7\n", "x.yaml:3" + second);
  expect_error("---\nrun:\n  steps: 5\n---\n", "x.yaml:4" + second);
  expect_error("run:\n  steps: 5\n...\n---\nrun:\n  lr: 1\n", "x.yaml:3" + second);
  // A leading --- and a closing ... are one document.
  EXPECT_EQ(read("---\nrun:\n  steps: 5\n...\n").run.steps, 5);
}

TEST(ConfigStrictYaml, UnclosedQuotesAreRefusedWhereTheyOpen) {
  expect_error(
      "run:\n  name: \"abc\n",
      "x.yaml:2:9: the quote \" opened here is never closed (YAML would read to the end of the file: \"abc \"); "
      "close it on this line");
  expect_error(
      "run:\n  steps: 3\n  name: 'abc\n",
      "x.yaml:3:9: the quote ' opened here is never closed (YAML would read to the end of the file: \"abc \"); "
      "close it on this line");
  // Escaped quotes inside, and quoted scalars over several lines, are closed.
  EXPECT_EQ(read("run:\n  name: \"a\\\"b\"\n").run.name, "a\"b");
  EXPECT_EQ(read("run:\n  name: 'it''s'\n").run.name, "it's");
  EXPECT_EQ(read("run:\n  name: \"two\n    lines\"\n").run.name, "two lines");
}

TEST(ConfigStrictYaml, ControlCharactersInTheTextAreRefused) {
  expect_error(std::string("run:\n  name: ab\0c\n", 18),
               "x.yaml:2:11: control character 0x00 in the file (YAML allows tab, newline and carriage return only); "
               "remove it");
  expect_error("run:\n  name: a\bc\n",
               "x.yaml:2:10: control character 0x08 in the file (YAML allows tab, newline and carriage return only); "
               "remove it");
  // Tabs inside a value, CRLF line ends and UTF-8 are fine.
  EXPECT_EQ(read("run:\r\n  name: a\tb\r\n").run.name, "a\tb");
  EXPECT_EQ(read("run:\n  name: d\xc3\xa9j\xc3\xa0\n").run.name, "d\xc3\xa9j\xc3\xa0");
}

TEST(ConfigStrictYaml, LeadingZerosAreRefusedNotReadAsOctal) {
  expect_error("run:\n  steps: 010\n",
               "x.yaml:2:10: run.steps=010: a leading zero makes YAML read an integer as octal (010 is 8); write 10 "
               "without the zero");
  expect_error("run:\n  steps: -007\n",
               "x.yaml:2:10: run.steps=-007: a leading zero makes YAML read an integer as octal (010 is 8); write -7 "
               "without the zero");
  expect_error("run:\n  lr: 00.5\n",
               "x.yaml:2:7: run.lr=00.5: a leading zero makes YAML read an integer as octal (010 is 8); write 0.5 "
               "without the zero");
  const auto o = read("run:\n  steps: 10\n  lr: 0.25\n");
  EXPECT_EQ(o.run.steps, 10);
  EXPECT_DOUBLE_EQ(o.run.lr, 0.25);
  EXPECT_EQ(read("run:\n  steps: 0x10\n").run.steps, 16);  // hexadecimal is explicit
}

TEST(ConfigStrictYaml, OverrideMistakesBlameTheOverride) {
  expect_error("run:\n  steps: 5\n", "--set foo.bar=1: unknown key 'foo' (valid keys here: run)", {"foo.bar=1"});
  expect_error("run:\n  steps: 5\n", "--set run=: 'run' is a section; set its keys one by one (--set run.KEY=VALUE)",
               {"run="});
  expect_error("run:\n  steps: 5\n", "--set run.=4: 'run.' is not a key path (expected section.key, no empty parts)",
               {"run.=4"});
  expect_error("run:\n  steps: 5\n",
               "--set .steps=4: '.steps' is not a key path (expected section.key, no empty parts)", {".steps=4"});
  expect_error("run:\n  steps: 5\n",
               "--set run.steps=010: run.steps=010: a leading zero makes YAML read an integer as octal (010 is 8); "
               "write 10 without the zero",
               {"run.steps=010"});
  expect_error(
      "run:\n  steps: 5\n",
      "--set run={steps: 1, steps: 2}: duplicate key 'run.steps'; YAML keeps one of them silently, so keep only "
      "the one you mean",
      {"run={steps: 1, steps: 2}"});
  // Keys inside a section a --set replaced are the --set's, not lines of the file.
  expect_error(
      "run:\n  steps: 5\n",
      "--set run={steps: 2, stepz: 3}: unknown key 'run.stepz' (valid keys here: lr, name, steps); did you mean "
      "'run.steps'?",
      {"run={steps: 2, stepz: 3}"});
  expect_error("run:\n  steps: 5\n", "--set run={steps: 0}: run.steps=0 is out of range [1, 1e+12]",
               {"run={steps: 0}"});
  EXPECT_EQ(read("run:\n  steps: 5\n", {"run.steps=6"}).run.steps, 6);
}

TEST(ConfigStrictYaml, EmptyValuesAreRefusedAtTheirKey) {
  expect_error("run:\n  steps:\n  lr: 0.1\n",
               "x.yaml:2:3: run.steps has no value; write one, or remove the key to keep the default");
  expect_error("run:\n  name:\n",
               "x.yaml:2:3: run.name has no value; write one, or remove the key to keep the default");
  expect_error("run:\n  steps: 5\n",
               "--set run.lr=: run.lr has no value; write one, or remove the key to keep the default", {"run.lr="});
  EXPECT_EQ(read("run:\n  name: \"\"\n").run.name, "");  // an empty string is written as ""
}

TEST(ConfigStrictYaml, DirectoriesAreNotConfigFiles) {
  const auto dir = std::filesystem::temp_directory_path() / "cpf_strict_yaml_dir";
  std::filesystem::create_directories(dir);
  try {
    load_config_file(dir.string());
    ADD_FAILURE() << "a directory was read as a config";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), dir.string() + ": is a directory, not a config file; name the YAML file in it");
  }
  const auto empty = dir / "empty.yaml";
  std::ofstream(empty).close();
  try {
    load_config_file(empty.string());
    ADD_FAILURE() << "an empty file was read as a config";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(empty.string() + ":1: the config is empty (no keys)", 0), 0u) << e.what();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace cpf::config
