#include <gtest/gtest.h>

#include "config/config_read.h"
#include "framework/config/schema.h"
#include "support/test_utils.h"

namespace demo {

enum class Norm { rmsnorm, layernorm };

struct Inner {
  int64_t heads = 4;
  double dropout = 0.0;
};

struct Options {
  int64_t layers = 2;
  double lr = 1e-3;
  bool tie = true;
  std::string name = "run";
  Norm norm = Norm::rmsnorm;
  Inner attention;
};

template <class V>
void describe(V& v, Inner& o) {
  v.field("heads", o.heads, "attention heads", cpf::config::Range{1, 64});
  v.field("dropout", o.dropout, "dropout probability", cpf::config::Range{0, 1});
}

template <class V>
void describe(V& v, Options& o) {
  v.field("layers", o.layers, "number of blocks", cpf::config::Range{1, 1000});
  v.field("lr", o.lr, "learning rate");
  v.field("tie", o.tie, "tie embeddings");
  v.field("name", o.name, "run name");
  v.choice("norm", o.norm, cpf::config::Choices<Norm>{{"rmsnorm", Norm::rmsnorm}, {"layernorm", Norm::layernorm}},
           "normalisation");
  v.section("attention", o.attention, "attention options");
}

}  // namespace demo

namespace cpf::config {
namespace {

demo::Options read(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return testing::read_options<demo::Options>(yaml, "configs/x.yaml", overrides);
}

void expect_error(const std::string& yaml, const std::string& expected,
                  const std::vector<std::string>& overrides = {}) {
  const auto error = testing::config_error<demo::Options>(yaml, "configs/x.yaml", overrides);
  if (!error) {
    ADD_FAILURE() << "expected ConfigError containing: " << expected;
  } else {
    EXPECT_NE(error->find(expected), std::string::npos) << *error;
  }
}

TEST(ConfigSchema, ReadsEveryTypeAndKeepsDefaults) {
  const auto o = read("layers: 6\nnorm: layernorm\nattention:\n  heads: 8\n");
  EXPECT_EQ(o.layers, 6);
  EXPECT_EQ(o.norm, demo::Norm::layernorm);
  EXPECT_EQ(o.attention.heads, 8);
  EXPECT_DOUBLE_EQ(o.lr, 1e-3);
  EXPECT_TRUE(o.tie);
  EXPECT_EQ(o.name, "run");
}

TEST(ConfigSchema, ErrorsNameFileLineColumnAndKeyPath) {
  expect_error("layers: 6\nattention:\n  heads: 0\n", "configs/x.yaml:3:10: attention.heads=0 is out of range [1, 64]");
  expect_error("layers: six\n", "configs/x.yaml:1:9: layers=six: expected an integer");
  expect_error("tie: maybe\n", "configs/x.yaml:1:6: tie=maybe: expected true or false");
  expect_error("norm: batchnorm\n", "norm=batchnorm is not one of: rmsnorm, layernorm");
  expect_error("layers: 2\nattention:\n  head: 3\n",
               "configs/x.yaml:3:3: unknown key 'attention.head' (valid keys here: dropout, heads)");
  expect_error("attention: 5\n", "attention: expected a section");
  expect_error("layers: [1, 2\n", "configs/x.yaml:");
}

// ConfigError is a cpf::Error like every other error; its text is the located message alone (no
// source location appended), which is what the CLI prints before exiting with code 2.
TEST(ConfigSchema, ConfigErrorIsACpfErrorWhoseTextIsTheMessage) {
  try {
    read("layers: six\n");
    ADD_FAILURE() << "a bad value was accepted";
  } catch (const Error& e) {
    EXPECT_NE(dynamic_cast<const ConfigError*>(&e), nullptr);
    EXPECT_EQ(std::string(e.what()), "configs/x.yaml:1:9: layers=six: expected an integer");
    EXPECT_EQ(e.message(), e.what());
    EXPECT_EQ(e.file(), "");
    EXPECT_EQ(e.line(), 0);
  }
}

TEST(ConfigSchema, OverridesWinAndAreReportedAsSuch) {
  const auto o = read("layers: 2\n", {"attention.heads=16", "lr=0.5", "name=exp1"});
  EXPECT_EQ(o.attention.heads, 16);
  EXPECT_DOUBLE_EQ(o.lr, 0.5);
  EXPECT_EQ(o.name, "exp1");
  expect_error("layers: 2\n", "--set layers=0: layers=0 is out of range", {"layers=0"});
  expect_error("layers: 2\n", "unknown key 'attention.bogus'", {"attention.bogus=1"});
  expect_error("layers: 2\n", "--set layers: expected key.path=value", {"layers"});
}

// A mapping over a section sets the keys it names and keeps the file's others (it used to replace the
// whole section, dropping them silently).
TEST(ConfigSchema, AMappingOverrideMergesIntoItsSection) {
  const auto o = read("layers: 3\nattention:\n  heads: 8\n  dropout: 0.25\n", {"attention={heads: 16}"});
  EXPECT_EQ(o.attention.heads, 16);
  EXPECT_DOUBLE_EQ(o.attention.dropout, 0.25);
  EXPECT_EQ(o.layers, 3);
  expect_error("attention:\n  heads: 8\n", "--set attention={heads: 0}: attention.heads=0 is out of range",
               {"attention={heads: 0}"});
  expect_error("attention:\n  heads: 8\n", "unknown key 'attention.bogus'", {"attention={bogus: 1}"});
}

// Brackets nested beyond any config's need: refused where they pass the limit, before the parser recurses.
TEST(ConfigSchema, DeepNestingIsRefusedWithItsPosition) {
  expect_error("layers: 2\nname: " + std::string(100000, '['),
               "configs/x.yaml:2:71: brackets nested more than 64 levels deep; a config needs a few");
  expect_error("name: '[[[[' # " + std::string(70, '{') + "\nlayers: " + std::string(65, '[') + std::string(65, ']'),
               "configs/x.yaml:2:73: brackets nested more than 64 levels deep");
}

TEST(ConfigSchema, OnlyRegularFilesAreRead) {
  EXPECT_CPF_ERROR(load_config_file("/dev/zero"),
                   "/dev/zero: is not a regular file (a device, pipe or socket); name a YAML file");
}

TEST(ConfigSchema, WriterRoundTripsAndDocsListEveryKey) {
  demo::Options o;
  o.layers = 12;
  o.norm = demo::Norm::layernorm;
  o.attention.dropout = 0.25;
  ConfigWriter writer;
  describe(writer, o);
  const auto back = read(writer.str());
  EXPECT_EQ(back.layers, 12);
  EXPECT_EQ(back.norm, demo::Norm::layernorm);
  EXPECT_DOUBLE_EQ(back.attention.dropout, 0.25);

  ConfigDocs docs;
  demo::Options defaults;
  describe(docs, defaults);
  std::vector<std::string> keys;
  for (const auto& row : docs.rows()) keys.push_back(row.key);
  EXPECT_EQ(keys,
            (std::vector<std::string>{"layers", "lr", "tie", "name", "norm", "attention.heads", "attention.dropout"}));
  EXPECT_NE(docs.markdown().find("| `norm` | one of rmsnorm, layernorm | `rmsnorm` | normalisation |"),
            std::string::npos)
      << docs.markdown();
}

}  // namespace
}  // namespace cpf::config
