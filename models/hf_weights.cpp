#include "models/hf_weights.h"

#include <map>
#include <set>

#include "framework/tensor/ops/copy.h"
#include "framework/tensor/ops/join.h"
#include "framework/tensor/ops/views.h"

namespace cpf::models {
namespace {

// How one HF tensor is made of cpformer tensors.
enum class Layout {
  same,              // identical
  transposed,        // Conv1D (in, out) of a Linear (out, in)
  fused_transposed,  // c_attn.weight: [q^T | k^T | v^T] along dim 1
  fused,             // c_attn.bias: [q | k | v]
};

struct Rule {
  std::vector<std::string> cpf;
  std::string hf;
  Layout layout = Layout::same;
};

std::string layer(int64_t i) { return "blocks." + std::to_string(i) + "."; }

void add_norm(std::vector<Rule>& rules, const std::string& cpf, const std::string& hf, bool bias) {
  rules.push_back({{cpf + ".weight"}, hf + ".weight"});
  if (bias) rules.push_back({{cpf + ".bias"}, hf + ".bias"});
}

std::vector<Rule> gpt2_rules(const GPTOptions& o) {
  std::vector<Rule> r{{{"embed_tokens.weight"}, "transformer.wte.weight"},
                      {{"embed_positions.weight"}, "transformer.wpe.weight"}};
  for (int64_t i = 0; i < o.num_layers; ++i) {
    const std::string b = layer(i), h = "transformer.h." + std::to_string(i) + ".";
    add_norm(r, b + "attn_norm", h + "ln_1", true);
    r.push_back({{b + "attn.q_proj.weight", b + "attn.k_proj.weight", b + "attn.v_proj.weight"},
                 h + "attn.c_attn.weight",
                 Layout::fused_transposed});
    r.push_back({{b + "attn.q_proj.bias", b + "attn.k_proj.bias", b + "attn.v_proj.bias"},
                 h + "attn.c_attn.bias",
                 Layout::fused});
    r.push_back({{b + "attn.o_proj.weight"}, h + "attn.c_proj.weight", Layout::transposed});
    r.push_back({{b + "attn.o_proj.bias"}, h + "attn.c_proj.bias"});
    add_norm(r, b + "mlp_norm", h + "ln_2", true);
    r.push_back({{b + "mlp.fc_in.weight"}, h + "mlp.c_fc.weight", Layout::transposed});
    r.push_back({{b + "mlp.fc_in.bias"}, h + "mlp.c_fc.bias"});
    r.push_back({{b + "mlp.fc_out.weight"}, h + "mlp.c_proj.weight", Layout::transposed});
    r.push_back({{b + "mlp.fc_out.bias"}, h + "mlp.c_proj.bias"});
  }
  add_norm(r, "final_norm", "transformer.ln_f", true);
  if (!o.tie_embeddings) r.push_back({{"lm_head.weight"}, "lm_head.weight"});
  return r;
}

std::vector<Rule> llama_rules(const GPTOptions& o) {
  std::vector<Rule> r{{{"embed_tokens.weight"}, "model.embed_tokens.weight"}};
  auto linear = [&](const std::string& cpf, const std::string& hf) {
    r.push_back({{cpf + ".weight"}, hf + ".weight"});
    if (o.bias) r.push_back({{cpf + ".bias"}, hf + ".bias"});
  };
  for (int64_t i = 0; i < o.num_layers; ++i) {
    const std::string b = layer(i), h = "model.layers." + std::to_string(i) + ".";
    add_norm(r, b + "attn_norm", h + "input_layernorm", false);
    for (const char* p : {"q_proj", "k_proj", "v_proj", "o_proj"}) linear(b + "attn." + p, h + "self_attn." + p);
    add_norm(r, b + "mlp_norm", h + "post_attention_layernorm", false);
    for (const char* p : {"gate_proj", "up_proj", "down_proj"}) linear(b + "mlp." + p, h + "mlp." + p);
  }
  add_norm(r, "final_norm", "model.norm", false);
  if (!o.tie_embeddings) r.push_back({{"lm_head.weight"}, "lm_head.weight"});
  return r;
}

std::vector<Rule> rules_for(const GPTOptions& o, HfArchitecture arch) {
  return arch == HfArchitecture::gpt2 ? gpt2_rules(o) : llama_rules(o);
}

Tensor transposed(const Tensor& t) { return raw::contiguous(raw::transpose(t, 0, 1)); }

// The HF shape a rule produces from the cpformer shapes of its parts.
Shape hf_shape(const Rule& rule, const std::vector<Shape>& parts) {
  switch (rule.layout) {
    case Layout::same: return parts[0];
    case Layout::transposed: return {parts[0][1], parts[0][0]};
    case Layout::fused_transposed: {
      int64_t out = 0;
      for (const Shape& s : parts) out += s[0];
      return {parts[0][1], out};
    }
    case Layout::fused: {
      int64_t n = 0;
      for (const Shape& s : parts) n += s[0];
      return {n};
    }
  }
  return {};
}

std::string requirement(bool ok, const std::string& what, const std::string& has) {
  return ok ? "" : what + " (has " + has + ")";
}

// The first unmet requirement of a shape, or "".
std::string first_unmet(const std::vector<std::string>& checks) {
  for (const std::string& c : checks) {
    if (!c.empty()) return c;
  }
  return "";
}

const char* attention_name(AttentionType a) {
  return a == AttentionType::mha ? "mha" : a == AttentionType::gqa ? "gqa" : "mla";
}

}  // namespace

std::string hf_architecture_name(HfArchitecture arch) {
  return arch == HfArchitecture::gpt2 ? "GPT2LMHeadModel" : "LlamaForCausalLM";
}

std::string hf_model_type(HfArchitecture arch) { return arch == HfArchitecture::gpt2 ? "gpt2" : "llama"; }

HfMatch match_hf_architecture(const GPTOptions& o) {
  const bool learned = o.positions == PositionType::learned, layernorm = o.norm == NormType::layernorm;
  const bool gelu = o.mlp == nn::Activation::gelu;
  const int64_t natural_head_dim = o.hidden_size / std::max<int64_t>(o.num_heads, 1);
  const std::string gpt2 = first_unmet({
      requirement(o.attention == AttentionType::mha, "attention: mha", attention_name(o.attention)),
      requirement(learned, "positions: learned", "rope"),
      requirement(layernorm, "norm: layernorm", "rmsnorm"),
      requirement(gelu, "mlp: gelu", "swiglu"),
      requirement(o.bias, "bias: true", "false"),
      requirement(o.head_dim == 0 || o.head_dim == natural_head_dim,
                  "head_dim: 0 (hidden_size / num_heads = " + std::to_string(natural_head_dim) + ")",
                  std::to_string(o.head_dim)),
      requirement(o.window < 0, "window: -1", std::to_string(o.window)),
  });
  if (gpt2.empty()) return {HfArchitecture::gpt2, ""};
  const std::string llama = first_unmet({
      requirement(o.attention != AttentionType::mla, "attention: mha or gqa", "mla"),
      requirement(!learned, "positions: rope", "learned"),
      requirement(!layernorm, "norm: rmsnorm", "layernorm"),
      requirement(!gelu, "mlp: swiglu", "gelu"),
      requirement(o.window < 0, "window: -1", std::to_string(o.window)),
  });
  if (llama.empty()) return {HfArchitecture::llama, ""};
  return {std::nullopt, "GPT-2 (GPT2LMHeadModel) needs " + gpt2 + "; Llama (LlamaForCausalLM) needs " + llama};
}

io::NamedTensors to_hf_weights(const GPTOptions& options, HfArchitecture arch, const io::NamedTensors& weights) {
  std::map<std::string, Tensor> by_name;
  for (const auto& [name, t] : weights) by_name[name] = raw::contiguous(raw::to(t, Device::cpu()));
  auto get = [&](const std::string& name) {
    auto it = by_name.find(name);
    CPF_CHECK(it != by_name.end(), "HF export: the model has no parameter '", name, "'");
    return it->second;
  };
  io::NamedTensors out;
  std::set<std::string> used;
  for (const Rule& rule : rules_for(options, arch)) {
    std::vector<Tensor> parts;
    for (const std::string& n : rule.cpf) {
      parts.push_back(get(n));
      used.insert(n);
    }
    Tensor t;
    switch (rule.layout) {
      case Layout::same: t = parts[0]; break;
      case Layout::transposed: t = transposed(parts[0]); break;
      case Layout::fused_transposed: {
        std::vector<Tensor> cols;
        for (const Tensor& p : parts) cols.push_back(transposed(p));
        t = raw::contiguous(raw::cat(cols, 1));
        break;
      }
      case Layout::fused: t = raw::contiguous(raw::cat(parts, 0)); break;
    }
    out.emplace_back(rule.hf, t);
  }
  for (const auto& [name, t] : weights) {
    CPF_CHECK(used.count(name), "HF export: parameter '", name, "' has no ", hf_architecture_name(arch),
              " counterpart (model options and weights disagree)");
  }
  return out;
}

namespace {

// HF names of tensors that are buffers, not weights (older GPT-2 files, Llama's rotary table).
bool is_hf_buffer(const std::string& name) {
  auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return ends_with(".attn.bias") || ends_with(".attn.masked_bias") || ends_with("rotary_emb.inv_freq");
}

// HF tensors by name; GPT-2's Hub files name "h.0..." and "wte.weight" without "transformer.".
std::map<std::string, Tensor> hf_by_name(HfArchitecture arch, const io::NamedTensors& hf) {
  std::map<std::string, Tensor> by_name;
  for (const auto& [name, t] : hf) {
    if (is_hf_buffer(name)) continue;
    const bool bare = arch == HfArchitecture::gpt2 && name.rfind("transformer.", 0) != 0 && name != "lm_head.weight";
    by_name[bare ? "transformer." + name : name] = t;
  }
  return by_name;
}

// A tied model's HF file may still hold lm_head.weight: accepted only as an exact copy of the embedding.
void drop_tied_head(std::map<std::string, Tensor>& by_name, const std::string& embedding, const std::string& where) {
  auto head = by_name.find("lm_head.weight");
  if (head == by_name.end()) return;
  auto emb = by_name.find(embedding);
  const bool same =
      emb != by_name.end() && emb->second.shape() == head->second.shape() &&
      raw::to(emb->second, DType::f64).to_vector<double>() == raw::to(head->second, DType::f64).to_vector<double>();
  CPF_CHECK(same, "lm_head.weight differs from ", embedding,
            " but model.tie_embeddings is true; set "
            "model.tie_embeddings: false to load a separate output layer");
  by_name.erase(head);
}

// The cpformer tensors of one rule from its HF tensor (already shape-checked).
std::vector<Tensor> split_rule(const Rule& rule, const Tensor& hf, const std::vector<Shape>& shapes) {
  std::vector<Tensor> out;
  int64_t offset = 0;
  for (const Shape& shape : shapes) {
    switch (rule.layout) {
      case Layout::same: out.push_back(hf); break;
      case Layout::transposed: out.push_back(transposed(hf)); break;
      case Layout::fused_transposed: out.push_back(transposed(raw::narrow(hf, 1, offset, shape[0]))); break;
      case Layout::fused: out.push_back(raw::contiguous(raw::narrow(hf, 0, offset, shape[0]))); break;
    }
    offset += shape[0];
  }
  return out;
}

}  // namespace

io::NamedTensors from_hf_weights(const GPTOptions& options, HfArchitecture arch, const io::NamedTensors& hf,
                                 const io::NamedTensors& params, const std::string& where) {
  std::map<std::string, Tensor> by_name = hf_by_name(arch, hf);
  std::map<std::string, Tensor> live;
  for (const auto& [name, t] : params) live[name] = t;
  if (options.tie_embeddings) {
    try {
      drop_tied_head(by_name, arch == HfArchitecture::gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight",
                     where);
    } catch (const Error& e) {
      CPF_FAIL(where, ": ", e.message());
    }
  }
  std::map<std::string, Tensor> loaded;
  for (const Rule& rule : rules_for(options, arch)) {
    std::vector<Shape> shapes;
    for (const std::string& n : rule.cpf) {
      CPF_CHECK(live.count(n), where, ": the model has no parameter '", n, "' for ", rule.hf);
      shapes.push_back(live[n].shape());
    }
    auto it = by_name.find(rule.hf);
    CPF_CHECK(it != by_name.end(), where, ": no tensor '", rule.hf, "', which the model's ", rule.cpf.front(),
              " needs (", hf_architecture_name(arch), " with ", options.num_layers, " layers",
              options.tie_embeddings ? "" : ", untied lm_head", ")");
    const Shape expected = hf_shape(rule, shapes);
    CPF_CHECK(it->second.shape() == expected, where, ": tensor '", rule.hf, "' has shape ", it->second.shape(),
              " but the model needs ", expected, " (model: hidden_size ", options.hidden_size, ", num_heads ",
              options.num_heads, ", vocab_size ", options.vocab_size, "); set the model: section to the checkpoint's");
    const std::vector<Tensor> parts = split_rule(rule, it->second, shapes);
    for (size_t j = 0; j < parts.size(); ++j) {
      loaded[rule.cpf[j]] = raw::contiguous(raw::to(parts[j], live[rule.cpf[j]].dtype()));
    }
    by_name.erase(it);
  }
  if (!by_name.empty()) {
    std::string extra;
    for (const auto& [name, t] : by_name) extra += (extra.empty() ? "" : ", ") + name;
    CPF_FAIL(where, ": ", by_name.size(), " tensor(s) the model has no place for: ", extra,
             " (more layers, biases or an untied lm_head than model: describes?)");
  }
  io::NamedTensors out;
  for (const auto& [name, t] : params) out.emplace_back(name, loaded.at(name));
  return out;
}

}  // namespace cpf::models
