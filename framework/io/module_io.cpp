// nn::Module::save / load (declared in framework/nn/module.h): a module's parameters and buffers as one
// plain safetensors file. Defined here, above cpf_nn, because the format lives in cpf_io.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "framework/autograd/grad_mode.h"
#include "framework/io/safetensors.h"
#include "framework/nn/module.h"
#include "framework/tensor/ops/copy.h"

namespace cpf::nn {
namespace {

namespace fs = std::filesystem;

// Parameters then buffers, refusing a name used by both (the file could not tell them apart).
std::vector<NamedTensor> state_of(const Module& module, const char* op) {
  std::vector<NamedTensor> state = module.named_parameters();
  std::set<std::string> names;
  for (const auto& [name, t] : state) names.insert(name);
  for (const auto& entry : module.named_buffers()) {
    CPF_CHECK(names.insert(entry.first).second, op, ": '", entry.first, "' names both a parameter and a buffer");
    state.push_back(entry);
  }
  return state;
}

// "a, b, c" with at most `limit` names, then "and N more".
std::string name_list(const std::vector<std::string>& names, size_t limit = 8) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < limit; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > limit) out += " and " + std::to_string(names.size() - limit) + " more";
  return out;
}

// Every difference between the file's header and the module, or "" when they match.
std::string header_problems(const io::SafetensorsHeader& header, const std::vector<NamedTensor>& state) {
  std::map<std::string, Shape> in_module;
  for (const auto& [name, t] : state) in_module[name] = t.shape();
  std::vector<std::string> missing, unexpected, misshaped;
  for (const auto& [name, shape] : in_module) {
    if (header.find(name) == nullptr) missing.push_back(name);
  }
  for (const io::SafetensorsEntry& e : header.entries) {
    auto it = in_module.find(e.name);
    if (it == in_module.end()) {
      unexpected.push_back(e.name);
    } else if (e.shape != it->second) {
      misshaped.push_back(::cpf::str_cat(e.name, " (file ", e.shape, ", module ", it->second, ")"));
    }
  }
  std::string problems;
  auto add = [&](const std::vector<std::string>& names, const std::string& what) {
    if (names.empty()) return;
    problems += (problems.empty() ? "" : "; ") + std::to_string(names.size()) + " " + what + ": " + name_list(names);
  };
  add(missing, "tensor(s) of the module missing from the file");
  add(unexpected, "unexpected tensor(s) in the file");
  add(misshaped, "tensor(s) with another shape");
  return problems;
}

bool all_finite(const Tensor& t) {
  if (!is_floating(t.dtype())) return true;
  const std::vector<double> v = t.to_vector<double>();
  return std::all_of(v.begin(), v.end(), [](double x) { return std::isfinite(x); });
}

}  // namespace

void Module::save(const std::string& path) const {
  const std::vector<NamedTensor> state = state_of(*this, "Module::save");
  CPF_CHECK(!path.empty(), "Module::save: the path is empty");
  const fs::path target(path);
  CPF_CHECK(!fs::is_directory(target), "Module::save: ", path,
            " is a folder; give a file name (e.g. model.safetensors)");
  const std::string partial = path + ".partial";
  io::save_safetensors(partial, state, {{"format", "cpformer.module"}}, /*sync=*/true);
  std::error_code ec;
  fs::rename(partial, target, ec);
  CPF_CHECK(!ec, "Module::save: cannot rename ", partial, " to ", path, ": ", ec.message());
}

void Module::load(const std::string& path) {
  const std::vector<NamedTensor> state = state_of(*this, "Module::load");
  const io::SafetensorsHeader header = io::read_safetensors_header(path);
  const std::string problems = header_problems(header, state);
  CPF_CHECK(problems.empty(), "Module::load: ", path, " does not fit the module: ", problems);
  // Read and check everything before changing a tensor: a bad file leaves the module as it was.
  const io::NamedTensors loaded = io::load_safetensors(path);
  std::map<std::string, Tensor> by_name(loaded.begin(), loaded.end());
  for (const auto& [name, t] : loaded) {
    CPF_CHECK(all_finite(t), "Module::load: ", path, ": tensor '", name, "' holds NaN or infinite values");
  }
  NoGradGuard no_grad;
  for (const auto& [name, live] : state) raw::copy_(live, by_name.at(name));
}

}  // namespace cpf::nn
