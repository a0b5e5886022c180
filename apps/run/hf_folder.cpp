#include "apps/run/hf_folder.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <typeinfo>

#include "apps/report/checked_file.h"

namespace cpf::trainer {
namespace fs = std::filesystem;
using models::HfArchitecture;
using nlohmann::json;
using nlohmann::ordered_json;

namespace {

int64_t kv_heads(const models::GPTOptions& m) {
  return m.attention == models::AttentionType::gqa && m.num_kv_heads > 0 ? m.num_kv_heads : m.num_heads;
}
int64_t head_dim(const models::GPTOptions& m) { return m.head_dim > 0 ? m.head_dim : m.hidden_size / m.num_heads; }

ordered_json gpt2_config(const models::GPTOptions& m) {
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", m.vocab_size},
          {"n_positions", m.max_positions},
          {"n_ctx", m.max_positions},
          {"n_embd", m.hidden_size},
          {"n_layer", m.num_layers},
          {"n_head", m.num_heads},
          {"n_inner", models::effective_intermediate_size(m)},
          {"activation_function", "gelu_new"},  // cpformer's gelu is the tanh approximation
          {"layer_norm_epsilon", m.norm_eps},
          {"resid_pdrop", 0.0},
          {"embd_pdrop", 0.0},
          {"attn_pdrop", 0.0},
          {"initializer_range", m.init_std},
          {"scale_attn_weights", true},
          {"tie_word_embeddings", m.tie_embeddings},
          {"use_cache", true},
          {"torch_dtype", "float32"}};
}

// Llama 3's scaling as transformers writes it, or null.
ordered_json rope_scaling_json(const RopeScaling& s) {
  if (!s.active()) return nullptr;
  return {{"rope_type", "llama3"},
          {"factor", s.factor},
          {"low_freq_factor", s.low_freq_factor},
          {"high_freq_factor", s.high_freq_factor},
          {"original_max_position_embeddings", s.original_context == std::floor(s.original_context)
                                                   ? ordered_json(static_cast<int64_t>(s.original_context))
                                                   : ordered_json(s.original_context)}};
}

ordered_json llama_config(const models::GPTOptions& m) {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", m.vocab_size},
          {"hidden_size", m.hidden_size},
          {"intermediate_size", models::effective_intermediate_size(m)},
          {"num_hidden_layers", m.num_layers},
          {"num_attention_heads", m.num_heads},
          {"num_key_value_heads", kv_heads(m)},
          {"head_dim", head_dim(m)},
          {"hidden_act", "silu"},
          {"max_position_embeddings", m.max_positions},
          {"rms_norm_eps", m.norm_eps},
          {"rope_theta", m.rope_base},
          {"rope_scaling", rope_scaling_json(m.rope_scaling)},
          {"attention_bias", m.bias},
          {"mlp_bias", m.bias},
          {"attention_dropout", 0.0},
          {"initializer_range", m.init_std},
          {"tie_word_embeddings", m.tie_embeddings},
          {"use_cache", true},
          {"torch_dtype", "float32"}};
}

json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  CPF_CHECK(in, path, ": cannot open");
  std::stringstream text;
  text << in.rdbuf();
  try {
    return json::parse(text.str());
  } catch (const json::exception& e) {
    CPF_FAIL(path, ": not valid JSON: ", e.what());
  }
}

// The architecture config.json describes (model_type, else architectures[0]).
HfArchitecture hf_architecture_of(const json& config, const std::string& path) {
  std::string type = config.value("model_type", "");
  if (type.empty() && config.contains("architectures") && config["architectures"].is_array() &&
      !config["architectures"].empty() && config["architectures"][0].is_string()) {
    const std::string a = config["architectures"][0].get<std::string>();
    type = a == "GPT2LMHeadModel" ? "gpt2" : a == "LlamaForCausalLM" ? "llama" : a;
  }
  if (type == "gpt2") return HfArchitecture::gpt2;
  if (type == "llama") return HfArchitecture::llama;
  CPF_FAIL(path, ": model_type '", type,
           "' is not one cpformer reads (gpt2: GPT2LMHeadModel, llama: LlamaForCausalLM)");
}

// One config.json key against the model option it must equal.
class ConfigComparer {
 public:
  ConfigComparer(const json& config, std::string path) : config_(config), path_(std::move(path)) {}
  // `fallback`: HF's default when the key is absent or null.
  template <class T>
  void equal(const std::string& key, const std::string& option, T ours,
             std::optional<T> fallback = std::nullopt) const {
    const bool present = config_.contains(key) && !config_[key].is_null();
    CPF_CHECK(present || fallback, path_, ": has no '", key, "' (needed for model.", option, ")");
    T theirs = *fallback;
    if (present) {
      try {
        theirs = config_[key].get<T>();
      } catch (const json::exception&) {
        CPF_FAIL(path_, ": '", key, "' is ", config_[key].dump(), ", not a ",
                 typeid(T) == typeid(bool) ? "boolean" : "number");
      }
    }
    CPF_CHECK(theirs == ours, path_, " has ", key, " ", show(theirs), " but model.", option, " is ", show(ours),
              "; set model.", option, ": ", show(theirs), " (the model: section must describe the weights)");
  }
  // A switch of HF's attention that cpformer computes one way only: absent, null or `expected`.
  void flag(const std::string& key, bool expected, const std::string& why) const {
    if (!config_.contains(key) || config_[key].is_null()) return;
    CPF_CHECK(config_[key].is_boolean() && config_[key].get<bool>() == expected, path_, " has ", key, " ",
              config_[key].dump(), ", but ", why, " (", key, " ", expected ? "true" : "false",
              "); the weights would compute another function");
  }
  void text(const std::string& key, const std::vector<std::string>& accepted, const std::string& why) const {
    const std::string value = config_.contains(key) && config_[key].is_string() ? config_[key].get<std::string>() : "";
    for (const auto& a : accepted) {
      if (value == a) return;
    }
    CPF_FAIL(path_, " has ", key, " '", value, "', but ", why);
  }

 private:
  template <class T>
  static std::string show(T v) {
    if constexpr (std::is_same_v<T, bool>) {
      return v ? "true" : "false";
    } else {
      std::ostringstream s;
      s << v;
      return s.str();
    }
  }
  const json& config_;
  std::string path_;
};

void check_gpt2_config(const ConfigComparer& c, const models::GPTOptions& m) {
  c.equal<int64_t>("vocab_size", "vocab_size", m.vocab_size);
  c.equal<int64_t>("n_embd", "hidden_size", m.hidden_size);
  c.equal<int64_t>("n_layer", "num_layers", m.num_layers);
  c.equal<int64_t>("n_head", "num_heads", m.num_heads);
  c.equal<int64_t>("n_positions", "max_positions", m.max_positions);
  c.equal<int64_t>("n_inner", "intermediate_size", models::effective_intermediate_size(m), 4 * m.hidden_size);
  c.equal<double>("layer_norm_epsilon", "norm_eps", m.norm_eps, 1e-5);
  c.equal<bool>("tie_word_embeddings", "tie_embeddings", m.tie_embeddings, true);
  c.flag("scale_attn_weights", true, "cpformer scales attention scores by 1/sqrt(head_dim)");
  c.flag("scale_attn_by_inverse_layer_idx", false, "cpformer does not scale scores by 1/(layer + 1)");
  c.text("activation_function", {"gelu_new", "gelu_pytorch_tanh"},
         "cpformer's gelu is the tanh approximation (gelu_new); the weights would compute another function");
}

std::string rope_type_of(const json& rope) {
  for (const char* key : {"rope_type", "type"}) {  // transformers < 4.45 wrote "type"
    if (rope.contains(key) && !rope[key].is_null())
      return rope[key].is_string() ? rope[key].get<std::string>() : rope[key].dump();
  }
  return "default";
}

// partial_rotary_factor (at the top level, as transformers < 5 reads it, or in the RoPE object): absent,
// null or 1.0, since cpformer rotates every dimension of a head.
void check_full_rotation(const json& holder, const std::string& path, const std::string& where) {
  if (!holder.contains("partial_rotary_factor") || holder["partial_rotary_factor"].is_null()) return;
  const json& factor = holder["partial_rotary_factor"];
  CPF_CHECK(factor.is_number() && factor.get<double>() == 1.0, path, " has ", where, "partial_rotary_factor ",
            factor.dump(), ", but cpformer rotates every dimension of a head (1.0)");
}

// Llama 3's scaling from a RoPE object of rope_type "llama3": its four numbers, under the keys the comparison
// reads ("rope_scaling.factor", ...).
void take_llama3_scaling(const json& rope, const std::string& path, const std::string& where, json& out) {
  for (const char* key : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
    CPF_CHECK(rope.contains(key) && rope[key].is_number(), path, ": ", where, key, " is ",
              rope.contains(key) ? rope[key].dump() : std::string("missing"),
              ", but rope_type llama3 needs it as a number");
    const std::string flat = std::string("rope_scaling.") + key;
    CPF_CHECK(!out.contains(flat) || out[flat] == rope[key], path, " has ", flat, " ", out.value(flat, json()).dump(),
              " and ", where, key, " ", rope[key].dump(), ", which disagree");
    out[flat] = rope[key];
  }
}

// config.json with its RoPE as cpformer computes it: one rope_theta (at the top level, as transformers < 5
// writes it, or in rope_parameters, as transformers >= 5 does; moved to the top level for the
// comparison), and either no scaling or Llama 3's (rope_type llama3, the Llama 3.1 / 3.2 checkpoints; its
// numbers moved to "rope_scaling.factor", ...). Other scalings (linear, dynamic, yarn, ...) or a partial
// rotation are refused: those weights would compute another function.
json with_known_rope(const json& config, const std::string& path) {
  json out = config;
  std::optional<double> theta;
  const auto take_theta = [&](const json& holder, const std::string& where) {
    if (!holder.contains("rope_theta") || holder["rope_theta"].is_null()) return;
    CPF_CHECK(holder["rope_theta"].is_number(), path, ": ", where, "rope_theta is ", holder["rope_theta"].dump(),
              ", not a number");
    const double value = holder["rope_theta"].get<double>();
    CPF_CHECK(!theta || *theta == value, path, " has rope_theta ", theta.value_or(0.0), " and ", where, "rope_theta ",
              value, ", which disagree");
    theta = value;
  };
  take_theta(config, "");
  out.erase("rope_parameters");
  out.erase("rope_scaling");
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!config.contains(key) || config[key].is_null()) continue;
    const json& rope = config[key];
    CPF_CHECK(rope.is_object(), path, ": ", key, " is ", rope.dump(), ", not an object");
    take_theta(rope, std::string(key) + ".");
    const std::string type = rope_type_of(rope);
    CPF_CHECK(type == "default" || type == "llama3", path, " has ", key, " ", rope.dump(), ": rope_type '", type,
              "' scales RoPE in a way cpformer does not compute (it has the unscaled RoPE, rope_type default, and "
              "Llama 3's, rope_type llama3), so these weights would compute another function");
    if (type == "llama3") take_llama3_scaling(rope, path, std::string(key) + ".", out);
    check_full_rotation(rope, path, std::string(key) + ".");
  }
  check_full_rotation(config, path, "");
  if (theta) {
    out["rope_theta"] = *theta;
  } else {
    out.erase("rope_theta");
  }
  return out;
}

void check_llama_config(const ConfigComparer& c, const models::GPTOptions& m) {
  c.equal<int64_t>("vocab_size", "vocab_size", m.vocab_size);
  c.equal<int64_t>("hidden_size", "hidden_size", m.hidden_size);
  c.equal<int64_t>("intermediate_size", "intermediate_size", models::effective_intermediate_size(m));
  c.equal<int64_t>("num_hidden_layers", "num_layers", m.num_layers);
  c.equal<int64_t>("num_attention_heads", "num_heads", m.num_heads);
  c.equal<int64_t>("num_key_value_heads", "num_kv_heads", kv_heads(m), m.num_heads);
  c.equal<int64_t>("head_dim", "head_dim", head_dim(m), m.hidden_size / m.num_heads);
  c.equal<double>("rms_norm_eps", "norm_eps", m.norm_eps, 1e-6);
  c.equal<double>("rope_theta", "rope_base", m.rope_base, 10000.0);
  // Llama 3's scaling: the factor always (1 when the folder has none), the other three when it has one.
  const RopeScaling& rs = m.rope_scaling;
  c.equal<double>("rope_scaling.factor", "rope_scaling.factor", rs.factor, 1.0);
  if (rs.active()) {
    c.equal<double>("rope_scaling.low_freq_factor", "rope_scaling.low_freq_factor", rs.low_freq_factor);
    c.equal<double>("rope_scaling.high_freq_factor", "rope_scaling.high_freq_factor", rs.high_freq_factor);
    c.equal<double>("rope_scaling.original_max_position_embeddings", "rope_scaling.original_max_position_embeddings",
                    rs.original_context);
  }
  c.equal<bool>("attention_bias", "bias", m.bias, false);
  c.equal<bool>("mlp_bias", "bias", m.bias, false);
  c.equal<bool>("tie_word_embeddings", "tie_embeddings", m.tie_embeddings, false);
  c.text("hidden_act", {"silu"}, "cpformer's swiglu gates with SiLU");
}

}  // namespace

bool is_hf_folder(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::is_regular_file(fs::path(path) / kHfConfigFile, ec) &&
         fs::is_regular_file(fs::path(path) / kHfWeightsFile, ec);
}

std::string hf_config_json(const models::GPTOptions& model, HfArchitecture arch) {
  return (arch == HfArchitecture::gpt2 ? gpt2_config(model) : llama_config(model)).dump(2) + "\n";
}

HfArchitecture write_hf_folder(const std::string& dir, const models::GPTOptions& model,
                               const io::NamedTensors& params) {
  const models::HfMatch match = models::match_hf_architecture(model);
  CPF_CHECK(match.arch, "export --format hf: the model fits no Hugging Face architecture: ", match.why_not);
  std::error_code ec;
  CPF_CHECK(!fs::exists(dir, ec) || (fs::is_directory(dir, ec) && fs::is_empty(dir, ec)), "export: ", dir,
            " exists and is not an empty folder; choose another with --out (nothing is overwritten)");
  fs::create_directories(dir, ec);
  CPF_CHECK(!ec, "export: cannot create ", dir, ": ", ec.message());
  const io::NamedTensors hf = models::to_hf_weights(model, *match.arch, params);
  io::save_safetensors((fs::path(dir) / kHfWeightsFile).string(), hf, {{"format", "pt"}}, true);
  write_file_atomically((fs::path(dir) / kHfConfigFile).string(), hf_config_json(model, *match.arch));
  return *match.arch;
}

io::NamedTensors read_hf_folder(const std::string& dir, const models::GPTOptions& model,
                                const io::NamedTensors& params) {
  const std::string config_path = (fs::path(dir) / kHfConfigFile).string();
  const json config = read_json(config_path);
  CPF_CHECK(config.is_object(), config_path, ": not a JSON object");
  const HfArchitecture arch = hf_architecture_of(config, config_path);
  const models::HfMatch match = models::match_hf_architecture(model);
  CPF_CHECK(match.arch == arch, config_path, " is a ", models::hf_architecture_name(arch),
            " but the model: section describes ",
            match.arch ? models::hf_architecture_name(*match.arch) : "neither HF architecture (" + match.why_not + ")",
            "; set the model: section to the ", models::hf_model_type(arch), " shape (docs/checkpoints.md)");
  if (arch == HfArchitecture::gpt2) {
    check_gpt2_config(ConfigComparer(config, config_path), model);
  } else {
    const json known_rope = with_known_rope(config, config_path);
    check_llama_config(ConfigComparer(known_rope, config_path), model);
  }
  const std::string weights_path = (fs::path(dir) / kHfWeightsFile).string();
  return models::from_hf_weights(model, arch, io::load_safetensors(weights_path), params, weights_path);
}

}  // namespace cpf::trainer
