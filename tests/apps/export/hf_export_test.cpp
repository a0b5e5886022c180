// Hugging Face interop: `cpformer export --format hf` (GPT-2 and Llama shapes), run.init_from from an
// HF folder or a cpformer checkpoint, and every refusal with its message. Round trips are bit-exact:
// export -> import gives back the checkpoint's very weights.
#include <gtest/gtest.h>

#include <filesystem>

#include "apps/export/hf_export.h"
#include "apps/run/checkpointing.h"
#include "apps/run/hf_folder.h"
#include "apps/run/init_from.h"
#include "apps/trainer/trainer.h"
#include "framework/io/checkpoint.h"
#include "framework/io/checkpoint_meta.h"
#include "framework/io/safetensors.h"
#include "framework/tensor/ops/views.h"
#include "tests/apps/cli_support.h"
#include "tests/support/test_utils.h"

namespace cpf::trainer {
namespace {
namespace fs = std::filesystem;

const char* kGpt2Model =
    "model:\n  hidden_size: 16\n  num_layers: 2\n  num_heads: 2\n  mlp: gelu\n  norm: layernorm\n"
    "  positions: learned\n  max_positions: 32\n  bias: true\n  tie_embeddings: true\n";
const char* kLlamaModel =
    "model:\n  hidden_size: 16\n  num_layers: 2\n  num_heads: 4\n  attention: gqa\n"
    "  num_kv_heads: 2\n  mlp: swiglu\n  norm: rmsnorm\n  positions: rope\n  bias: false\n"
    "  tie_embeddings: false\n";

std::string run_yaml(const fs::path& dir, const std::string& model, const std::string& extra_run = "",
                     double lr = 0.003) {
  return "run:\n  out_dir: " + dir.string() +
         "\n  steps: 2\n  log_every: 1\n  eval_every: 0\n  eval_batches: 1\n  eval_examples: 4\n  threads: 1\n" +
         extra_run + model + "optimizer:\n  lr: " + std::to_string(lr) +
         "\ndata:\n  seq_len: 16\n  tokens_per_batch: 64\n";
}

TrainConfig config_of(const std::string& yaml) { return load_train_config_string(yaml, "t.yaml"); }

// Trains `yaml` and returns its final checkpoint's weights.
io::NamedTensors train_and_load(const std::string& yaml, std::string* checkpoint = nullptr) {
  const TrainConfig c = config_of(yaml);
  std::ostringstream out;
  const TrainOutcome outcome = train(c, out);
  models::GPT model(c.model);
  io::load_checkpoint(outcome.checkpoint, model.named_parameters(), nullptr, "");
  if (checkpoint) *checkpoint = outcome.checkpoint;
  io::NamedTensors weights;
  for (const auto& [name, t] : model.named_parameters()) weights.emplace_back(name, t.detach());
  return weights;
}

void expect_bit_equal(const io::NamedTensors& a, const io::NamedTensors& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_EQ(a[i].second.shape(), b[i].second.shape()) << a[i].first;
    EXPECT_EQ(a[i].second.to_vector<float>(), b[i].second.to_vector<float>()) << a[i].first;
  }
}

// Exports `yaml`'s trained run and reads the folder back into a fresh model of the same config.
void expect_round_trip(const std::string& model, models::HfArchitecture arch) {
  const fs::path dir = testing::scratch_dir("run");
  const std::string yaml = run_yaml(dir, model);
  const io::NamedTensors trained = train_and_load(yaml);
  const HfExportResult r = export_hf(dir.string(), std::nullopt);
  EXPECT_EQ(r.out_dir, (dir / "hf").string());
  EXPECT_EQ(r.arch, arch);
  EXPECT_EQ(r.step, 2);
  const TrainConfig c = config_of(yaml);
  models::GPT fresh(c.model);
  expect_bit_equal(read_hf_folder(r.out_dir, c.model, fresh.named_parameters()), trained);
  io::Metadata metadata;
  io::load_safetensors((fs::path(r.out_dir) / kHfWeightsFile).string(), &metadata);
  EXPECT_EQ(metadata, (io::Metadata{{"format", "pt"}}));
}

TEST(HfExport, Gpt2RoundTripIsBitExact) { expect_round_trip(kGpt2Model, models::HfArchitecture::gpt2); }

TEST(HfExport, LlamaRoundTripIsBitExact) { expect_round_trip(kLlamaModel, models::HfArchitecture::llama); }

TEST(HfExport, LlamaWithBiasesRoundTrips) {
  std::string model = kLlamaModel;
  model.replace(model.find("bias: false"), 11, "bias: true");
  expect_round_trip(model, models::HfArchitecture::llama);
}

// The HF layouts: GPT-2's Conv1D weights are the transposed Linear weights, c_attn fuses q, k, v along
// the output dimension; tied embeddings write no lm_head; config.json names the architecture.
TEST(HfExport, Gpt2NamesAndLayouts) {
  const fs::path dir = testing::scratch_dir("run");
  const io::NamedTensors w = train_and_load(run_yaml(dir, kGpt2Model));
  const HfExportResult r = export_hf(dir.string(), (dir / "out").string());
  const io::NamedTensors hf = io::load_safetensors((fs::path(r.out_dir) / kHfWeightsFile).string());
  auto find = [](const io::NamedTensors& t, const std::string& name) {
    for (const auto& [n, v] : t) {
      if (n == name) return v;
    }
    ADD_FAILURE() << "no " << name;
    return Tensor();
  };
  const Tensor c_attn = find(hf, "transformer.h.1.attn.c_attn.weight");
  ASSERT_EQ(c_attn.shape(), (Shape{16, 48}));
  const Tensor k_part = raw::contiguous(raw::narrow(c_attn, 1, 16, 16));
  const Tensor k_proj = raw::contiguous(raw::transpose(find(w, "blocks.1.attn.k_proj.weight"), 0, 1));
  EXPECT_EQ(k_part.to_vector<float>(), k_proj.to_vector<float>());
  EXPECT_EQ(find(hf, "transformer.h.0.mlp.c_fc.weight").shape(), (Shape{16, 64}));
  EXPECT_EQ(find(hf, "transformer.wpe.weight").shape(), (Shape{32, 16}));
  for (const auto& [name, t] : hf) EXPECT_NE(name, "lm_head.weight");
  const std::string config = testing::read_file(fs::path(r.out_dir) / kHfConfigFile);
  for (const char* key : {"\"GPT2LMHeadModel\"", "\"model_type\": \"gpt2\"", "\"n_embd\": 16", "\"n_layer\": 2",
                          "\"activation_function\": \"gelu_new\"", "\"tie_word_embeddings\": true"}) {
    EXPECT_NE(config.find(key), std::string::npos) << key << " in\n" << config;
  }
}

TEST(HfExport, LlamaConfigNamesHeadsAndRope) {
  const fs::path dir = testing::scratch_dir("run");
  train_and_load(run_yaml(dir, kLlamaModel));
  const HfExportResult r = export_hf(dir.string(), std::nullopt);
  const std::string config = testing::read_file(fs::path(r.out_dir) / kHfConfigFile);
  for (const char* key : {"\"LlamaForCausalLM\"", "\"num_key_value_heads\": 2", "\"head_dim\": 4",
                          "\"rope_theta\": 10000.0", "\"hidden_act\": \"silu\"", "\"tie_word_embeddings\": false"}) {
    EXPECT_NE(config.find(key), std::string::npos) << key << " in\n" << config;
  }
}

TEST(HfExport, RefusesModelsWithoutAnHfArchitectureAndUsedFolders) {
  const fs::path dir = testing::scratch_dir("run");
  train_and_load(run_yaml(dir,
                          "model:\n  hidden_size: 16\n  num_layers: 1\n  num_heads: 2\n  attention: mla\n"
                          "  kv_lora_rank: 8\n  qk_nope_head_dim: 4\n  qk_rope_head_dim: 4\n  v_head_dim: 4\n"));
  EXPECT_CPF_ERROR(export_hf(dir.string(), std::nullopt),
                   "the model fits no Hugging Face architecture: GPT-2 (GPT2LMHeadModel) needs attention: mha (has "
                   "mla); Llama (LlamaForCausalLM) needs attention: mha or gqa (has mla)");
  const fs::path used = testing::scratch_dir("used");
  testing::write_file(used / "keep.txt", "mine");
  const fs::path gpt2 = testing::scratch_dir("gpt2");
  train_and_load(run_yaml(gpt2, kGpt2Model));
  EXPECT_CPF_ERROR(export_hf(gpt2.string(), used.string()), "exists and is not an empty folder");
  EXPECT_EQ(testing::read_file(used / "keep.txt"), "mine");
}

TEST(HfExport, CommandLine) {
  const fs::path dir = testing::scratch_dir("run");
  train_and_load(run_yaml(dir, kGpt2Model));
  testing::CliResult r = testing::run({"export", dir.string(), "--format", "hf"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("as GPT2LMHeadModel to " + (dir / "hf").string()), std::string::npos) << r.out;
  EXPECT_TRUE(is_hf_folder((dir / "hf").string()));
  r = testing::run({"export", dir.string()});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("export: --format is required (hf: a Hugging Face model folder)"), std::string::npos) << r.err;
  r = testing::run({"export", dir.string(), "--format", "onnx"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--format onnx: expected hf"), std::string::npos) << r.err;
  r = testing::run({"export", "--format", "hf"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("'export' takes exactly one run or checkpoint folder, got 0"), std::string::npos) << r.err;
  r = testing::run({"export", (dir / "nothing").string(), "--format", "hf"});
  EXPECT_EQ(r.code, 1);
}

// ---- run.init_from ---------------------------------------------------------------------------

// A run with lr 0 from `source`: its checkpoint holds exactly the weights it started from.
io::NamedTensors start_from(const std::string& source, const std::string& model, const std::string& name) {
  const fs::path dir = testing::scratch_dir(name);
  return train_and_load(run_yaml(dir, model, "  init_from: " + source + "\n", 0.0));
}

TEST(InitFrom, StartsFromAnHfFolderOrACheckpoint) {
  for (const char* model : {kGpt2Model, kLlamaModel}) {
    const fs::path dir = testing::scratch_dir("source");
    std::string checkpoint;
    const io::NamedTensors trained = train_and_load(run_yaml(dir, model), &checkpoint);
    export_hf(dir.string(), std::nullopt);
    expect_bit_equal(start_from((dir / "hf").string(), model, "from_hf"), trained);
    expect_bit_equal(start_from(dir.string(), model, "from_run"), trained);
    expect_bit_equal(start_from(checkpoint, model, "from_checkpoint"), trained);
  }
}

// load_init_weights with `model` (a YAML model: section) from `path`; "" when it loads.
std::string init_error(const std::string& path, const std::string& model) {
  const TrainConfig c = config_of(run_yaml(testing::scratch_dir("target"), model));
  models::GPT target(c.model);
  try {
    load_init_weights(path, c, target.named_parameters());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string with(std::string model, const std::string& from, const std::string& to) {
  return model.replace(model.find(from), from.size(), to);
}

// A checkpoint whose saved config no longer reads (as one written before a key was renamed, its
// checksums intact): load_init_weights passes the config::ConfigError on as it is (located in
// meta.json, exit code 2 from the CLI), not as a "run.init_from:" cpf::Error.
TEST(InitFrom, AnUnreadableSavedConfigKeepsItsConfigError) {
  const fs::path dir = testing::scratch_dir("source");
  std::string checkpoint;
  train_and_load(run_yaml(dir, kGpt2Model), &checkpoint);
  const fs::path meta = fs::path(checkpoint) / io::kCheckpointMetaFile;
  io::CheckpointMetaFile file = io::parse_checkpoint_meta(testing::read_file(meta));
  std::string& config = file.meta.extra.at("config");
  const size_t at = config.find("hidden_size: 16");
  ASSERT_NE(at, std::string::npos) << config;
  config.replace(at, std::string("hidden_size").size(), "hidden_sise");
  testing::write_file(meta, io::checkpoint_meta_json(file));
  const TrainConfig c = config_of(run_yaml(testing::scratch_dir("target"), kGpt2Model));
  models::GPT target(c.model);
  try {
    load_init_weights(checkpoint, c, target.named_parameters());
    ADD_FAILURE() << "a checkpoint with an unknown config key was loaded";
  } catch (const config::ConfigError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind(checkpoint + "/meta.json:extra.config", 0), 0u) << what;
    EXPECT_NE(what.find("hidden_sise"), std::string::npos) << what;
    EXPECT_EQ(what.find("run.init_from"), std::string::npos) << what;
  }
}

TEST(InitFrom, RefusesEveryMismatchNamingIt) {
  const fs::path dir = testing::scratch_dir("source");
  train_and_load(run_yaml(dir, kGpt2Model));
  const HfExportResult r = export_hf(dir.string(), std::nullopt);
  const std::string hf = r.out_dir, config = (fs::path(hf) / kHfConfigFile).string();
  EXPECT_EQ(init_error(hf, kGpt2Model), "");
  EXPECT_NE(init_error((dir / "none").string(), kGpt2Model)
                .find("run.init_from: " + (dir / "none").string() + " does not exist"),
            std::string::npos);
  EXPECT_NE(init_error(hf, with(kGpt2Model, "hidden_size: 16", "hidden_size: 32"))
                .find(config + " has n_embd 16 but model.hidden_size is 32; set model.hidden_size: 16"),
            std::string::npos);
  EXPECT_NE(init_error(hf, with(kGpt2Model, "num_layers: 2", "num_layers: 3"))
                .find("has n_layer 2 but model.num_layers is 3"),
            std::string::npos);
  EXPECT_NE(init_error(hf, kLlamaModel)
                .find(config + " is a GPT2LMHeadModel but the model: section describes "
                               "LlamaForCausalLM"),
            std::string::npos);
  // A cpformer checkpoint of another model: the differing model: keys.
  EXPECT_NE(init_error(dir.string(), with(kGpt2Model, "norm: layernorm", "norm: rmsnorm"))
                .find("holds another model: model.norm: layernorm in the checkpoint, rmsnorm now"),
            std::string::npos);
}

TEST(InitFrom, RefusesMissingExtraAndMisshapenTensors) {
  const fs::path dir = testing::scratch_dir("source");
  train_and_load(run_yaml(dir, kGpt2Model));
  const std::string hf = export_hf(dir.string(), std::nullopt).out_dir;
  const std::string weights = (fs::path(hf) / kHfWeightsFile).string();
  const io::NamedTensors original = io::load_safetensors(weights);
  auto rewrite = [&](io::NamedTensors tensors) { io::save_safetensors(weights, tensors, {{"format", "pt"}}); };

  io::NamedTensors missing;
  for (const auto& t : original) {
    if (t.first != "transformer.h.1.ln_2.bias") missing.push_back(t);
  }
  rewrite(missing);
  EXPECT_NE(init_error(hf, kGpt2Model)
                .find(weights + ": no tensor 'transformer.h.1.ln_2.bias', which the model's "
                                "blocks.1.mlp_norm.bias needs"),
            std::string::npos);

  io::NamedTensors extra = original;
  extra.emplace_back("transformer.h.2.ln_1.weight", zeros({16}));
  rewrite(extra);
  EXPECT_NE(init_error(hf, kGpt2Model).find("1 tensor(s) the model has no place for: transformer.h.2.ln_1.weight"),
            std::string::npos);

  io::NamedTensors misshapen = original;
  for (auto& [name, t] : misshapen) {
    if (name == "transformer.h.0.attn.c_proj.weight") t = zeros({16, 8});
  }
  rewrite(misshapen);
  const std::string shape_error = init_error(hf, kGpt2Model);
  EXPECT_NE(shape_error.find("tensor 'transformer.h.0.attn.c_proj.weight' has shape [16,8] but the model needs "
                             "[16,16]"),
            std::string::npos)
      << shape_error;

  // A tied model's file may hold lm_head.weight only as a copy of the embedding.
  io::NamedTensors head = original;
  head.emplace_back("lm_head.weight", zeros(original[0].second.shape()));
  rewrite(head);
  EXPECT_NE(init_error(hf, kGpt2Model)
                .find("lm_head.weight differs from transformer.wte.weight but "
                      "model.tie_embeddings is true"),
            std::string::npos);
  // The Hub's original gpt2 names (no "transformer." prefix) and its attn.bias buffers load.
  io::NamedTensors hub;
  for (const auto& [name, t] : original) hub.emplace_back(name.substr(std::string("transformer.").size()), t);
  hub.emplace_back("h.0.attn.bias", zeros({1, 1, 32, 32}));
  rewrite(hub);
  EXPECT_EQ(init_error(hf, kGpt2Model), "");
}

}  // namespace
}  // namespace cpf::trainer
