// Hugging Face interop with transformers itself in the loop: two tiny models saved by transformers'
// `save_pretrained` (tests/golden/hf: GPT2LMHeadModel and LlamaForCausalLM with GQA and rope_theta
// 500000, as transformers 5 writes them, with `rope_parameters`), and the logits transformers computed
// for a fixed input. run.init_from must load them and give those logits; `cpformer export` of the loaded
// weights must give back transformers' own file, tensor for tensor (names, shapes, layouts, values).
// tests/golden/hf/README.md records how the fixtures were made; no Python runs here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "apps/run/hf_folder.h"
#include "apps/run/init_from.h"
#include "framework/io/safetensors.h"
#include "models/data/embedded_file.h"
#include "models/gpt_input.h"
#include "tests/apps/cli_support.h"
#include "tests/support/test_utils.h"

// The fixture files are assembled into this binary (CPF_HF_FIXTURES_DIR: tests/CMakeLists.txt), so
// the test runs from any folder.
#define CPF_HF_FIXTURE(symbol, file) __asm__(CPF_EMBED_FILE(symbol, CPF_HF_FIXTURES_DIR "/" file));
CPF_HF_FIXTURE(cpf_hf_gpt2_config, "gpt2_tiny/config.json")
CPF_HF_FIXTURE(cpf_hf_gpt2_weights, "gpt2_tiny/model.safetensors")
CPF_HF_FIXTURE(cpf_hf_gpt2_logits, "gpt2_tiny/logits.json")
CPF_HF_FIXTURE(cpf_hf_llama_config, "llama_tiny/config.json")
CPF_HF_FIXTURE(cpf_hf_llama_weights, "llama_tiny/model.safetensors")
CPF_HF_FIXTURE(cpf_hf_llama_logits, "llama_tiny/logits.json")
CPF_HF_FIXTURE(cpf_hf_llama3_config, "llama3_tiny/config.json")
CPF_HF_FIXTURE(cpf_hf_llama3_weights, "llama3_tiny/model.safetensors")
CPF_HF_FIXTURE(cpf_hf_llama3_logits, "llama3_tiny/logits.json")
CPF_DECLARE_EMBEDDED(cpf_hf_gpt2_config)
CPF_DECLARE_EMBEDDED(cpf_hf_gpt2_weights)
CPF_DECLARE_EMBEDDED(cpf_hf_gpt2_logits)
CPF_DECLARE_EMBEDDED(cpf_hf_llama_config)
CPF_DECLARE_EMBEDDED(cpf_hf_llama_weights)
CPF_DECLARE_EMBEDDED(cpf_hf_llama_logits)
CPF_DECLARE_EMBEDDED(cpf_hf_llama3_config)
CPF_DECLARE_EMBEDDED(cpf_hf_llama3_weights)
CPF_DECLARE_EMBEDDED(cpf_hf_llama3_logits)
#define CPF_HF_BYTES(symbol) std::string(symbol##_begin, static_cast<size_t>(symbol##_end - symbol##_begin))

namespace cpf::trainer {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

struct Fixture {
  std::string config, weights, logits;
  std::string model_yaml;  // the model: section that describes the weights
};

Fixture gpt2_fixture() {
  return {CPF_HF_BYTES(cpf_hf_gpt2_config), CPF_HF_BYTES(cpf_hf_gpt2_weights), CPF_HF_BYTES(cpf_hf_gpt2_logits),
          "model:\n  vocab_size: 32\n  hidden_size: 8\n  num_layers: 2\n  num_heads: 2\n  mlp: gelu\n"
          "  norm: layernorm\n  positions: learned\n  max_positions: 16\n  bias: true\n  tie_embeddings: true\n"};
}

Fixture llama_fixture() {
  return {CPF_HF_BYTES(cpf_hf_llama_config), CPF_HF_BYTES(cpf_hf_llama_weights), CPF_HF_BYTES(cpf_hf_llama_logits),
          "model:\n  vocab_size: 32\n  hidden_size: 16\n  intermediate_size: 24\n  num_layers: 2\n  num_heads: 4\n"
          "  attention: gqa\n  num_kv_heads: 2\n  mlp: swiglu\n  norm: rmsnorm\n  positions: rope\n"
          "  rope_base: 500000\n  max_positions: 16\n  bias: false\n  tie_embeddings: false\n"};
}

// Llama 3's RoPE scaling (rope_type llama3; transformers 5 writes it into rope_parameters), head dim 8, so
// its four frequencies take each of the three branches (rope_frequencies.h).
Fixture llama3_fixture() {
  return {CPF_HF_BYTES(cpf_hf_llama3_config), CPF_HF_BYTES(cpf_hf_llama3_weights), CPF_HF_BYTES(cpf_hf_llama3_logits),
          "model:\n  vocab_size: 32\n  hidden_size: 32\n  intermediate_size: 48\n  num_layers: 2\n  num_heads: 4\n"
          "  attention: gqa\n  num_kv_heads: 2\n  mlp: swiglu\n  norm: rmsnorm\n  positions: rope\n"
          "  rope_base: 20000\n  rope_scaling: {factor: 8, low_freq_factor: 0.5, high_freq_factor: 8,\n"
          "    original_max_position_embeddings: 64}\n  max_positions: 512\n  bias: false\n  tie_embeddings: false\n"};
}

// The fixture as a folder, with config.json edited by `edit` when given.
fs::path write_folder(const Fixture& f, const std::function<void(json&)>& edit = nullptr) {
  const fs::path dir = testing::scratch_dir("hf");
  json config = json::parse(f.config);
  if (edit) edit(config);
  testing::write_file(dir / kHfConfigFile, config.dump(2));
  testing::write_file(dir / kHfWeightsFile, f.weights);
  return dir;
}

TrainConfig config_of(const Fixture& f) {
  return load_train_config_string("run:\n  threads: 1\n" + f.model_yaml + "data:\n  seq_len: 16\n", "t.yaml");
}

// run.init_from's loader on the fixture, then cpformer's forward on the input transformers saw.
void expect_transformers_logits(const Fixture& f) {
  const TrainConfig c = config_of(f);
  models::GPT model(c.model);
  const std::string loaded = load_init_weights(write_folder(f).string(), c, model.named_parameters());
  EXPECT_NE(loaded.find("Hugging Face"), std::string::npos) << loaded;
  const json expected = json::parse(f.logits);
  const std::vector<int64_t> ids = expected["input_ids"].get<std::vector<int64_t>>();
  models::GPTInput input = models::make_prompt_input({ids});
  if (expected.contains("position_ids")) {  // positions transformers was given (spread, so RoPE's scaling shows)
    const std::vector<int64_t> positions = expected["position_ids"].get<std::vector<int64_t>>();
    input.positions = from_vector(positions, {static_cast<int64_t>(positions.size())});
    input.seq = input.seq.with_positions(positions, positions);
  }
  const std::vector<float> ours = model.forward(input).to_vector<float>();
  const int64_t vocab = c.model.vocab_size;
  ASSERT_EQ(ours.size(), ids.size() * static_cast<size_t>(vocab));
  double worst = 0;
  for (size_t t = 0; t < ids.size(); ++t) {
    const std::vector<double> row = expected["logits"][t].get<std::vector<double>>();
    ASSERT_EQ(row.size(), static_cast<size_t>(vocab));
    for (int64_t v = 0; v < vocab; ++v) worst = std::max(worst, std::abs(ours[t * vocab + v] - row[v]));
    const auto ours_row = ours.begin() + static_cast<std::ptrdiff_t>(t * vocab);
    EXPECT_EQ(std::max_element(ours_row, ours_row + vocab) - ours_row,
              std::max_element(row.begin(), row.end()) - row.begin())
        << "argmax at position " << t;
  }
  ::testing::Test::RecordProperty("max_abs_logit_difference", std::to_string(worst));
  EXPECT_LT(worst, 1e-5) << "largest |cpformer - transformers| over the logits (magnitude up to ~4): f32 rounding";
}

TEST(HfTransformers, Gpt2FromTransformersGivesItsLogits) { expect_transformers_logits(gpt2_fixture()); }

TEST(HfTransformers, LlamaFromTransformers5GivesItsLogits) { expect_transformers_logits(llama_fixture()); }

TEST(HfTransformers, Llama3ScaledRopeGivesTransformersLogits) { expect_transformers_logits(llama3_fixture()); }

// Without model.rope_scaling the same weights compute another function: the loader refuses, naming the fix.
TEST(HfTransformers, Llama3ScalingMustBeInTheModelSection) {
  Fixture unscaled = llama3_fixture();
  unscaled.model_yaml =
      "model:\n  vocab_size: 32\n  hidden_size: 32\n  intermediate_size: 48\n  num_layers: 2\n"
      "  num_heads: 4\n  attention: gqa\n  num_kv_heads: 2\n  mlp: swiglu\n  norm: rmsnorm\n"
      "  rope_base: 20000\n  max_positions: 512\n  tie_embeddings: false\n";
  const TrainConfig c = config_of(unscaled);
  models::GPT model(c.model);
  EXPECT_CPF_ERROR(load_init_weights(write_folder(unscaled).string(), c, model.named_parameters()),
                   "has rope_scaling.factor 8 but model.rope_scaling.factor is 1; set model.rope_scaling.factor: 8");
  Fixture other = llama3_fixture();
  const TrainConfig oc = config_of(other);
  models::GPT other_model(oc.model);
  EXPECT_CPF_ERROR(
      load_init_weights(write_folder(other, [](json& j) { j["rope_parameters"]["low_freq_factor"] = 1.0; }).string(),
                        oc, other_model.named_parameters()),
      "has rope_scaling.low_freq_factor 1 but model.rope_scaling.low_freq_factor is 0.5");
  EXPECT_CPF_ERROR(
      load_init_weights(write_folder(other, [](json& j) { j["rope_parameters"].erase("high_freq_factor"); }).string(),
                        oc, other_model.named_parameters()),
      "rope_parameters.high_freq_factor is missing, but rope_type llama3 needs it as a number");
  // transformers < 5's form: rope_scaling beside a top-level rope_theta, loads the same.
  EXPECT_NO_THROW(load_init_weights(write_folder(other,
                                                 [](json& j) {
                                                   j["rope_scaling"] = j["rope_parameters"];
                                                   j["rope_scaling"].erase("rope_theta");
                                                   j.erase("rope_parameters");
                                                   j["rope_theta"] = 20000.0;
                                                 })
                                        .string(),
                                    oc, other_model.named_parameters()));
}

// Export of the loaded weights = the file transformers wrote: same names, dtypes, shapes and values.
void expect_export_equals_transformers(const Fixture& f, const std::vector<std::string>& same_keys) {
  const TrainConfig c = config_of(f);
  models::GPT model(c.model);
  load_init_weights(write_folder(f).string(), c, model.named_parameters());
  const fs::path out = testing::scratch_dir("export") / "hf";
  write_hf_folder(out.string(), c.model, model.named_parameters());
  const fs::path theirs_path = write_folder(f) / kHfWeightsFile;
  io::NamedTensors theirs = io::load_safetensors(theirs_path.string());
  io::NamedTensors ours = io::load_safetensors((out / kHfWeightsFile).string());
  const auto by_name = [](const auto& a, const auto& b) { return a.first < b.first; };
  std::sort(theirs.begin(), theirs.end(), by_name);
  std::sort(ours.begin(), ours.end(), by_name);
  ASSERT_EQ(ours.size(), theirs.size());
  for (size_t i = 0; i < ours.size(); ++i) {
    EXPECT_EQ(ours[i].first, theirs[i].first);
    EXPECT_EQ(ours[i].second.dtype(), theirs[i].second.dtype()) << theirs[i].first;
    EXPECT_EQ(ours[i].second.shape(), theirs[i].second.shape()) << theirs[i].first;
    EXPECT_EQ(ours[i].second.to_vector<float>(), theirs[i].second.to_vector<float>()) << theirs[i].first;
  }
  const json our_config = json::parse(testing::read_file(out / kHfConfigFile));
  const json their_config = json::parse(f.config);
  for (const std::string& key : same_keys) EXPECT_EQ(our_config[key], their_config[key]) << key;
}

TEST(HfTransformers, Gpt2ExportIsTransformersOwnFile) {
  expect_export_equals_transformers(
      gpt2_fixture(), {"architectures", "model_type", "vocab_size", "n_positions", "n_embd", "n_layer", "n_head",
                       "activation_function", "layer_norm_epsilon", "tie_word_embeddings"});
}

TEST(HfTransformers, Llama3ExportWritesItsRopeScaling) {
  expect_export_equals_transformers(llama3_fixture(),
                                    {"architectures", "model_type", "head_dim", "max_position_embeddings"});
  const Fixture f = llama3_fixture();
  const TrainConfig c = config_of(f);
  models::GPT model(c.model);
  const fs::path out = testing::scratch_dir("export3") / "hf";
  write_hf_folder(out.string(), c.model, model.named_parameters());
  const json ours = json::parse(testing::read_file(out / kHfConfigFile));
  const json theirs = json::parse(f.config)["rope_parameters"];
  EXPECT_EQ(ours["rope_scaling"]["rope_type"], "llama3");
  for (const char* key : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
    EXPECT_EQ(ours["rope_scaling"][key], theirs[key]) << key;
  }
  // And cpformer reads its own export back.
  models::GPT again(c.model);
  EXPECT_NO_THROW(load_init_weights(out.string(), c, again.named_parameters()));
}

TEST(HfTransformers, LlamaExportIsTransformersOwnFile) {
  expect_export_equals_transformers(
      llama_fixture(),
      {"architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
       "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings",
       "rms_norm_eps", "attention_bias", "mlp_bias", "tie_word_embeddings"});
}

// What transformers can describe and cpformer cannot compute is refused by name, never loaded.
void expect_refused(const Fixture& f, const std::function<void(json&)>& edit, const std::string& message) {
  const TrainConfig c = config_of(f);
  models::GPT model(c.model);
  EXPECT_CPF_ERROR(load_init_weights(write_folder(f, edit).string(), c, model.named_parameters()), message);
}

TEST(HfTransformers, RopeOfEitherTransformersVersionIsReadAndOtherScalingsRefused) {
  const Fixture llama = llama_fixture();
  expect_refused(
      llama, [](json& c) { c["rope_parameters"]["rope_theta"] = 10000.0; },
      "has rope_theta 10000 but model.rope_base is 500000; set model.rope_base: 10000");
  expect_refused(
      llama, [](json& c) { c["rope_theta"] = 10000.0; }, "has rope_theta 10000 and rope_parameters.rope_theta 500000");
  expect_refused(
      llama, [](json& c) { c.erase("rope_parameters"); },
      "has rope_theta 10000 but model.rope_base is 500000");  // absent: transformers' default
  expect_refused(
      llama,
      [](json& c) {
        c["rope_parameters"] = {{"rope_theta", 500000.0}, {"rope_type", "yarn"}, {"factor", 32.0}};
      },
      "rope_type 'yarn' scales RoPE in a way cpformer does not compute");
  expect_refused(
      llama,
      [](json& c) {
        c.erase("rope_parameters");
        c["rope_theta"] = 500000.0;
        c["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
      },
      "rope_type 'linear' scales RoPE");
  expect_refused(
      llama, [](json& c) { c["rope_parameters"]["partial_rotary_factor"] = 0.5; },
      "rope_parameters.partial_rotary_factor 0.5, but cpformer rotates every dimension of a head");
  expect_refused(
      llama, [](json& c) { c["partial_rotary_factor"] = "half"; },
      "has partial_rotary_factor \"half\", but cpformer rotates every dimension of a head (1.0)");
  // transformers < 5: rope_theta at the top level, rope_scaling null.
  const TrainConfig c = config_of(llama);
  models::GPT model(c.model);
  EXPECT_NO_THROW(load_init_weights(write_folder(llama,
                                                 [](json& j) {
                                                   j.erase("rope_parameters");
                                                   j["rope_theta"] = 500000.0;
                                                   j["rope_scaling"] = nullptr;
                                                 })
                                        .string(),
                                    c, model.named_parameters()));
}

TEST(HfTransformers, Gpt2AttentionVariantsAreRefused) {
  const Fixture gpt2 = gpt2_fixture();
  expect_refused(
      gpt2, [](json& c) { c["scale_attn_by_inverse_layer_idx"] = true; },
      "has scale_attn_by_inverse_layer_idx true, but cpformer does not scale scores by 1/(layer + 1)");
  expect_refused(
      gpt2, [](json& c) { c["scale_attn_weights"] = false; },
      "has scale_attn_weights false, but cpformer scales attention scores by 1/sqrt(head_dim)");
}

}  // namespace
}  // namespace cpf::trainer
